"""Mirror a release's whole closure to another registry, or to a directory and on across an
air gap, and prove it arrived whole (docs/release.md#mirroring-a-release).

    bazel run //tools/release -- mirror SOURCE/REPO@sha256:... TARGET/REPO[:TAG] [--pins images/X.pins.json]
    bazel run //tools/release -- mirror SOURCE/REPO@sha256:... TARGET/REPO --check --key cosign.pub
    bazel run //tools/release -- mirror SOURCE/REPO@sha256:... --to-dir DIR [--pins ...]
    bazel run //tools/release -- mirror --from-dir DIR TARGET/REPO[:TAG] [--key cosign.pub]

The closure: the image (or index) and everything it names, each referrer (Sigstore bundles,
the ModelPack manifest) and cosign's legacy .sig/.att/.sbom tags; with --pins, also the model
artifact the image pins and its own referrers and tags. Blobs first, skipped where the target
has them, mounted within one registry, else streamed and hashed, a cut read resumed; then the
manifests, referrers, legacy tags, and the release's tags last. With --key the signatures are
checked on the source before anything is written, and on the target after.

Credentials per registry as for every Omni command (docker config, credential helpers,
OMNI_REGISTRY_* for one host): the source's never go to the target. Output: a JSON summary on
stdout, progress on stderr. Exit 0; --check exits 1 naming each missing item; a refusal exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from attest.documents import load_document
from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from attest.errors import AttestError
from attest.pins import ImagePins
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.keys import load_public_key
from tools.release.check import DirectoryBlobs, bound_to_pins, missing, root_kind, unverified
from tools.release.closure import walk
from tools.release.copy import MIRROR_JOBS, RegistrySource, Route, mirror
from tools.release.offline import DirectorySource, Rooted, from_dir, to_dir
from tools.settings import user_path

MAX_JOBS = 64  # blobs in flight: beyond this a registry only sees more refused connections


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="release", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    mirroring = verbs.add_parser("mirror", help="copy a release's closure, or check a copy", description=__doc__)
    mirroring.formatter_class = argparse.RawDescriptionHelpFormatter
    mirroring.add_argument(
        "references",
        nargs="*",
        metavar="REFERENCE",
        help="SOURCE/REPO@sha256:... then TARGET/REPO[:TAG]; with --from-dir only the target",
    )
    mirroring.add_argument("--pins", type=user_path, help="the image's pins document: its model artifact comes too")
    mirroring.add_argument(
        "--model-to",
        default="",
        help="REGISTRY/REPO for the model artifact (default: its repository path, on the target)",
    )
    mirroring.add_argument("--key", type=user_path, help="the release's PEM public key: signatures checked both sides")
    mirroring.add_argument("--check", action="store_true", help="copy nothing: exit 1 naming what the target lacks")
    where = mirroring.add_mutually_exclusive_group()
    where.add_argument("--to-dir", type=user_path, help="write the closure into DIR (an OCI layout) instead")
    where.add_argument("--from-dir", type=user_path, help="push the closure an offline mirror's DIR holds")
    mirroring.add_argument("--jobs", type=int, default=MIRROR_JOBS, help=f"blobs in flight (default {MIRROR_JOBS})")
    mirroring.add_argument("--deadline", type=_seconds, help="seconds the whole mirror may take (default: none)")
    return parser


def _reference(text: str, flag: str, *, digest: bool) -> Reference:
    try:
        ref = Reference.parse(text)
    except OciError as exc:
        raise OciError(f"{flag} {text!r}: {exc}", field=flag) from None
    if digest and not ref.digest:
        raise OciError(f"{flag} {text!r}: name the release by digest (REGISTRY/REPO@sha256:...)", field=flag)
    if not digest and ref.digest:
        raise OciError(f"{flag} {text!r}: a target is REGISTRY/REPO[:TAG]; the digest is the source's", field=flag)
    return ref


def _arguments(args: argparse.Namespace) -> tuple[Reference | None, Reference | None]:
    """(source, target) from the positional references, as the mode wants them."""
    count = len(args.references)
    wanted = 1 if args.from_dir or args.to_dir else 2
    if count != wanted:
        shapes = {
            1: "--from-dir DIR TARGET/REPO[:TAG]" if args.from_dir else "SOURCE/REPO@sha256:... --to-dir DIR",
            2: "SOURCE/REPO@sha256:... TARGET/REPO[:TAG]",
        }
        raise OciError(f"mirror takes {shapes[wanted]}; got {count} reference(s)", field="references")
    if args.to_dir and args.check:
        raise OciError("--check checks a registry: give a target, not --to-dir", field="--check")
    if not 1 <= args.jobs <= MAX_JOBS:
        raise OciError(f"--jobs must be 1 to {MAX_JOBS}, got {args.jobs}", field="--jobs")
    if args.key:
        load_public_key(args.key)  # an unreadable key is refused before any request
    if args.model_to:
        _model_target(args, None, "")  # checked before any request
    if args.from_dir:
        return None, _reference(args.references[0], "TARGET", digest=False)
    source = _reference(args.references[0], "SOURCE", digest=True)
    target = None if args.to_dir else _reference(args.references[1], "TARGET", digest=False)
    return source, target


class Clients:
    """One client per registry (its own credential), all within the mirror's deadline."""

    def __init__(self, stack: ExitStack, deadline: float) -> None:
        self.stack, self.deadline, self.made = stack, deadline, {}

    def __call__(self, registry: str) -> RegistryClient:
        if registry not in self.made:
            client = self.stack.enter_context(RegistryClient(registry))
            client.operation_deadline = self.deadline
            self.made[registry] = client
        return self.made[registry]


def _pins(args: argparse.Namespace) -> ImagePins | None:
    if args.pins is None:
        return None
    try:
        return load_document(ImagePins, args.pins, label=f"--pins {args.pins}")
    except AttestError as exc:
        raise OciError(str(exc), field="--pins") from None


def _model_reference(pins: ImagePins | None) -> Reference | None:
    artifact = pins.model.artifact if pins is not None else None
    if artifact is None:
        return None
    if not artifact.digest:
        raise OciError(
            "--pins: model.artifact.digest is empty: pin the artifact (tools/pin --write) before mirroring it",
            field="model.artifact.digest",
        )
    return _reference(f"{artifact.repository}@{artifact.digest}", "model.artifact", digest=True)


def _walked(args, clients: Clients, source: Reference, pins: ImagePins | None) -> list[tuple[Rooted, Reference]]:
    """The release's closures read from the source registries, bound to the pins where given."""
    image = walk(clients(source.registry), source.repository, source.digest)
    if pins is not None:
        bound_to_pins(clients(source.registry), source.repository, image, pins, args.pins)
    role = "model" if root_kind(image) == "model" else "image"
    found = [(Rooted(role, image, []), source)]
    model = _model_reference(pins)
    if model is not None:
        closure = walk(clients(model.registry), model.repository, model.digest)
        if root_kind(closure) != "model":
            raise OciError(f"model.artifact {model} is not a model artifact", field="model.artifact")
        tags = [pins.model.artifact.tag] if pins.model.artifact.tag else []
        found.append((Rooted("model", closure, tags), model))
    return found


def _model_tags_pinned(rooted: list[Rooted], pins: ImagePins | None, where: Path | None) -> None:
    """With --pins, the model tags an offline mirror's record lists are exactly the pin's."""
    artifact = pins.model.artifact if pins is not None else None
    wanted = [artifact.tag] if artifact is not None and artifact.tag else []
    for item in rooted if pins is not None else ():
        if item.role == "model" and item.tags != wanted:
            raise OciError(
                f"the offline mirror's record tags the model {item.tags}; --pins {where} pins {wanted}",
                field="model.artifact.tag",
            )


def _model_target(args, target: Reference | None, repository: str) -> tuple[str, str]:
    """(registry, repository) the model artifact goes to: --model-to, else its own path on the target."""
    if not args.model_to:
        return target.registry, repository.split("/", 1)[1]
    ref = _reference(args.model_to, "--model-to", digest=False)
    if ref.tag:
        raise OciError(f"--model-to {args.model_to!r}: REGISTRY/REPO only (the tag is the pin's)", field="--model-to")
    return ref.registry, ref.repository


def _routes(args, clients: Clients, rooted: list[Rooted], sources: list, target: Reference) -> list[Route]:
    routes = []
    for item, source in zip(rooted, sources):
        if item.role == "image" or len(rooted) == 1:
            registry, repository, tags = target.registry, target.repository, [target.tag] if target.tag else []
        else:
            registry, repository = _model_target(args, target, item.closure.repository)
            tags = item.tags
        routes.append(Route(item.closure, source, clients(registry), repository, tags))
    return routes


def _lock_sha256(pins: ImagePins | None) -> str:
    return (pins.model.lock_sha256 or "") if pins is not None else ""


def _verify(routes: list[Route], key: Path, pins: ImagePins | None, side: str) -> None:
    failed = [problem for route in routes for problem in unverified(route, key, _lock_sha256(pins))]
    if failed:
        raise OciError(f"the {side} does not verify with --key {key}: " + "; ".join(failed), field="--key")


def _progress(line: str) -> None:
    print(f"mirror: {line}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, stack: ExitStack) -> tuple[dict, int]:
    source, target = _arguments(args)
    pins = _pins(args)
    clients = Clients(stack, time.monotonic() + args.deadline if args.deadline else math.inf)
    if args.from_dir:
        rooted = from_dir(args.from_dir)
        images = [item for item in rooted if item.role == "image"]
        if pins is not None and not images:
            raise OciError(f"--pins {args.pins}: {args.from_dir} holds no image to check them against", field="--pins")
        for item in images if pins is not None else ():
            bound_to_pins(DirectoryBlobs(args.from_dir), "", item.closure, pins, args.pins)
        _model_tags_pinned(rooted, pins, args.pins)
        sources = [DirectorySource(args.from_dir, clients.deadline)] * len(rooted)
    else:
        walked = _walked(args, clients, source, pins)
        rooted = [item for item, _ in walked]
        sources = [RegistrySource(clients(ref.registry), ref.repository) for _, ref in walked]
        if args.key:
            _verify(
                [Route(i.closure, s, s.client, s.repository) for i, s in zip(rooted, sources)], args.key, pins, "source"
            )
    if args.to_dir:
        summary = to_dir(rooted, [s.blob_stream for s in sources], args.to_dir, jobs=args.jobs, progress=_progress)
        return {"ok": True, **summary, "roots": [f"{i.closure.repository}@{i.closure.root}" for i in rooted]}, 0
    routes = _routes(args, clients, rooted, sources, target)
    if args.check:
        lacking = [item for route in routes for item in missing(route)]
        if args.key and not lacking:
            lacking = [problem for route in routes for problem in unverified(route, args.key, _lock_sha256(pins))]
        references = [route.reference for route in routes]
        return {"ok": not lacking, "references": references, "missing": lacking}, 1 if lacking else 0
    # With a key, the copy is verified on the target before the release's tags name it.
    verified = (lambda: _verify(routes, args.key, pins, "target")) if args.key else None
    reports = mirror(routes, jobs=args.jobs, progress=_progress, before_tags=verified)
    return {"ok": True, "verified": bool(args.key), "mirrored": [report.summary() for report in reports]}, 0


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    args = _parser().parse_args(argv)
    with ExitStack() as stack:
        try:
            summary, code = _run(args, stack)
        except AttestError as exc:
            if exc.field != "deadline" or not args.deadline:
                raise
            raise OciError(f"{exc} (--deadline {args.deadline:g} s)", field="deadline") from None
    print(json.dumps(summary, indent=2, sort_keys=True))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
