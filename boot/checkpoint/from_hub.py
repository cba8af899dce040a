"""MODEL_SOURCE=hub: the pinned checkpoint downloaded into MODEL_PATH, exactly as its lock says.

Rank 0 checks what is on disk against the lock, and only for files that are missing or
wrong asks the hub: its listing must equal the lock, and each file is hashed as it
arrives. It then writes the receipt and, in a multi-node group, publishes its verdict for the other
ranks (boot.checkpoint.ranks). Which lock is verified against: boot.checkpoint.locks.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from attest.baked import load_baked
from attest.errors import AttestError
from attest.files import RUN_LOCK, exclusive_run
from attest.lock import LOCK_FILE, PARTIAL_DIR
from attest.pins import BakedImage
from attest.primitives import writable_dir
from attest.tree import stat_regular
from boot.checkpoint import hub
from boot.checkpoint.download import Limits, download_progress, partial_names
from boot.checkpoint.locks import LockInUse, resolve_lock
from boot.checkpoint.ranks import publish, publish_refusal, wait_for_rank0, withdraw_verdicts
from boot.checkpoint.receipt import Identity, Receipt, load_receipt, save_receipt
from boot.checkpoint.verify import VerifyReport, check_local, finish, first_problem
from boot.errors import BootError
from boot.settings import REVISION, BootSettings


def _limits(settings: BootSettings) -> Limits:
    return Limits(
        settings.download_stall_s, settings.download_deadline_s, settings.download_attempts, settings.download_workers
    )


def _drop_stale_partials(partial: Path, items: list) -> None:
    """Partial files of files no longer wanted (placed since, or another lock's) would only
    take space: each wanted file's own partial stays, to be resumed."""
    keep = {RUN_LOCK, *(name for item in items for name in partial_names(item))}
    for entry in os.scandir(partial):
        if entry.name not in keep and not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)


def _fetch_missing(settings: BootSettings, in_use: LockInUse, names: list[str]) -> dict[str, Identity]:
    """Download `names` (files missing or wrong on disk) after the hub's listing matched the
    lock; each is hashed as it arrives. Returns each placed file's identity."""
    lock = in_use.lock
    deadline = time.monotonic() + settings.download_deadline_s  # the listing and every file within it
    listing = hub.fetch_listing(
        lock.repo, lock.revision, stall_s=settings.download_stall_s, endpoint=settings.hf_endpoint, deadline=deadline
    )
    hub.compare_with_lock(lock, listing)
    items = [lock.by_path[name] for name in names]
    writable_dir(settings.model, "MODEL_PATH", create=False, default_used="MODEL_PATH" in settings.defaults_used)
    partial = settings.model / PARTIAL_DIR
    partial.mkdir(mode=0o700, exist_ok=True)
    _drop_stale_partials(partial, items)
    total = sum(item.size for item in items)
    print(
        f"downloading {len(items)} file(s), {total / 1e9:.2f} GB, from {settings.hf_endpoint or 'the hub'}",
        file=sys.stderr,
        flush=True,
    )
    progress = download_progress(total, len(items), enabled=total >= 64 << 20)
    with ThreadPoolExecutor(settings.download_workers) as pool:
        futures = [
            pool.submit(
                hub.download_file,
                lock.repo,
                lock.revision,
                item,
                settings.model,
                partial,
                _limits(settings),
                deadline,
                progress,
                settings.hf_endpoint,
            )
            for item in items
        ]
        errors = [future.exception() for future in futures]
    try:
        partial.rmdir()
    except OSError:
        pass
    for error in errors:
        if error is not None:
            raise error
    return {item.path: Identity.of(future.result()) for item, future in zip(items, futures)}


def _model_root(settings: BootSettings, *, create: bool) -> Path:
    model = settings.model
    source = "MODEL_PATH" + (" (default)" if "MODEL_PATH" in settings.defaults_used else "")
    if not model.is_absolute():
        raise BootError(f"{source} must be an absolute path, got {model}", field="MODEL_PATH")
    if create:
        try:
            model.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BootError(f"{source} {model} cannot be created: {exc.strerror}", field="MODEL_PATH") from None
    if not model.is_dir():
        raise BootError(f"no checkpoint at {source} {model}: not a directory", field="MODEL_PATH")
    return model


def _require_some_checkpoint(settings: BootSettings, lock) -> None:
    """A MODEL_PATH holding none of the locked files is a wrong path, not a broken checkpoint:
    refuse before withdrawing the receipt, which still vouches for the real one."""
    if not any(os.path.lexists(settings.model / item.path) for item in lock.files):
        source = "MODEL_PATH" + (" (default)" if "MODEL_PATH" in settings.defaults_used else "")
        raise BootError(
            f"no checkpoint at {source} {settings.model}: none of the lock's {len(lock.files)} files "
            f"(e.g. {lock.files[0].path}) is there; is MODEL_PATH right? The receipt in "
            f"{settings.state} (STATE_PATH) is kept",
            field="MODEL_PATH",
        )


def verify_rank0(
    settings: BootSettings, in_use: LockInUse, *, download: bool, rehash_all: bool = False, quiet: bool = False
) -> VerifyReport:
    started = time.monotonic()
    receipt, refused = load_receipt(settings.state, lock_sha256=in_use.sha256, revision=REVISION)
    if refused:
        if not download and not rehash_all:
            raise BootError(
                f"the receipt is refused: {refused}; run `boot verify --full` or `boot prepare`",
                field="verification.json",
            )
        print(f"receipt refused: {refused}; re-hashing every file", file=sys.stderr, flush=True)
    lock = in_use.lock
    if not download:
        _require_some_checkpoint(settings, lock)
    withdraw_verdicts(settings)  # from here on files may change: nothing claims "verified"
    check = check_local(
        settings.model, lock, receipt, rehash_all=rehash_all, workers=settings.verify_workers, quiet=quiet
    )
    if check.problems and download:
        for name, problem in check.problems.items():
            if "is missing" not in problem:
                print(f"fetching {name} again: {problem}", file=sys.stderr, flush=True)
        check.good.update(_fetch_missing(settings, in_use, list(check.problems)))
        check.downloaded = len(check.problems)
        check.problems = {}
    if check.problems:
        raise first_problem(lock, check.problems)
    report = finish(settings.model, lock, check, started=started, trust=in_use.trust, quiet=quiet)
    signed = Receipt(revision=REVISION, lock_sha256=in_use.sha256, trust=in_use.trust, files=check.good)
    save_receipt(settings.state, signed)
    if settings.nnodes > 1:  # the verdict other ranks wait for; a single node writes nothing to MODEL_PATH
        publish(settings, in_use, signed)
    return report


def prepare_from_hub(settings: BootSettings) -> VerifyReport | None:
    if settings.skip_prepare:
        if not (settings.model / "config.json").is_file():
            raise BootError(f"SKIP_PREPARE=1 but {settings.model}/config.json is missing", field="SKIP_PREPARE")
        print("SKIP_PREPARE=1 - using existing checkpoint (no lock check)", flush=True)
        return None
    baked = load_baked()
    if settings.node_rank != 0:
        wait_for_rank0(settings, baked)
        return None
    _model_root(settings, create=True)
    if not os.access(settings.model, os.W_OK):  # nothing can be written there: no run to exclude
        return _rank0_reporting(settings, baked)
    # One run at a time on MODEL_PATH. A second one is refused here, before it publishes anything:
    # the verdict files belong to the run holding the lock, whose ranks must not read this refusal.
    with exclusive_run(settings.model / PARTIAL_DIR, what=f"MODEL_PATH {settings.model}", field="MODEL_PATH"):
        return _rank0_reporting(settings, baked)


def _rank0_reporting(settings: BootSettings, baked: BakedImage | None) -> VerifyReport | None:
    try:
        return _prepare_rank0(settings, baked)
    except AttestError as exc:
        if settings.nnodes > 1:  # the other ranks wait in the model root for this verdict
            publish_refusal(settings, exc)
        raise


def _prepare_rank0(settings: BootSettings, baked: BakedImage | None) -> VerifyReport | None:
    in_use = resolve_lock(settings, baked, derive=True)
    in_use.warn()
    if settings.skip_verify:
        withdraw_verdicts(settings)
        missing = [
            item.path
            for item in in_use.lock.files
            if (found := stat_regular(settings.model, item.path)) is None or found.st_size != item.size
        ]
        if missing:
            _fetch_missing(settings, in_use, missing)
        print("SKIP_VERIFY=1 - not re-hashing the checkpoint (downloads were hashed as they arrived)", flush=True)
        return None
    return verify_rank0(settings, in_use, download=True)


def verify_hub_copy(settings: BootSettings, *, full: bool) -> VerifyReport:
    """`boot verify [--full]` of a hub copy: the local checkpoint against the lock, no network."""
    model = _model_root(settings, create=False)
    print(f"verifying {model} (MODEL_PATH)", file=sys.stderr, flush=True)
    in_use = resolve_lock(settings, load_baked(), derive=False)
    if in_use is None:
        raise BootError(
            f"no checkpoint lock: {settings.checkpoint_lock} (CHECKPOINT_LOCK) is missing and "
            f"{settings.state / LOCK_FILE} was never derived; run `boot prepare` first",
            field="CHECKPOINT_LOCK",
        )
    in_use.warn()
    return verify_rank0(settings, in_use, download=False, rehash_all=full)
