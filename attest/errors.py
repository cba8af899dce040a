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


def report_refusal(exc: Exception) -> int:
    """Print `{"ok": false, "error": ..., "field": ...}` on stderr; the exit code is 2.

    Any error carrying a `field` (AttestError and its subclasses, the OCI tools' OciError)."""
    print(json.dumps({"ok": False, "error": str(exc), "field": getattr(exc, "field", "")}, ensure_ascii=False),
          file=sys.stderr)
    return 2
