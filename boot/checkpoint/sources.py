"""The one MODEL_SOURCE switch: how the checkpoint arrives, for `boot prepare` (and `boot run`)
and `boot verify` alike. Each source sits beside the others in this package:

- hub (from_hub.py): rank 0 downloads into MODEL_PATH what the lock names, the other ranks
  wait for its verdict (ranks.py);
- image (from_image.py): a read-only image volume of the model artifact, verified by each rank;
- registry (from_registry.py): every rank pulls the pinned artifact into its own MODEL_PATH.
SKIP_PREPARE and SKIP_VERIFY are each source's to allow or refuse, naming the variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from boot.checkpoint.from_hub import prepare_from_hub, verify_hub_copy
from boot.checkpoint.from_image import verify_image_volume
from boot.checkpoint.from_registry import prepare_from_registry, verify_pulled_copy
from boot.checkpoint.verify import VerifyReport
from boot.settings import HUB, IMAGE, REGISTRY, BootSettings


@dataclass(frozen=True)
class Source:
    prepare: Callable[[BootSettings], VerifyReport | None]
    verify: Callable[..., VerifyReport]  # (settings, *, full)


def _check_image_volume(settings: BootSettings) -> VerifyReport:
    return verify_image_volume(settings, full=False)


SOURCES = {
    HUB: Source(prepare_from_hub, verify_hub_copy),
    IMAGE: Source(_check_image_volume, verify_image_volume),  # nothing to fetch: checked where it is
    REGISTRY: Source(prepare_from_registry, verify_pulled_copy),
}


def prepare(settings: BootSettings) -> VerifyReport | None:
    """The checkpoint ready in MODEL_PATH, from MODEL_SOURCE (None where a skip allowed it)."""
    return SOURCES[settings.model_source].prepare(settings)


def verify_only(settings: BootSettings, *, full: bool) -> VerifyReport:
    """`boot verify [--full]`: the checkpoint MODEL_SOURCE gave against the lock, no download."""
    return SOURCES[settings.model_source].verify(settings, full=full)
