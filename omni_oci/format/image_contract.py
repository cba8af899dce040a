"""What an Omni image promises, one name each: where it bakes its pins and its checkpoint lock,
the labels generated from the pins and from its runtime contract, and the variables that name
places it writes. The image build writes these facts; verify, deploy and the release check read
them here.

The two paths and the writable variables are defined by the runtime's floor (attest.baked,
attest.runtime_contract), which the programs inside the images read without this library; they
are named here once for everything that builds or reads an image from outside.
"""

from __future__ import annotations

from typing import Any

from attest.baked import BAKED_LOCK_PATH, BAKED_PATH
from attest.runtime_contract import WRITABLE_VARIABLES
from omni_oci.format.statement import TOOLKIT_VERSION

__all__ = [
    "BAKED_LOCK_PATH",
    "BAKED_MEMBER",
    "BAKED_PATH",
    "CHECKPOINT_LOCK_URI",
    "GROUPS_LABEL",
    "ROOT_LABEL",
    "TEST_ONLY_LABEL",
    "USER_LABEL",
    "VOLUMES_LABEL",
    "WRITABLE_VARIABLES",
    "pin_labels",
]

BAKED_MEMBER = BAKED_PATH.lstrip("/")  # the baked pins as a layer's tar member names them
CHECKPOINT_LOCK_URI = f"file://{BAKED_LOCK_PATH}"  # the lock as the provenance names it
# The runtime contract's labels: the supplementary groups, the user, the volumes, and why an
# image runs as root (only where its pins declare engine.needs_root).
GROUPS_LABEL = "omni.runtime.groups"
USER_LABEL = "omni.runtime.user"
VOLUMES_LABEL = "omni.runtime.volumes"
ROOT_LABEL = "omni.runtime.root"
# An image for local try-outs only (the CPU engine image): deploy refuses it without --test-image.
TEST_ONLY_LABEL = "omni.test_only"


def pin_labels(pins: dict[str, Any]) -> dict[str, str]:
    """Image labels generated from the pin document (never typed twice)."""
    labels = {
        "omni.image": pins["image"],
        "omni.base.pinned": f"{pins['base']['image']}@{pins['base']['digest'] or 'unpinned'}",
        "omni.engine": pins["engine"]["name"],
        "omni.engine.repository": pins["engine"]["repository"],
        "omni.engine.commit": pins["engine"]["commit"] or "unpinned",
        "omni.engine.record_sha256": pins["engine"].get("record_sha256") or "unpinned",
        "omni.model.id": pins["model"]["id"],
        "omni.model.revision": pins["model"]["revision"] or "unpinned",
        **(
            {"omni.model.lock_sha256": pins["model"]["lock_sha256"] or "unpinned"}
            if pins["model"].get("lock_sha256") is not None
            else {}
        ),
        "omni.hardware.profile": pins["hardware"]["profile"],
        "omni.hardware.gpu_arch": pins["hardware"]["gpu_arch"],
        "omni.toolkit.version": TOOLKIT_VERSION,
    }
    artifact = pins["model"].get("artifact")
    if artifact:
        labels["omni.model.artifact"] = f"{artifact['repository']}@{artifact['digest'] or 'unpinned'}"
    if pins["model"].get("signature"):
        labels["omni.model.signer"] = pins["model"]["signature"]["signer"]
    if pins.get("speculator"):
        labels["omni.speculator.id"] = pins["speculator"]["id"]
        labels["omni.speculator.revision"] = pins["speculator"]["revision"] or "unpinned"
    return labels
