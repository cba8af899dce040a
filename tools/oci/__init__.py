"""The byte work behind Omni's OCI rules: deterministic layers, image assembly on shallow
bases, and a registry client (push, pull, mount, stream) built on httpx."""
