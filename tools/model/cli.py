"""Models as signed OCI artifacts, from a checkpoint lock:

    bazel run //tools/model -- pack --model DIR --lock LOCK --output PACK [--signing-key KEY]
    bazel run //tools/model -- push PACK REGISTRY/REPO[:TAG]          (signed with OMNI_SIGNING_KEY_FILE)
    bazel run //tools/model -- push --model DIR --lock LOCK REGISTRY/REPO[:TAG]   (pack and push, one pass)
    bazel run //tools/model -- pull REGISTRY/REPO@sha256:... DIR --lock LOCK [--key cosign.pub]
    bazel run //tools/model -- verify REGISTRY/REPO@sha256:... --key cosign.pub [--lock LOCK]

Each locked file becomes one uncompressed tar layer holding it at its lock path; the lock
itself travels as the last layer (.omni-artifact.lock.json) and as manifest annotations. Two
manifests share the layers: a plain OCI image (what Kubernetes image volumes mount) and a
ModelPack artifact (application/vnd.cncf.model.manifest.v1+json) referring to it. A signed
push (and pack --signing-key) also carries an OpenSSF Model Signing signature of the files as
model.sig, which pull places beside them: `model_signing verify key DIR --signature
DIR/model.sig --public_key cosign.pub` checks a pulled or mounted directory. Relative
paths are taken from the directory `bazel run` was started in. Results are JSON on stdout;
a refusal is one JSON line on stderr and exit 2. See docs/models.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from omni_oci.model.artifact import PLATFORMS
from omni_oci.model.errors import ModelError
from omni_oci.model.pack import load_lock_bytes, pack, read_pack, summary, write_pack
from omni_oci.model.pull import expected_lock, pull
from omni_oci.model.push import PUSH_JOBS, push_artifact, push_checkpoint, push_summary
from omni_oci.model.sign import signed_artifact
from omni_oci.model.verify import signed, verify_artifact
from omni_oci.signing.bundles import BUNDLES_ONLY_WARNING
from omni_oci.signing.verify import LAYOUTS
from tools.settings import user_path
from tools.signing_key import release_signing_key


def _progress(command: str):
    return lambda line: print(f"{command}: {line}", file=sys.stderr, flush=True)


def _lock_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lock", type=user_path, help="the checkpoint lock the artifact must carry")
    parser.add_argument("--lock-sha256", default="", help="or only its sha256 (the image pin model.lock_sha256)")


def _expected(args: argparse.Namespace, *, required: bool = True):
    if args.lock is None and not args.lock_sha256 and not required:
        return None
    data = load_lock_bytes(args.lock)[1] if args.lock is not None else None
    return expected_lock(data, args.lock_sha256)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="model", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="make the artifact's documents from a checkpoint and its lock")
    packing.add_argument("--model", type=user_path, required=True, help="the checkpoint directory")
    packing.add_argument("--lock", type=user_path, required=True, help="its checkpoint lock")
    packing.add_argument("--output", type=user_path, required=True, help="the pack directory to write")
    packing.add_argument("--platform", default="linux/amd64", choices=PLATFORMS, help="of the plain image's config")
    packing.add_argument(
        "--signing-key", type=Path, help="PEM ECDSA P-256 key: sign the files as model.sig (OpenSSF Model Signing)"
    )
    pushing = commands.add_parser(
        "push",
        help="push a pack (its files from the checkpoint), or --model and --lock in one pass; signed",
        usage="model push (PACK | --model DIR --lock LOCK [--platform P]) REGISTRY/REPO[:TAG] [options]",
    )
    pushing.add_argument(
        "places", nargs="+", metavar="[PACK] TARGET", help="a pack `pack --output` wrote, then REGISTRY/REPO[:TAG]"
    )
    pushing.add_argument("--model", type=user_path, help="the checkpoint directory (instead of a pack: one pass)")
    pushing.add_argument("--lock", type=user_path, help="its checkpoint lock (with --model)")
    pushing.add_argument(
        "--platform", default="linux/amd64", choices=PLATFORMS, help="with --model: of the plain image's config"
    )
    pushing.add_argument("--tag", action="append", default=[], help="another tag (repeatable)")
    pushing.add_argument("--signing-key", type=Path, help="PEM ECDSA P-256 key (else OMNI_SIGNING_KEY_FILE)")
    pushing.add_argument("--unsigned", action="store_true", help="push without signature or provenance")
    pushing.add_argument(
        "--no-model-signature",
        action="store_true",
        help="with --model: sign the manifests but carry no model.sig (a pack carries what pack made)",
    )
    pushing.add_argument(
        "--legacy-signatures",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also push cosign's legacy .sig/.att tags beside the Sigstore bundles (default on for this release)",
    )
    pushing.add_argument("--jobs", type=int, default=PUSH_JOBS, help=f"blobs in flight (default {PUSH_JOBS})")
    pulling = commands.add_parser("pull", help="pull an artifact by digest into a directory, verified")
    pulling.add_argument("reference", help="REGISTRY/REPO@sha256:...")
    pulling.add_argument("directory", type=user_path)
    pulling.add_argument("--key", type=user_path, help="check the signature first, with this PEM public key")
    _lock_options(pulling)
    verifying = commands.add_parser("verify", help="check a pushed artifact without pulling its files")
    verifying.add_argument("reference", help="REGISTRY/REPO@sha256:...")
    verifying.add_argument("--key", type=user_path, required=True, help="the signer's PEM public key")
    verifying.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="where the signatures are: Sigstore bundles where any refer to the artifact, else cosign's "
        "legacy tags (auto, the default); or only one of them",
    )
    _lock_options(verifying)
    return parser


def _push(args: argparse.Namespace) -> dict:
    one_pass = args.model is not None or args.lock is not None
    if len(args.places) != (1 if one_pass else 2) or (one_pass and (args.model is None or args.lock is None)):
        raise ModelError("push takes PACK TARGET, or --model DIR --lock LOCK TARGET (one pass, no pack)", field="push")
    if args.no_model_signature and not one_pass:
        raise ModelError(
            "--no-model-signature is for push --model; a pack carries the model signature pack made (or none)",
            field="--no-model-signature",
        )
    key = None if args.unsigned else release_signing_key(args.signing_key)
    options = {
        "key": key,
        "tags": args.tag,
        "jobs": args.jobs,
        "progress": _progress("push"),
        "legacy_signatures": args.legacy_signatures,
    }
    if one_pass:
        lock, lock_bytes = load_lock_bytes(args.lock)
        report = push_checkpoint(
            args.model,
            lock,
            lock_bytes,
            args.places[0],
            platform=args.platform,
            model_signed=not args.no_model_signature,
            **options,
        )
    else:
        artifact, model = read_pack(user_path(args.places[0]))
        report = push_artifact(artifact, model, args.places[1], **options)
    if report.signed and not args.legacy_signatures:
        print(f"push: {BUNDLES_ONLY_WARNING}", file=sys.stderr)
    return push_summary(report)


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    args = _parser().parse_args(argv)
    if args.command == "pack":
        lock, lock_bytes = load_lock_bytes(args.lock)
        key = release_signing_key(args.signing_key) if args.signing_key is not None else None
        artifact = pack(args.model, lock, lock_bytes, platform=args.platform)
        artifact = signed_artifact(artifact, args.model, key) if key is not None else artifact
        write_pack(artifact, args.model, args.output)
        result = summary(artifact)
    elif args.command == "push":
        result = _push(args)
    elif args.command == "pull":
        check = (lambda client, ref: signed(client, ref, args.key)) if args.key is not None else None
        result = pull(args.reference, args.directory, _expected(args), progress=_progress("pull"), before_files=check)
    else:
        result = verify_artifact(args.reference, args.key, _expected(args, required=False), layout=args.layout)
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
