"""Secrets out of everything we print: the raw value and the forms it takes once escaped
(JSON, Python repr, shell quoting, URL encoding), so a key with a quote or backslash in it
cannot slip through in its escaped spelling.

The secrets are those of the environment (SECRET_VARIABLES) and every one the process learned
while it ran (`learn`: registry passwords from files and credential helpers, identity and
bearer tokens, the base64 `user:password` of a Basic header). `redacting_output()` makes every
line a command prints on stdout and stderr pass through `redact_known`, retries and progress
included.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import shlex
import sys
import threading
import unicodedata
from typing import Callable, Iterable, TextIO
from urllib.parse import quote

from attest.reader import UNSHOWN_CATEGORIES

REDACTED = "[REDACTED]"
# Environment variables whose values are secrets wherever they appear.
SECRET_VARIABLES = (
    "API_KEY",
    "QWEN_API_KEY",
    "VLLM_API_KEY",
    "OMNI_GATE_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "OMNI_SIGNING_KEY",
    "COSIGN_PASSWORD",
    "OMNI_REGISTRY_PASSWORD",
    "OMNI_ACCEPTANCE_API_KEY",
)
MIN_SECRET_CHARS = 4  # shorter values ("0", "off") are switches, not secrets


def secret_forms(secret: str) -> list[str]:
    """Every spelling of `secret` worth hiding, longest first (so a form is never left half-replaced)."""
    if len(secret) < MIN_SECRET_CHARS:
        return []
    # shlex.quote leaves a safe string alone or wraps it in '...' with each ' spelled '"'"';
    # the inner spelling is what shows when a quoted argument is printed inside other quotes.
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        shlex.quote(secret),
        secret.replace("'", "'\"'\"'"),
        quote(secret, safe=""),
        secret.encode("unicode_escape").decode("ascii"),
    }
    return sorted((form for form in forms if form), key=len, reverse=True)


def redactor(secrets: Iterable[str]) -> Callable[[str], str]:
    forms = sorted({form for secret in secrets if secret for form in secret_forms(secret)}, key=len, reverse=True)

    def redact(text: str) -> str:
        for form in forms:
            text = text.replace(form, REDACTED)
        return text

    return redact


def _environment_secrets() -> list[str]:
    return [os.environ[name] for name in SECRET_VARIABLES if os.environ.get(name)]


_learned: set[str] = set()
_learned_lock = threading.Lock()


def learn(*secrets: str) -> None:
    """Secrets found while running (files, helpers, tokens): redacted from now on."""
    with _learned_lock:
        _learned.update(secret for secret in secrets if secret)


def learn_basic(username: str, password: str) -> None:
    """A username/password pair: the password, `user:password` and its base64 (a Basic header)."""
    pair = f"{username}:{password}"
    learn(password, pair, base64.b64encode(pair.encode()).decode("ascii"))


def known_secrets() -> tuple[str, ...]:
    with _learned_lock:
        learned = sorted(_learned)
    return tuple(sorted({*_environment_secrets(), *learned}))


@functools.lru_cache(maxsize=16)
def _redactor_for(secrets: tuple[str, ...]) -> Callable[[str], str]:
    return redactor(secrets)


def redact_known(text: str) -> str:
    """`text` with every form of every known secret replaced."""
    return _redactor_for(known_secrets())(text)


class _RedactingStream(io.TextIOBase):
    """A text stream whose every write is redacted before it reaches `stream`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_known(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")


def redacting_output() -> None:
    """From now on, stdout and stderr redact every known secret (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _RedactingStream):
            setattr(sys, name, _RedactingStream(stream))


def escaped(text: str) -> str:
    """Untrusted text as shown on a terminal or in `kubectl describe`: control characters (ESC of
    ANSI/OSC sequences, BEL, newlines), format characters (bidi overrides) and line separators
    escaped as \\uXXXX, everything else as it is."""
    return "".join(f"\\u{ord(char):04x}" if unicodedata.category(char) in UNSHOWN_CATEGORIES else char for char in text)
