"""The pinned Debian base: resolving the package lock and assembling the root filesystem layer.
Build actions run it: it must not import `attest`, `launcher`, `boot` or `tests`."""
