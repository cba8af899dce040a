"""The launcher's error type: every refusal of the launcher's own policy."""

from __future__ import annotations

from attest.errors import AttestError


class LauncherError(AttestError):
    """A runtime invariant could not be established safely; `field` names the culprit."""
