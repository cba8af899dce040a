"""Tests of tools/model: the artifact's bytes and documents, and its way through a registry."""
