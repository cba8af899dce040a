"""A remote image's files read from its layers as they stream, nothing unpacked: each layer
decompressed piece by piece (stream), applied as a runtime applies it (overlay), the wanted
members kept (files).
"""

# The package's face: its modules, each imported by name.
__all__ = ["files", "overlay", "stream"]
