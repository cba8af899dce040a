"""Fetch a base image SHALLOW: its manifest and config only, never its layers.

    python -m tools.oci.base --image docker.io/rocm/vllm --digest sha256:... \
        --platform linux/amd64 --output DIR [--registry MIRROR]

Both digests are verified; an index is resolved to the pinned platform. DIR receives
manifest.json and config.json (exact bytes) and base.json (where the layers live). The release
bases' repository rule (tools/private/extensions/bases.bzl) runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from omni_oci.remote.shallow_base import fetch_base


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    parser = argparse.ArgumentParser(
        prog="base", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", required=True)
    parser.add_argument("--digest", default="")
    parser.add_argument("--platform", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--registry", default="", help="fetch from this mirror instead (same digests)")
    args = parser.parse_args(argv)
    fetch_base(args.image, args.digest, args.platform, args.output, registry=args.registry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
