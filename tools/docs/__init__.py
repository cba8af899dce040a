"""Generators of the documentation's reference sections (docs/images.md: the public rules).
Standard library only: it reads .bzl files as text."""
