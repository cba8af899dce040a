"""oci_image_index: one image index over images of different platforms."""

load(":common.bzl", "RUNNER", "WORKER", "display")
load(":providers.bzl", "OciImageInfo")
load(":toolchain.bzl", "TOOLCHAIN_TYPE", "oci_tools")

def _oci_image_index_impl(ctx):
    layout = ctx.actions.declare_directory(ctx.label.name + ".layout")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    images = [image[OciImageInfo].layout for image in ctx.attr.images]
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--output", layout.path)
    args.add("--digest-file", digest)
    args.add_all(images, before_each = "--image", expand_directories = False)
    ctx.actions.run(
        executable = oci_tools(ctx).index,
        arguments = [args],
        inputs = images,
        outputs = [layout, digest],
        mnemonic = "OciIndex",
        execution_requirements = WORKER,
        progress_message = "Assembling image index %{label}",
    )
    runner = ctx.actions.declare_file(ctx.label.name + ".run.sh")
    ctx.actions.write(runner, RUNNER.format(
        label = display(ctx.label),
        runner = ctx.executable._runner.short_path,
        layout = layout.short_path,
    ), is_executable = True)
    runfiles = ctx.runfiles(files = [layout, digest]).merge(ctx.attr._runner[DefaultInfo].default_runfiles)
    return [
        DefaultInfo(files = depset([layout, digest]), executable = runner, runfiles = runfiles),
        OciImageInfo(layout = layout, digest = digest),
    ]

oci_image_index = rule(
    implementation = _oci_image_index_impl,
    executable = True,
    doc = """One OCI image index over images of different platforms (each image's platform is read
from its own config; two of one platform are refused). `bazel run` prints it; `oci_push` pushes
every image and the index, signed as one digest.""",
    toolchains = [TOOLCHAIN_TYPE],
    attrs = {
        "images": attr.label_list(mandatory = True, providers = [OciImageInfo]),
        "_runner": attr.label(default = "//tools/oci:run", executable = True, cfg = "target"),
    },
)
