"""The tests of `tools.deploy`: generated manifests checked by Kubernetes' schemas and a 3-rank rehearsal."""
