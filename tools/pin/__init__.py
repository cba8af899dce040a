"""tools/pin: fills an image's pin document from the registry and the hub, and checks it.
Imports attest, boot.hub, tools.oci and tools.model; it must not import `launcher`, `tests` or an engine (`vllm`, `sglang`)."""
