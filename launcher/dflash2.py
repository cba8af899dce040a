"""The DFlash2 canary's evidence: the exact drafter, and the parity/benchmark gate.

Any failed check raises LauncherError; the selector turns that into a recorded fallback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from attest.documents import DocumentT, read_document
from attest.errors import AttestError
from attest.hashing import sha256_file
from attest.primitives import child_file, local_root, require_revision, require_sha256
from attest.profile import DrafterProfile
from attest.reader import read_json_file, refuse_nul
from attest.speculation import PARITY_CASES, SPECULATOR_ATTESTATION_FILE, DFlash2Gate, SpeculatorAttestation
from launcher.checkpoint import CheckpointInspection
from launcher.engine_probe import VllmCapabilities
from launcher.errors import LauncherError
from launcher.settings import LauncherSettings

SPECULATOR = "DFlash2 attestation"
GATE = "DFlash2 gate"
REQUIRED_CONCURRENCY = {1, 2}
MIN_SAMPLES_PER_MODE = 100


def _pinned(
    model: type[DocumentT], path: Path, label: str, pinned: str, pin_field: str
) -> tuple[DocumentT | None, str]:
    """One read: the pin is checked on exactly the bytes that are parsed. (None, why) when
    the bytes do not have the pinned sha256."""
    try:
        return read_document(model, path, label=label, pinned_sha256=pinned, pin_field=pin_field)[0], ""
    except AttestError as exc:
        if exc.field == pin_field:
            return None, str(exc)
        raise


def _drafter(target: CheckpointInspection) -> DrafterProfile:
    if target.profile.dflash2 is None:
        raise LauncherError(
            f"the target profile {target.profile.name} allows no DFlash2 canary", field="INFERENCE_MODE"
        )
    return target.profile.dflash2


def _check_config(config: dict, drafter, target: CheckpointInspection) -> None:
    """The drafter's config.json: its architecture, model type and the exact published shape."""
    if config.get("architectures") != [drafter.architecture]:
        raise LauncherError(
            f"DFlash2 config does not declare {drafter.architecture}", field="DFlash2 config.architectures"
        )
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.strip():
        # vLLM reads a draft model's config.json through transformers, which refuses it without one.
        raise LauncherError(
            f"DFlash2 config has no model_type (found {model_type!r}); vLLM cannot load it",
            field="DFlash2 config.model_type",
        )
    for key, expected in drafter.shape.items():
        if config.get(key) != expected:
            raise LauncherError(
                f"DFlash2 config is not shaped for the exact {target.profile.display_name} target "
                f"({key} must be {expected!r})",
                field=f"DFlash2 config.{key}",
            )
    declared = config.get("dflash_config")
    if (
        not isinstance(declared, dict)
        or {key: declared.get(key) for key in drafter.drafter_config} != drafter.drafter_config
    ):
        raise LauncherError(
            "DFlash2 config does not match the exact published drafter shape", field="DFlash2 config.dflash_config"
        )


def _check_weight_file(root: Path, manifest: SpeculatorAttestation, drafter) -> None:
    """The one weight file the attestation lists: its exact name, size and SHA-256."""
    for item in manifest.weight_files:
        if item.path != drafter.weight_file:
            raise LauncherError(
                f"DFlash2 weight file must be exactly {drafter.weight_file}", field=f"{SPECULATOR}.weight_files.0.path"
            )
        weight_path = child_file(root, item.path, label="DFlash2 weight file")
        if weight_path.stat().st_size != item.size:
            raise LauncherError(
                "DFlash2 weight file size does not match its attestation", field=f"{SPECULATOR}.weight_files.0.size"
            )
        if sha256_file(weight_path) != item.sha256:
            raise LauncherError(
                "DFlash2 weight SHA-256 does not match its attestation", field=f"{SPECULATOR}.weight_files.0.sha256"
            )


def _verify_speculator(settings: LauncherSettings, target: CheckpointInspection) -> Path:
    drafter = _drafter(target)
    if settings.dflash2_path is None:
        raise LauncherError("DFLASH2_SPECULATOR_PATH is required", field="DFLASH2_SPECULATOR_PATH")
    root = local_root(settings.dflash2_path, label="DFLASH2_SPECULATOR_PATH")
    revision = require_revision(settings.dflash2_revision, "DFLASH2_SPECULATOR_REVISION")
    config_path = child_file(root, "config.json", label="DFlash2 config")
    config, config_read = read_json_file(config_path, label="DFlash2 config")
    _check_config(config, drafter, target)
    manifest_path = root / SPECULATOR_ATTESTATION_FILE
    expected_manifest_sha = require_sha256(settings.dflash2_manifest_sha256, "DFLASH2_MANIFEST_SHA256")
    if not os.path.lexists(manifest_path):
        raise LauncherError(f"DFlash2 attestation is missing: {manifest_path}", field=SPECULATOR_ATTESTATION_FILE)
    manifest, mismatch = _pinned(
        SpeculatorAttestation, manifest_path, SPECULATOR, expected_manifest_sha, "DFLASH2_MANIFEST_SHA256"
    )
    if manifest is None:
        raise LauncherError(
            f"DFlash2 attestation file SHA-256 does not match the pinned value: {mismatch}",
            field="DFLASH2_MANIFEST_SHA256",
        )
    if manifest.model_id != drafter.model_id:
        raise LauncherError(
            "DFlash2 attestation has the wrong schema or exact model_id", field=f"{SPECULATOR}.model_id"
        )
    if manifest.revision != revision:
        raise LauncherError("DFlash2 attestation revision does not match its pin", field=f"{SPECULATOR}.revision")
    if (manifest.target.model_id, manifest.target.revision) != (target.model_id, target.revision):
        raise LauncherError(
            "DFlash2 attestation is not bound to the exact target checkpoint", field=f"{SPECULATOR}.target"
        )
    if config_read.sha256 != manifest.config_sha256:
        raise LauncherError(
            "DFlash2 config SHA-256 does not match its attestation", field=f"{SPECULATOR}.config_sha256"
        )
    if len(manifest.weight_files) != 1:
        raise LauncherError(
            "DFlash2 attestation must list its one exact weight file", field=f"{SPECULATOR}.weight_files"
        )
    _check_weight_file(root, manifest, drafter)
    return root


def _check_gate_document(gate: DFlash2Gate, binding: dict[str, str], min_improvement: float) -> None:
    for key, expected in binding.items():
        actual = getattr(gate, key)
        if actual != expected:
            raise LauncherError(
                f"DFlash2 gate {key} is not bound to the active runtime (gate has {actual!r}, runtime is {expected!r})",
                field=f"{GATE}.{key}",
            )
    parity = gate.parity
    if parity.passed is not True:
        raise LauncherError("DFlash2 AR parity gate has not passed", field=f"{GATE}.parity.passed")
    if parity.covers != list(PARITY_CASES):
        raise LauncherError(
            "DFlash2 parity gate does not cover all required quality cases", field=f"{GATE}.parity.covers"
        )
    benchmark = gate.benchmark
    if benchmark.passed is not True:
        raise LauncherError("DFlash2 target-hardware benchmark gate has not passed", field=f"{GATE}.benchmark.passed")
    if not REQUIRED_CONCURRENCY.issubset(set(benchmark.concurrency)):
        raise LauncherError("DFlash2 benchmark must cover concurrency 1 and 2", field=f"{GATE}.benchmark.concurrency")
    if benchmark.samples_per_mode < MIN_SAMPLES_PER_MODE:
        raise LauncherError(
            "DFlash2 benchmark needs at least 100 samples per mode", field=f"{GATE}.benchmark.samples_per_mode"
        )
    ar_p95, draft_p95 = benchmark.ar_p95_ms, benchmark.dflash2_p95_ms
    if ar_p95 <= 0 or draft_p95 <= 0 or draft_p95 >= ar_p95:
        raise LauncherError("DFlash2 did not beat AR p95 latency", field=f"{GATE}.benchmark.dflash2_p95_ms")
    improvement = (ar_p95 - draft_p95) / ar_p95 * 100.0
    if improvement < min_improvement:
        raise LauncherError(
            f"DFlash2 p95 improvement is below the configured canary threshold ({improvement:.1f}% < {min_improvement}%)",
            field="QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT",
        )


def verify_dflash2_gate(
    settings: LauncherSettings, target: CheckpointInspection, vllm: VllmCapabilities, hardware_arches: Sequence[str]
) -> dict[str, Any]:
    """The speculative config of a DFlash2 canary whose every gate passed; else raises."""
    drafter = _drafter(target)
    hardware = target.profile.hardware
    if not settings.dflash2_canary:
        raise LauncherError("QWEN_DFLASH2_CANARY is not explicitly enabled", field="QWEN_DFLASH2_CANARY")
    if (settings.hardware_profile or hardware.profile) != hardware.profile or hardware.gpu_arch not in hardware_arches:
        raise LauncherError(
            f"DFlash2 canary gate was not measured on the active {hardware.description}", field="OMNI_HARDWARE_PROFILE"
        )
    if not vllm.dflash2:
        raise LauncherError("installed vLLM does not prove DFlash2 model and V2 worker support", field="vllm")
    required_commit = require_revision(settings.dflash2_vllm_commit, "DFLASH2_VLLM_COMMIT")
    matches, how = vllm.commit_matches(required_commit)
    if not matches:
        raise LauncherError(
            f"installed vLLM commit does not equal the DFlash2 commit pin "
            f"(installed {vllm.identity.commit if vllm.identity and vllm.identity.commit else 'unknown'}: {how}; "
            f"pinned {required_commit})",
            field="DFLASH2_VLLM_COMMIT",
        )
    speculator_root = _verify_speculator(settings, target)
    if settings.dflash2_gate_path is None:
        raise LauncherError("QWEN_DFLASH2_GATE_PATH is required", field="QWEN_DFLASH2_GATE_PATH")
    expected_gate_sha = require_sha256(settings.dflash2_gate_sha256, "QWEN_DFLASH2_GATE_SHA256")
    if not os.path.lexists(refuse_nul(settings.dflash2_gate_path, "QWEN_DFLASH2_GATE_PATH")):
        raise LauncherError(f"DFlash2 gate is missing: {settings.dflash2_gate_path}", field="QWEN_DFLASH2_GATE_PATH")
    gate, mismatch = _pinned(
        DFlash2Gate, settings.dflash2_gate_path, GATE, expected_gate_sha, "QWEN_DFLASH2_GATE_SHA256"
    )
    if gate is None:
        raise LauncherError(
            f"DFlash2 parity/benchmark gate SHA-256 does not match its pin: {mismatch}",
            field="QWEN_DFLASH2_GATE_SHA256",
        )
    binding = {
        "engine": "vllm",
        "target_model_id": target.model_id,
        "target_revision": target.revision,
        "speculator_model_id": drafter.model_id,
        "speculator_revision": settings.dflash2_revision.lower(),
        "vllm_commit": required_commit,
        "hardware_profile": hardware.profile,
        "gpu_arch": hardware.gpu_arch,
    }
    _check_gate_document(gate, binding, settings.dflash2_min_p95_improvement_percent)
    return {"method": "dflash", "model": str(speculator_root), "num_speculative_tokens": drafter.speculative_tokens}
