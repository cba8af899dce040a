"""prepare: the pinned revision on local disk, verified.

Rank 0 downloads through huggingface_hub (HF_ENDPOINT selects the hub) and verifies;
other ranks wait, with a deadline, for the checkpoint rank 0 makes visible on shared
storage.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from boot.errors import BootError
from boot.settings import REPO, REVISION, BootSettings
from boot.verify import FileEntry, VerifyReport, verify_checkpoint, withdraw_receipt

POLL_S = 5.0


def _endpoint() -> str | None:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, at its import.
    return os.environ.get("HF_ENDPOINT") or None


def pinned_file_entries(repo: str = REPO, revision: str = REVISION) -> list[FileEntry]:
    """The hub's file metadata at exactly `revision`; refuses another commit."""
    from huggingface_hub import HfApi  # imported here: `boot health` and `serve` need no hub

    try:
        info = HfApi(endpoint=_endpoint()).model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:  # huggingface_hub raises many types; all mean "no metadata"
        raise BootError(f"cannot read hub metadata of {repo}@{revision}: {exc}", field="HF_ENDPOINT") from None
    if info.sha != revision:
        raise BootError(
            f"hub metadata is for commit {info.sha}, not the pinned revision {revision}", field="revision"
        )
    return [FileEntry.from_sibling(sibling) for sibling in info.siblings or []]


def download(model: Path, repo: str = REPO, revision: str = REVISION) -> None:
    from huggingface_hub import snapshot_download

    model.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo, revision=revision, local_dir=str(model), max_workers=4, endpoint=_endpoint())


def wait_for_checkpoint(settings: BootSettings, *, poll_s: float = POLL_S) -> None:
    deadline = time.monotonic() + settings.rank_wait_s
    while time.monotonic() < deadline:
        if (settings.model / "config.json").is_file():
            print(f"Rank {settings.node_rank}: checkpoint visible at {settings.model}", flush=True)
            return
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    raise BootError(
        f"Rank {settings.node_rank}: {settings.model} never appeared within {settings.rank_wait_s} s",
        field="RANK_WAIT_TIMEOUT_S",
    )


def prepare(settings: BootSettings) -> VerifyReport | None:
    if settings.skip_prepare:
        if not (settings.model / "config.json").is_file():
            raise BootError(f"SKIP_PREPARE=1 but {settings.model}/config.json is missing", field="SKIP_PREPARE")
        print("SKIP_PREPARE=1 - using existing checkpoint", flush=True)
        return None
    if settings.node_rank != 0:
        wait_for_checkpoint(settings)
        return None
    previous = withdraw_receipt(settings.state)  # the files may change from here on
    entries = pinned_file_entries()
    download(settings.model)
    if settings.skip_verify:
        print("SKIP_VERIFY=1 - not re-hashing the checkpoint", flush=True)
        return None
    return verify_checkpoint(settings.model, entries, state=settings.state, revision=REVISION,
                             workers=settings.verify_workers, previous=previous)
