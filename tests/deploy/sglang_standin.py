"""The stand-in SGLang of the podman group test, installed as pip installs SGLang: one tar layer
with an `sglang` distribution at the engine commit the pins name, whose `sglang.launch_server`
runs one rank of tests/fixtures/fake_sglang_group.py, and an `nvidia-smi` that lists one GB10.
Both land where the image's Debian python3 and PATH find them, so boot starts, checks and runs
the stand-in exactly as it runs SGLang in the release image (its pinned identity included).

    sglang_standin --pins deepseek_spark.pins.json --output standin.tar FIXTURE.py ...
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path

from tests.fixtures.vendor_base import installed_engine

# Debian 12's python3 (the image's local base) reads /usr/local/lib/python3.11/dist-packages.
SITE = "usr/local/lib/python3.11/dist-packages"
VERSION = "0.5.23"
LAUNCH_SERVER = b'''"""Stand-in: `python3 -m sglang.launch_server ARGS` runs one rank of the group stand-in."""

from tests.fixtures.fake_sglang_group import main

raise SystemExit(main())
'''
NVIDIA_SMI = b"""#!/usr/bin/python3 -I
# Stand-in for the node's nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits.
print("NVIDIA GB10, 122880")
"""


def members(commit: str, fixtures: list[Path]) -> dict[str, tuple[bytes, int]]:
    """Image path -> (bytes, mode) of every file the layer holds."""
    extra = {"sglang/launch_server.py": LAUNCH_SERVER}
    for package in ("tests", "tests/fixtures"):
        extra[f"{package}/__init__.py"] = b""
    for fixture in fixtures:
        extra[f"tests/fixtures/{fixture.name}"] = fixture.read_bytes()
    files = installed_engine(SITE, "sglang", VERSION, package="sglang", direct_url_commit=commit, extra=extra)
    layer = {name: (data, 0o644) for name, data in files.items()}
    layer["usr/local/bin/nvidia-smi"] = (NVIDIA_SMI, 0o755)
    return layer


def write_tar(output: Path, layer: dict[str, tuple[bytes, int]]) -> None:
    with tarfile.open(output, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, (data, mode) in sorted(layer.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pins", type=Path, required=True, help="the image's pin document (engine.commit)")
    parser.add_argument("--output", type=Path, required=True, help="the tar to write")
    parser.add_argument("fixtures", type=Path, nargs="+", help="tests/fixtures modules the stand-in imports")
    args = parser.parse_args()
    commit = json.loads(args.pins.read_text())["engine"]["commit"]
    if not commit:
        parser.error(f"{args.pins}: engine.commit is empty; the stand-in is installed at the pinned commit")
    write_tar(args.output, members(commit, args.fixtures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
