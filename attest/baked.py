"""Where an Omni image keeps its baked pins (/etc/omni/image.json) and its checkpoint lock, and
reading the pins: the one home of both paths, for the image build and the programs alike.

Kept apart from the pin models (attest.pins): a process outside an image, or one that only
needs the path, loads no model at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from attest.reader import refuse_nul

if TYPE_CHECKING:
    from attest.pins import BakedImage

BAKED_PATH_ENV = "OMNI_IMAGE_JSON"
BAKED_PATH = "/etc/omni/image.json"
# Where a release image bakes its checkpoint lock (the image build writes it, boot's
# CHECKPOINT_LOCK defaults to it).
BAKED_LOCK_PATH = "/etc/omni/checkpoint.lock.json"


def baked_path() -> Path:
    return Path(refuse_nul(os.environ.get(BAKED_PATH_ENV, BAKED_PATH), BAKED_PATH_ENV))


def load_baked() -> "BakedImage | None":
    """The baked file of the image we run in; None outside an Omni image."""
    path = baked_path()
    if not os.path.lexists(path):  # anything there (a dangling or looping link too) must read as a document
        return None
    from attest.documents import load_document
    from attest.pins import BakedImage

    return load_document(BakedImage, path, label=str(path))
