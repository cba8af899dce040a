"""tools/pin: fills an image's pin document from the registry and the hub, and checks it.
The hub through boot's checkpoint API, the registry through tools.oci."""
