"""The one reader for untrusted bytes: files, HTTP bodies and documents.

Every document that the launcher, boot, the gate generator and the OCI tools read from a
file, a peer or the environment comes through here:

- a file is opened once (non-blocking, so a FIFO cannot hang the open; optionally without
  following a final symlink), `fstat`-ed on the opened descriptor (regular file, size within
  a cap), read once, and the digest and the parse are computed over those same bytes, so a
  file swapped between a hash and a parse can never be accepted;
- JSON is parsed strictly: bounded nesting depth, no NaN/Infinity, integers of bounded
  length, no duplicate keys, valid UTF-8.

Any violation raises AttestError naming the document (`label`) and what was expected.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attest.errors import AttestError

MAX_JSON_BYTES = 16 * 1024 * 1024
# What Unicode calls control, format and line/paragraph separators: refused in names
# (attest.primitives, tools.deploy) and escaped wherever untrusted text is shown (attest.edge.redact).
UNSHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
MAX_JSON_DEPTH = 64
# The longest integer literal accepted: enough for any size, count or port, far below the
# length at which int() parsing becomes quadratic or Python refuses it.
MAX_INT_DIGITS = 40

# Strings (with escapes) removed first, so brackets inside them do not count as nesting. The
# unrolled form (runs of plain characters, then one escape) is ~60x faster on long strings than
# an alternation per character: a 16 MiB document is checked in 0.1 s, not 6 s.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


@dataclass(frozen=True)
class UntrustedBytes:
    """The bytes of one read and the sha256 of exactly those bytes."""

    data: bytes
    sha256: str
    path: Path | None = None


def refuse_nul(path: str | os.PathLike[str], label: str) -> str:
    """A path string with no NUL byte (the OS would raise ValueError, not a refusal)."""
    text = os.fspath(path)
    if "\x00" in text:
        raise AttestError(f"{label} path contains a NUL byte", field=label)
    return text


def read_file(
    path: str | os.PathLike[str], *, label: str, max_bytes: int, follow_symlinks: bool = True, allow_empty: bool = False
) -> UntrustedBytes:
    """Open once, fstat the descriptor, read at most `max_bytes` once, digest those bytes."""
    text = refuse_nul(path, label)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(text, flags)
    except OSError as exc:
        raise AttestError(f"{label} cannot be opened: {text} ({_why(exc)})", field=label) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AttestError(f"{label} must be a regular file: {text}", field=label)
        if info.st_size > max_bytes:
            raise AttestError(f"{label} is {info.st_size} bytes; at most {max_bytes} allowed: {text}", field=label)
        chunks, remaining = [], max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise AttestError(f"{label} cannot be read: {text} ({_why(exc)})", field=label) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise AttestError(f"{label} grew past {max_bytes} bytes while read: {text}", field=label)
    if not data and not allow_empty:
        raise AttestError(f"{label} is empty: {text}", field=label)
    return UntrustedBytes(data, hashlib.sha256(data).hexdigest(), Path(text))


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop, or a symlink where none is allowed"
    return exc.strerror or type(exc).__name__


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits is out of range")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > 64:
        raise ValueError(f"a number of {len(text)} characters is out of range")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} overflows a float")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects, strings ignored."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub(b'""', data)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(data: bytes | str, *, label: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON from untrusted bytes; every violation is an AttestError naming `label`."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise AttestError(f"{label} is {len(raw)} bytes; at most {max_bytes} allowed", field=label)
    if _json_depth(raw) > max_depth:
        raise AttestError(f"{label} nests deeper than {max_depth} levels", field=label)
    try:
        return json.loads(
            raw.decode("utf-8"),
            parse_constant=_refuse_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
            object_pairs_hook=_unique_keys,
        )
    except UnicodeDecodeError:
        raise AttestError(f"{label} is not valid UTF-8", field=label) from None
    except (ValueError, RecursionError) as exc:
        raise AttestError(f"{label} is not valid JSON: {str(exc)[:200]}", field=label) from None


def loads_object(data: bytes | str, *, label: str, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    value = loads(data, label=label, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise AttestError(f"{label} must contain a JSON object, got {type(value).__name__}", field=label)
    return value


def read_json_file(
    path: str | os.PathLike[str], *, label: str, max_bytes: int = MAX_JSON_BYTES, follow_symlinks: bool = True
) -> tuple[dict[str, Any], UntrustedBytes]:
    """A JSON object from a file, and the exact bytes (with their digest) it was parsed from."""
    read = read_file(path, label=label, max_bytes=max_bytes, follow_symlinks=follow_symlinks)
    return loads_object(read.data, label=label, max_bytes=max_bytes), read
