"""oci_image: base + layers + config -> an OCI image layout, runnable (summary, copy,
archive, push), with the pins, provenance and SBOM of Omni's images."""

load(":common.bzl", "RUNNER", "display")
load(":providers.bzl", "OciBaseInfo", "OciImageInfo", "OciLayerInfo")
load(":toolchain.bzl", "TOOLCHAIN_TYPE", "oci_tools")

def _oci_image_impl(ctx):
    layout = ctx.actions.declare_directory(ctx.label.name + ".layout")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    spec = {}
    if ctx.attr.entrypoint:
        spec["entrypoint"] = ctx.attr.entrypoint
    if ctx.attr.cmd:
        spec["cmd"] = ctx.attr.cmd
    for key in ("env", "labels", "annotations"):
        if getattr(ctx.attr, key):
            spec[key] = getattr(ctx.attr, key)
    if ctx.attr.volumes:
        spec["volumes"] = ctx.attr.volumes
    for key in ("workdir", "user", "os", "architecture", "variant"):
        if getattr(ctx.attr, key):
            spec[key] = getattr(ctx.attr, key)
    if ctx.attr.exposed_ports:
        spec["exposed_ports"] = ctx.attr.exposed_ports
    spec["layer_names"] = [display(layer.label) for layer in ctx.attr.layers]
    spec_file = ctx.actions.declare_file(ctx.label.name + ".config.json")
    ctx.actions.write(spec_file, json.encode(spec))
    args = ctx.actions.args()
    args.add("--output", layout.path)
    args.add("--config-spec", spec_file)
    args.add("--digest-file", digest)
    inputs = [spec_file]
    if ctx.file.pins:
        args.add("--pins", ctx.file.pins)
        inputs.append(ctx.file.pins)
        if ctx.attr.release:
            args.add("--release")
        if ctx.file.checkpoint_lock:
            args.add("--checkpoint-lock", ctx.file.checkpoint_lock)
            inputs.append(ctx.file.checkpoint_lock)
    if ctx.attr.base:
        base = ctx.attr.base
        if OciImageInfo in base:
            args.add("--base", base[OciImageInfo].layout.path)
            inputs.append(base[OciImageInfo].layout)
        else:
            marker = base[OciBaseInfo].dir_marker
            args.add("--base", marker.dirname)
            inputs += base[DefaultInfo].files.to_list()
    for layer in ctx.attr.layers:
        info = layer[OciLayerInfo]
        args.add("--layer", info.descriptor.path + "=" + info.blob.path)
        inputs += [info.descriptor, info.blob]
    ctx.actions.run(
        executable = oci_tools(ctx).image,
        arguments = [args],
        inputs = inputs,
        outputs = [layout, digest],
        mnemonic = "OciImage",
        progress_message = "Assembling image %{label}",
        env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
    )
    outputs = [layout, digest]
    extra_args = ""
    if ctx.file.pins:
        provenance = ctx.actions.declare_file(ctx.label.name + ".provenance.json")
        prov_args = ctx.actions.args()
        prov_args.add("--name", ctx.label.name)
        prov_args.add("--digest-file", digest)
        prov_args.add("--layout", layout.path)
        prov_args.add("--pins", ctx.file.pins)
        prov_args.add("--status", ctx.info_file)
        prov_args.add_all(ctx.files.locks, before_each = "--lock")
        prov_args.add("--output", provenance)
        ctx.actions.run(
            executable = oci_tools(ctx).provenance,
            arguments = [prov_args],
            inputs = [digest, layout, ctx.file.pins, ctx.info_file] + ctx.files.locks,
            outputs = [provenance],
            mnemonic = "OciProvenance",
            progress_message = "Writing the provenance of %{label}",
        )
        outputs.append(provenance)
        extra_args += " --provenance " + provenance.short_path
    if ctx.files.sbom_debian or ctx.files.sbom_wheels:
        sbom = ctx.actions.declare_file(ctx.label.name + ".spdx.json")
        sbom_args = ctx.actions.args()
        sbom_args.add("--name", ctx.label.name)
        sbom_args.add("--digest-file", digest)
        sbom_args.add("--output", sbom)
        sbom_args.add_all(ctx.files.sbom_debian, before_each = "--debian")
        sbom_args.add_all(ctx.files.sbom_wheels, before_each = "--wheels")
        if ctx.file.debian_lock:
            sbom_args.add("--debian-lock", ctx.file.debian_lock)
        ctx.actions.run(
            executable = oci_tools(ctx).sbom,
            arguments = [sbom_args],
            inputs = [digest] + ctx.files.sbom_debian + ctx.files.sbom_wheels + ctx.files.debian_lock,
            outputs = [sbom],
            mnemonic = "OciSbom",
            progress_message = "Writing the SBOM of %{label}",
            env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
        )
        outputs.append(sbom)
        extra_args += " --sbom " + sbom.short_path
    runner = ctx.actions.declare_file(ctx.label.name + ".run.sh")
    ctx.actions.write(runner, RUNNER.format(
        label = display(ctx.label),
        runner = ctx.executable._runner.short_path,
        layout = layout.short_path + extra_args,
    ), is_executable = True)
    runfiles = ctx.runfiles(files = outputs).merge(ctx.attr._runner[DefaultInfo].default_runfiles)
    return [
        DefaultInfo(files = depset(outputs), executable = runner, runfiles = runfiles),
        OciImageInfo(layout = layout, digest = digest),
    ]

oci_image = rule(
    implementation = _oci_image_impl,
    executable = True,
    doc = """Base + layers + config -> an OCI image layout. `bazel run` prints its digest and a
summary; `-- --push REGISTRY/REPO[:TAG]` pushes it, `--output DIR` copies the layout,
`--archive FILE` writes an OCI archive tarball.""",
    toolchains = [TOOLCHAIN_TYPE],
    attrs = {
        "base": attr.label(providers = [[OciImageInfo], [OciBaseInfo]],
                           doc = "A shallow pinned base (OciBaseInfo) or another image's layout."),
        "layers": attr.label_list(providers = [OciLayerInfo]),
        "entrypoint": attr.string_list(),
        "cmd": attr.string_list(),
        "env": attr.string_dict(),
        "workdir": attr.string(),
        "user": attr.string(doc = "uid:gid (numeric, so Kubernetes runAsNonRoot can check it)."),
        "volumes": attr.string_list(doc = "Paths the image writes to, declared as Volumes."),
        "exposed_ports": attr.string_list(),
        "labels": attr.string_dict(),
        "annotations": attr.string_dict(doc = "Manifest annotations (org.opencontainers.image.*)."),
        "os": attr.string(doc = "For images without a base; with one, only its own (else refused)."),
        "architecture": attr.string(doc = "For images without a base; with one, only its own (else refused)."),
        "variant": attr.string(),
        "source_date_epoch": attr.string(default = "0"),
        "sbom_debian": attr.label_list(allow_files = [".json"], doc = "Debian package lists (SBOM)."),
        "sbom_wheels": attr.label_list(allow_files = [".json"], doc = "wheels.json of the deps layer (SBOM)."),
        "debian_lock": attr.label(allow_single_file = True, doc = "Adds download URLs to the SBOM."),
        "pins": attr.label(allow_single_file = [".json"],
                           doc = "The pin document: labels, /etc/omni/image.json and the provenance."),
        "release": attr.bool(doc = "Refuse empty pins (set by --config=release)."),
        "checkpoint_lock": attr.label(allow_single_file = [".json"],
                                      doc = "Baked at /etc/omni/checkpoint.lock.json; its sha256 must be the pin's."),
        "locks": attr.label_list(allow_files = True, doc = "Lock files whose digests the provenance records."),
        "_runner": attr.label(default = "//tools/oci:run", executable = True, cfg = "target"),
    },
)
