"""The rules behind the vendor-base repositories (tools/private/extensions/bases.bzl): a shallow pinned base,
or one that could not be fetched."""

load(":providers.bzl", "OciBaseInfo")

def _oci_shallow_base_impl(ctx):
    return [DefaultInfo(files = depset(ctx.files.srcs)), OciBaseInfo(dir_marker = ctx.file.manifest)]

oci_shallow_base = rule(
    implementation = _oci_shallow_base_impl,
    attrs = {
        "manifest": attr.label(allow_single_file = True, mandatory = True),
        "srcs": attr.label_list(allow_files = True),
    },
)

def _oci_unavailable_base_impl(ctx):
    fail(ctx.attr.message)

oci_unavailable_base = rule(
    implementation = _oci_unavailable_base_impl,
    doc = "A base that could not be fetched: any build that needs it fails with `message`.",
    attrs = {"message": attr.string(mandatory = True)},
    provides = [OciBaseInfo],
)
