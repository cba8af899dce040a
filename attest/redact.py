"""Secrets out of everything we print: the raw value and the forms it takes once escaped
(JSON, Python repr, shell quoting, URL encoding), so a key with a quote or backslash in it
cannot slip through in its escaped spelling."""
from __future__ import annotations

import json
import os
import shlex
from typing import Callable, Iterable
from urllib.parse import quote

REDACTED = "[REDACTED]"
# Environment variables whose values are secrets wherever they appear.
SECRET_VARIABLES = ("API_KEY", "QWEN_API_KEY", "VLLM_API_KEY", "OMNI_GATE_API_KEY", "HF_TOKEN",
                    "HUGGING_FACE_HUB_TOKEN", "OMNI_SIGNING_KEY", "COSIGN_PASSWORD", "OMNI_REGISTRY_PASSWORD",
                    "OMNI_ACCEPTANCE_API_KEY")
MIN_SECRET_CHARS = 4  # shorter values ("0", "off") are switches, not secrets


def secret_forms(secret: str) -> list[str]:
    """Every spelling of `secret` worth hiding, longest first (so a form is never left half-replaced)."""
    if len(secret) < MIN_SECRET_CHARS:
        return []
    # shlex.quote leaves a safe string alone or wraps it in '...' with each ' spelled '"'"';
    # the inner spelling is what shows when a quoted argument is printed inside other quotes.
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1],
             shlex.quote(secret), secret.replace("'", "'\"'\"'"), quote(secret, safe=""),
             secret.encode("unicode_escape").decode("ascii")}
    return sorted((form for form in forms if form), key=len, reverse=True)


def redactor(secrets: Iterable[str]) -> Callable[[str], str]:
    forms = sorted({form for secret in secrets if secret for form in secret_forms(secret)}, key=len, reverse=True)

    def redact(text: str) -> str:
        for form in forms:
            text = text.replace(form, REDACTED)
        return text
    return redact


def environment_secrets() -> list[str]:
    return [os.environ[name] for name in SECRET_VARIABLES if os.environ.get(name)]
