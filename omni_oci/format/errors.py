"""The OCI tools' one error type, and the one way a registry document becomes an object."""

from __future__ import annotations

from typing import Any

from attest.errors import AttestError
from attest.reader import loads_object


class OciError(AttestError):
    """An image, layer, base or registry operation failed; `field` names the culprit
    (a file, a descriptor, a pin or a reference). `final`: no other attempt could go
    differently (a credential or token refused, the deadline passed), so none is made.
    `digest_refused`: the registry refused the bytes under their digest (DIGEST_INVALID), which
    is final too: the same bytes would be refused again."""

    def __init__(self, message: str, *, field: str = "", final: bool = False, digest_refused: bool = False) -> None:
        super().__init__(message, field=field)
        self.digest_refused = digest_refused
        self.final = final or digest_refused or field in ("deadline", "Retry-After")


def refusing_object(data: bytes, what: str, field: str = "") -> dict[str, Any]:
    """A JSON object from untrusted bytes, parsed by the strict reader (attest.reader: duplicate
    keys, NaN, deep nesting and bad UTF-8 refused), else an OciError naming `what` (and `field`,
    default `what`)."""
    try:
        return loads_object(data, label=what)
    except AttestError as exc:
        raise OciError(str(exc), field=field or what) from None
