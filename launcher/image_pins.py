"""The launcher's start-up checks against the image's baked pins (/etc/omni/image.json)."""

from __future__ import annotations

from attest.documents import load_document
from attest.errors import AttestError
from attest.pins import BakedImage, check_engine_identity, check_model_revision, mismatch
from launcher.engine_probe import VllmCapabilities
from launcher.settings import LauncherSettings


def check_image_pins(baked: BakedImage, settings: LauncherSettings, vllm: VllmCapabilities) -> list[str]:
    """What was checked; raises AttestError naming the pin and both values on a mismatch."""
    notes = [
        *check_engine_identity(baked, "vllm", vllm.identity),
        check_model_revision(baked, settings.model_revision, "MODEL_REVISION"),
    ]
    gate_path = settings.dflash2_gate_path
    if settings.requested_mode != "dflash2_canary" or gate_path is None or not gate_path.is_file():
        return notes
    from attest.speculation import DFlash2Gate

    try:
        gate = load_document(DFlash2Gate, gate_path, label="DFlash2 gate")
    except AttestError:
        return notes  # an unreadable gate only disables the canary (checked, with its reason, later)
    pins = baked.pins
    bindings = (
        ("vllm_commit", "engine.commit", pins.engine.commit),
        ("target_revision", "model.revision", pins.model.revision),
        ("speculator_revision", "speculator.revision", pins.speculator.revision if pins.speculator else ""),
    )
    for field, pin, pinned in bindings:
        if pinned and getattr(gate, field) != pinned:
            raise mismatch(pin, pinned, getattr(gate, field), f"the DFlash2 gate's {field}")
    notes.append("the DFlash2 gate is bound to the pinned engine, model and speculator")
    return notes
