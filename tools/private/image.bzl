"""oci_image: base + layers + config -> an OCI image layout, runnable (summary, copy, archive,
push), with rules_oci's attribute names; omni_image: the same, plus what Omni's images carry
(pins baked into labels and /etc/omni/image.json, release checks, provenance, SBOM)."""

load(":providers.bzl", "OciBaseInfo", "OciImageInfo", "OciLayerInfo")
load(":runnable.bzl", "WORKER", "display", "runnable_layout", "worker_args")
load(":toolchain.bzl", "TOOLCHAIN_TYPE", "oci_tools")

def _tar_layers(ctx):
    """rules_oci's `tars`: each tar file another rule made becomes one normalised gzip layer."""
    layers = []
    for index, tar in enumerate(ctx.files.tars):
        spec = ctx.actions.declare_file("{}.tar{}.spec.json".format(ctx.label.name, index))
        ctx.actions.write(spec, json.encode({"entries": [], "tars": [{"src": tar.path, "prefix": "/"}]}))
        blob = ctx.actions.declare_file("{}.tar{}.tar.gz".format(ctx.label.name, index))
        descriptor = ctx.actions.declare_file("{}.tar{}.layer.json".format(ctx.label.name, index))
        ctx.actions.run(
            executable = oci_tools(ctx).layer,
            arguments = [worker_args(ctx, [
                "--spec",
                spec.path,
                "--output",
                blob.path,
                "--descriptor",
                descriptor.path,
            ])],
            execution_requirements = WORKER,
            inputs = [spec, tar],
            outputs = [blob, descriptor],
            mnemonic = "OciLayer",
            progress_message = "Normalising the layer tar " + tar.short_path,
            env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
        )
        layers.append(struct(name = tar.short_path, info = OciLayerInfo(blob = blob, descriptor = descriptor)))
    return layers

def _files(targets):
    return [f for target in targets for f in target.files.to_list()]

def _omni(ctx, name, default):
    """An omni_image attribute; oci_image has none of them."""
    return getattr(ctx.attr, name, default)

def _config_spec(ctx, layers):
    """The image tool's config spec (entrypoint, env, labels, ...), written as a file."""
    spec = {}
    for key in ("entrypoint", "cmd", "env", "labels", "annotations", "volumes"):
        if getattr(ctx.attr, key):
            spec[key] = getattr(ctx.attr, key)
    for key in ("workdir", "user", "os", "architecture", "variant"):
        if getattr(ctx.attr, key):
            spec[key] = getattr(ctx.attr, key)
    if ctx.attr.exposed_ports:
        spec["exposed_ports"] = ctx.attr.exposed_ports
    spec["layer_names"] = [layer.name for layer in layers]
    spec_file = ctx.actions.declare_file(ctx.label.name + ".config.json")
    ctx.actions.write(spec_file, json.encode(spec))
    return spec_file

def _single_file(ctx, name):
    """The one file of an omni_image label attribute, or None (oci_image has none of them)."""
    target = _omni(ctx, name, None)
    return target.files.to_list()[0] if target else None

def _base_inputs(base):
    """The image tool's --base directory and the files it reads there."""
    if OciImageInfo in base:
        return base[OciImageInfo].layout.path, [base[OciImageInfo].layout]
    return base[OciBaseInfo].dir_marker.dirname, base[DefaultInfo].files.to_list()

def _assemble(ctx, layout, digest, layers, pins):
    """The image tool: base + layers + config (+ the pins and the lock it bakes) -> the layout."""
    spec_file = _config_spec(ctx, layers)
    args = worker_args(ctx)
    args.add("--output", layout.path)
    args.add("--config-spec", spec_file)
    args.add("--digest-file", digest)
    inputs = [spec_file]
    checkpoint_lock = _single_file(ctx, "checkpoint_lock")
    if pins:
        args.add("--pins", pins)
        inputs.append(pins)
        if _omni(ctx, "release", False):
            args.add("--release")
        if checkpoint_lock:
            args.add("--checkpoint-lock", checkpoint_lock)
            inputs.append(checkpoint_lock)
    if ctx.attr.base:
        base_dir, base_files = _base_inputs(ctx.attr.base)
        args.add("--base", base_dir)
        inputs += base_files
    for layer in layers:
        info = layer.info
        args.add("--layer", info.descriptor.path + "=" + info.blob.path)
        inputs += [info.descriptor, info.blob]
    ctx.actions.run(
        executable = oci_tools(ctx).image,
        arguments = [args],
        inputs = inputs,
        outputs = [layout, digest],
        mnemonic = "OciImage",
        execution_requirements = WORKER,
        progress_message = "Assembling image %{label}",
        env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
    )

def _provenance(ctx, layout, digest, pins):
    """The provenance tool: the image's SLSA provenance, naming its pins and locks."""
    locks = _files(_omni(ctx, "locks", []))
    provenance = ctx.actions.declare_file(ctx.label.name + ".provenance.json")
    args = ctx.actions.args()
    args.add("--name", ctx.label.name)
    args.add("--digest-file", digest)
    args.add("--layout", layout.path)
    args.add("--pins", pins)
    args.add("--status", ctx.info_file)
    args.add_all(locks, before_each = "--lock")
    args.add("--output", provenance)
    ctx.actions.run(
        executable = oci_tools(ctx).provenance,
        arguments = [args],
        inputs = [digest, layout, pins, ctx.info_file] + locks,
        outputs = [provenance],
        mnemonic = "OciProvenance",
        progress_message = "Writing the provenance of %{label}",
    )
    return provenance

def _sbom(ctx, digest):
    """The SBOM tool: the image's SPDX 2.3 document from its package lists, and the same as
    [CycloneDX 1.6, SPDX 3.0.1]; (None, []) without any."""
    sbom_debian = _files(_omni(ctx, "sbom_debian", []))
    sbom_wheels = _files(_omni(ctx, "sbom_wheels", []))
    debian_lock = _files([_omni(ctx, "debian_lock", None)] if _omni(ctx, "debian_lock", None) else [])
    if not sbom_debian and not sbom_wheels:
        return None, []

    # A release is built on the pinned vendor base: its packages come from the contents file
    # tools/pin recorded, checked against the pins by the action (missing: refused there).
    vendor_base = []
    if _omni(ctx, "release", False):
        vendor_base = [_single_file(ctx, "pins")] + _files(_omni(ctx, "sbom_base_contents", []))
    sbom = ctx.actions.declare_file(ctx.label.name + ".spdx.json")
    cyclonedx = ctx.actions.declare_file(ctx.label.name + ".cdx.json")
    spdx3 = ctx.actions.declare_file(ctx.label.name + ".spdx3.json")
    args = ctx.actions.args()
    args.add("--name", ctx.label.name)
    args.add("--digest-file", digest)
    args.add("--output", sbom)
    args.add("--cyclonedx", cyclonedx)
    args.add("--spdx3", spdx3)
    args.add_all(sbom_debian, before_each = "--debian")
    args.add_all(sbom_wheels, before_each = "--wheels")
    if debian_lock:
        args.add("--debian-lock", debian_lock[0])
    if vendor_base:
        args.add("--vendor-base-pins", vendor_base[0])
        args.add_all(vendor_base[1:], before_each = "--base-contents")
    ctx.actions.run(
        executable = oci_tools(ctx).sbom,
        arguments = [args],
        inputs = [digest] + sbom_debian + sbom_wheels + debian_lock + vendor_base,
        outputs = [sbom, cyclonedx, spdx3],
        mnemonic = "OciSbom",
        progress_message = "Writing the SBOM of %{label}",
        env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
    )
    return sbom, [cyclonedx, spdx3]

def _oci_image_impl(ctx):
    layout = ctx.actions.declare_directory(ctx.label.name + ".layout")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    layers = [struct(name = display(layer.label), info = layer[OciLayerInfo]) for layer in ctx.attr.layers]
    layers += _tar_layers(ctx)
    pins = _single_file(ctx, "pins")
    _assemble(ctx, layout, digest, layers, pins)
    outputs = [layout, digest]
    extra_args = ""
    if pins:
        provenance = _provenance(ctx, layout, digest, pins)
        outputs.append(provenance)
        extra_args += " --provenance " + provenance.short_path
    sbom, alternates = _sbom(ctx, digest)
    if sbom:
        outputs += [sbom] + alternates
        extra_args += " --sbom " + sbom.short_path + " --cyclonedx " + alternates[0].short_path
    return runnable_layout(ctx, layout, digest, outputs, extra_args)

_GENERIC_ATTRS = {
    "base": attr.label(
        providers = [[OciImageInfo], [OciBaseInfo]],
        doc = "A shallow pinned base (OciBaseInfo) or another image's layout.",
    ),
    "layers": attr.label_list(providers = [OciLayerInfo], doc = "oci_layer targets, in order."),
    "tars": attr.label_list(
        allow_files = [".tar", ".tar.gz", ".tgz", ".tar.zst"],
        doc = "rules_oci's name: tar files other rules made, each one more layer after `layers`.",
    ),
    "entrypoint": attr.string_list(doc = "The config's Entrypoint (replaces the base's, and drops its Cmd)."),
    "cmd": attr.string_list(doc = "The config's Cmd: default arguments of the entrypoint."),
    "env": attr.string_dict(doc = "Variables added to (or replacing) the base's Env."),
    "workdir": attr.string(doc = "The config's WorkingDir."),
    "user": attr.string(doc = "uid:gid (numeric, so Kubernetes runAsNonRoot can check it)."),
    "volumes": attr.string_list(doc = "Paths the image writes to, declared as Volumes."),
    "exposed_ports": attr.string_list(doc = "PORT/tcp entries of ExposedPorts (the base's kept)."),
    "labels": attr.string_dict(doc = "Config labels, added to the base's (omni_image adds the pins' own)."),
    "annotations": attr.string_dict(doc = "Manifest annotations (org.opencontainers.image.*)."),
    "os": attr.string(doc = "For images without a base; with one, only its own (else refused)."),
    "architecture": attr.string(doc = "For images without a base; with one, only its own (else refused)."),
    "variant": attr.string(doc = "Platform variant (e.g. v8 for arm64), for images without a base."),
    "source_date_epoch": attr.string(default = "0", doc = "Timestamp (seconds since the epoch) of every file and of the config: fixed, so builds are bit-identical."),
    "_runner": attr.label(default = "//tools/oci:run", executable = True, cfg = "target"),
}

_OMNI_ATTRS = {
    "pins": attr.label(
        allow_single_file = [".json"],
        mandatory = True,
        doc = "The pin document: labels, /etc/omni/image.json and the provenance.",
    ),
    "release": attr.bool(doc = "Refuse empty pins (set by --config=release); the SBOM lists the vendor base's packages."),
    "checkpoint_lock": attr.label(
        allow_single_file = [".json"],
        doc = "Baked at /etc/omni/checkpoint.lock.json; its sha256 must be the pin's.",
    ),
    "locks": attr.label_list(allow_files = True, doc = "Lock files whose digests the provenance records."),
    "sbom_debian": attr.label_list(allow_files = [".json"], doc = "Debian package lists (SBOM)."),
    "sbom_wheels": attr.label_list(allow_files = [".json"], doc = "wheels.json of the Python layers (SBOM)."),
    "sbom_base_contents": attr.label_list(
        allow_files = [".base-contents.json"],
        doc = "With release: images/IMAGE.base-contents.json, the vendor base's packages tools/pin recorded (at most one).",
    ),
    "debian_lock": attr.label(allow_single_file = True, doc = "Adds download URLs to the SBOM."),
}

_RUN_DOC = """`bazel run` prints its digest and a summary; `-- --push REGISTRY/REPO[:TAG]` pushes it,
`--output DIR` copies the layout, `--archive FILE` writes an OCI archive tarball."""

_OCI_IMAGE_EXAMPLE = """

Example:

    oci_image(
        name = "tool",
        base = ":local_base_amd64",  # or a pinned shallow base: "@my_vendor_base//:base"
        layers = [":app"],
        tars = [":some_tar"],        # a tar another rule made, one more layer
        entrypoint = ["/usr/bin/python3", "/opt/omni/app/tool.py"],
        user = "1000:1000",
    )
"""

oci_image = rule(
    implementation = _oci_image_impl,
    executable = True,
    doc = "Base + layers + config -> an OCI image layout (rules_oci's attribute names). " + _RUN_DOC + _OCI_IMAGE_EXAMPLE,
    toolchains = [TOOLCHAIN_TYPE],
    attrs = _GENERIC_ATTRS,
)

_OMNI_IMAGE_EXAMPLE = """

Example:

    omni_image(
        name = "qwen_mi300x",
        base = select({":release": "@qwen_mi300x_vendor_base//:base", "//conditions:default": ":local_base_amd64"}),
        layers = [":deps_amd64", ":entry_shim", ":app_qwen"],
        pins = "qwen_mi300x.pins.json",  # baked into labels and /etc/omni/image.json
        release = select({":release": True, "//conditions:default": False}),  # empty pins refused
        locks = ["//:requirements.lock"],  # recorded by the provenance
        sbom_wheels = ["@pypi_image_cp311_amd64//:wheels.json"],
    )
    # images/serving_image.bzl's omni_serving_image writes this shape once for both serving images.
"""

omni_image = rule(
    implementation = _oci_image_impl,
    executable = True,
    doc = "An oci_image that carries Omni's evidence: the pin document (labels, /etc/omni/image.json, " +
          "release checks, the runtime contract), its SLSA provenance and its SPDX SBOM. " + _RUN_DOC + _OMNI_IMAGE_EXAMPLE,
    toolchains = [TOOLCHAIN_TYPE],
    attrs = _GENERIC_ATTRS | _OMNI_ATTRS,
)
