"""The pinned checkpoint on disk: the hub's metadata and downloads, the lock in use, the local
verification and its receipt, and the image-volume check. Below `boot.ranks` and `boot.prepare`
(which decide who downloads), above `boot.settings`; never `boot.serving` (docs/development.md#floors).

What other packages use (tools.pin, the benchmarks) is the public API below; boot's own modules
and its tests may reach the modules themselves.
"""

from boot.checkpoint.download import Limits, download_progress
from boot.checkpoint.hub import compare_with_lock, download_file, fetch_listing, fetch_model_info, lock_from_listing
from boot.checkpoint.locks import LockInUse, resolve_lock
from boot.checkpoint.receipt import RECEIPT, Identity, Receipt
from boot.checkpoint.verify import ENGINE_LOADED_SUFFIXES, VerifyReport
from boot.checkpoint.volume import verify_image_volume

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
