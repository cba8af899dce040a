"""debian_base_layer: locked Debian packages -> one layer (the byte work: //tools/debian:rootfs)."""

load(":providers.bzl", "OciLayerInfo")
load(":toolchain.bzl", "TOOLCHAIN_TYPE", "oci_tools")

def _debian_base_layer_impl(ctx):
    blob = ctx.actions.declare_file(ctx.label.name + ".tar.gz")
    descriptor = ctx.actions.declare_file(ctx.label.name + ".layer.json")
    packages = ctx.actions.declare_file(ctx.label.name + ".packages.json")
    debs = ctx.files.debs
    if (ctx.file.passwd == None) != (ctx.file.group == None):
        fail("{}: passwd and group go together (a base), or neither (an add-on layer)".format(ctx.label))
    ctx.actions.run(
        executable = oci_tools(ctx).rootfs,
        arguments = [
            "--lock",
            ctx.file.lock.path,
            "--arch",
            ctx.attr.arch,
            "--debs",
            debs[0].dirname,
            "--output",
            blob.path,
            "--descriptor",
            descriptor.path,
            "--packages",
            packages.path,
        ] + (["--passwd", ctx.file.passwd.path, "--group", ctx.file.group.path] if ctx.file.passwd else []),
        inputs = debs + [ctx.file.lock] + ([ctx.file.passwd, ctx.file.group] if ctx.file.passwd else []),
        outputs = [blob, descriptor, packages],
        mnemonic = "DebianBase",
        progress_message = "Assembling the Debian base layer %{label}",
        env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
    )
    return [
        DefaultInfo(files = depset([blob, descriptor, packages])),
        OciLayerInfo(blob = blob, descriptor = descriptor),
        OutputGroupInfo(packages = depset([packages])),
    ]

_DEBIAN_BASE_LAYER_EXAMPLE = """

Example:

    debian_base_layer(
        name = "debian_rootfs_amd64",
        arch = "amd64",
        debs = "@debian_bookworm//:debs_amd64",
        lock = "debian.lock.json",
        passwd = "local_base/passwd",
        group = "local_base/group",
    )
"""

debian_base_layer = rule(
    implementation = _debian_base_layer_impl,
    doc = "The locked Debian packages of one architecture, merged in lock order into one layer: a base " +
          "(with passwd and group), or an add-on over one (neither; its lock made with --over)." + _DEBIAN_BASE_LAYER_EXAMPLE,
    toolchains = [TOOLCHAIN_TYPE],
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True, doc = "The package lock (images/debian.lock.json): names, versions and sha256 in install order."),
        "arch": attr.string(mandatory = True, values = ["amd64", "arm64"], doc = "Which architecture's lock entries to merge."),
        "debs": attr.label(mandatory = True, doc = "The architecture's .deb files (one directory)."),
        "passwd": attr.label(allow_single_file = True, doc = "/etc/passwd of the base (the non-root omni user, uid 1000)."),
        "group": attr.label(allow_single_file = True, doc = "/etc/group of the base (omni, video 44, render 110)."),
        "source_date_epoch": attr.string(default = "0", doc = "Timestamp (seconds since the epoch) of every file and of the config: fixed, so builds are bit-identical."),
    },
)
