"""The toolchain behind the OCI rules: the programs their build actions run.

Rules reach the tools through `//tools/oci:toolchain_type` instead of private attributes, so
a user can register other builds of them (a compiled layer tool, a remote-execution image)
without touching the rules. `//tools/oci:default_toolchain` is Omni's Python tools.
"""

OciToolsInfo = provider(
    doc = "The executables of the OCI build actions (each a FilesToRunProvider, built for the exec platform).",
    fields = {
        "layer": "files + tars -> one layer (//tools/oci/build:layer)",
        "image": "base + layers + config -> an image layout (//tools/oci/build:image)",
        "index": "image layouts -> an image index layout (//tools/oci/build:index)",
        "loader": "an image layout -> a docker-archive or OCI archive (//tools/oci/build:load)",
        "provenance": "an image -> its SLSA provenance (//tools/oci/build:provenance)",
        "sbom": "an image's package lists -> its SPDX SBOM (//tools/oci/build:sbom)",
        "rootfs": "locked .debs -> one Debian layer (//tools/debian:rootfs)",
    },
)

_TOOLS = ["layer", "image", "index", "loader", "provenance", "sbom", "rootfs"]

def _oci_toolchain_impl(ctx):
    tools = {name: getattr(ctx.attr, name)[DefaultInfo].files_to_run for name in _TOOLS}
    return [platform_common.ToolchainInfo(oci_tools = OciToolsInfo(**tools))]

oci_toolchain = rule(
    implementation = _oci_toolchain_impl,
    doc = "Binds the OCI build tools for `//tools/oci:toolchain_type`.",
    attrs = {name: attr.label(mandatory = True, executable = True, cfg = "exec") for name in _TOOLS},
)

TOOLCHAIN_TYPE = "//tools/oci:toolchain_type"

def oci_tools(ctx):
    """The tools of the resolved toolchain (for rules declaring `toolchains = [TOOLCHAIN_TYPE]`)."""
    return ctx.toolchains[TOOLCHAIN_TYPE].oci_tools
