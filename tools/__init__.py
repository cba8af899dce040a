"""The Bazel rules' Python tools (image byte work, registry, pins, gate, deploy, docs) and their settings.
The package's own modules (settings) must not import `launcher`, `boot` or `tests`."""
