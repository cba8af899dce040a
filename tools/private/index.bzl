"""oci_image_index: one image index over images of different platforms."""

load(":providers.bzl", "OciImageInfo")
load(":runnable.bzl", "WORKER", "runnable_layout", "worker_args")
load(":toolchain.bzl", "TOOLCHAIN_TYPE", "oci_tools")

def _oci_image_index_impl(ctx):
    layout = ctx.actions.declare_directory(ctx.label.name + ".layout")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    images = [image[OciImageInfo].layout for image in ctx.attr.images]
    args = worker_args(ctx)
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
    return runnable_layout(ctx, layout, digest, [layout, digest])

_OCI_IMAGE_INDEX_EXAMPLE = """

Example:

    oci_image_index(
        name = "spark_multiarch",
        images = [":deepseek_spark", ":deepseek_spark_amd64"],  # one per platform
    )
"""

oci_image_index = rule(
    implementation = _oci_image_index_impl,
    executable = True,
    doc = """One OCI image index over images of different platforms (each image's platform is read
from its own config; two of one platform are refused). `bazel run` prints it; `oci_push` pushes
every image and the index, signed as one digest.""" + _OCI_IMAGE_INDEX_EXAMPLE,
    toolchains = [TOOLCHAIN_TYPE],
    attrs = {
        "images": attr.label_list(mandatory = True, providers = [OciImageInfo], doc = "One image per platform (two of the same platform are refused)."),
        "_runner": attr.label(default = "//tools/oci:run", executable = True, cfg = "target"),
    },
)
