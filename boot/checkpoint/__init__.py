"""The pinned checkpoint on disk: the hub's metadata and downloads, the lock in use, the local
verification and its receipt, the group's verdict (ranks), and every way a checkpoint arrives,
side by side behind one MODEL_SOURCE switch (sources: from_hub, from_image, from_registry).
Above `boot.settings`; never `boot.serving` (docs/development.md#floors).

What other packages use (tools.pin, the benchmarks) is the public API below; boot's own modules
and its tests may reach the modules themselves.
"""

from boot.checkpoint.download import Limits, download_progress
from boot.checkpoint.from_image import verify_image_volume
from boot.checkpoint.hub import compare_with_lock, download_file, fetch_listing, fetch_model_info, lock_from_listing
from boot.checkpoint.locks import LockInUse, resolve_lock
from boot.checkpoint.receipt import RECEIPT, Identity, Receipt
from boot.checkpoint.verify import ENGINE_LOADED_SUFFIXES, VerifyReport

__all__ = [
    "ENGINE_LOADED_SUFFIXES",
    "RECEIPT",
    "download_progress",
    "Identity",
    "Limits",
    "LockInUse",
    "Receipt",
    "VerifyReport",
    "compare_with_lock",
    "download_file",
    "fetch_listing",
    "fetch_model_info",
    "lock_from_listing",
    "resolve_lock",
    "verify_image_volume",
]
