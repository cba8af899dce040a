"""Verify a pushed Omni image for its consumer, without pulling its large layers.

    bazel run //tools/oci:verify -- REGISTRY/REPO@sha256:... --key cosign.pub

The checks are omni_oci.signing.verify's: the signature and signed provenance (Sigstore
bundles where any refer to the image, else cosign's legacy tags), then the baked pins, labels
and layer list against them. Exit 0 with a summary, or 2 with {"ok": false, "error", "field"}.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from omni_oci.signing.verify import LAYOUTS, verify_image


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    parser = argparse.ArgumentParser(
        prog="verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reference", help="REGISTRY/REPO@sha256:...")
    parser.add_argument("--key", type=Path, required=True, help="the signer's PEM public key")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="where the signatures are: Sigstore bundles where any refer to the image, else cosign's legacy "
        "tags (auto, the default); or only one of them",
    )
    args = parser.parse_args(argv)
    key = Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / args.key  # where the user typed it
    summary = verify_image(args.reference, key, layout=args.layout)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
