"""The programs Bazel's OCI actions run: deterministic layers, image and index assembly, SBOM,
provenance and load tarballs; standard library and the locked zstandard (attest only for pins).
Actions never reach a network: no HTTP client, no registry.
"""
