"""runfiles_listing: the files each target runs with (its outputs and runfiles), one path a line:
what Bazel puts in an action that runs the target as a tool, so what that action's key covers."""

def _runfiles_listing_impl(ctx):
    files = depset(transitive = [
        depset(transitive = [target[DefaultInfo].files, target[DefaultInfo].default_runfiles.files])
        for target in ctx.attr.targets
    ])
    listing = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(listing, "\n".join(sorted([f.short_path for f in files.to_list()])) + "\n")
    return [DefaultInfo(files = depset([listing]))]

runfiles_listing = rule(
    implementation = _runfiles_listing_impl,
    doc = """The files `targets` run with, as one sorted listing.

Example:

    runfiles_listing(
        name = "build_tools_files",
        targets = ["//tools/oci/build:image"],
    )
""",
    attrs = {"targets": attr.label_list(cfg = "exec", doc = "The programs whose files are listed.")},
)
