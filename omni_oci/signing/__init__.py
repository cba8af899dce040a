"""Signatures: keys, cosign's legacy signature tags and Sigstore bundles over a registry, and
which of them verifies an image; above `format` and `remote`.
"""
