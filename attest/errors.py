"""The one error type of the attest domain: every domain's error (boot, launcher, deploy, model,
OCI) derives from it, so a refusal is caught and reported one way (attest.edge.refusal)."""

from __future__ import annotations


class AttestError(ValueError):
    """A document, digest or path failed a check.

    `field` names what was wrong (an environment variable, a document field such as
    `checkpoint attestation.revision`, or a file) so callers can report it exactly.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field
