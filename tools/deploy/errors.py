"""The deploy domain's one error type."""

from __future__ import annotations

from attest.errors import AttestError


class DeployError(AttestError):
    """Manifests could not be generated as asked; `field` names the flag, label, pin or file at fault."""
