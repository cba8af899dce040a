"""The DFlash2 documents (schema_version "1"): the speculator attestation bound to its exact
target, and the parity/benchmark gate. Imported only where a canary is judged or a gate
is generated."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from attest.documents import Document
from attest.primitives import Revision, Sha256

SPECULATOR_ATTESTATION_FILE = ".omni-speculator.json"


class TargetBinding(Document):
    model_id: str
    revision: Revision


class WeightFile(Document):
    path: str
    size: int = Field(ge=0)
    sha256: Sha256


class SpeculatorAttestation(Document):
    """`.omni-speculator.json`: a DFlash2 drafter bound to its exact target."""

    schema_version: Literal["1"]
    model_id: str
    revision: Revision
    target: TargetBinding
    config_sha256: Sha256
    weight_files: list[WeightFile]


PARITY_CASES = ("greedy", "sampling", "tool_json", "stop_and_cancel")


class ParityResult(Document):
    passed: bool
    covers: list[str]
    corpus_sha256: Sha256
    result_sha256: Sha256
    reasons: list[str] = []
    # Added evidence (absent from seed-format gates): benchmark samples also compared token for token.
    benchmark_samples_compared: int | None = Field(default=None, ge=0)


class ConcurrencyResult(Document):
    """Latency of one concurrency level, per mode (milliseconds)."""

    concurrency: int
    samples: int
    ar_p50_ms: float
    ar_p95_ms: float
    dflash2_p50_ms: float
    dflash2_p95_ms: float
    # Added evidence (absent from seed-format gates): tails and per-output-token time.
    ar_p99_ms: float | None = None
    dflash2_p99_ms: float | None = None
    ar_tpot_p50_ms: float | None = None
    ar_tpot_p95_ms: float | None = None
    ar_tpot_p99_ms: float | None = None
    dflash2_tpot_p50_ms: float | None = None
    dflash2_tpot_p95_ms: float | None = None
    dflash2_tpot_p99_ms: float | None = None


class BenchmarkResult(Document):
    passed: bool
    concurrency: list[int]
    samples_per_mode: int
    ar_p95_ms: float
    dflash2_p95_ms: float
    per_concurrency: list[ConcurrencyResult] = []
    reasons: list[str] = []
    # Added evidence (absent from seed-format gates).
    median_completion_tokens: float | None = None
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None


class DFlash2Gate(Document):
    """The parity and target-hardware benchmark gate a DFlash2 canary needs.

    `engine` says which server was measured; `vllm_commit` carries that engine's commit
    (the field keeps the launcher's original name; for SGLang DSpark it is SGLang's).
    """

    schema_version: Literal["1"]
    engine: Literal["vllm", "sglang"] = "vllm"
    target_model_id: str
    target_revision: Revision
    speculator_model_id: str
    speculator_revision: Revision
    vllm_commit: Revision
    hardware_profile: str
    gpu_arch: str
    parity: ParityResult
    benchmark: BenchmarkResult
