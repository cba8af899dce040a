"""Signatures: keys, cosign's legacy signature tags and Sigstore bundles over a registry, and
which of them verifies an image; above `format`, `build` (the provenance it signs) and `remote`.
It must not import the commands (`tools.oci.push`, `tools.oci.run_image`, `tools.oci.verify`), `launcher` or `boot`.
"""
