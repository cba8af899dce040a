"""Mode selection: a lossless mode, and speculation only on proof.

Autoregressive is the quality baseline. Native MTP needs the checkpoint's MTP head and
vLLM's support; the DFlash2 canary needs every gate. A failed speculation check never
refuses the launch: it falls back and the reason is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from attest.errors import AttestError
from launcher.checkpoint import CheckpointInspection
from launcher.engine_probe import VllmCapabilities
from launcher.errors import LauncherError
from launcher.settings import LauncherSettings

MODES = ("autoregressive", "native_mtp", "dflash2_canary")


@dataclass(frozen=True)
class ModeVerdict:
    mode: str
    accepted: bool
    selected: bool
    reasons: tuple[str, ...]
    field: str = ""  # what refused this mode, when a check did

    def public_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "accepted": self.accepted,
            "selected": self.selected,
            "reasons": list(self.reasons),
            "field": self.field or None,
        }


@dataclass(frozen=True)
class Decision:
    mode: str
    reasons: tuple[str, ...] = ()
    speculative_config: dict[str, Any] | None = None
    explanation: tuple[ModeVerdict, ...] = field(default=(), compare=False)

    def public_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "reasons": list(self.reasons), "speculative_config": self.speculative_config}


def _judge_canary(
    settings: LauncherSettings, target: CheckpointInspection, vllm: VllmCapabilities, arches: tuple, explain: bool
) -> tuple[dict[str, Any] | None, str, str]:
    """The DFlash2 canary's configuration when its gates pass (None otherwise), the reason, and
    the field a refusal names; judged only when requested or explained."""
    if settings.requested_mode != "dflash2_canary" and not explain:
        return None, "DFlash2 canary not requested (INFERENCE_MODE is not dflash2_canary)", "INFERENCE_MODE"
    try:
        from launcher.dflash2 import verify_dflash2_gate  # the canary's models load only when judged

        canary = verify_dflash2_gate(settings, target, vllm, arches)
    except AttestError as exc:  # every check of the canary, ours or attest's
        return None, f"DFlash2 canary disabled: {exc}", exc.field
    return canary, "explicit exact DFlash2 parity and target-hardware benchmark gates passed", ""


def _verdicts(
    decision: Decision,
    target: CheckpointInspection,
    settings: LauncherSettings,
    mtp_ready: bool,
    mtp_reasons: list[str],
    judged_canary: tuple[dict[str, Any] | None, str, str],
) -> tuple[ModeVerdict, ...]:
    """Every mode judged, for --explain: whether it could serve, whether it was chosen, and why."""
    canary, canary_reason, canary_field = judged_canary
    not_chosen = "not selected: AR was explicitly requested" if settings.requested_mode == "ar" else ""
    return (
        ModeVerdict(
            "autoregressive",
            True,
            decision.mode == "autoregressive",
            (f"installed vLLM serves the exact {target.profile.family} target; always the lossless fallback",),
        ),
        ModeVerdict(
            "native_mtp",
            mtp_ready,
            decision.mode == "native_mtp",
            tuple(mtp_reasons or ["exact native MTP head and installed vLLM support were proven"])
            + ((not_chosen,) if not_chosen and mtp_ready else ()),
        ),
        ModeVerdict(
            "dflash2_canary",
            canary is not None,
            decision.mode == "dflash2_canary",
            (canary_reason,)
            + ((not_chosen,) if not_chosen and canary is not None else ())
            + (
                ("not selected: INFERENCE_MODE is not dflash2_canary",)
                if canary is not None and settings.requested_mode in ("auto", "mtp")
                else ()
            ),
            canary_field,
        ),
    )


def select_mode(
    target: CheckpointInspection,
    vllm: VllmCapabilities,
    settings: LauncherSettings,
    *,
    hardware_arches: Sequence[str] = (),
    explain: bool = False,
) -> Decision:
    """Choose the mode; with `explain`, also judge every mode and say why."""
    if not vllm.installed or not vllm.qwen35_ar:
        raise LauncherError(
            f"installed vLLM cannot serve the exact {target.profile.family} target even in AR mode"
            + (f" ({'; '.join(vllm.reasons)})" if vllm.reasons else ""),
            field="vllm",
        )
    arches = tuple(str(item).lower() for item in hardware_arches)
    if settings.required_gpu_arch and settings.required_gpu_arch not in arches:
        raise LauncherError(
            f"required GPU architecture {settings.required_gpu_arch!r} was not found locally "
            f"(found {list(arches) or 'none'})",
            field="QWEN_REQUIRE_GPU_ARCH",
        )
    mtp_reasons: list[str] = []
    if not target.native_mtp_head:
        mtp_reasons.append(f"native MTP disabled: {target.mtp_reason}")
    if not vllm.native_mtp:
        mtp_reasons.append("native MTP disabled: installed vLLM capability probe failed")
    mtp_ready = target.native_mtp_head and vllm.native_mtp and settings.mtp_tokens == 1

    canary, canary_reason, canary_field = _judge_canary(settings, target, vllm, arches, explain)

    reasons = list(mtp_reasons)
    if settings.requested_mode == "ar":
        decision = Decision(mode="autoregressive", reasons=("AR was explicitly requested",))
    elif settings.requested_mode == "dflash2_canary" and canary is not None:
        decision = Decision(mode="dflash2_canary", reasons=(canary_reason,), speculative_config=canary)
    else:
        if settings.requested_mode == "dflash2_canary":
            reasons.append(canary_reason)
        if mtp_ready:
            reasons.append("exact native MTP head and installed vLLM support were proven")
            decision = Decision(
                mode="native_mtp",
                reasons=tuple(reasons),
                speculative_config={"method": "mtp", "num_speculative_tokens": 1},
            )
        else:
            reasons.append("using the quality-baseline autoregressive fallback")
            decision = Decision(mode="autoregressive", reasons=tuple(reasons))
    if not explain:
        return decision

    verdicts = _verdicts(decision, target, settings, mtp_ready, mtp_reasons, (canary, canary_reason, canary_field))
    return Decision(decision.mode, decision.reasons, decision.speculative_config, verdicts)


def explanation_table(verdicts: Sequence[ModeVerdict]) -> str:
    """A readable table: one row per mode, then its reasons indented."""
    lines = [f"{'MODE':<16} {'ACCEPTED':<9} {'SELECTED':<9} REASONS"]
    for verdict in verdicts:
        first, *rest = verdict.reasons or ("",)
        lines.append(
            f"{verdict.mode:<16} {'yes' if verdict.accepted else 'no':<9} {'*' if verdict.selected else '':<9} {first}"
        )
        lines.extend(f"{'':<36} {reason}" for reason in rest)
    return "\n".join(lines)
