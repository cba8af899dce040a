"""Write a checkpoint's `.omni-checkpoint.json` and print its sha256.

    python -m launcher.build_attestation /models/qwen --revision <40-hex> [--hash-shards]

The printed digest is what QWEN_CHECKPOINT_MANIFEST_SHA256 pins. An operator convenience,
not a download provenance oracle: obtain and verify the immutable revision first.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Sequence

from attest.documents import CHECKPOINT_ATTESTATION_FILE
from attest.edge.refusal import refusing_main, report_refusal
from attest.errors import AttestError
from attest.files import canonical_json, require_replaceable, write_atomic
from launcher.checkpoint import build_checkpoint_attestation
from launcher.target import DEFAULT_PROFILE, PROFILE_SETTING, load_target_profile, shipped_profiles


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="build_attestation", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "model_path",
        nargs="?",
        default=os.environ.get("MODEL_PATH", ""),
        help="the local checkpoint directory (default: $MODEL_PATH)",
    )
    parser.add_argument(
        "--profile",
        default=os.environ.get(PROFILE_SETTING, DEFAULT_PROFILE),
        help=f"the target profile, one of {', '.join(shipped_profiles())} "
        f"(default: ${PROFILE_SETTING} or {DEFAULT_PROFILE})",
    )
    parser.add_argument("--model-id", default=None, help="default: $MODEL_ID or the profile's model id")
    parser.add_argument(
        "--revision",
        default=os.environ.get("MODEL_REVISION", ""),
        help="the pinned 40-hex revision (default: $MODEL_REVISION)",
    )
    parser.add_argument(
        "--hash-shards",
        action="store_true",
        help="also record each shard's size and sha256, so the launcher catches a swapped shard",
    )
    parser.add_argument("--output", type=Path, help=f"default: MODEL_PATH/{CHECKPOINT_ATTESTATION_FILE}")
    return parser.parse_args(argv)


@refusing_main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Refusals name what the user typed: the flag, or the variable its default came from.
    path_setting = "MODEL_PATH argument" if args.model_path != os.environ.get("MODEL_PATH", "") else "MODEL_PATH"
    revision_setting = "--revision" if args.revision != os.environ.get("MODEL_REVISION", "") else "MODEL_REVISION"
    if not args.model_path:
        return report_refusal(
            AttestError("no checkpoint directory: give it as the first argument or set MODEL_PATH", field="MODEL_PATH")
        )
    profile = load_target_profile(args.profile, field="--profile")
    model_id = os.environ.get("MODEL_ID", profile.model_id) if args.model_id is None else args.model_id
    attestation = build_checkpoint_attestation(
        Path(args.model_path),
        model_id=model_id,
        revision=args.revision,
        hash_shards=args.hash_shards,
        path_setting=path_setting,
        revision_setting=revision_setting,
        profile=profile,
    )
    data = canonical_json(attestation.model_dump(mode="json", exclude_none=True))
    output = args.output or Path(args.model_path) / CHECKPOINT_ATTESTATION_FILE
    try:
        require_replaceable(
            output,
            frozenset({"schema_version", "model_id", "revision"}),
            what="a checkpoint attestation",
            field="--output" if args.output else "MODEL_PATH",
        )
    except AttestError as exc:
        return report_refusal(exc)
    write_atomic(output, data, field="--output")
    digest = hashlib.sha256(data).hexdigest()
    print(f"wrote {output}; pin it with QWEN_CHECKPOINT_MANIFEST_SHA256={digest}", file=sys.stderr)
    print(digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
