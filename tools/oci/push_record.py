"""Where each image digest was last pushed, so later commands (the deploy manifests) can name
it by digest without the operator copying it: one small file per digest under
$XDG_STATE_HOME/omni/pushes (default ~/.local/state/omni/pushes). A record only says where a
digest went; whoever reads it checks the digest it asked for is the one recorded."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from attest.errors import AttestError
from attest.files import write_atomic
from attest.reader import read_json_file
from omni_oci.format.errors import OciError
from omni_oci.format.reference import DIGEST_RE, Reference

MAX_RECORD_BYTES = 4096


def _records_dir() -> Path | None:
    state = os.environ.get("XDG_STATE_HOME", "")
    if state.startswith("/"):
        return Path(state) / "omni" / "pushes"
    home = os.environ.get("HOME", "")
    return Path(home) / ".local" / "state" / "omni" / "pushes" if home.startswith("/") else None


def _record_path(digest: str) -> Path | None:
    where = _records_dir()
    if where is None or not DIGEST_RE.fullmatch(digest):
        return None
    return where / (digest.split(":", 1)[1] + ".json")


def record_push(reference: str, digest: str) -> Path | None:
    """Remember `reference` (REGISTRY/REPO@digest) for `digest`; a failure only warns: the push
    itself succeeded."""
    path = _record_path(digest)
    if path is None:
        return None
    try:
        write_atomic(path, json.dumps({"digest": digest, "reference": reference}, sort_keys=True).encode() + b"\n")
    except OSError as exc:
        print(f"push: could not record the push in {path}: {exc}", file=sys.stderr)
        return None
    return path


def last_push(digest: str) -> str | None:
    """REGISTRY/REPO@digest where `digest` was last pushed from this account, or None."""
    path = _record_path(digest)
    if path is None or not path.exists():
        return None
    try:
        record, _ = read_json_file(path, label=str(path), max_bytes=MAX_RECORD_BYTES, follow_symlinks=False)
        reference = record.get("reference")
        if (
            record.get("digest") != digest
            or not isinstance(reference, str)
            or Reference.parse(reference).digest != digest
        ):
            raise AttestError(f"{path} does not record a push of {digest}", field=str(path))
    except (AttestError, OciError) as exc:
        raise OciError(
            f"the push record {path} is unusable ({exc}); delete it or pass the reference", field=str(path)
        ) from None
    return reference
