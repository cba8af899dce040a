"""Signatures: keys, cosign's legacy signature tags and Sigstore bundles over a registry, and
which of them verifies an image; above `format` and `remote`.
"""

# The package's face: its modules, each imported by name (nothing is imported here, so a
# program pays only for the modules it uses).
__all__ = ["bundles", "dsse", "keys", "legacy", "verify"]
