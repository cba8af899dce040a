"""Omni's module extensions, for MODULE.bazel.

    pypi = use_extension("//tools:extensions.bzl", "pypi")
    pypi.lock(name = "pypi", lock = "//:requirements.lock")

    oci_bases = use_extension("//tools:extensions.bzl", "oci_bases")
    oci_bases.from_pins(name = "qwen_mi300x_vendor_base", pins = "//images:qwen_mi300x.pins.json")

    debian = use_extension("//tools:extensions.bzl", "debian")
    debian.lock(name = "debian_bookworm", lock = "//images:debian.lock.json")

- `pypi`: the hashed Python lock as `@pypi//:<distribution>` libraries and the Python toolchain;
  `pypi.image_site` / `pypi.site`: a lock's wheels unpacked for an image's CPython and platform.
- `oci_bases`: each pinned vendor base, fetched shallow (manifest and config) from its pin document.
- `debian`: the locked Debian packages of the local base, each fetched by sha256.

The implementations live in `//tools/private/extensions`; this file is the stable address.
"""

load("//tools/private/extensions:bases.bzl", _oci_bases = "oci_bases")
load("//tools/private/extensions:debian.bzl", _debian = "debian")
load("//tools/private/extensions:pypi.bzl", _pypi = "pypi")

oci_bases = _oci_bases
debian = _debian
pypi = _pypi
