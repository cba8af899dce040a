"""The tools a benchmark measures against (crane, openssl, ...): found on PATH, or a one-line
refusal naming the tool and how set-up installs it; and the machine's sha256 limit.

A benchmark states its peers first (`require`), so a missing one ends the run at once with
`<bench>: crane is not on PATH: tools/setup installs it (Debian package crane)` and exit 2,
before minutes of synthetic data are written, never with a traceback halfway through.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

# Each peer: the Debian package that provides it, and who installs it.
PACKAGES = {
    "crane": ("crane", "tools/setup installs it"),
    # Only the model benchmark uses it, so set-up leaves it out: Debian 13 has it.
    "oras": ("oras", "`apt-get install oras` (Debian 13 and later)"),
    "docker-registry": ("docker-registry", "tools/setup installs it"),
    "openssl": ("openssl", "Debian's openssl; `apt-get install openssl`"),
    "sha256sum": ("coreutils", "part of every Debian"),
    "dd": ("coreutils", "part of every Debian"),
}


def require(bench: str, *names: str) -> dict[str, str]:
    """name -> path of each peer; a missing one exits 2 with one line naming it."""
    found: dict[str, str] = {}
    for name in names:
        path = shutil.which(name)
        if path is None:
            package, how = PACKAGES[name]
            print(f"{bench}: {name} is not on PATH: {how} (Debian package {package})", file=sys.stderr)
            raise SystemExit(2)
        found[name] = path
    return found


def optional(name: str) -> tuple[str | None, str]:
    """(path, "") of a peer a benchmark can do without, or (None, why it is missing)."""
    path = shutil.which(name)
    if path is None:
        package, how = PACKAGES[name]
        return None, f"not measured: {name} is not on PATH: {how} (Debian package {package})"
    return path, ""


def openssl_sha256_per_core_mb_s(openssl: str, seconds: int = 3) -> float:
    """`openssl speed` sha256 on one core, 16 KiB blocks (MB/s): the hashing limit per core."""
    out = subprocess.run(
        [openssl, "speed", "-seconds", str(seconds), "-bytes", "16384", "-evp", "sha256"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # last line: "sha256   <thousands of bytes per second>k"
    value = re.findall(r"([\d.]+)k\s*$", out.strip().splitlines()[-1])[0]
    return float(value) * 1000 / 1e6


def cores() -> int:
    return os.cpu_count() or 1
