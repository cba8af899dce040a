"""Fill an image's pins from the registry and the hub, or check that upstream has not moved.

    bazel run //tools/pin -- IMAGE [--base-tag TAG] [--model-ref REF] [--speculator-ref REF]
                                   [--deadline S] [--write | --check]

IMAGE names images/IMAGE.pins.json. What is resolved, each value computed here:
  base.digest          the manifest digest of base.platform for the tag (an index is resolved
                       to that platform), from OMNI_BASE_MIRROR when set
  engine.*             the engine's commit (full only) and RECORD digest, read from the base's
                       layers as they stream (whiteouts honoured, nothing unpacked)
  model.revision       the hub's 40-hex commit for the ref (HF_ENDPOINT, HF_TOKEN)
  base.contents_sha256 the sha256 of IMAGE.base-contents.json, written beside the pins: every
                       package the base installs (dpkg's database, each copyright file, every
                       Python distribution's metadata and RECORD digest), for the release's SBOM
  model.lock_sha256    where the image pins a checkpoint lock: the lock of the listing at that
                       revision, written beside the pins as IMAGE.checkpoint.lock.json
  speculator.revision  as the model's
  model.artifact.digest  where the image names its model artifact (or --model-artifact
                       REGISTRY/REPO[:TAG]): the manifest digest of the tag, refused unless the
                       artifact carries the pinned checkpoint lock (docs/models.md)
  model.signature      with --model-signature FILE and --model-signer-key PEM (or
                       --model-signer-chain PEM, the root certificates you trust, or
                       --model-signer-identity ID --model-signer-issuer URL, Sigstore's keyless
                       method, verified offline against a pinned trusted root): a
                       publisher's OpenSSF Model Signing signature, verified and naming
                       exactly the lock's files and digests; the lock's trust is then
                       publisher-signed, and the pins record the signer and the file's sha256

Without --write it prints a table (pin, current, upstream) and the diff, and writes nothing.
--write writes the pins (and lock and base contents) atomically. --check exits 1 when any pin
differs from upstream (a tag names another digest, a ref another revision, an empty pin) or the
committed base contents are not the pinned bytes. A refusal
(an unreachable source, a platform missing from the index, a base without the engine or
with two of it) exits 2 with one JSON line naming the pin and the source.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from attest.documents import parse_document
from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from attest.errors import AttestError
from attest.files import write_atomic
from attest.lock import PUBLISHER_SIGNED, CheckpointLock
from attest.pins import ImagePins
from attest.reader import MAX_JSON_BYTES, loads_object, read_file
from boot.settings import url_or_empty
from omni_oci.format.reference import Reference
from tools.pin.artifact import ArtifactUpstream, resolve_artifact
from tools.pin.report import contents_state, proposed_pins, shown
from tools.pin.signature import PublisherSignature, Signer, keyless_signer, publisher_signature
from tools.pin.upstream import ModelUpstream, Upstream, resolve_base, resolve_model
from tools.settings import PIN, tools_help, user_path

IMAGE_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
PINS_SUFFIX = ".pins.json"
LOCK_SUFFIX = ".checkpoint.lock.json"
CONTENTS_SUFFIX = ".base-contents.json"
DEFAULT_DEADLINE_S = 3600.0


def _workspace(given: Path | None) -> Path:
    if given is not None:
        return given
    return Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY") or ".")


def _artifact(
    args: argparse.Namespace, current: dict[str, Any], model_id: str, model, deadline: float
) -> ArtifactUpstream | None:
    """The model artifact's pin, where the pins name one or --model-artifact does."""
    pinned = (current.get("model") or {}).get("artifact")
    if not args.model_artifact and not pinned:
        return None
    if args.model_artifact:
        ref = Reference.parse(args.model_artifact)
        if ref.digest:
            raise AttestError(
                "--model-artifact: name REGISTRY/REPO[:TAG]; the digest is what pin finds", field="--model-artifact"
            )
        pinned = {"repository": f"{ref.registry}/{ref.repository}", "tag": ref.tag or "", "digest": ""}
    from attest.pins import ArtifactPin

    pin = parse_document(ArtifactPin, pinned, label="model.artifact")
    try:
        return resolve_artifact(pin, "", model_id, model, deadline=deadline)
    except AttestError as exc:  # the registry's and the hub's deadline alike
        if exc.field == "deadline":
            raise AttestError(f"{exc} (--deadline {args.deadline:g} s)", field="--deadline") from None
        raise


def _signed_model(
    args: argparse.Namespace, pins: ImagePins, model: ModelUpstream, endpoint: str, deadline: float
) -> tuple[ModelUpstream, PublisherSignature | None]:
    """With --model-signature: the publisher's signature checked against the resolved lock,
    whose trust becomes publisher-signed. Pins that record one and no signature given: refused,
    since the lock would silently lose that trust."""
    if args.model_signature is None:
        if pins.model.signature is not None:
            raise AttestError(
                f"the pins record a publisher signature of the model ({pins.model.signature.signer}): pass "
                "--model-signature FILE --model-signer-key PEM again, or remove model.signature to pin a "
                "reviewed lock",
                field="model.signature",
            )
        return model, None
    assert model.lock is not None  # run() refused pins that lock no checkpoint, before any request
    signer = Signer(
        key=args.model_signer_key,
        roots=args.model_signer_chain,
        keyless=keyless_signer(
            args.model_signer_identity, args.model_signer_issuer, args.model_trust_root, args.model_trust_root_sha256
        )
        if args.model_signer_identity
        else None,
    )
    try:
        signature = publisher_signature(args.model_signature, signer, model.lock, endpoint=endpoint, deadline=deadline)
    except AttestError as exc:
        if exc.field == "deadline":
            raise AttestError(f"{exc} (--deadline {args.deadline:g} s)", field="--deadline") from None
        raise
    signed = {**model.lock.model_dump(mode="json", exclude_none=True), "trust": PUBLISHER_SIGNED}
    lock = parse_document(CheckpointLock, {**signed, "signed_by": signature.signer}, label="the publisher-signed lock")
    return dataclasses.replace(model, lock=lock, lock_bytes=lock.document_bytes()), signature


def run(args: argparse.Namespace) -> int:
    if not IMAGE_NAME.fullmatch(args.image):
        raise AttestError(
            f"IMAGE {args.image!r} must be an image name such as qwen_mi300x (lower case, digits, _)", field="IMAGE"
        )
    images = _workspace(args.workspace) / "images"
    pins_path = images / f"{args.image}{PINS_SUFFIX}"
    if not pins_path.is_file():
        known = sorted(path.name[: -len(PINS_SUFFIX)] for path in images.glob(f"*{PINS_SUFFIX}"))
        raise AttestError(f"{pins_path} does not exist; images with pins: {', '.join(known) or 'none'}", field="IMAGE")
    read = read_file(pins_path, label=pins_path.name, max_bytes=MAX_JSON_BYTES)  # once: checked and kept
    current = loads_object(read.data, label=pins_path.name)
    pins = parse_document(ImagePins, current, label=pins_path.name)
    mirror = os.environ.get("OMNI_BASE_MIRROR", "").strip()
    endpoint = url_or_empty(os.environ.get("HF_ENDPOINT", ""), "HF_ENDPOINT")
    if args.speculator_ref and pins.speculator is None:
        raise AttestError(f"--speculator-ref: {pins_path.name} pins no speculator", field="--speculator-ref")
    if args.model_signature is not None and pins.model.lock_sha256 is None:
        raise AttestError(
            f"--model-signature: {pins_path.name} locks no checkpoint (model.lock_sha256)", field="--model-signature"
        )
    deadline = time.monotonic() + args.deadline
    try:
        base = resolve_base(pins, args.base_tag or pins.base.tag, mirror, deadline=deadline)
        model = resolve_model(pins.model, args.model_ref, endpoint, "model", deadline=deadline)
        speculator = (
            resolve_model(pins.speculator, args.speculator_ref, endpoint, "speculator", deadline=deadline)
            if pins.speculator is not None
            else None
        )
    except AttestError as exc:  # the registry's and the hub's deadline alike
        if exc.field == "deadline":
            raise AttestError(f"{exc} (--deadline {args.deadline:g} s)", field="--deadline") from None
        raise
    model, signature = _signed_model(args, pins, model, endpoint, deadline)
    artifact = _artifact(args, current, pins.model.id, model, deadline)
    proposed, notes = proposed_pins(current, Upstream(base, model, speculator), artifact, signature)
    contents_path = images / f"{args.image}{CONTENTS_SUFFIX}"
    contents_notes, stale = contents_state(contents_path, pins.base.contents_sha256, base.contents)
    moved, diff, after = shown(current, proposed, notes + contents_notes, pins_path.name)
    lock_path = images / f"{args.image}{LOCK_SUFFIX}"
    if args.write:
        write_atomic(contents_path, base.contents)
        print(f"pin: wrote {contents_path} (sha256 {base.contents_sha256}): review it and commit it", file=sys.stderr)
        if model.lock is not None:
            write_atomic(lock_path, model.lock_bytes)
            print(f"pin: wrote {lock_path} (sha256 {model.lock_sha256}): review it and commit it", file=sys.stderr)
        if diff:
            write_atomic(pins_path, after)
            print(f"pin: wrote {pins_path}", file=sys.stderr)
        return 0
    if stale:
        print(f"pin: {stale}", file=sys.stderr)
    if args.check and (moved or stale):
        moved = moved + [contents_path.name] if stale else moved
        print(f"pin: upstream differs from the pins of {args.image}: {', '.join(moved)}", file=sys.stderr)
        return 1
    return 0


def _seconds(text: str) -> float:
    if not re.fullmatch(r"[0-9]{1,7}(\.[0-9]{1,3})?", text) or float(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds (ASCII digits), got {text!r}")
    return float(text)


def _signature_flags(parser: argparse.ArgumentParser) -> None:
    """--model-signature and whom it must name: a key, root certificates, or a keyless identity."""
    parser.add_argument(
        "--model-signature",
        type=user_path,
        metavar="FILE",
        help="a publisher's OpenSSF Model Signing signature (model.sig) of the model: verified and compared "
        "with the lock's files (docs/models.md#a-publishers-signature)",
    )
    signer = parser.add_mutually_exclusive_group()
    signer.add_argument(
        "--model-signer-key", type=user_path, metavar="PEM", help="the publisher's public key (the key method)"
    )
    signer.add_argument(
        "--model-signer-chain",
        type=user_path,
        metavar="PEM",
        help="root certificates the signature's certificate chain must lead to (the certificate method)",
    )
    signer.add_argument(
        "--model-signer-identity",
        default="",
        metavar="IDENTITY",
        help="Sigstore's keyless method: the identity (e-mail or URI) the signing certificate must name, "
        "with --model-signer-issuer; verified offline against --model-trust-root",
    )
    parser.add_argument(
        "--model-signer-issuer", default="", metavar="URL", help="with --model-signer-identity: the OIDC issuer"
    )
    parser.add_argument(
        "--model-trust-root",
        type=user_path,
        metavar="JSON",
        help="a Sigstore trusted_root.json (default: Sigstore's public one, committed as "
        "tools/pin/trust/sigstore-production.trusted_root.json), with --model-trust-root-sha256",
    )
    parser.add_argument("--model-trust-root-sha256", default="", metavar="HEX", help="the pin of --model-trust-root")


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog="pin", description=__doc__, epilog=tools_help(PIN), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    result.add_argument("image", metavar="IMAGE", help="the image whose pins to resolve (images/IMAGE.pins.json)")
    result.add_argument("--base-tag", default="", help="the base tag to resolve (default: base.tag of the pins)")
    result.add_argument("--model-ref", default="", help="the model's hub branch or tag (default: model.ref, or main)")
    result.add_argument(
        "--speculator-ref", default="", help="the speculator's hub branch or tag (default: speculator.ref, or main)"
    )
    result.add_argument(
        "--deadline",
        type=_seconds,
        default=DEFAULT_DEADLINE_S,
        help=f"seconds the whole resolution may take (default {DEFAULT_DEADLINE_S:g}); each wait "
        "for a peer is also bounded by its read timeout",
    )
    result.add_argument(
        "--model-artifact",
        default="",
        metavar="REGISTRY/REPO[:TAG]",
        help="pin the model's OCI artifact (tools/model push) at this tag (default: model.artifact of the pins)",
    )
    _signature_flags(result)
    mode = result.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the pins (and checkpoint lock) atomically")
    mode.add_argument("--check", action="store_true", help="exit 1 when any pin differs from upstream")
    result.add_argument("--workspace", type=Path, default=None, help=argparse.SUPPRESS)
    return result


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    arguments = parser()
    try:
        args = arguments.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    signer = args.model_signer_key or args.model_signer_chain or args.model_signer_identity or None
    if (args.model_signature is None) != (signer is None):
        raise AttestError(
            "--model-signature goes with --model-signer-key, --model-signer-chain or --model-signer-identity",
            field="--model-signer-key",
        )
    if bool(args.model_signer_identity) != bool(args.model_signer_issuer):
        raise AttestError(
            "--model-signer-identity and --model-signer-issuer go together: Sigstore's keyless method pins both "
            "(an identity alone admits whoever any issuer vouches for)",
            field="--model-signer-issuer" if args.model_signer_identity else "--model-signer-identity",
        )
    if (args.model_trust_root or args.model_trust_root_sha256) and not args.model_signer_identity:
        raise AttestError(
            "--model-trust-root is for --model-signer-identity (Sigstore's keyless method)", field="--model-trust-root"
        )
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
