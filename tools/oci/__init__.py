"""The OCI commands (push, verify, run_image, build_diff, push_record) and, in `build/`, the
programs Bazel's actions run; both over the library in omni_oci/ (docs/development.md#floors).
"""
