"""The programs Bazel's OCI actions run: deterministic layers, image and index assembly, SBOM,
provenance and load tarballs; standard library and the locked zstandard (attest only for pins).
Actions never reach a network: it must not import `httpx`, `httpcore`, `tools.oci.remote` or the commands (`tools.oci.push`, `tools.oci.run_image`, `tools.oci.signing`, `tools.oci.verify`).
"""
