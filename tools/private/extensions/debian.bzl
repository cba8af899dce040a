"""Module extension: the locked Debian packages of the runtime base, fetched by sha256.

    debian = use_extension("//tools:extensions.bzl", "debian")
    debian.lock(name = "debian_bookworm", lock = "//images:debian.lock.json")

Each .deb is downloaded with repository_ctx.download(sha256=...): bytes that do not match
the lock are refused by Bazel, and later fetches come from the repository cache.
`@debian_bookworm//:debs_amd64` and `:debs_arm64` hold them.
"""

def _debian_repo_impl(rctx):
    lock = json.decode(rctx.read(rctx.path(rctx.attr.lock)))
    groups = []
    for arch, packages in sorted(lock["packages"].items()):
        files = []
        for package in packages:
            output = "debs/{}/{}_{}.deb".format(arch, package["name"], package["architecture"])
            rctx.download(url = package["urls"], output = output, sha256 = package["sha256"])
            files.append(output)
        groups.append('filegroup(\n    name = "debs_{}",\n    srcs = {},\n)\n'.format(arch, json.encode(files)))
    rctx.file("BUILD.bazel", "# Generated from {}. Do not edit.\n".format(rctx.attr.lock.name) +
                             'package(default_visibility = ["//visibility:public"])\n\n' + "\n".join(groups))

debian_repo = repository_rule(
    implementation = _debian_repo_impl,
    attrs = {"lock": attr.label(mandatory = True, allow_single_file = True)},
)

_lock = tag_class(attrs = {
    "name": attr.string(mandatory = True),
    "lock": attr.label(mandatory = True),
})

def _debian_impl(module_ctx):
    for mod in module_ctx.modules:
        for tag in mod.tags.lock:
            debian_repo(name = tag.name, lock = tag.lock)

debian = module_extension(implementation = _debian_impl, tag_classes = {"lock": _lock})
