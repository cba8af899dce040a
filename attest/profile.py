"""Target profiles: the exact model, hardware and modes a launcher image serves, as a document.

A profile replaces constants: the checkpoint's architecture and text shapes, its vocabulary,
its MTP layout, the hardware profile, the modes the image may choose, the DFlash2 drafter it
may pair with, and how the server is started. The image's pins name the profile
(`target_profile`); the launcher reads exactly that one (launcher.profiles).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from attest.documents import Document

PROFILE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# Each is what vLLM's --dtype accepts for it; the aliases are vLLM's too.
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}
DTYPES = ("float16", "bfloat16", "float32")
Mode = Literal["autoregressive", "native_mtp", "dflash2_canary"]


def _name(value: str) -> str:
    if not PROFILE_NAME_RE.fullmatch(value):
        raise ValueError(f"must match {PROFILE_NAME_RE.pattern}")
    return value


ProfileName = Annotated[str, AfterValidator(_name)]
Exact = int | str | bool  # a config value compared exactly (JSON types; strict: 1 is not true)


class MtpLayout(Document):
    """What proves a native MTP head: the config field declaring its layers, and the weight
    groups (tensor-name prefixes) that must all be in the weight index."""

    layers_field: str = Field(min_length=1)
    layers: int = Field(gt=0)
    weight_groups: list[str] = Field(min_length=1)
    groups_label: str = Field(min_length=1)  # how reasons name the groups, e.g. "mtp.layers/fc/norm"


class DrafterProfile(Document):
    """The one DFlash2 drafter the canary may pair with this target."""

    model_id: str = Field(min_length=1)
    architecture: str = Field(min_length=1)
    shape: dict[str, Exact] = Field(min_length=1)
    drafter_config: dict[str, Exact | list[int]] = Field(min_length=1)
    weight_file: str = Field(min_length=1)
    speculative_tokens: int = Field(gt=0)


class HardwareProfile(Document):
    """`profile` is what OMNI_HARDWARE_PROFILE must say; `gpu_arch` what the vendor tool must
    report for a gated canary ("" on a CPU profile, which has no canary)."""

    profile: str = Field(min_length=1)
    gpu_arch: str = ""
    description: str = Field(min_length=1)


class ServerProfile(Document):
    """How vLLM is started for this target: the --dtype values allowed (the first is the
    default) and the flags that depend on the hardware."""

    dtypes: list[Literal["float16", "bfloat16", "float32"]] = Field(min_length=1)
    prefix_caching: bool
    chunked_prefill: bool
    gpu_memory_utilization: bool
    enforce_eager: bool
    # vLLM's --tool-call-parser (with --enable-auto-tool-choice); None: no tool calls, as the
    # seed's server has none. vLLM refuses a forced tool_choice without one.
    tool_call_parser: str | None = Field(default=None, pattern=r"^[a-z0-9_]{1,40}$")


class TargetProfile(Document):
    schema_version: Literal["1"]
    name: ProfileName
    display_name: str = Field(min_length=1)  # "Qwen3.8-27B"
    family: str = Field(min_length=1)  # "Qwen3.8": what the engine must be able to serve
    test_only: bool = False
    model_id: str = Field(min_length=1)
    architecture: str = Field(min_length=1)
    model_type: str = Field(min_length=1)
    # The config.json key of the nested text config (multimodal checkpoints), or None where
    # the text fields are at the top level.
    text_config: str | None
    text_shape: dict[str, Exact] = Field(min_length=1)
    mtp: MtpLayout | None
    hardware: HardwareProfile
    modes: list[Mode] = Field(min_length=1)
    dflash2: DrafterProfile | None
    server: ServerProfile

    @model_validator(mode="after")
    def _modes_have_their_evidence(self) -> "TargetProfile":
        if self.modes[0] != "autoregressive" or len(set(self.modes)) != len(self.modes):
            raise ValueError("modes must start with autoregressive (the lossless fallback) and list each mode once")
        if ("native_mtp" in self.modes) != (self.mtp is not None):
            raise ValueError("native_mtp is allowed exactly when an mtp layout is given")
        if ("dflash2_canary" in self.modes) != (self.dflash2 is not None):
            raise ValueError("dflash2_canary is allowed exactly when a dflash2 drafter is given")
        if "dflash2_canary" in self.modes and not self.hardware.gpu_arch:
            raise ValueError("dflash2_canary needs hardware.gpu_arch: its gate is measured on that accelerator")
        return self

    def text_fields(self, config: dict) -> tuple[dict | None, str]:
        """The part of config.json holding the text shape, and how to name a field of it."""
        if self.text_config is None:
            return config, ""
        nested = config.get(self.text_config)
        return (nested if isinstance(nested, dict) else None), f"{self.text_config}."
