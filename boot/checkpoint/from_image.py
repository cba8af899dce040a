"""MODEL_SOURCE=image: the checkpoint is a read-only image volume of the model artifact
(tools/model), one copy per node, put there by the container runtime from a digest.

How boot knows: the deployment says so (MODEL_SOURCE=image, which tools/deploy sets with the
image volume), and boot then requires MODEL_PATH to be mounted read-only; it never guesses
from what it finds. Every rank verifies its own copy against the pinned lock (a receipt in
STATE_PATH spares re-hashing an unchanged copy), refuses a missing, changed or extra file
naming it, and writes nothing to MODEL_PATH: no download, no verdict for other ranks to
trust, none read from them. SKIP_PREPARE and SKIP_VERIFY are refused, and so is any file or
directory under MODEL_PATH on another mount than the volume's own.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from attest.baked import load_baked
from attest.errors import AttestError
from attest.lock import ARTIFACT_LOCK
from attest.pins import BakedImage
from attest.tree import open_regular
from boot.checkpoint.locks import LockInUse, resolve_lock
from boot.checkpoint.receipt import Receipt, load_receipt, save_receipt
from boot.checkpoint.verify import LocalCheck, VerifyReport, check_local, finish, first_problem
from boot.errors import BootError
from boot.settings import REVISION, BootSettings


def _require_read_only(settings: BootSettings) -> None:
    model = settings.model
    try:
        flags = os.statvfs(model).f_flag
    except OSError as exc:
        raise BootError(f"MODEL_PATH {model} cannot be read: {exc.strerror}", field="MODEL_PATH") from None
    if not model.is_dir():
        raise BootError(f"no checkpoint at MODEL_PATH {model}: not a directory", field="MODEL_PATH")
    if not flags & os.ST_RDONLY:
        raise BootError(
            f"MODEL_SOURCE=image but MODEL_PATH {model} is mounted writable; an image volume is read-only "
            "(a writable model root is not one boot may take for the artifact: use MODEL_SOURCE=hub)",
            field="MODEL_SOURCE",
        )


MOUNTINFO = "/proc/self/mountinfo"
MAX_MOUNTINFO_BYTES = 4 << 20  # thousands of mounts; read once, bounded


def _mount_points() -> list[tuple[str, bool]]:
    """(mount point, writable) of every mount this process sees (proc(5): mountinfo's fifth field
    is the mount point with octal escapes, the sixth its per-mount options)."""
    try:
        with open(MOUNTINFO, "rb") as handle:
            data = handle.read(MAX_MOUNTINFO_BYTES + 1)
    except OSError as exc:
        raise BootError(f"{MOUNTINFO} cannot be read ({exc.strerror}): the mounts under MODEL_PATH are unknown",
                        field="MODEL_PATH") from None  # fmt: skip
    if len(data) > MAX_MOUNTINFO_BYTES:
        raise BootError(f"{MOUNTINFO} is over {MAX_MOUNTINFO_BYTES} bytes", field="MODEL_PATH")
    found = []
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(" ")
        if len(fields) > 5:
            point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), fields[4])
            found.append((point, "rw" in fields[5].split(",")))
    return found


def _require_one_mount(settings: BootSettings) -> None:
    """Nothing under MODEL_PATH is mounted over the volume: a file or directory bind-mounted
    there (a writable one above all) could change after it was verified, so it is refused,
    naming it. Bind mounts from the same filesystem share its device number, so the kernel's
    mount table is read, not st_dev."""
    model = os.path.realpath(settings.model)
    for point, writable in _mount_points():
        if point.startswith(model + "/"):
            raise BootError(
                f"MODEL_SOURCE=image but {os.path.relpath(point, model)} under MODEL_PATH {settings.model} is a "
                f"mount of its own{' (writable)' if writable else ''}; every file of an image volume is on its one "
                "read-only mount",
                field="MODEL_PATH",
            )


def carried_lock_is(model: Path, data: bytes) -> bool | None:
    """Whether the artifact's lock in `model` (ARTIFACT_LOCK) is exactly `data`; None where there is
    none. One that is there but not a regular file of its own is refused (AttestError)."""
    try:
        with open_regular(model, ARTIFACT_LOCK) as fd:
            return os.pread(fd, len(data) + 1, 0) == data
    except AttestError:
        if not os.path.lexists(model / ARTIFACT_LOCK):
            return None
        raise


def _artifact_lock_matches(settings: BootSettings, data: bytes) -> None:
    """The lock the artifact carries, where it is, must be the lock boot verifies against."""
    try:
        carried = carried_lock_is(settings.model, data)
    except AttestError as exc:
        raise BootError(f"{ARTIFACT_LOCK} in MODEL_PATH: {exc}", field=ARTIFACT_LOCK) from None
    if carried is False:  # None: a copy made without tools/model, whose files alone are checked
        raise BootError(
            f"the model volume carries another checkpoint lock ({ARTIFACT_LOCK}) than the one pinned: it is "
            "the artifact of another checkpoint",
            field=ARTIFACT_LOCK,
        )


def refuse_skips(settings: BootSettings) -> None:
    """No variable weakens a start where each rank has its own copy (an image volume, a pull)."""
    for variable, skipped in (("SKIP_PREPARE", settings.skip_prepare), ("SKIP_VERIFY", settings.skip_verify)):
        if skipped:
            raise BootError(
                f"{variable}=1 cannot be used with MODEL_SOURCE={settings.model_source}: each rank verifies its own "
                "copy (a receipt in STATE_PATH already spares re-hashing an unchanged one)",
                field=variable,
            )


def pinned_lock(settings: BootSettings, baked: BakedImage | None) -> LockInUse:
    """The lock a rank's own copy is checked against: the local one, never the copy's."""
    in_use = resolve_lock(settings, baked, derive=False)
    if in_use is None:
        raise BootError(
            f"MODEL_SOURCE={settings.model_source} needs the pinned checkpoint lock: {settings.checkpoint_lock} "
            "(CHECKPOINT_LOCK) is missing",
            field="CHECKPOINT_LOCK",
        )
    in_use.warn()
    return in_use


def verify_image_volume(settings: BootSettings, *, full: bool) -> VerifyReport:
    refuse_skips(settings)
    _require_read_only(settings)
    _require_one_mount(settings)
    started = time.monotonic()
    in_use = pinned_lock(settings, load_baked())
    _artifact_lock_matches(settings, in_use.data)
    print(f"verifying the image volume at {settings.model} (rank {settings.node_rank})", file=sys.stderr, flush=True)
    return verify_own_copy(settings, in_use, full=full, started=started)


def verify_own_copy(settings: BootSettings, in_use: LockInUse, *, full: bool, started: float) -> VerifyReport:
    """Every file of this rank's copy against the lock (the receipt's identities spare re-hashing
    unchanged ones), nothing else there; the receipt saved for the next start."""
    receipt, refused = load_receipt(settings.state, lock_sha256=in_use.sha256, revision=REVISION)
    if refused:
        print(f"receipt refused: {refused}; re-hashing every file", file=sys.stderr, flush=True)
    check = check_local(settings.model, in_use.lock, receipt, rehash_all=full, workers=settings.verify_workers)
    if check.problems:
        raise first_problem(in_use.lock, check.problems)
    return record(settings, in_use, check, started)


def record(settings: BootSettings, in_use: LockInUse, check: LocalCheck, started: float) -> VerifyReport:
    """The checks after every file matched, and the receipt of what was verified."""
    report = finish(settings.model, in_use.lock, check, started=started, trust=in_use.trust, refuse_extra=True)
    save_receipt(
        settings.state, Receipt(revision=REVISION, lock_sha256=in_use.sha256, trust=in_use.trust, files=check.good)
    )
    return report
