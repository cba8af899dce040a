"""Deterministic layers: tar.gz, or plain tar.

    python -m tools.oci.build.layer --spec SPEC.json --output LAYER.tar.gz --descriptor LAYER.json

SPEC is {"entries": [{"src": path, "dest": "/abs/path"}, ...], "tars": [{"src": path,
"prefix": "/abs/dir"}, ...], "compression": "gzip" | "zstd" | "none"}; an entry's "src" may be a file
or omitted with "type": "dir"; entries may set "mode", "uid" and "gid". In Python, an entry
may carry its bytes as "data" instead of "src", or be a "symlink" with a "target". "tars"
are tar files other rules made (.tar, .tar.gz, .tar.zst: tools/oci/build/tar_input.py), their
members placed under "prefix". Output: sorted entries, parents added, mtime fixed
(SOURCE_DATE_EPOCH or 0), uid/gid 0 and empty owner names, modes 0755 for directories and
executables and 0644 otherwise, GNU tar format (no pax atime/ctime records); gzip (the
default) with header mtime 0, no file name and level 6, or none: a plain tar, whose digest
is its diff_id (for layers of gigabytes that compress little, where gzip costs minutes).
The descriptor holds mediaType, digest, diff_id, size.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from omni_oci.format.errors import OciError
from omni_oci.format.layout import OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD
from tools.oci.build.tar_input import TarReader, tar_entries

COMPRESS_LEVEL = 6
COMPRESSIONS = ("gzip", "zstd", "none")
ZSTD_LEVEL = 3


class _HashingWriter(io.RawIOBase):
    """Counts and hashes what passes through to `sink`."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.digest, self.size = sink, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        self.size += len(data)
        self.sink.write(data)
        return len(data)


def _normalise(dest: str) -> str:
    path = PurePosixPath("/" + dest.lstrip("/"))
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    if ".." in parts or not parts:
        raise OciError(f"layer destination must be a path inside the image, got {dest!r}", field=dest)
    return "/".join(parts)


# A parent directory no entry named: an entry for it given later (its mode, its owner) wins.
_IMPLIED_DIR = {
    "type": "dir",
    "src": None,
    "data": None,
    "target": None,
    "tar": None,
    "size": None,
    "mode": None,
    "uid": 0,
    "gid": 0,
}


def _plan_entries(entries: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Destination -> entry, parents included, duplicates refused unless identical."""
    planned: dict[str, dict[str, Any]] = {}
    for raw in entries:
        dest = _normalise(raw["dest"])
        kind = raw.get("type", "file" if raw.get("src") or "data" in raw else "dir")
        entry = {
            "type": kind,
            "src": raw.get("src"),
            "data": raw.get("data"),
            "target": raw.get("target"),
            "tar": raw.get("tar"),
            "size": raw.get("size"),
            "mode": raw.get("mode"),
            "uid": raw.get("uid", 0),
            "gid": raw.get("gid", 0),
        }
        if dest in planned and planned[dest] != entry and not (planned[dest] == _IMPLIED_DIR and kind == "dir"):
            raise OciError(f"two different entries for {dest} in one layer", field=dest)
        planned[dest] = entry
        parent = PurePosixPath(dest).parent
        while str(parent) not in (".", "/"):
            planned.setdefault(str(parent), dict(_IMPLIED_DIR))
            parent = parent.parent
    return planned


def _info(
    name: str, kind: str, mode: int, mtime: int, size: int = 0, target: str = "", uid: int = 0, gid: int = 0
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode, info.mtime, info.size, info.linkname = mode, mtime, size, target
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    return info


def _add_entries(tar: tarfile.TarFile, planned: dict[str, dict[str, Any]], mtime: int) -> None:
    reader = TarReader()
    try:
        for dest in sorted(planned):
            entry = planned[dest]
            owner = {"uid": entry["uid"], "gid": entry["gid"]}
            if entry["type"] == "dir":
                tar.addfile(_info(dest, "dir", entry["mode"] or 0o755, mtime, **owner))
            elif entry["type"] == "symlink":
                tar.addfile(_info(dest, "symlink", 0o777, mtime, target=entry["target"], **owner))
            elif entry["data"] is not None:
                data = entry["data"]
                tar.addfile(
                    _info(dest, "file", entry["mode"] or 0o644, mtime, size=len(data), **owner), io.BytesIO(data)
                )
            elif entry["tar"] is not None:
                with reader.read(entry["tar"]) as handle:
                    tar.addfile(_info(dest, "file", entry["mode"], mtime, size=entry["size"], **owner), handle)
            else:
                source = Path(entry["src"])
                try:
                    handle = source.open("rb")
                    size = os.fstat(handle.fileno()).st_size
                    executable = os.fstat(handle.fileno()).st_mode & stat.S_IXUSR
                except OSError as exc:
                    raise OciError(f"layer input {source} is unreadable: {exc.strerror}", field=str(source)) from None
                mode = entry["mode"] or (0o755 if executable else 0o644)
                with handle:
                    tar.addfile(_info(dest, "file", mode, mtime, size=size, **owner), handle)
    finally:
        reader.close()


def write_layer(
    entries: Iterable[dict[str, Any]],
    output: Path,
    *,
    mtime: int = 0,
    tars: Iterable[dict[str, str]] = (),
    compression: str = "gzip",
) -> dict[str, Any]:
    if compression not in COMPRESSIONS:
        raise OciError(
            f"layer compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}", field="compression"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    scratch = output.parent / f".{output.name}.inputs"
    try:
        from_tars = [
            entry for item in tars for entry in tar_entries(Path(item["src"]), item.get("prefix", "/"), scratch)
        ]
        planned = _plan_entries([*entries, *from_tars])
        with output.open("wb") as raw:
            compressed = _HashingWriter(raw)
            if compression == "gzip":
                with gzip.GzipFile(
                    filename="", mode="wb", compresslevel=COMPRESS_LEVEL, fileobj=compressed, mtime=0
                ) as gz:
                    uncompressed = _HashingWriter(gz)
                    with tarfile.open(fileobj=uncompressed, mode="w", format=tarfile.GNU_FORMAT) as tar:
                        _add_entries(tar, planned, mtime)
            elif compression == "zstd":
                import zstandard  # the locked binding; one thread and a fixed level: the same bytes everywhere

                compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=0, write_checksum=True)
                with compressor.stream_writer(compressed, closefd=False) as zst:
                    uncompressed = _HashingWriter(zst)
                    with tarfile.open(fileobj=uncompressed, mode="w", format=tarfile.GNU_FORMAT) as tar:
                        _add_entries(tar, planned, mtime)
            else:
                uncompressed = compressed
                with tarfile.open(fileobj=compressed, mode="w", format=tarfile.GNU_FORMAT) as tar:
                    _add_entries(tar, planned, mtime)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "mediaType": {"gzip": OCI_LAYER_GZIP, "zstd": OCI_LAYER_ZSTD}.get(compression, OCI_LAYER_TAR),
        "digest": "sha256:" + compressed.digest.hexdigest(),
        "size": compressed.size,
        "diff_id": "sha256:" + uncompressed.digest.hexdigest(),
    }


def source_date_epoch() -> int:
    # ASCII digits only, as attest.edge.settings.ascii_integer (build tools import only the standard
    # library): int() would also take "１", "1_0" and spaces.
    raw = os.environ.get("SOURCE_DATE_EPOCH", "0")
    if not re.fullmatch(r"[0-9]{1,12}", raw):
        raise OciError(
            f"SOURCE_DATE_EPOCH must be a non-negative integer in ASCII digits, got {raw!r}", field="SOURCE_DATE_EPOCH"
        )
    return int(raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="layer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--descriptor", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        spec = json.loads(args.spec.read_text())
        desc = write_layer(
            spec.get("entries", []),
            args.output,
            mtime=source_date_epoch(),
            tars=spec.get("tars", []),
            compression=spec.get("compression", "gzip"),
        )
    except OciError as exc:
        print(f"layer: {exc}", file=sys.stderr)
        return 2
    args.descriptor.write_text(json.dumps(desc, sort_keys=True, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from tools.oci.build.worker import run  # a persistent worker under Bazel, a command line otherwise

    raise SystemExit(run(main))
