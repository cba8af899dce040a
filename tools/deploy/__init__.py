"""Kubernetes manifests generated from an Omni image's own contract and pins (`bazel run //deploy:<image>`).
A host tool: it reads attest, boot and launcher settings and tools.oci, and must not import an engine (`vllm`, `sglang`) or `tests`."""
