"""The benchmark: the same greedy requests to both servers, interleaved, each pair also a
parity sample. A speculator that is fast because it answers less fails here: its answers
differ from autoregressive ones, or the work per sample is below the floor.

Per-output-token time (TPOT) here is a request's latency divided by its completion tokens,
measured on whole (non-streamed) answers: it is comparable between the two servers because
both decode the same tokens for the same prompt.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from tools.gate.corpus import BENCHMARK_MAX_TOKENS, benchmark_request
from tools.gate.openai_client import DeadlinePassed, Endpoint, PeerError
from tools.gate.parity import Answer, compare, honesty_problem
from tools.gate.stats import percentile

MIN_SAMPLES = 100
REQUIRED_CONCURRENCY = (1, 2)
MIN_MEDIAN_COMPLETION_TOKENS = 64
Progress = Callable[[str], None]


@dataclass
class Sample:
    index: int
    latency_ms: float | None = None
    answer: Answer | None = None
    error: str | None = None
    deadline_passed: bool = False

    @property
    def tpot_ms(self) -> float | None:
        tokens = self.answer.completion_tokens if self.answer else None
        return self.latency_ms / tokens if self.latency_ms is not None and tokens else None


def _one(endpoint: Endpoint, client: httpx.Client, index: int) -> Sample:
    sample = Sample(index)
    started = time.perf_counter()
    try:
        completion = endpoint.chat(client, benchmark_request(index))
        sample.latency_ms = (time.perf_counter() - started) * 1000
        sample.answer = Answer.of(completion)
    except PeerError as exc:
        sample.error = str(exc)
        sample.deadline_passed = isinstance(exc, DeadlinePassed)
    return sample


def run_level(
    ar: Endpoint,
    spec: Endpoint,
    ar_client: httpx.Client,
    spec_client: httpx.Client,
    *,
    level: int,
    samples: int,
    progress: Progress,
) -> tuple[list[Sample], list[Sample]]:
    """`samples` requests per server at `level` concurrent requests, in rounds that alternate
    which server goes first, so drift on a noisy host falls on both alike."""
    ar_samples: list[Sample] = []
    spec_samples: list[Sample] = []
    with ThreadPoolExecutor(level) as pool:
        for round_number, start in enumerate(range(0, samples, level)):
            indices = list(range(start, min(start + level, samples)))
            order = [(ar, ar_client, ar_samples), (spec, spec_client, spec_samples)]
            for endpoint, client, sink in order if round_number % 2 == 0 else order[::-1]:
                sink += pool.map(lambda index: _one(endpoint, client, index), indices)
            done = len(ar_samples)
            if done % 10 < level or done == samples:
                progress(f"benchmark concurrency {level}: {done}/{samples} per server")
            if any(sample.deadline_passed for sample in ar_samples[-level:] + spec_samples[-level:]):
                break
    return ar_samples, spec_samples


def _percentiles(values: list[float], prefix: str) -> dict[str, float]:
    return {f"{prefix}_p{q}_ms": round(percentile(values, q), 3) for q in (50, 95, 99)} if values else {}


def judge_level(
    level: int, ar_samples: list[Sample], spec_samples: list[Sample]
) -> tuple[dict[str, Any], list[str], list[str]]:
    """One level's statistics, its parity reasons and its benchmark reasons."""
    parity: list[str] = []
    errors: list[str] = []
    mismatched = 0
    for ar_sample, spec_sample in zip(ar_samples, spec_samples):
        name = f"benchmark sample c{level}-{ar_sample.index}"
        for side, sample in (("AR", ar_sample), ("speculative", spec_sample)):
            if sample.error:
                errors.append(f"{name}: {side} request failed: {sample.error}")
            elif problem := honesty_problem(sample.answer, BENCHMARK_MAX_TOKENS):
                parity.append(f"{name}: {side} answer is inconsistent: {problem}")
        if ar_sample.answer and spec_sample.answer and (why := compare(ar_sample.answer, spec_sample.answer)):
            mismatched += 1
            if mismatched == 1:
                parity.append(f"{name}: speculative output differs from AR: {why}")
    if mismatched > 1:
        parity.append(f"concurrency {level}: {mismatched} of {len(ar_samples)} benchmark samples differ from AR")
    ok = [(a, s) for a, s in zip(ar_samples, spec_samples) if a.latency_ms is not None and s.latency_ms is not None]
    stats: dict[str, Any] = {"concurrency": level, "samples": len(ok)}
    for prefix, side in (("ar", 0), ("dflash2", 1)):
        stats.update(_percentiles([pair[side].latency_ms for pair in ok], prefix))
        stats.update(_percentiles([t for pair in ok if (t := pair[side].tpot_ms) is not None], f"{prefix}_tpot"))
    reasons = errors[:3] + ([f"concurrency {level}: {len(errors)} requests failed"] if len(errors) > 3 else [])
    return stats, parity, reasons


def _raw_samples(ar_samples: list, spec_samples: list) -> dict[str, list[dict[str, Any]]]:
    """One concurrency level's samples of both sides, as the results file records them."""
    return {
        side: [
            {"index": s.index, "latency_ms": s.latency_ms, "error": s.error, **(s.answer.as_json() if s.answer else {})}
            for s in sink
        ]
        for side, sink in (("ar", ar_samples), ("speculative", spec_samples))
    }


def _coverage_reasons(per_level: list[dict[str, Any]], samples_per_mode: int, median_tokens: float) -> list[str]:
    """Why the measurement does not cover enough: samples, levels, decoding work, and each
    level whose speculative p95 does not beat AR's."""
    reasons: list[str] = []
    if samples_per_mode < MIN_SAMPLES:
        reasons.append(f"only {samples_per_mode} samples per mode and concurrency level; at least {MIN_SAMPLES} needed")
    missing = [level for level in REQUIRED_CONCURRENCY if level not in [s["concurrency"] for s in per_level]]
    if missing:
        reasons.append(f"concurrency levels {missing} were not measured; 1 and 2 are required")
    if median_tokens < MIN_MEDIAN_COMPLETION_TOKENS:
        reasons.append(
            f"the median benchmark completion is {median_tokens:g} tokens; at least "
            f"{MIN_MEDIAN_COMPLETION_TOKENS} are needed so each sample does real decoding work"
        )
    for level in per_level:
        ar_p95, spec_p95 = level.get("ar_p95_ms", 0.0), level.get("dflash2_p95_ms", 0.0)
        if spec_p95 <= 0 or spec_p95 >= ar_p95:
            reasons.append(
                f"concurrency {level['concurrency']}: speculative p95 {spec_p95} ms does not beat AR p95 {ar_p95} ms"
            )
    return reasons


def run_benchmark(
    ar: Endpoint,
    spec: Endpoint,
    ar_client: httpx.Client,
    spec_client: httpx.Client,
    *,
    samples: int,
    concurrency: list[int],
    min_improvement: float,
    progress: Progress,
) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The benchmark section of the gate, the parity reasons it found, and its raw samples."""
    reasons: list[str] = []
    parity_reasons: list[str] = []
    per_level: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    all_ar: list[float] = []
    all_spec: list[float] = []
    ar_tokens: list[int] = []
    for level in concurrency:
        ar_samples, spec_samples = run_level(
            ar, spec, ar_client, spec_client, level=level, samples=samples, progress=progress
        )
        stats, level_parity, level_reasons = judge_level(level, ar_samples, spec_samples)
        parity_reasons += level_parity
        reasons += level_reasons
        if stats["samples"]:
            per_level.append(stats)
        all_ar += [s.latency_ms for s in ar_samples if s.latency_ms is not None]
        all_spec += [s.latency_ms for s in spec_samples if s.latency_ms is not None]
        ar_tokens += [s.answer.completion_tokens or 0 for s in ar_samples if s.answer]
        raw[f"concurrency_{level}"] = _raw_samples(ar_samples, spec_samples)
        if any(sample.deadline_passed for sample in ar_samples + spec_samples):
            break
    samples_per_mode = min((level["samples"] for level in per_level), default=0)
    median_tokens = statistics.median(ar_tokens) if ar_tokens else 0
    reasons += _coverage_reasons(per_level, samples_per_mode, median_tokens)
    ar_p95 = round(percentile(all_ar, 95), 3) if all_ar else 0.0
    spec_p95 = round(percentile(all_spec, 95), 3) if all_spec else 0.0
    # A side without samples has p95 0.0, which fails one of these two.
    if spec_p95 <= 0 or spec_p95 >= ar_p95:
        reasons.append(f"speculative p95 {spec_p95} ms does not beat AR p95 {ar_p95} ms")
    elif (improvement := (ar_p95 - spec_p95) / ar_p95 * 100) < min_improvement:
        reasons.append(f"speculative p95 improvement {improvement:.1f}% is below {min_improvement}%")
    section = {
        "passed": not reasons and not parity_reasons,
        "concurrency": sorted(concurrency),
        "samples_per_mode": samples_per_mode,
        "ar_p95_ms": ar_p95,
        "dflash2_p95_ms": spec_p95,
        "median_completion_tokens": median_tokens,
        "per_concurrency": per_level,
        "reasons": reasons,
    }
    if parity_reasons and not reasons:
        section["reasons"] = ["benchmark outputs differ from AR (see parity reasons): the timing compares unequal work"]
    return section, parity_reasons, raw
