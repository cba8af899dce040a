"""tools/pin: fills an image's pin document from the registry and the hub, and checks it.
Imports attest, boot.hub and tools.oci; nothing imports it but its own command and tests."""
