"""The benchmarks' child processes: each run's wall time, its own CPU time and its peak RSS,
and a home of its own for oras (never the user's)."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu_s: float  # the child's user + system time (wait4's rusage): the client's own CPU
    rss_mb: int
    out: str

    def row(self, size: int) -> str:
        return f"{self.seconds:.2f} s, {self.cpu_s / (size / 1e9):.2f} s CPU/GB, {self.rss_mb} MB RSS"


def _peak_rss(pid: int, peak: list[int]) -> None:
    """The child's VmHWM, read from /proc while it runs (rusage's ru_maxrss would count the
    benchmark's own memory, which the child holds between fork and exec)."""
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        found = re.search(r"VmHWM:\s+(\d+) kB", status)
        if found is None:  # a zombie: it has exited
            return
        peak[0] = max(peak[0], int(found.group(1)))
        time.sleep(0.02)


def timed_child(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> Run:
    """Wall time, CPU time, peak RSS and stdout of a child process."""
    peak = [0]
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=output, stderr=errors, cwd=cwd, env=env)
        watcher = threading.Thread(target=_peak_rss, args=(process.pid, peak), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        watcher.join()
        if process.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"{' '.join(argv[:5])} failed: {errors.read().decode()[-3000:]}")
        output.seek(0)
        return Run(seconds, usage.ru_utime + usage.ru_stime, peak[0] // 1024, output.read().decode())


@functools.cache
def oras_env() -> dict[str, str]:
    """oras's own home (its config and credentials): never the user's, and one exists under
    `bazel test`, which sets no HOME."""
    home = tempfile.mkdtemp(prefix="oras-home-", dir=os.environ.get("BENCH_DIR"))
    atexit.register(shutil.rmtree, home, True)
    return {**os.environ, "HOME": home, "DOCKER_CONFIG": home}
