"""The compressions a layer blob may carry, told by their first bytes (RFC 1952 for gzip, RFC 8878
for zstd): the build's tar input and the registry's layer stream read them here."""

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
