"""MODEL_SOURCE=registry: every rank pulls the pinned model artifact into its own MODEL_PATH,
for clusters that cannot mount it as an image volume (Kubernetes before 1.35 without the
ImageVolume gate, containerd before 2.1).

The deployment runs `boot prepare` as an init container of the serving image itself, so the
bytes move through tools/model's pull (the registry data plane), and `boot run` then finds the
copy and its receipt. Contract:
- The expected bytes come from the local lock (CHECKPOINT_LOCK, pinned by the image), never
  from the registry: the artifact must carry exactly that lock, and each file is hashed once,
  as it arrives, against it (tools/model pull).
- MODEL_ARTIFACT names the artifact by digest; where the image pins model.artifact, the digest
  must be the pinned one (a mirror's repository may differ, its bytes may not).
- A copy is complete only when the artifact's lock (ARTIFACT_LOCK) lies in MODEL_PATH: a cut
  pull leaves none, and the next start fetches only what is missing.
- A complete copy with a receipt (STATE_PATH) is re-used without network: only files whose
  identity changed are hashed again, and a file that fails is fetched again, named.
- No hub, no token, no verdict for other ranks: each rank pulls and verifies its own copy.

Threat model: the registry, its mirrors and every file under MODEL_PATH are untrusted;
credentials go only to their own registry (omni_oci.remote.auth.credentials); the whole pull has
one deadline (DOWNLOAD_DEADLINE_S).
"""

from __future__ import annotations

import sys
import time

from attest.baked import load_baked
from attest.errors import AttestError
from attest.lock import ARTIFACT_LOCK
from attest.pins import BakedImage
from attest.tree import stat_regular
from boot.checkpoint.from_image import carried_lock_is, pinned_lock, record, refuse_skips, verify_own_copy
from boot.checkpoint.locks import LockInUse
from boot.checkpoint.receipt import Identity, load_receipt, withdraw_receipt
from boot.checkpoint.verify import LocalCheck, VerifyReport, check_local
from boot.errors import BootError
from boot.settings import REVISION, BootSettings
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from omni_oci.model.pull import ExpectedLock, pull
from omni_oci.remote.registry import RegistryClient

# What a refusal of the pull names, said as the variable that sets it.
FIELDS = {"reference": "MODEL_ARTIFACT", "deadline": "DOWNLOAD_DEADLINE_S", "DIR": "MODEL_PATH"}


def artifact_reference(settings: BootSettings, baked: BakedImage | None) -> Reference:
    """MODEL_ARTIFACT, else the image's pinned artifact; by digest, and the pinned digest."""
    artifact = baked.pins.model.artifact if baked is not None else None
    pinned = f"{artifact.repository}@{artifact.digest}" if artifact is not None and artifact.digest else ""
    text = settings.model_artifact or pinned
    if not text:
        raise BootError(
            "MODEL_SOURCE=registry needs the model artifact: set MODEL_ARTIFACT=REGISTRY/REPO@sha256:... "
            "(the image pins none)",
            field="MODEL_ARTIFACT",
        )
    try:
        ref = Reference.parse(text)
    except OciError as exc:
        raise BootError(f"MODEL_ARTIFACT: {exc}", field="MODEL_ARTIFACT") from None
    if not ref.digest:
        raise BootError(f"MODEL_ARTIFACT {text!r}: name the artifact by digest (@sha256:...)", field="MODEL_ARTIFACT")
    if pinned and ref.digest != artifact.digest:
        raise BootError(
            f"MODEL_ARTIFACT {text!r} is not the artifact the image pins ({pinned}); a mirror keeps the digest",
            field="MODEL_ARTIFACT",
        )
    return ref


def _complete(settings: BootSettings, in_use: LockInUse) -> bool:
    """Whether MODEL_PATH holds a whole pull of this lock (its ARTIFACT_LOCK, placed last)."""
    try:
        return carried_lock_is(settings.model, in_use.data) is True
    except AttestError:
        return False


def _checked(settings: BootSettings, in_use: LockInUse) -> LocalCheck | None:
    """A whole copy checked against the lock (the receipt sparing unchanged files), each file that
    no longer matches named; None where the copy is not whole."""
    if not _complete(settings, in_use):
        return None
    receipt, refused = load_receipt(settings.state, lock_sha256=in_use.sha256, revision=REVISION)
    if refused:
        print(f"receipt refused: {refused}; re-hashing every file", file=sys.stderr, flush=True)
    check = check_local(settings.model, in_use.lock, receipt, workers=settings.verify_workers)
    for name, problem in sorted(check.problems.items()):
        print(f"fetching {name} again: {problem}", file=sys.stderr, flush=True)
    return check


def _pull(settings: BootSettings, in_use: LockInUse, ref: Reference, verified: dict[str, Identity]) -> dict:
    print(f"pulling {ref} into {settings.model} (rank {settings.node_rank})", file=sys.stderr, flush=True)
    try:
        with RegistryClient(ref.registry) as client:
            client.operation_deadline = time.monotonic() + settings.download_deadline_s
            return pull(
                str(ref),
                settings.model,
                ExpectedLock(in_use.sha256),
                client=client,
                jobs=settings.download_workers,
                progress=lambda line: print(f"pull: {line}", file=sys.stderr, flush=True),
                # Files just checked against the lock, still as they were then: not hashed again.
                vouched=lambda path, found: verified.get(path) == Identity.of(found),
            )
    except AttestError as exc:
        field = FIELDS.get(exc.field or "", exc.field)
        raise BootError(f"MODEL_SOURCE=registry: {exc}", field=field) from None


def _identities(settings: BootSettings, in_use: LockInUse) -> dict[str, Identity]:
    """Each placed file's identity, for the receipt: the pull hashed its bytes as they arrived."""
    found = {}
    for item in in_use.lock.files:
        info = stat_regular(settings.model, item.path)
        if info is None or info.st_size != item.size:
            raise BootError(f"{item.path} changed under MODEL_PATH during the pull", field=item.path)
        found[item.path] = Identity.of(info)
    return found


def verify_pulled_copy(settings: BootSettings, *, full: bool) -> VerifyReport:
    """`boot verify`: this rank's pulled copy against the lock, without any network."""
    refuse_skips(settings)
    started = time.monotonic()
    in_use = pinned_lock(settings, load_baked())
    if not _complete(settings, in_use):
        raise BootError(
            f"MODEL_PATH {settings.model} holds no whole pull of the pinned artifact ({ARTIFACT_LOCK} is missing or "
            "another lock's): run `boot prepare` (the init container) first",
            field=ARTIFACT_LOCK,
        )
    return verify_own_copy(settings, in_use, full=full, started=started)


def prepare_from_registry(settings: BootSettings) -> VerifyReport:
    """This rank's own copy of the pinned artifact: re-used when whole and unchanged, else pulled."""
    refuse_skips(settings)
    started = time.monotonic()
    baked = load_baked()
    in_use = pinned_lock(settings, baked)
    ref = artifact_reference(settings, baked)
    checked = _checked(settings, in_use)
    if checked is not None and not checked.problems:
        return record(settings, in_use, checked, started)
    withdraw_receipt(settings.state)  # from here on files may change: nothing claims "verified"
    summary = _pull(settings, in_use, ref, checked.good if checked is not None else {})
    check = LocalCheck(good=_identities(settings, in_use), downloaded=summary["fetched"])
    check.hashed, check.hashed_bytes = summary["kept_hashed"], summary["kept_hashed_bytes"]
    check.reused = summary["kept"] - summary["kept_hashed"]
    return record(settings, in_use, check, started)
