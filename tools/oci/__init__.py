"""Omni's OCI byte work, by floor, each its own Bazel package: `format/` (errors, layout,
reference, tar reader and members: shared by all), `build/` (the programs Bazel's actions run),
`remote/` (the registry stack), `signing/` (keys, legacy tags, bundles), and here the commands
(push, verify, run_image, build_diff, push_record) on top of them all.
Neither `build` nor `remote` imports the other (docs/development.md#floors).
"""
