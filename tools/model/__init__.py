"""`tools/model`: the command over omni_oci.model (pack, push, pull, verify, sign)."""
