"""Local accelerator discovery from the vendors' own reports (rocminfo, nvidia-smi).

Never imports torch and never opens a socket. Missing tools mean "nothing found".
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

GPU_ARCH_RE = re.compile(r"\bgfx[0-9a-f]+\b", re.IGNORECASE)
MAX_REPORT_CHARS = 8_000_000
VENDOR_TOOL_TIMEOUT_S = 8  # a hung driver stack must not hold the start: after this, nothing was found


def _tool(name: str, fallback: str) -> str | None:
    found = shutil.which(name)
    if not found and Path(fallback).is_file():
        found = fallback
    return found


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    import subprocess  # only where a vendor tool exists: a start without one does not pay for it

    try:
        completed = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=VENDOR_TOOL_TIMEOUT_S, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return (completed.stdout + "\n" + completed.stderr)[:MAX_REPORT_CHARS]


def detect_rocm_architectures() -> tuple[str, ...]:
    """gfx names from rocminfo, e.g. ('gfx942',)."""
    command = _tool("rocminfo", "/opt/rocm/bin/rocminfo")
    if not command:
        return ()
    env = {**os.environ, "ROCR_VISIBLE_DEVICES": os.environ.get("ROCR_VISIBLE_DEVICES", "0")}
    return tuple(sorted({match.lower() for match in GPU_ARCH_RE.findall(_run([command], env))}))


def detect_nvidia_gpus() -> tuple[dict[str, str], ...]:
    """Name and compute capability of each NVIDIA GPU; reported, never required."""
    command = _tool("nvidia-smi", "/usr/bin/nvidia-smi")
    if not command:
        return ()
    report = _run([command, "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    gpus = []
    for line in report.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0] and re.fullmatch(r"\d+\.\d+", parts[1]):
            gpus.append({"name": parts[0], "compute_capability": parts[1]})
    return tuple(gpus)
