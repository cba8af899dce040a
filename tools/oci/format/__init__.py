"""The OCI formats every floor of tools/oci shares: errors, the image layout, references, the tar
reader and its members; standard library only (attest for the one error base and JSON reader).
"""
