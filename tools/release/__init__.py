"""Releases as a whole: mirror a release's closure between registries and across air gaps."""
