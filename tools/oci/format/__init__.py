"""The OCI formats every floor of tools/oci shares: errors, the image layout, references, the tar
reader and its members; standard library only (attest for the one error base and JSON reader).
It must not import `httpx`, `httpcore`, `tools.oci.build`, `tools.oci.remote`, `tools.oci.signing` or the commands (`tools.oci.push`, `tools.oci.run_image`, `tools.oci.verify`).
"""
