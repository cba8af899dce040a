"""The providers of Omni's OCI rules: one each, documented."""

OciLayerInfo = provider(
    doc = "A deterministic layer (tar.gz, or a plain tar with compression = \"none\").",
    fields = {"blob": "the layer File", "descriptor": "JSON File: mediaType, digest, size, diff_id"},
)

OciImageInfo = provider(
    doc = "An OCI image layout directory (complete, or shallow on a remote base).",
    fields = {"layout": "directory File", "digest": "File holding the manifest digest"},
)

OciBaseInfo = provider(
    doc = "A shallow base: the pinned manifest and config only.",
    fields = {"dir_marker": "manifest.json File; its directory holds config.json and base.json"},
)
