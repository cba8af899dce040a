"""Generate a speculative-decoding gate: parity, then benchmark, then the gate document.

    python -m tools.gate.generate --ar-url http://127.0.0.1:8103 --spec-url http://127.0.0.1:8104 \
        --model qwen3.8-27b --target-revision <40-hex> --speculator-revision <40-hex> \
        --engine-commit <40-hex> --output gate.json

The API key comes from OMNI_GATE_API_KEY (never from the command line). Both endpoints
must be loopback: run this on the GPU host beside the two servers. Parity divergences
and p95 regressions produce a gate with `passed: false` and the reasons, never a
passing one. The gate is written atomically and its sha256 printed for
QWEN_DFLASH2_GATE_SHA256; the raw results go beside it (<output>.results.json).
"""
from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from attest.documents import DFlash2Gate, parse_document
from attest.errors import AttestError, report_refusal
from attest.files import canonical_json, write_atomic
from attest.primitives import require_revision
from tools.gate.corpus import BENCHMARK_MAX_TOKENS, BENCHMARK_PROMPTS, CORPUS, CORPUS_SHA256, PARITY_CASES
from tools.gate.stats import percentile

MIN_SAMPLES = 100
REQUIRED_CONCURRENCY = (1, 2)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    model: str
    api_key: str

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url.rstrip("/"), headers=headers, timeout=600)


def require_loopback(url: str, flag: str) -> str:
    host = urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if urlsplit(url).scheme not in ("http", "https") or not loopback:
        raise AttestError(f"{flag} must be an http(s) URL on loopback (the servers run on this host), got {url!r}",
                          field=flag)
    return url


def _chat(client: httpx.Client, model: str, request: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"model": model, **request})
    response.raise_for_status()
    return response.json()


def _cancel_then_follow_up(client: httpx.Client, model: str, request: dict[str, Any]) -> dict[str, Any]:
    """Start a streamed answer, drop the connection after the first chunk, then prove the
    server still answers the first greedy case exactly."""
    chunks = 0
    with client.stream("POST", "/v1/chat/completions", json={"model": model, **request}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                chunks += 1
                break
    follow_up = _chat(client, model, CORPUS[0]["request"])
    return {"cancelled_after_chunks": chunks, "follow_up": follow_up["choices"][0]["message"].get("content")}


def observe(client: httpx.Client, model: str, item: dict[str, Any]) -> Any:
    """What the comparison of `item` looks at, from one endpoint."""
    if item["compare"] == "cancel":
        return _cancel_then_follow_up(client, model, item["request"])
    result = _chat(client, model, item["request"])
    choice = result["choices"][0]
    message = choice.get("message") or {}
    if item["compare"] == "tool_calls":
        return [{"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"] or "{}")}
                for call in message.get("tool_calls") or []]
    if item["compare"] == "json":
        return json.loads(message.get("content") or "null")
    if item["compare"] == "stop":
        return {"content": message.get("content"), "finish_reason": choice.get("finish_reason")}
    return message.get("content")


def _observe_safely(client: httpx.Client, model: str, item: dict[str, Any]) -> Any:
    try:
        return {"ok": observe(client, model, item)}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_parity(ar: Endpoint, spec: Endpoint, progress: Progress) -> tuple[dict[str, Any], dict[str, Any]]:
    results: dict[str, Any] = {"ar": {}, "speculative": {}}
    reasons: list[str] = []
    with ar.client() as ar_client, spec.client() as spec_client:
        for number, item in enumerate(CORPUS, 1):
            progress(f"parity {number}/{len(CORPUS)}: {item['id']}")
            got_ar = _observe_safely(ar_client, ar.model, item)
            got_spec = _observe_safely(spec_client, spec.model, item)
            results["ar"][item["id"]], results["speculative"][item["id"]] = got_ar, got_spec
            if "error" in got_ar or "error" in got_spec:
                reasons.append(f"parity {item['id']} ({item['case']}): request failed "
                               f"(AR: {got_ar.get('error', 'ok')}; speculative: {got_spec.get('error', 'ok')})")
            elif got_ar != got_spec:
                reasons.append(f"parity divergence in {item['id']} ({item['case']}): AR {json.dumps(got_ar['ok'])[:160]}"
                               f" vs speculative {json.dumps(got_spec['ok'])[:160]}")
            elif item["compare"] == "stop" and (got_ar["ok"]["finish_reason"] != "stop" or any(
                    s in (got_ar["ok"]["content"] or "") for s in item["request"]["stop"])):
                reasons.append(f"parity {item['id']}: the stop sequence did not end the answer on either endpoint")
            elif item["compare"] == "cancel" and not got_ar["ok"]["cancelled_after_chunks"]:
                reasons.append(f"parity {item['id']}: no streamed chunk arrived before the cancel")
    covered = [case for case in PARITY_CASES if any(item["case"] == case for item in CORPUS)]
    result_sha256 = hashlib.sha256(canonical_json(results)).hexdigest()
    parity = {"passed": not reasons, "covers": covered, "corpus_sha256": CORPUS_SHA256,
              "result_sha256": result_sha256, "reasons": reasons}
    return parity, results


def _latencies(endpoint: Endpoint, samples: int, concurrency: int, progress: Progress) -> tuple[list[float], int]:
    done = failures = 0

    def one(index: int) -> float | None:
        nonlocal done, failures
        request = {"temperature": 0, "max_tokens": BENCHMARK_MAX_TOKENS,
                   "messages": [{"role": "user", "content": BENCHMARK_PROMPTS[index % len(BENCHMARK_PROMPTS)]}]}
        started = time.perf_counter()
        try:
            _chat(client, endpoint.model, request)
            latency: float | None = (time.perf_counter() - started) * 1000
        except httpx.HTTPError:
            failures += 1
            latency = None
        done += 1
        if done % 10 == 0 or done == samples:
            progress(f"benchmark {endpoint.name} concurrency {concurrency}: {done}/{samples}")
        return latency

    with endpoint.client() as client, ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(one, range(samples)))
    return [value for value in latencies if value is not None], failures


def run_benchmark(ar: Endpoint, spec: Endpoint, *, samples: int, concurrency: list[int], min_improvement: float,
                  progress: Progress) -> dict[str, Any]:
    reasons: list[str] = []
    per_level, all_ar, all_spec = [], [], []
    counts = []
    for level in concurrency:
        ar_ms, ar_failed = _latencies(ar, samples, level, progress)
        spec_ms, spec_failed = _latencies(spec, samples, level, progress)
        if ar_failed or spec_failed:
            reasons.append(f"concurrency {level}: {ar_failed} AR and {spec_failed} speculative requests failed")
        counts += [len(ar_ms), len(spec_ms)]
        all_ar += ar_ms
        all_spec += spec_ms
        if ar_ms and spec_ms:
            per_level.append({"concurrency": level, "samples": min(len(ar_ms), len(spec_ms)),
                              "ar_p50_ms": round(percentile(ar_ms, 50), 3), "ar_p95_ms": round(percentile(ar_ms, 95), 3),
                              "dflash2_p50_ms": round(percentile(spec_ms, 50), 3),
                              "dflash2_p95_ms": round(percentile(spec_ms, 95), 3)})
    samples_per_mode = min(counts) if counts else 0
    if samples_per_mode < MIN_SAMPLES:
        reasons.append(f"only {samples_per_mode} samples per mode and concurrency level; at least {MIN_SAMPLES} needed")
    missing = [level for level in REQUIRED_CONCURRENCY if level not in concurrency]
    if missing:
        reasons.append(f"concurrency levels {missing} were not measured; 1 and 2 are required")
    ar_p95 = round(percentile(all_ar, 95), 3) if all_ar else 0.0
    spec_p95 = round(percentile(all_spec, 95), 3) if all_spec else 0.0
    if not all_ar or not all_spec or spec_p95 >= ar_p95:
        reasons.append(f"speculative p95 {spec_p95} ms does not beat AR p95 {ar_p95} ms")
    elif (ar_p95 - spec_p95) / ar_p95 * 100 < min_improvement:
        reasons.append(f"speculative p95 improvement {(ar_p95 - spec_p95) / ar_p95 * 100:.1f}% is below "
                       f"{min_improvement}%")
    return {"passed": not reasons, "concurrency": sorted(concurrency), "samples_per_mode": samples_per_mode,
            "ar_p95_ms": ar_p95, "dflash2_p95_ms": spec_p95, "per_concurrency": per_level, "reasons": reasons}


def generate(args: argparse.Namespace, progress: Progress) -> tuple[DFlash2Gate, dict[str, Any]]:
    key = os.environ.get("OMNI_GATE_API_KEY", "")
    ar = Endpoint("ar", require_loopback(args.ar_url, "--ar-url"), args.model, key)
    spec = Endpoint("speculative", require_loopback(args.spec_url, "--spec-url"), args.spec_model or args.model, key)
    binding = {
        "target_revision": require_revision(args.target_revision, "--target-revision"),
        "speculator_revision": require_revision(args.speculator_revision, "--speculator-revision"),
        "vllm_commit": require_revision(args.engine_commit, "--engine-commit"),
    }
    if args.samples < 1:
        raise AttestError("--samples must be positive", field="--samples")
    parity, results = run_parity(ar, spec, progress)
    benchmark = run_benchmark(ar, spec, samples=args.samples, concurrency=args.concurrency,
                              min_improvement=args.min_improvement, progress=progress)
    document = {
        "schema_version": "1", "engine": args.engine,
        "target_model_id": args.target_model_id, **binding,
        "speculator_model_id": args.speculator_model_id,
        "hardware_profile": args.hardware_profile, "gpu_arch": args.gpu_arch,
        "parity": parity, "benchmark": benchmark,
    }
    return parse_document(DFlash2Gate, document, label="generated gate"), results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ar-url", required=True, help="the autoregressive server (loopback)")
    parser.add_argument("--spec-url", required=True, help="the speculative server of the same target (loopback)")
    parser.add_argument("--model", required=True, help="served model name on the AR server")
    parser.add_argument("--spec-model", help="served model name on the speculative server (default: --model)")
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--engine-commit", required=True, help="the measured engine's full commit")
    parser.add_argument("--target-model-id", default="Qwen/Qwen3.8-27B")
    parser.add_argument("--target-revision", required=True)
    parser.add_argument("--speculator-model-id", default="incoai/Qwen3.8-27B-DFlash2")
    parser.add_argument("--speculator-revision", required=True)
    parser.add_argument("--hardware-profile", default="mi300x_single")
    parser.add_argument("--gpu-arch", default="gfx942")
    parser.add_argument("--samples", type=int, default=MIN_SAMPLES, help="per mode and concurrency level")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                        help="comma-separated levels (default 1,2)")
    parser.add_argument("--min-improvement", type=float, default=5.0, help="p95 improvement in percent")
    parser.add_argument("--output", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def progress(message: str) -> None:
        print(f"gate: {message}", file=sys.stderr, flush=True)

    try:
        gate, results = generate(args, progress)
    except AttestError as exc:
        return report_refusal(exc)
    data = canonical_json(gate.model_dump(mode="json"))
    write_atomic(args.output.with_name(args.output.name + ".results.json"), canonical_json(results))
    write_atomic(args.output, data)
    digest = hashlib.sha256(data).hexdigest()
    verdict = "PASSED" if gate.parity.passed and gate.benchmark.passed else "FAILED"
    for reason in gate.parity.reasons + gate.benchmark.reasons:
        print(f"gate: {reason}", file=sys.stderr)
    print(f"gate: {verdict}; AR p95 {gate.benchmark.ar_p95_ms} ms, speculative p95 {gate.benchmark.dflash2_p95_ms} ms; "
          f"wrote {args.output}; pin it with QWEN_DFLASH2_GATE_SHA256={digest}", file=sys.stderr)
    print(digest)
    return 0 if verdict == "PASSED" else 1


if __name__ == "__main__":
    raise SystemExit(main())
