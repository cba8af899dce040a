"""Write a checkpoint lock from the hub's metadata, for review and commit.

    bazel run //boot:lock -- --output images/deepseek_spark.checkpoint.lock.json
        [--repo deepseek-ai/DeepSeek-V4.1-Flash] [--revision <40-hex>] [--force]

HF_ENDPOINT selects the hub or mirror and HF_TOKEN authenticates (huggingface_hub). The lock
lists every file of the revision with its size and digest. Review it, commit it, then pin
its sha256 (printed) as `model.lock_sha256` in the image's pin document: from then on the
hub is only checked against it. Exits 0 with the sha256 on stdout, 2 with one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from attest.edge.refusal import refusing_main
from attest.files import require_replaceable, write_atomic
from attest.lock import REVIEWED
from attest.primitives import require_revision
from boot.checkpoint import hub
from boot.errors import BootError
from boot.settings import REPO, REVISION, url_or_empty


@refusing_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="boot-lock", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", default=REPO)
    parser.add_argument("--revision", default=REVISION, help="a full 40-hex commit (default: boot's pin)")
    parser.add_argument(
        "--output", type=Path, required=True, help="where to write the lock (relative to where `bazel run` was started)"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing file at --output")
    parser.add_argument("--stall-timeout", type=float, default=120.0, help="seconds without bytes (default 120)")
    args = parser.parse_args(argv)
    revision = require_revision(args.revision, "--revision")
    output = (
        args.output if args.output.is_absolute() else Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / args.output
    )
    if output.exists() and not args.force:
        raise BootError(f"--output {output} exists; pass --force to replace it", field="--output")
    require_replaceable(output, frozenset({"repo", "revision", "files"}), what="a checkpoint lock", field="--output")
    endpoint = url_or_empty(os.environ.get("HF_ENDPOINT", ""), "HF_ENDPOINT")
    listing = hub.fetch_listing(args.repo, revision, stall_s=args.stall_timeout, endpoint=endpoint)
    lock = hub.lock_from_listing(args.repo, revision, listing, REVIEWED)
    data = lock.document_bytes()
    write_atomic(output, data, field="--output")
    digest = hashlib.sha256(data).hexdigest()
    print(
        f"boot-lock: wrote {output}: {len(lock.files)} files, {lock.total_bytes / 1e9:.2f} GB at {revision}; "
        f"review it, commit it, and pin model.lock_sha256 = {digest}",
        file=sys.stderr,
    )
    print(digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
