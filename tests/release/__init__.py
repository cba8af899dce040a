"""Tests of tools/release: a release mirrored whole between registries and across an air gap."""
