"""What upstream says now for each pin of an image: the base's manifest digest for its tag, the
engine's identity inside that base, and the hub's revision (and checkpoint lock) for each ref.

Every value is computed here from bytes checked against something local (a digest computed
from the manifest bytes received, layers hashed against their descriptors, the hub's listing
at the commit it names); none is copied from what a peer claims about itself.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass
from typing import Any

from attest.engine import ABBREVIATED, FULL, InstalledDistribution
from attest.errors import AttestError
from attest.lock import REVIEWED, CheckpointLock
from attest.pins import ImagePins, ModelPin
from boot.checkpoint import fetch_model_info, lock_from_listing
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from omni_oci.remote.layers.files import read_layer_files
from omni_oci.remote.registry import RegistryClient, client_for
from omni_oci.remote.shallow_base import resolve_image
from tools.pin.base_contents import base_contents, contents_bytes, noted, wanted_contents
from tools.pin.engine_files import engine_identity, wanted_files

DEFAULT_MODEL_REF = "main"
HUB_STALL_S = 120.0
MAX_ENGINE_FILE_BYTES = 32 * 1024 * 1024  # attest.engine's RECORD cap
# The engine's metadata and the base's package records, all layers together: a large vendor
# base's RECORDs, dpkg database and copyright files are tens of MB.
MAX_BASE_FILES_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class BaseUpstream:
    tag: str
    digest: str
    engine: InstalledDistribution
    # images/IMAGE.base-contents.json as tools/pin writes it (b"": not read).
    contents: bytes = b""

    @property
    def contents_sha256(self) -> str:
        return hashlib.sha256(self.contents).hexdigest() if self.contents else ""


@dataclass(frozen=True)
class ModelUpstream:
    ref: str
    revision: str
    lock: CheckpointLock | None = None
    lock_bytes: bytes = b""

    @property
    def lock_sha256(self) -> str:
        return hashlib.sha256(self.lock_bytes).hexdigest() if self.lock_bytes else ""


@dataclass
class Upstream:
    base: BaseUpstream
    model: ModelUpstream
    speculator: ModelUpstream | None


def resolve_base(
    pins: ImagePins,
    tag: str,
    mirror: str,
    *,
    client: RegistryClient | None = None,
    deadline: float = math.inf,
    contents: bool = True,
) -> BaseUpstream:
    """The manifest digest of the pinned platform for `tag`, the engine read from its layers
    and, with `contents`, the packages it installs (tools.pin.base_contents), in the same read."""
    if not tag:
        raise OciError(
            f"base.tag of {pins.image} is empty and no --base-tag was given: name the tag whose digest "
            "to pin (Omni never guesses one, not even `latest`)",
            field="base.tag",
        )
    ref = Reference.parse(f"{pins.base.image}:{tag}")
    registry = mirror or ref.registry
    label = f"base {ref}" + (f" (from the mirror {mirror})" if mirror else "")
    with client_for(registry, client) as client:
        client.operation_deadline = deadline  # documents, answers and layers: all within --deadline
        resolved = resolve_image(client, ref.repository, tag, pins.base.platform, label)
        sizes = [layer.get("size") for layer in resolved.layers]
        total = sum(size for size in sizes if isinstance(size, int))
        print(
            f"pin: {label}: {pins.base.platform} is {resolved.digest}; reading {pins.engine.name}'s identity "
            + ("and the installed packages " if contents else "")
            + f"from its {len(resolved.layers)} layers ({total / 1e9:.2f} GB)",
            file=sys.stderr,
            flush=True,
        )
        engine_file = wanted_files(pins.engine.name)
        files = read_layer_files(
            client,
            ref.repository,
            resolved.layers,
            wanted=(lambda path: engine_file(path) or wanted_contents(path)) if contents else engine_file,
            noted=noted if contents else lambda path: False,
            max_file_bytes=MAX_ENGINE_FILE_BYTES,
            max_kept_bytes=MAX_BASE_FILES_BYTES,
            label=f"{label}@{resolved.digest}",
            deadline=deadline,
        )
    installed = engine_identity(files, pins.engine.name, f"{label}@{resolved.digest}")
    if not installed.record_sha256 and installed.commit_kind != FULL:
        raise OciError(
            f"{label}: {installed.dist_info} has no RECORD and no full commit: the engine's identity cannot be pinned",
            field="engine",
        )
    if not contents:
        return BaseUpstream(tag, resolved.digest, installed)
    base = {"image": pins.base.image, "digest": resolved.digest, "platform": pins.base.platform}
    found = base_contents(files, base, pins.image, f"{label}@{resolved.digest}")
    print(
        f"pin: {label}: {len(found.dpkg)} dpkg packages, {len(found.python)} Python distributions installed",
        file=sys.stderr,
        flush=True,
    )
    return BaseUpstream(tag, resolved.digest, installed, contents_bytes(found))


def resolve_model(pin: ModelPin, ref: str, endpoint: str, what: str, *, deadline: float = math.inf) -> ModelUpstream:
    """The hub's 40-hex revision for `ref`; with a lock pin, the checkpoint lock at that revision."""
    ref = ref or pin.ref or DEFAULT_MODEL_REF
    try:
        revision, listing = fetch_model_info(pin.id, ref, stall_s=HUB_STALL_S, endpoint=endpoint, deadline=deadline)
    except AttestError as exc:
        field = exc.field if exc.field == "deadline" else f"{what}.revision"
        raise OciError(f"{what} {pin.id}@{ref}: {exc}", field=field) from None
    if pin.lock_sha256 is None:
        return ModelUpstream(ref, revision)
    try:
        lock = lock_from_listing(pin.id, revision, listing, REVIEWED)
    except AttestError as exc:
        raise OciError(f"{what} {pin.id}@{revision}: {exc}", field=f"{what}.lock_sha256") from None
    return ModelUpstream(ref, revision, lock, lock.document_bytes())


def engine_pins(installed: InstalledDistribution) -> tuple[dict[str, Any], str]:
    """(engine.commit and engine.record_sha256 to pin, a note on how the commit was judged)."""
    engine = f"engine {installed.name} {installed.version}"
    if installed.commit_kind == FULL:
        note = f"{engine}: full commit {installed.commit} from {installed.commit_source}"
        return {"commit": installed.commit, "record_sha256": installed.record_sha256}, note
    if installed.commit_kind == ABBREVIATED:
        note = (
            f"{engine}: the base records only the abbreviated commit {installed.commit} "
            f"({installed.commit_source}): engine.commit stays empty, engine.record_sha256 pins the exact files"
        )
    else:
        note = f"{engine}: the base records no commit: engine.record_sha256 pins the exact files"
    return {"commit": "", "record_sha256": installed.record_sha256}, note


def lock_summary(lock: CheckpointLock) -> str:
    lfs = [item for item in lock.files if item.sha256]
    total = sum(item.size for item in lock.files)
    lfs_bytes = sum(item.size for item in lfs)
    share = lfs_bytes / total * 100 if total else 0.0
    return (
        f"{lock.repo}@{lock.revision}: {len(lock.files)} files, {total} bytes ({total / 1e9:.2f} GB); "
        f"{len(lfs)} LFS files hold {share:.1f}% of the bytes"
    )
