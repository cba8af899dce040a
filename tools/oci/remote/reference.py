"""Image references, REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], as every Omni command parses them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.oci.errors import OciError

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
DOCKER_HUB = "registry-1.docker.io"


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str, *, require_digest: bool = False) -> Reference:
        rest, _, digest = text.partition("@")
        if digest and not DIGEST_RE.fullmatch(digest):
            raise OciError(f"{text}: digest must be sha256:<64 hex>", field="digest")
        first, slash, remainder = rest.partition("/")
        if not slash or not ("." in first or ":" in first or first == "localhost"):
            registry, path = "docker.io", rest
        else:
            registry, path = first, remainder
        name, colon, tag = path.rpartition(":")
        if not colon or "/" in tag:
            name, tag = path, ""
        if registry in ("docker.io", "index.docker.io"):
            registry = DOCKER_HUB
            if "/" not in name:
                name = "library/" + name
        if not name or name != name.lower():
            raise OciError(f"{text}: repository name must be lower case and non-empty", field="reference")
        if require_digest and not digest:
            raise OciError(f"{text} is not pinned: a base must be referenced by @sha256:<digest>", field="digest")
        return cls(registry, name, tag, digest)

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tag}{digest}"
