"""The model artifact tools' one error type."""

from __future__ import annotations

from attest.errors import AttestError


class ModelError(AttestError):
    """A model artifact was refused or could not be made, pushed or pulled; `field` names the
    file, layer, annotation, flag or reference at fault."""
