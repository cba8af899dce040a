"""The byte work behind Omni's OCI rules: deterministic layers, image assembly on shallow
bases, and a registry client (push, pull, mount, stream) built on httpx.
It must not import `launcher`, `boot` or `tests`; build-action modules (layer, tar_input) import the standard library only."""
