"""The Bazel rules' Python tools and the product's programs: tools/oci (image bytes, registry,
push, sign, verify), tools/pin, tools/deploy, tools/gate, tools/debian, tools/docs and their
settings; tools/dev holds what only development uses (docs/development.md has the map).
"""
