"""Push an OCI layout by digest: `python -m tools.oci.push LAYOUT REGISTRY/REPO[:TAG]`.

Up to four blobs go up at once. Blobs already in the target are skipped (HEAD). Base layers a
shallow layout only references are mounted from the base's repository when it is on the same
registry, else streamed from the base's registry straight into the target, never touching
disk. Blobs over 256 MB go up in 64 MB chunks (PATCH); a failed upload is retried from the
start with backoff, each attempt named on stderr; progress is printed per blob.
Prints REGISTRY/REPO@sha256:... on stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from omni_oci.format.errors import OciError
from omni_oci.remote.push import push
from tools.oci.push_record import record_push


def read_tags(path: Path) -> list[str]:
    """Tags from a file: one per line; blank lines and `#` comments skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OciError(f"tags file {path} cannot be read: {exc}", field=str(path)) from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_status(paths: list[Path]) -> dict[str, str]:
    """Bazel's workspace status files (`KEY value` lines): what stamped tags may use."""
    status: dict[str, str] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(" ")
            if key:
                status[key] = value
    return status


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    parser = argparse.ArgumentParser(
        prog="push", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("layout", type=Path)
    parser.add_argument("target", help="REGISTRY/REPO[:TAG]")
    args = parser.parse_args(argv)
    report = push(args.layout, args.target, progress=lambda line: print(f"push: {line}", file=sys.stderr, flush=True))
    print(
        f"pushed: {len(report.uploaded)} uploaded ({report.uploaded_bytes} bytes), {len(report.mounted)} mounted, "
        f"{len(report.streamed)} streamed from the base registry, {len(report.present)} already present",
        file=sys.stderr,
    )
    record_push(report.reference, report.digest)
    print(report.reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
