"""Every benchmark still runs: each `tools/dev/bench` py_binary, through its Bazel target, at the
smallest size that still goes through every code path (a few MB, one run, the peers it compares
against included), exits 0 and prints its table. A benchmark the BUILD file gains without a row
here fails the test; a missing peer is one line naming it, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

BENCH = Path("tools/dev/bench")

# target -> (smallest arguments, a line of its table that only a finished run prints)
SMOKE = {
    "launcher_inspect": (["--runs", "1", "--shards", "4"], r"launcher --inspect-only, 4 shards, 1 fresh processes"),
    "boot_prepare": (["--gb", "0.004", "--files", "2"], r"\(b\)/\(a\) = [\d.]+ \(target <= 1.15\)"),
    "boot_resume": (["--gb", "0.004", "--runs", "1"], r"\(b\) sent [\d.]+x the file"),
    "boot_verify": (
        ["--gb", "0.004", "--files", "2", "--small", "10", "--speed-seconds", "1"],
        r"limit: openssl speed +\d+ MB/s",
    ),
    "image_rebuild": (["--sizes", "0.002", "--rebuilds", "1"], r"0.002G +\d+ms +\d+ms +\d+ms"),
    "push": (["--size-gb", "0.004", "--layers", "2"], r"crane push +[\d.]+ +1.00"),
    "model_artifact": (
        ["--size-gb", "0.004", "--files", "2", "--small-files", "3", "--memory-gb", "0.004"]
        + ["--speed-seconds", "1", "--dd-mb", "4"],
        r"re-push, every blob present \(0 uploaded\)",
    ),
    "mirror": (["--size-gb", "0.004", "--files", "2"], r"mirror again, everything present +[\d.]+ s"),
    "pin": (["--size-gb", "0.004", "--layers", "2", "--runs", "1"], r"crane export IMAGE - > /dev/null +[\d.]+ +1.00"),
}


def _targets() -> list[str]:
    """The py_binary names of the benchmarks' BUILD file."""
    text = (BENCH / "BUILD.bazel").read_text()
    return re.findall(r'py_binary\(\s*name = "([^"]+)"', text)


def _run(name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    work = Path(os.environ.get("TEST_TMPDIR", "/tmp")) / f"bench-{name}"
    work.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "BENCH_DIR": str(work), **(env or {})}
    return subprocess.run(
        [str(BENCH / name), *args], capture_output=True, text=True, timeout=120, env=environment, check=False
    )


def test_every_benchmark_target_has_a_smoke_row() -> None:
    targets = _targets()
    assert len(targets) >= 8  # the parse found the file's binaries
    assert sorted(set(targets) - set(SMOKE)) == [], "benchmarks without a row in SMOKE"
    assert sorted(set(SMOKE) - set(targets)) == [], "rows for benchmarks the BUILD file no longer has"


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_at_its_smallest_size_and_prints_its_table(name: str) -> None:
    args, table = SMOKE[name]
    completed = _run(name, args)  # how long it takes is the benchmark's to measure, not this test's
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert re.search(table, completed.stdout), completed.stdout


@pytest.mark.parametrize("name", ["image_rebuild", "push", "model_artifact", "mirror", "pin", "boot_verify"])
def test_a_missing_peer_is_one_line_naming_it_and_how_to_install_it(name: str, tmp_path: Path) -> None:
    """PATH without the peers (the binaries name their interpreter by its absolute path)."""
    completed = _run(name, SMOKE[name][0], env={"PATH": str(tmp_path)})
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr[-2000:]
    assert re.fullmatch(rf"{name}: [a-z0-9-]+ is not on PATH: .+ \(Debian package [a-z0-9-]+\)", lines[0]), lines
