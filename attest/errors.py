"""The one error type of the attest domain, and how every command reports a refusal."""
from __future__ import annotations

import json
import sys


class AttestError(ValueError):
    """A document, digest or path failed a check.

    `field` names what was wrong (an environment variable, a document field such as
    `checkpoint attestation.revision`, or a file) so callers can report it exactly.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def report_refusal(exc: Exception, secrets: tuple[str, ...] = ()) -> int:
    """Print `{"ok": false, "error": ..., "field": ...}` on stderr; the exit code is 2.

    Any error carrying a `field` (AttestError and its subclasses, the OCI tools' OciError).
    Secrets from the environment, those the process learned (attest.redact.learn) and
    `secrets` are redacted in every escaped form."""
    from attest.redact import known_secrets, redactor

    redact = redactor([*known_secrets(), *secrets])
    # Before encoding (the message may hold an escaped form) and after (encoding escapes again).
    line = json.dumps({"ok": False, "error": redact(str(exc)), "field": redact(str(getattr(exc, "field", "")))},
                      ensure_ascii=False)
    print(redact(line), file=sys.stderr)
    return 2


def report_unexpected(exc: BaseException, secrets: tuple[str, ...] = ()) -> int:
    """A bug is still a refusal: one JSON line (no traceback, no secret), exit 2."""
    return report_refusal(AttestError(f"internal error: {type(exc).__name__}: {str(exc)[:500]}", field="internal"),
                          secrets)
