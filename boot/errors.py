"""The boot domain's one error type."""

from __future__ import annotations

from attest.errors import AttestError


class BootError(AttestError):
    """Boot could not proceed safely; `field` names the variable, file or field at fault."""
