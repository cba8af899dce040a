"""Kubernetes manifests generated from an Omni image's own contract and pins (`bazel run //deploy:<image>`).
A host tool: it may import attest, boot and launcher settings and tools.oci, never an engine."""
