"""oci_layer: files, the transitive files of Python targets and the members of tars -> one
deterministic layer (the byte work: //tools/oci/build:layer)."""

load(":providers.bzl", "OciLayerInfo")
load(":runnable.bzl", "WORKER", "worker_args")
load(":toolchain.bzl", "TOOLCHAIN_TYPE", "oci_tools")

def _dest_path(f, strip_prefix):
    path = f.short_path
    if path.startswith("../"):
        path = path.split("/", 2)[2]  # ../<repo>/<path> -> <path>
    if strip_prefix:
        if not path.startswith(strip_prefix + "/"):
            return None
        path = path[len(strip_prefix) + 1:]
    return path

def _oci_layer_impl(ctx):
    transitive = []
    for src in ctx.attr.srcs:
        transitive.append(src[DefaultInfo].files)
        transitive.append(src[DefaultInfo].default_runfiles.files)
    entries = []
    for f in depset(transitive = transitive).to_list():
        is_external = f.owner != None and f.owner.workspace_name != ""
        if (ctx.attr.include == "main" and is_external) or (ctx.attr.include == "external" and not is_external):
            continue
        if f.extension in ("pyc",) or f.basename in ctx.attr.exclude_basenames:
            continue
        dest = _dest_path(f, ctx.attr.strip_prefix)
        if dest == None:
            continue
        entries.append({"src": f.path, "dest": ctx.attr.prefix.rstrip("/") + "/" + dest})
    for path, mode in ctx.attr.directories.items():
        entries.append({"dest": path, "type": "dir", "mode": int(mode, 8)})
    for f, dest in ctx.attr.files.items():
        for file in f.files.to_list():
            entries.append({"src": file.path, "dest": dest})
    tars = [{"src": f.path, "prefix": ctx.attr.prefix} for f in ctx.files.tars]
    spec = ctx.actions.declare_file(ctx.label.name + ".spec.json")
    ctx.actions.write(spec, json.encode({"entries": entries, "tars": tars, "compression": ctx.attr.compression}))
    blob = ctx.actions.declare_file(ctx.label.name + {"gzip": ".tar.gz", "zstd": ".tar.zst"}.get(ctx.attr.compression, ".tar"))
    descriptor = ctx.actions.declare_file(ctx.label.name + ".layer.json")
    inputs = depset([spec] + ctx.files.tars, transitive = transitive + [f.files for f in ctx.attr.files])
    ctx.actions.run(
        executable = oci_tools(ctx).layer,
        arguments = [worker_args(ctx, ["--spec", spec.path, "--output", blob.path, "--descriptor", descriptor.path])],
        execution_requirements = WORKER,
        inputs = inputs,
        outputs = [blob, descriptor],
        mnemonic = "OciLayer",
        progress_message = "Building layer %{label}",
        env = {"SOURCE_DATE_EPOCH": ctx.attr.source_date_epoch},
    )
    return [
        DefaultInfo(files = depset([blob, descriptor])),
        OciLayerInfo(blob = blob, descriptor = descriptor),
    ]

_OCI_LAYER_EXAMPLE = """

Example:

    oci_layer(
        name = "app",
        srcs = ["//launcher:lib"],  # the files of a py_library and its runfiles
        include = "main",           # only this repository's files (deps go in their own layer)
        prefix = "/opt/omni/app",
    )
"""

oci_layer = rule(
    implementation = _oci_layer_impl,
    doc = "Files, the transitive files of Python targets and the members of tars -> one deterministic layer." + _OCI_LAYER_EXAMPLE,
    toolchains = [TOOLCHAIN_TYPE],
    attrs = {
        "srcs": attr.label_list(doc = "Targets whose files (and runfiles) go in the layer."),
        "tars": attr.label_list(
            allow_files = [".tar", ".tar.gz", ".tgz", ".tar.zst"],
            doc = "Tar files other rules made; their members land under prefix, normalised.",
        ),
        "compression": attr.string(
            default = "gzip",
            values = ["gzip", "zstd", "none"],
            doc = "zstd: smaller and faster to unpack (level 3, one thread); none: a plain tar " +
                  "(digest = diff_id), for huge layers gzip barely shrinks.",
        ),
        "prefix": attr.string(default = "/", doc = "Directory in the image the files land under."),
        "strip_prefix": attr.string(doc = "Path prefix (within the source repository) to drop; others skipped."),
        "include": attr.string(
            default = "all",
            values = ["all", "main", "external"],
            doc = "main: this repository's files only; external: other repositories' only.",
        ),
        "exclude_basenames": attr.string_list(doc = "File names never placed in the layer."),
        "directories": attr.string_dict(doc = "Extra empty directories: path -> octal mode."),
        "files": attr.label_keyed_string_dict(allow_files = True, doc = "Single files: label -> destination."),
        "source_date_epoch": attr.string(default = "0", doc = "Timestamp (seconds since the epoch) of every file and of the config: fixed, so builds are bit-identical."),
    },
)
