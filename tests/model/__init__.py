"""Tests of tools/model: the artifact's bytes and documents, and its way through a registry.
They must not import `launcher` or `boot` (the artifact tools stand alone)."""
