"""The pinned Debian base: resolving the package lock and assembling the root filesystem layer.
Set-up and build actions run it."""
