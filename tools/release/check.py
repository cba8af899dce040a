"""Whether a registry holds a release whole, and whether the release is the one pinned.

- `missing(route)`: what of the closure the target lacks: every blob (HEAD), every manifest
  by digest, every referrer listed for its subject, every legacy tag and release tag holding
  the closure's digest. Each item is named: a missing bundle by its predicate and subject.
- `unverified(route, key, lock)`: the release's signatures, read from the target, checked
  with the public key by the verifiers users run: tools/oci:verify for an image (for an
  index, its signature), tools/model verify for a model artifact (both manifests), the lock
  bound where pinned.
- `bound_to_pins(...)`: the image bakes exactly the pins document given (`--pins`), so a
  mirror never carries another build under an image's pins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from attest.documents import parse_document
from attest.errors import AttestError
from attest.lock import ARTIFACT_LOCK
from attest.pins import ImagePins
from attest.reader import read_file
from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.image_contract import BAKED_PATH
from omni_oci.format.layout import TITLE
from omni_oci.format.reference import Reference
from omni_oci.model.artifact import MODEL_ARTIFACT, notes_of
from omni_oci.model.layers import FILEPATH
from omni_oci.model.pull import ExpectedLock
from omni_oci.model.verify import verify_artifact
from omni_oci.remote.referrers import referrers
from omni_oci.signing.bundles import PREDICATE_ANNOTATION
from omni_oci.signing.keys import load_public_key
from omni_oci.signing.verify import baked_pins, signatures, verify_image
from tools.release.closure import IMAGE, LEGACY, REFERRER, Closure, Manifest, parts
from tools.release.copy import Route
from tools.release.offline import blob_file
from tools.release.record import RECORD


class BlobReader(Protocol):
    def blob(self, repository: str, digest: str, *, size: int | None = None, max_bytes: int = ...) -> bytes: ...


def describe(item: Manifest) -> str:
    """A manifest as a refusal names it: a bundle by its predicate, a tag by its name."""
    if item.kind == LEGACY:
        return f"legacy tag {item.tag} ({item.digest})"
    if item.kind == IMAGE:
        return f"manifest {item.digest}"
    document = refusing_object(item.data, f"referrer {item.digest}")
    notes = notes_of(document)
    kind = str(document.get("artifactType") or "referrer")
    predicate = notes.get(PREDICATE_ANNOTATION)
    what = f"bundle {item.digest} ({predicate})" if predicate else f"{kind} {item.digest}"
    return f"{what} of {item.subject}"


def missing(route: Route) -> list[str]:
    """Every item of the closure the target lacks, named (the module's contract)."""
    target, repository, closure = route.target, route.repository, route.closure
    where = f"{target.registry}/{repository}"
    found = [
        f"{where}: blob {blob.digest} ({blob.size} bytes) is missing"
        for blob in closure.blobs.values()
        if not target.has_blob(repository, blob.digest)
    ]
    listings: dict[str, set[str]] = {}
    for item in closure.manifests:
        if item.kind == LEGACY:
            held = target.manifest_digest(repository, item.tag)
            if held != item.digest:
                found.append(f"{where}: {describe(item)} {'is missing' if held is None else f'holds {held}'}")
            continue
        if target.manifest_digest(repository, item.digest) is None:
            found.append(f"{where}: {describe(item)} is missing")
        elif item.kind == REFERRER:
            if item.subject not in listings:
                listed, _ = referrers(target, repository, item.subject)
                listings[item.subject] = {str(entry.get("digest")) for entry in listed}
            if item.digest not in listings[item.subject]:
                found.append(f"{where}: {describe(item)} is not listed among the referrers of {item.subject}")
    for tag in route.tags:
        held = target.manifest_digest(repository, tag)
        if held != closure.root:
            found.append(f"{where}:{tag} {'is missing' if held is None else f'holds {held}'}, not {closure.root}")
    return found


def root_kind(closure: Closure) -> str:
    """ "image" (an Omni image: its last layer holds the baked pins), "model" (a model artifact:
    its last layer is the checkpoint lock), "index", or "other"."""
    root = closure.root_manifest
    document, _, is_index = parts(root.data, root.digest, root.media_type)
    if is_index:
        return "index"
    layers = document.get("layers") or []
    last = notes_of(layers[-1]) if layers else {}
    if last.get(TITLE) == BAKED_PATH:
        return "image"
    if last.get(FILEPATH) == ARTIFACT_LOCK:
        return "model"
    return "other"


def unverified(route: Route, key: Path, lock_sha256: str = "") -> list[str]:
    """Each signature check that fails on the target, named; [] when all pass."""
    kind = root_kind(route.closure)
    checks: list[tuple[str, Any]] = []
    if kind == "image":
        checks.append((route.reference, lambda: verify_image(route.reference, key, client=route.target)))
    elif kind == "model":
        expected = ExpectedLock(lock_sha256) if lock_sha256 else None
        modelpack = [
            item.digest
            for item in route.closure.manifests
            if item.kind == REFERRER
            and item.subject == route.closure.root
            and refusing_object(item.data, item.digest).get("artifactType") == MODEL_ARTIFACT
        ]
        for digest in [route.closure.root, *modelpack]:
            reference = f"{route.target.registry}/{route.repository}@{digest}"
            checks.append((reference, lambda r=reference: verify_artifact(r, key, expected, client=route.target)))
    elif kind == "index":
        # An index is signed as one digest (tools/oci/push of a multi-platform image): its signature.
        index = Reference.parse(route.reference)
        checks.append((route.reference, lambda: signatures(route.target, index, load_public_key(key))))
    else:
        return [
            f"{route.reference}: its root is neither an Omni image, an index nor a model artifact: --key cannot verify it"
        ]
    failed = []
    for checked, check in checks:
        try:
            check()
        except AttestError as exc:
            failed.append(f"{checked}: {exc}")
    return failed


def _difference(baked: Any, pinned: Any, path: str = "") -> str:
    """The first dotted path where two pin documents differ."""
    if isinstance(baked, dict) and isinstance(pinned, dict):
        for name in sorted(set(baked) | set(pinned)):
            found = _difference(baked.get(name), pinned.get(name), f"{path}.{name}" if path else name)
            if found:
                return found
        return ""
    return "" if baked == pinned else f"{path} is {baked!r} in the image, {pinned!r} in the file"


def bound_to_pins(reader: BlobReader, repository: str, closure: Closure, pins: ImagePins, pins_path: Path) -> None:
    """Every image manifest the root reaches bakes exactly `pins` (the module's contract)."""
    images = [item for item in closure.manifests if item.kind == IMAGE]
    checked = 0
    for item in images:
        document, _, is_index = parts(item.data, item.digest, item.media_type)
        if is_index:
            continue
        try:
            baked, _ = baked_pins(reader, repository, document)
            typed = parse_document(ImagePins, baked.get("pins"), label=f"{BAKED_PATH} of {item.digest}")
        except AttestError as exc:
            raise OciError(f"--pins {pins_path}: image {item.digest}: {exc}", field="--pins") from None
        if typed != pins:
            raise OciError(
                f"--pins {pins_path}: image {item.digest} was built from other pins: "
                f"{_difference(typed.model_dump(mode='json'), pins.model_dump(mode='json'))}",
                field="--pins",
            )
        checked += 1
    if not checked:
        raise OciError(f"--pins {pins_path}: {closure.root} holds no image that bakes pins", field="--pins")


class DirectoryBlobs:
    """An offline mirror's blobs read as a registry client reads small blobs: bounded, by digest."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def blob(self, repository: str, digest: str, *, size: int | None = None, max_bytes: int = 16 << 20) -> bytes:
        if size is not None and size > max_bytes:
            raise OciError(f"blob {digest} declares {size} bytes; at most {max_bytes} are read", field=digest)
        try:
            read = read_file(
                blob_file(self.directory, digest), label=f"blob {digest}", max_bytes=max_bytes, follow_symlinks=False
            )
        except AttestError as exc:
            raise OciError(f"{RECORD} directory: {exc}", field=digest) from None
        if "sha256:" + read.sha256 != digest or (size is not None and len(read.data) != size):
            raise OciError(f"{self.directory}: blob {digest} is corrupt", field=digest)
        return read.data
