"""What an image build produced, file by file, and why two builds differ.

    python -m tools.oci.build_diff update --output images/digests.json NAME=LAYOUT ...
    python -m tools.oci.build_diff check images/digests.json NAME=LAYOUT ...
    python -m tools.oci.build_diff diff LAYOUT_A LAYOUT_B

`update` records each image's manifest digest, its layers and, per layer, every entry
(path -> mode and the first 16 hex of its sha256, or a link target), so that a build on
another host that gives another digest can be explained without that host's output:
`check` names the layer and the first differing file. `diff` compares two layouts (two
builds, e.g. two hosts' `bazel-bin/images/NAME.layout` or `--output` directories) and
prints every differing path and a unified diff of the first differing text file.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterator

from attest.files import write_atomic
from omni_oci.format.errors import OciError
from omni_oci.format.layout import blob_path

FORMAT = "omni.image-digests/1"
SHORT_HASH = 16  # 64 bits: enough to spot a difference, not a security check
MAX_DOCUMENT = 4 << 20  # index, manifest and config of our own layouts are a few KiB
MAX_TEXT_DIFF = 200_000  # bytes of one text file shown by `diff`


def _load_json(path: Path, what: str) -> Any:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_DOCUMENT + 1)
    except OSError as exc:
        raise OciError(f"cannot read {what} {path}: {exc.strerror}", field=str(path)) from None
    if len(raw) > MAX_DOCUMENT:
        raise OciError(f"{what} {path} is over {MAX_DOCUMENT} bytes", field=str(path))
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise OciError(f"{what} {path} is not JSON: {exc}", field=str(path)) from None


def manifest_of(layout: Path) -> tuple[str, dict[str, Any]]:
    """The layout's single image manifest: (digest, manifest)."""
    index = _load_json(layout / "index.json", "OCI index")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or len(manifests) != 1:
        raise OciError(f"{layout}/index.json: expected exactly one manifest", field="index.json manifests")
    digest = manifests[0].get("digest", "")
    return digest, _load_json(blob_path(layout, digest), "manifest")


def _entries(layer: Path) -> Iterator[tuple[str, str, bytes | None]]:
    """(path, summary, bytes of a regular file) for every tar entry of a gzip layer, in order."""
    with tarfile.open(layer, mode="r|gz") as archive:
        for member in archive:
            path = member.name.lstrip("./") or "."
            owner = f"{member.uid}:{member.gid}"
            if member.isfile():
                data = archive.extractfile(member).read()
                summary = f"{member.mode:04o} {owner} {hashlib.sha256(data).hexdigest()[:SHORT_HASH]}"
                yield path, summary, data
            elif member.isdir():
                yield path, f"dir {member.mode:04o} {owner}", None
            elif member.issym():
                yield path, f"-> {member.linkname}", None
            elif member.islnk():
                yield path, f"=> {member.linkname}", None
            else:
                yield path, f"type {member.type!r} {member.mode:04o}", None


def layer_files(layer: Path) -> dict[str, str]:
    return {path: summary for path, summary, _ in _entries(layer)}


def describe(layout: Path) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """An image's record (digest, config, layers) and each layer's file table by digest."""
    digest, manifest = manifest_of(layout)
    layers, tables = [], {}
    for layer in manifest.get("layers", []):
        title = (layer.get("annotations") or {}).get("org.opencontainers.image.title")
        layers.append({"digest": layer["digest"], "size": layer["size"], **({"title": title} if title else {})})
        tables[layer["digest"]] = layer_files(blob_path(layout, layer["digest"]))
    record = {"digest": digest, "config": manifest["config"]["digest"], "layers": layers}
    return record, tables


def update(images: dict[str, Path]) -> dict[str, Any]:
    document: dict[str, Any] = {"format": FORMAT, "images": {}, "layers": {}}
    for name, layout in sorted(images.items()):
        record, tables = describe(layout)
        document["images"][name] = record
        document["layers"].update(tables)
    document["layers"] = dict(sorted(document["layers"].items()))
    return document


def _first_difference(expected: dict[str, str], actual: dict[str, str]) -> str:
    for path in sorted(set(expected) | set(actual)):
        if expected.get(path) != actual.get(path):
            return (
                f"first differing file {path}: recorded {expected.get(path, '(absent)')}, "
                f"built {actual.get(path, '(absent)')}"
            )
    return "same files, entries and modes: the tar order or gzip compression differs"


def check(recorded: dict[str, Any], images: dict[str, Path]) -> list[str]:
    """Every difference between the recorded digests and these builds, explained."""
    if recorded.get("format") != FORMAT:
        return [f"digest file format is {recorded.get('format')!r}, expected {FORMAT!r}"]
    problems = []
    for name, layout in sorted(images.items()):
        want = recorded["images"].get(name)
        digest, manifest = manifest_of(layout)
        if want is None:
            problems.append(f"{name}: not recorded (built {digest})")
            continue
        if digest == want["digest"]:
            continue
        problems.append(f"{name}: built {digest}, recorded {want['digest']}")
        built_layers = manifest.get("layers", [])
        if len(built_layers) != len(want["layers"]):
            problems.append(f"  {name}: {len(built_layers)} layers built, {len(want['layers'])} recorded")
        for position, (built, wanted) in enumerate(zip(built_layers, want["layers"])):
            if built["digest"] == wanted["digest"]:
                continue
            label = built.get("annotations", {}).get("org.opencontainers.image.title") or f"layer {position}"
            table = recorded["layers"].get(wanted["digest"], {})
            difference = _first_difference(table, layer_files(blob_path(layout, built["digest"])))
            problems.append(f"  {name} {label}: built {built['digest']}, recorded {wanted['digest']}; {difference}")
        if manifest["config"]["digest"] != want["config"]:
            problems.append(
                f"  {name} config: built {manifest['config']['digest']}, recorded {want['config']} "
                "(labels, environment or history differ)"
            )
    return problems


def _text(data: bytes | None) -> list[str] | None:
    if data is None or len(data) > MAX_TEXT_DIFF or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def diff(layout_a: Path, layout_b: Path, out=sys.stdout) -> int:
    """Print how two builds differ; 0 when their manifests are identical."""
    digest_a, manifest_a = manifest_of(layout_a)
    digest_b, manifest_b = manifest_of(layout_b)
    if digest_a == digest_b:
        print(f"identical: {digest_a}", file=out)
        return 0
    print(f"manifests differ: {digest_a} vs {digest_b}", file=out)
    if manifest_a["config"]["digest"] != manifest_b["config"]["digest"]:
        config_a = _load_json(blob_path(layout_a, manifest_a["config"]["digest"]), "config")
        config_b = _load_json(blob_path(layout_b, manifest_b["config"]["digest"]), "config")
        for key in sorted(set(config_a.get("config", {})) | set(config_b.get("config", {}))):
            if config_a.get("config", {}).get(key) != config_b.get("config", {}).get(key):
                print(f"  config.{key} differs", file=out)
    shown_text = False
    layers_a, layers_b = manifest_a.get("layers", []), manifest_b.get("layers", [])
    if len(layers_a) != len(layers_b):
        print(f"  layer count differs: {len(layers_a)} vs {len(layers_b)}", file=out)
    for position, (a, b) in enumerate(zip(layers_a, layers_b)):
        if a["digest"] == b["digest"]:
            continue
        label = (a.get("annotations") or {}).get("org.opencontainers.image.title") or f"layer {position}"
        files_a = {p: (s, d) for p, s, d in _entries(blob_path(layout_a, a["digest"]))}
        files_b = {p: (s, d) for p, s, d in _entries(blob_path(layout_b, b["digest"]))}
        differing = [
            p for p in sorted(set(files_a) | set(files_b)) if files_a.get(p, ("",))[0] != files_b.get(p, ("",))[0]
        ]
        print(f"  {label}: {a['digest']} vs {b['digest']}: {len(differing)} differing paths", file=out)
        if not differing:
            print("    same entries: tar order or gzip compression differs", file=out)
        for path in differing:
            print(
                f"    {path}: {files_a.get(path, ('(absent)',))[0]} | {files_b.get(path, ('(absent)',))[0]}", file=out
            )
        for path in differing:
            text_a = _text(files_a.get(path, ("", None))[1])
            text_b = _text(files_b.get(path, ("", None))[1])
            if not shown_text and text_a is not None and text_b is not None:
                out.writelines(difflib.unified_diff(text_a, text_b, f"a/{path}", f"b/{path}"))
                shown_text = True
    return 1


def _images(pairs: list[str]) -> dict[str, Path]:
    images = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name:
            raise OciError(f"expected NAME=LAYOUT, got {pair!r}", field="images")
        images[name] = Path(path)
    return images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="build_diff", description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    update_parser = commands.add_parser("update", help="record the digests of these builds")
    update_parser.add_argument("--output", type=Path, required=True)
    update_parser.add_argument("images", nargs="+", metavar="NAME=LAYOUT")
    check_parser = commands.add_parser("check", help="compare builds with the recorded digests")
    check_parser.add_argument("recorded", type=Path)
    check_parser.add_argument("images", nargs="+", metavar="NAME=LAYOUT")
    diff_parser = commands.add_parser("diff", help="explain how two builds differ")
    diff_parser.add_argument("a", type=Path)
    diff_parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "update":
            document = update(_images(args.images))
            # A relative --output is the workspace's (`bazel run //images:update_digests`).
            output = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")) / args.output
            write_atomic(output, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode())
            for name, record in document["images"].items():
                print(f"{name}: {record['digest']}")
            return 0
        if args.command == "check":
            problems = check(_load_json(args.recorded, "digest file"), _images(args.images))
            for problem in problems:
                print(problem)
            return 1 if problems else 0
        return diff(args.a, args.b)
    except OciError as exc:
        print(f"digests: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
