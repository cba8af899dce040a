"""Module extension: pinned vendor bases, fetched SHALLOW from the image's pin document.

    oci_bases = use_extension("//tools:extensions.bzl", "oci_bases")
    oci_bases.from_pins(name = "qwen_mi300x_vendor_base", pins = "//images:qwen_mi300x.pins.json")

The pin document is the one source of the base's reference, digest and platform. Only
the manifest and config are fetched (both digests verified); the layers stay in the
registry. A base that is not pinned, or cannot be reached, becomes a target that fails
with a message saying which pin to fill or how to mirror the base; nothing else fails.
Set OMNI_BASE_MIRROR=REGISTRY (e.g. `--repo_env=OMNI_BASE_MIRROR=127.0.0.1:5000`) to fetch
the same digests from a mirror.
"""

def _unavailable(rctx, message):
    rctx.file("BUILD.bazel", """load("@@//tools/private:shallow_base.bzl", "oci_unavailable_base")

oci_unavailable_base(
    name = "base",
    message = {message},
    visibility = ["//visibility:public"],
)
""".format(message = json.encode(message)))

def _vendor_base_impl(rctx):
    pins_path = rctx.path(rctx.attr.pins)
    pins = json.decode(rctx.read(pins_path))
    base = pins.get("base", {})
    pins_file = "{}/{}".format(rctx.attr.pins.package, rctx.attr.pins.name)
    where = "{} (base.image / base.digest / base.platform)".format(pins_file)
    image, digest, platform = base.get("image", ""), base.get("digest", ""), base.get("platform", "")
    if not image or not platform:
        _unavailable(rctx, "release base not declared: fill base.image and base.platform in " + where)
        return
    if not digest:
        _unavailable(rctx, ("release base {} is not pinned: base.digest in {} is empty. Fill it with the " +
                            "image's manifest (or index) digest, e.g. from `crane digest {}:<tag>`; Omni never " +
                            "guesses a digest.").format(image, pins_file, image))
        return
    python = rctx.read(rctx.path(Label("@pypi//:python.txt"))).strip()
    root = rctx.path(Label("//:MODULE.bazel")).dirname
    site = rctx.path(Label("@pypi//:python.txt")).dirname.get_child("site")
    mirror = rctx.os.environ.get("OMNI_BASE_MIRROR", "")
    result = rctx.execute(
        [
            python,
            "-m",
            "tools.oci.base",
            "--image",
            image,
            "--digest",
            digest,
            "--platform",
            platform,
            "--output",
            "shallow",
        ] + (["--registry", mirror] if mirror else []),
        environment = {"PYTHONPATH": "{}:{}".format(root, site)},
        timeout = 180,
        quiet = True,
    )
    if result.return_code != 0:
        _unavailable(rctx, ("release base {}@{} could not be fetched: {} To build offline, mirror it " +
                            "(`crane copy {}@{} MIRROR/REPO@{}`, or skopeo copy) and build with " +
                            "--repo_env=OMNI_BASE_MIRROR=MIRROR.").format(
            image,
            digest,
            result.stderr.strip(),
            image,
            digest,
            digest,
        ))
        return
    rctx.file("BUILD.bazel", """load("@@//tools/private:shallow_base.bzl", "oci_shallow_base")

oci_shallow_base(
    name = "base",
    manifest = "shallow/manifest.json",
    srcs = ["shallow/manifest.json", "shallow/config.json", "shallow/base.json"],
    visibility = ["//visibility:public"],
)
""")

vendor_base = repository_rule(
    implementation = _vendor_base_impl,
    attrs = {"pins": attr.label(mandatory = True, allow_single_file = True)},
    environ = ["OMNI_BASE_MIRROR"],
)

_from_pins = tag_class(attrs = {
    "name": attr.string(mandatory = True),
    "pins": attr.label(mandatory = True, doc = "The image's pin document (images/<image>.pins.json)."),
})

def _oci_bases_impl(module_ctx):
    for mod in module_ctx.modules:
        for tag in mod.tags.from_pins:
            vendor_base(name = tag.name, pins = tag.pins)

oci_bases = module_extension(
    implementation = _oci_bases_impl,
    tag_classes = {"from_pins": _from_pins},
)
