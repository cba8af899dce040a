"""The hub as an untrusted peer: its metadata is compared with the lock, and each file it
serves is hashed as it arrives, against the lock (boot.checkpoint.download resumes and verifies them).

Requests use huggingface_hub's URL builder and headers (token, endpoint, user agent) over
attest.edge.transport, whose answers all arrive within the stall limit and the operation's deadline
(huggingface_hub's own session bounds each socket read only: a hub sending a header byte per
second held boot forever). The byte stream is handled by Omni because the download must be
hashed in the same pass that writes it, resumed from a partial file that is never trusted, and
bounded by the lock's size; huggingface_hub's downloaders verify nothing against a local lock.
"""

from __future__ import annotations

import math
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from attest.documents import parse_document
from attest.edge.bodies import error_detail, read_bounded
from attest.edge.data_plane import DataPlaneTransport
from attest.edge.transport import ProxyRefused, answer_deadline
from attest.errors import AttestError
from attest.lock import CheckpointLock, LockedFile
from attest.primitives import REVISION_RE
from attest.progress import Progress
from attest.reader import loads_object
from boot.checkpoint import download
from boot.checkpoint.download import Limits
from boot.errors import BootError

MAX_METADATA_BYTES = 32 * 1024 * 1024
_CLIENTS: dict[tuple, httpx.Client] = {}
_CLIENTS_LOCK = threading.Lock()


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class _Lfs(_Lenient):
    sha256: str
    size: int


class _Sibling(_Lenient):
    rfilename: str
    size: int | None = None
    blobId: str | None = None  # noqa: N815 (the hub's field name)
    lfs: _Lfs | None = None


class _ModelInfo(_Lenient):
    sha: str
    siblings: list[_Sibling]


def _endpoint(endpoint: str) -> str:
    """HF_ENDPOINT as boot's settings parsed it, else huggingface_hub's default."""
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def _session() -> httpx.Client:
    """The client for boot's hub traffic: attest.edge.transport's deadline per answer, proxies from
    the environment (a SOCKS one refused naming its variable); one per proxy setting."""
    proxies = tuple(sorted(urllib.request.getproxies_environment().items()))
    with _CLIENTS_LOCK:
        if proxies not in _CLIENTS:
            try:
                _CLIENTS[proxies] = httpx.Client(transport=DataPlaneTransport())
            except ProxyRefused as exc:
                raise BootError(f"the hub cannot be reached: {exc}", field=exc.variable) from None
        return _CLIENTS[proxies]


def _headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers()


def fetch_model_info(
    repo: str, ref: str, *, stall_s: float, endpoint: str = "", deadline: float = math.inf
) -> tuple[str, list[LockedFile]]:
    """The 40-hex commit the hub names for `ref` (a revision, branch or tag) and its file
    listing there, read bounded and checked strictly; `deadline` (time.monotonic()) bounds the
    whole read, each wait at most `stall_s`."""
    url = f"{_endpoint(endpoint)}/api/models/{repo}/revision/{quote(ref, safe='')}"
    where = f"hub metadata of {repo}@{ref} ({url})"
    try:
        session = _session()
        request = session.build_request(
            "GET", url, params={"blobs": "true"}, headers=_headers(), timeout=httpx.Timeout(stall_s)
        )
        # The answer (every redirect hop) within stall_s, and all of it within the deadline.
        with answer_deadline(stall_s, ends=deadline):
            response = session.send(request, stream=True, follow_redirects=True)
        try:
            body = read_bounded(
                response, MAX_METADATA_BYTES, where, deadline=deadline, error=BootError, field="HF_ENDPOINT"
            )
            status = response.status_code
        finally:
            response.close()
    except httpx.HTTPError as exc:
        if time.monotonic() >= deadline:
            raise BootError(f"reading {where} passed its deadline", field="deadline") from None
        raise BootError(
            f"cannot read {where}: {type(exc).__name__}: {exc} (check HF_ENDPOINT and the network)", field="HF_ENDPOINT"
        ) from None
    if status != 200:
        raise BootError(f"{where} answered HTTP {status}: {error_detail(body)}", field="HF_ENDPOINT")
    try:
        info = _ModelInfo.model_validate(loads_object(body, label=where, max_bytes=MAX_METADATA_BYTES))
    except AttestError as exc:
        raise BootError(str(exc), field="HF_ENDPOINT") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BootError(
            f"{where} is malformed at {'.'.join(map(str, first['loc']))}: {first['msg']}", field="HF_ENDPOINT"
        ) from None
    if not REVISION_RE.fullmatch(info.sha):
        raise BootError(f"{where} names commit {info.sha[:80]!r}; expected 40 hex digits", field="HF_ENDPOINT")
    files = []
    for sibling in info.siblings:
        if sibling.lfs and sibling.size is not None and sibling.size != sibling.lfs.size:
            raise BootError(
                f"hub metadata of {sibling.rfilename!r} gives two sizes: {sibling.size} and LFS {sibling.lfs.size}",
                field=sibling.rfilename,
            )
        entry: dict[str, Any] = {"path": sibling.rfilename, "size": sibling.lfs.size if sibling.lfs else sibling.size}
        if sibling.lfs:
            entry["sha256"] = sibling.lfs.sha256
        else:
            entry["git_sha1"] = sibling.blobId
        try:
            files.append(parse_document(LockedFile, entry, label=f"hub metadata file {sibling.rfilename!r}"))
        except AttestError as exc:
            raise BootError(str(exc), field=sibling.rfilename) from None
    return info.sha.lower(), files


def fetch_listing(
    repo: str, revision: str, *, stall_s: float, endpoint: str = "", deadline: float = math.inf
) -> list[LockedFile]:
    """The hub's file listing at exactly `revision`, read bounded and checked strictly."""
    sha, files = fetch_model_info(repo, revision, stall_s=stall_s, endpoint=endpoint, deadline=deadline)
    if sha != revision:
        raise BootError(f"hub metadata is for commit {sha}, not the pinned revision {revision}", field="revision")
    return files


def lock_from_listing(repo: str, revision: str, files: list[LockedFile], trust: str) -> CheckpointLock:
    document = {
        "schema_version": "1",
        "repo": repo,
        "revision": revision,
        "trust": trust,
        "files": [
            item.model_dump(mode="json", exclude_none=True) for item in sorted(files, key=lambda item: item.path)
        ],
    }
    try:
        return parse_document(CheckpointLock, document, label="hub metadata")
    except AttestError as exc:
        raise BootError(str(exc), field="HF_ENDPOINT") from None


def compare_with_lock(lock: CheckpointLock, listing: list[LockedFile]) -> None:
    """Any difference between the hub's listing and the lock refuses, naming the file."""
    hub = {item.path: item for item in listing}
    for name in sorted(set(hub) - set(lock.by_path)):
        raise BootError(
            f"the hub lists {name}, which the checkpoint lock does not: refusing a listing that differs from the lock",
            field=name,
        )
    for item in lock.files:
        theirs = hub.get(item.path)
        if theirs is None:
            raise BootError(f"the hub does not list {item.path}, which the checkpoint lock does", field=item.path)
        for what, ours, other in (("size", item.size, theirs.size), (item.algorithm, item.digest, theirs.digest)):
            if ours != other:
                raise BootError(
                    f"hub metadata differs from the checkpoint lock for {item.path}: {what} lock {ours}, hub {other}",
                    field=item.path,
                )


def download_file(
    repo: str,
    revision: str,
    item: LockedFile,
    model: Path,
    partial: Path,
    limits: Limits,
    deadline: float,
    progress: Progress,
    endpoint: str = "",
) -> os.stat_result:
    """`item` from the hub at `revision`, through huggingface_hub's URL builder, session and
    headers, resumed and verified as boot.checkpoint.download does it."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, item.path, revision=revision, endpoint=_endpoint(endpoint))
    return download.download_file(
        _session(), url, revision, item, model, partial, limits, deadline, progress, _headers()
    )
