"""Omni's OCI and model-artifact library, by floor: `format/` (errors, layouts, references, tar,
statements), `remote/` (the registry verbs and their session), `signing/` (keys, DSSE, cosign's
legacy tags, Sigstore bundles), `model/` (a checkpoint as a signed OCI artifact).

No `main()`, no argparse, no environment reads: the programs under `tools/` parse flags and
variables and call one function here; the runtime (`boot`) calls the same functions.
Named `omni_oci`, not `oci`: `oci` is the import name of Oracle's Cloud SDK on PyPI, and an
`omni` namespace would meet NVIDIA Omniverse's `omni.*` packages.
"""

__all__ = ["format", "model", "remote", "signing"]
