"""The OCI tools' one error type."""

from __future__ import annotations


class OciError(RuntimeError):
    """An image, layer, base or registry operation failed; `field` names the culprit
    (a file, a descriptor, a pin or a reference)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field
