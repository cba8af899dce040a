"""Omni's OCI byte work, by role: `build/` holds the programs Bazel's actions run (layers, image
and index assembly, SBOM, provenance, load tarballs), `remote/` the registry stack (authentication,
transport with one deadline per answer, shallow bases, layer streaming and overlay), and this
folder the commands (push, sign, bundles, verify, run_image, build_diff, push_record) plus the formats both
halves share (errors, layout, reference, tar_reader, tar_members: standard library only).
It must not import `launcher`, `boot` or `tests`. Neither half imports the other.
"""
