"""Generate a speculative-decoding gate: parity, then benchmark, then the gate document.

    python -m tools.gate.cli --ar-url http://127.0.0.1:8103 --spec-url http://127.0.0.1:8104 \
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
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from attest.documents import parse_document
from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from attest.errors import AttestError
from attest.files import canonical_json, require_replaceable, write_atomic
from attest.primitives import require_revision
from attest.speculation import DFlash2Gate
from tools.gate.benchmark import MIN_SAMPLES, run_benchmark
from tools.gate.corpus import CORPUS, CORPUS_SHA256, PARITY_CASES, benchmark_request
from tools.gate.openai_client import KEY_VARIABLE, Deadline, Endpoint, PeerError, acceptance
from tools.gate.parity import run_corpus
from tools.settings import GATE, tools_help

Progress = Callable[[str], None]
WARMUP_REQUESTS = 2


def require_loopback(url: str, flag: str) -> str:
    host = urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if urlsplit(url).scheme not in ("http", "https") or not loopback:
        raise AttestError(
            f"{flag} must be an http(s) URL on loopback (the servers run on this host), got {url!r}", field=flag
        )
    return url


def describe(endpoint: Endpoint, client: httpx.Client) -> dict[str, Any]:
    """Preflight: one authorised request, which must succeed before the run sends hundreds;
    what the server says of itself (models, version) is recorded."""
    models = endpoint.get_json(client, "/v1/models")
    ids = (
        [item.get("id") for item in models.get("data", []) if isinstance(item, dict)]
        if isinstance(models, dict) and isinstance(models.get("data"), list)
        else None
    )
    if ids is None:
        raise PeerError(f"{endpoint.name} server: /v1/models is not an OpenAI model list")
    if endpoint.model not in ids:
        raise PeerError(
            f"{endpoint.name} server serves {ids}, not the model {endpoint.model!r} "
            f"({'--model' if endpoint.name == 'ar' else '--spec-model'})"
        )
    try:
        version = endpoint.get_json(client, "/version")
    except PeerError:
        version = None
    return {"url": endpoint.url, "models": ids, "version": version}


def _warm_up(endpoint: Endpoint, client: httpx.Client) -> None:
    for index in range(WARMUP_REQUESTS):
        endpoint.chat(client, benchmark_request(index))


def _checked_inputs(args: argparse.Namespace) -> tuple[dict[str, str], Endpoint, Endpoint]:
    """The pinned revisions the gate binds, and both loopback endpoints under one deadline."""
    key = os.environ.get(KEY_VARIABLE, "")
    if args.samples < 1:
        raise AttestError("--samples must be positive", field="--samples")
    if args.request_timeout <= 0 or args.deadline <= 0:
        raise AttestError(
            "--request-timeout and --deadline must be positive seconds",
            field="--request-timeout" if args.request_timeout <= 0 else "--deadline",
        )
    binding = {
        "target_revision": require_revision(args.target_revision, "--target-revision"),
        "speculator_revision": require_revision(args.speculator_revision, "--speculator-revision"),
        "vllm_commit": require_revision(args.engine_commit, "--engine-commit"),
    }
    deadline = Deadline(args.deadline)
    ar = Endpoint("ar", require_loopback(args.ar_url, "--ar-url"), args.model, key, args.request_timeout, deadline)
    spec = Endpoint(
        "speculative",
        require_loopback(args.spec_url, "--spec-url"),
        args.spec_model or args.model,
        key,
        args.request_timeout,
        deadline,
    )
    return binding, ar, spec


def _gate_document(
    args: argparse.Namespace,
    binding: dict[str, str],
    parity_reasons: list[str],
    benchmark: dict[str, Any],
    results: dict[str, Any],
) -> dict[str, Any]:
    """The gate document: parity (its reasons and the hash of every result) and the benchmark."""
    covered = [case for case in PARITY_CASES if any(item["case"] == case for item in CORPUS)]
    parity = {
        "passed": not parity_reasons,
        "covers": covered,
        "corpus_sha256": CORPUS_SHA256,
        "result_sha256": hashlib.sha256(canonical_json(results)).hexdigest(),
        "reasons": parity_reasons,
        "benchmark_samples_compared": benchmark.get("samples_per_mode", 0) * len(args.concurrency),
    }
    document = {
        "schema_version": "1",
        "engine": args.engine,
        "target_model_id": args.target_model_id,
        **binding,
        "speculator_model_id": args.speculator_model_id,
        "hardware_profile": args.hardware_profile,
        "gpu_arch": args.gpu_arch,
        "parity": parity,
        "benchmark": benchmark,
    }
    return document


def generate(args: argparse.Namespace, progress: Progress) -> tuple[DFlash2Gate, dict[str, Any]]:
    binding, ar, spec = _checked_inputs(args)
    results: dict[str, Any] = {
        "host": {"node": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "corpus_sha256": CORPUS_SHA256,
    }
    parity_reasons: list[str] = []
    benchmark: dict[str, Any] = {
        "passed": False,
        "concurrency": sorted(args.concurrency),
        "samples_per_mode": 0,
        "ar_p95_ms": 0.0,
        "dflash2_p95_ms": 0.0,
        "reasons": [],
    }
    with ar.client() as ar_client, spec.client() as spec_client:
        try:
            results["servers"] = {"ar": describe(ar, ar_client), "speculative": describe(spec, spec_client)}
            progress("warming up both servers")
            _warm_up(ar, ar_client)
            _warm_up(spec, spec_client)
        except PeerError as exc:
            # Stop at once: hundreds of failing requests would only bury the reason.
            parity_reasons.append(f"preflight: {exc}")
            benchmark["reasons"] = [f"not run: preflight failed: {exc}"]
        else:
            parity_reasons, results["parity"] = run_corpus(ar, spec, ar_client, spec_client, progress)
            metrics_before = spec.metrics(spec_client)
            benchmark, sample_reasons, results["benchmark"] = run_benchmark(
                ar,
                spec,
                ar_client,
                spec_client,
                samples=args.samples,
                concurrency=args.concurrency,
                min_improvement=args.min_improvement,
                progress=progress,
            )
            parity_reasons += sample_reasons
            acceptance_stats = acceptance(metrics_before, spec.metrics(spec_client))
            results["acceptance"] = acceptance_stats
            for name in ("acceptance_rate", "mean_accepted_length"):
                if name in acceptance_stats:
                    benchmark[name] = acceptance_stats[name]
    document = _gate_document(args, binding, parity_reasons, benchmark, results)
    return parse_document(DFlash2Gate, document, label="generated gate"), results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gate", description=__doc__, epilog=tools_help(GATE), formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2],
        help="comma-separated levels (default 1,2)",
    )
    parser.add_argument("--min-improvement", type=float, default=5.0, help="p95 improvement in percent")
    parser.add_argument(
        "--request-timeout", type=float, default=300.0, help="seconds one request may take (default 300)"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=3600.0,
        help="seconds the whole run may take; past it the gate fails (default 3600)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="the gate file (relative to the directory `bazel run` was started from)",
    )
    args = parser.parse_args(argv)
    if not args.output.is_absolute():
        args.output = Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / args.output
    return args


def results_table(gate: DFlash2Gate) -> str:
    """mode, concurrency, p50/p95/p99 latency and TPOT, acceptance: docs/gpu-runbook.md's table."""
    bench = gate.benchmark
    rows = [
        "| mode | concurrency | p50 ms | p95 ms | p99 ms | TPOT p50 ms | TPOT p95 ms | TPOT p99 ms | acceptance |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    accepted = "-" if bench.acceptance_rate is None else f"{bench.acceptance_rate:.1%}"
    if bench.mean_accepted_length is not None:
        accepted += f", mean length {bench.mean_accepted_length:g}"
    for level in bench.per_concurrency:
        for mode, prefix in (("AR", "ar"), ("speculative", "dflash2")):
            values = [
                getattr(level, f"{prefix}{part}_ms")
                for part in ("_p50", "_p95", "_p99", "_tpot_p50", "_tpot_p95", "_tpot_p99")
            ]
            cells = ["-" if value is None else f"{value:.2f}" for value in values]
            rows.append(
                f"| {mode} | {level.concurrency} | {' | '.join(cells)} | {accepted if prefix == 'dflash2' else '-'} |"
            )
    return "\n".join(rows)


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    args = parse_args(argv)

    def progress(message: str) -> None:
        print(f"gate: {message}", file=sys.stderr, flush=True)

    # Checked before the run, which takes long: a path holding something else is never replaced.
    require_replaceable(
        args.output, frozenset({"schema_version", "parity", "benchmark"}), what="a gate", field="--output"
    )
    require_replaceable(
        args.output.with_name(args.output.name + ".results.json"),
        frozenset({"corpus_sha256"}),
        what="a gate's results",
        field="--output",
    )
    gate, results = generate(args, progress)
    data = canonical_json(gate.model_dump(mode="json", exclude_none=True))
    write_atomic(args.output.with_name(args.output.name + ".results.json"), canonical_json(results), field="--output")
    write_atomic(args.output, data, field="--output")
    digest = hashlib.sha256(data).hexdigest()
    if gate.benchmark.per_concurrency:
        print(results_table(gate), file=sys.stderr)
    if not (gate.parity.passed and gate.benchmark.passed):
        # A failing gate leads with its reasons and offers nothing to pin.
        for reason in gate.parity.reasons + gate.benchmark.reasons:
            print(f"gate: FAILED: {reason}", file=sys.stderr)
        print(
            f"gate: FAILED; wrote {args.output} (passed: false; the launcher will not enable the canary with it)",
            file=sys.stderr,
        )
        return 1
    print(
        f"gate: PASSED; AR p95 {gate.benchmark.ar_p95_ms} ms, speculative p95 {gate.benchmark.dflash2_p95_ms} ms; "
        f"wrote {args.output}; pin it with QWEN_DFLASH2_GATE_SHA256={digest}",
        file=sys.stderr,
    )
    print(digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
