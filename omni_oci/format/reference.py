"""Image references, REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], as every Omni command parses them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from omni_oci.format.errors import OciError

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
DOCKER_HUB = "registry-1.docker.io"


# The distribution reference grammar (distribution/reference, regexp.go), ASCII only.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])"
DOMAIN_RE = re.compile(rf"^{_HOST}(?::(?P<port>[0-9]+))?$")
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
PATH_RE = re.compile(rf"^{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
MAX_NAME_LENGTH = 255


def _refuse(text: str, what: str, field: str = "reference") -> OciError:
    return OciError(f"{text!r}: {what} (expected REGISTRY[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST])", field=field)


def _split_domain(text: str, rest: str) -> tuple[str, str]:
    """(registry, path): the first component is a registry when it has a dot or a port, or is localhost."""
    first, slash, remainder = rest.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        return "docker.io", rest
    found = DOMAIN_RE.fullmatch(first)
    if not found:
        raise _refuse(text, f"the registry {first!r} is not a host name, IPv4 or [IPv6] address")
    if found["port"] is not None and not 1 <= int(found["port"]) <= 65535:
        raise _refuse(text, f"the registry port {found['port']} is outside 1..65535")
    return first, remainder


# Where the distribution spec's API puts a repository's objects (distribution-spec, "Endpoints").
API_KINDS = ("manifests", "blobs", "blobs/uploads", "referrers", "tags")
# A tag of this shape is not a release's own: it is computed from a digest (the referrers API's
# fallback tag `sha256-<hex>`, cosign's legacy `sha256-<hex>.sig/.att/.sbom`) and never taken from
# a document.
COMPUTED_TAG_RE = re.compile(r"^sha256-[0-9a-f]{64}(?:\.[a-z]+)?$")


def api_path(repository: str, kind: str, reference: str = "") -> str:
    """`/v2/<repository>/<kind>/<reference>`, the one place a registry URL's path is built: the
    repository must be the grammar's path components (no dot segment, no percent sign), the
    reference a tag or a sha256 digest (or empty, for an upload), so no name read from a document
    can climb into another repository of the registry once the URL is normalised."""
    if not PATH_RE.fullmatch(repository) or len(repository) > MAX_NAME_LENGTH:
        raise OciError(f"repository {repository!r} is not '/'-separated lower-case components", field="repository")
    if kind not in API_KINDS:
        raise OciError(f"{kind!r} is not a registry API path ({', '.join(API_KINDS)})", field="reference")
    if reference and not (TAG_RE.fullmatch(reference) or DIGEST_RE.fullmatch(reference)):
        raise OciError(
            f"{reference!r} is neither a tag (1-128 letters, digits, '_', '.' or '-', not starting with '.' "
            "or '-') nor a sha256 digest",
            field="reference",
        )
    return f"/v2/{repository}/{kind}/{reference}"


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str, *, require_digest: bool = False) -> Reference:
        """`text` as the distribution reference grammar reads it (host, port, lower-case path
        components, tag, sha256 digest); anything else is refused, naming the part."""
        if not text.isascii() or not text.isprintable() or " " in text:
            raise _refuse(text, "it holds a space, a control character or a non-ASCII character")
        rest, _, digest = text.partition("@")
        if digest and not DIGEST_RE.fullmatch(digest):
            raise _refuse(text, "the digest must be sha256:<64 lower-case hex>", "digest")
        registry, path = _split_domain(text, rest)
        name, colon, tag = path.rpartition(":")
        if not colon or "/" in tag:
            name, tag = path, ""
        if tag and not TAG_RE.fullmatch(tag):
            raise _refuse(text, f"the tag {tag!r} is not 1-128 letters, digits, '_', '.' or '-'")
        if not name or name != name.lower():
            raise _refuse(text, "the repository name must be lower case and non-empty")
        if not PATH_RE.fullmatch(name):
            raise _refuse(text, f"the repository {name!r} is not '/'-separated lower-case components")
        if len(f"{registry}/{name}") > MAX_NAME_LENGTH:
            raise _refuse(text, f"the name is longer than {MAX_NAME_LENGTH} characters")
        if registry in ("docker.io", "index.docker.io"):
            registry = DOCKER_HUB
            if "/" not in name:
                name = "library/" + name
        if require_digest and not digest:
            raise OciError(f"{text} is not pinned: a base must be referenced by @sha256:<digest>", field="digest")
        return cls(registry, name, tag, digest)

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tag}{digest}"
