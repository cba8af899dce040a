"""tools/oci/layer_files.py in memory: layers apply as a runtime applies them (a later layer
wins, whiteouts, opaque directories, a file replacing a directory, hard links), each layer is
bounded by its descriptor and checked against its digest, and only wanted members are kept."""
from __future__ import annotations

import gzip
import hashlib
import time
from pathlib import PurePosixPath

import httpx
import pytest
import zstandard

from tests.fixtures.vendor_base import layer
from tools.oci.errors import OciError
from tools.oci.layer_files import read_layer_files
from tools.oci.registry import RegistryClient


class MemoryRegistry:
    """Omni's own RegistryClient over a transport that serves blobs held in memory; `served`
    may give other bytes than the digest names."""

    def __init__(self, pause_s: float = 0.0) -> None:
        self.blobs: dict[str, bytes] = {}
        self.served: dict[str, bytes] = {}
        self.pause_s = pause_s  # between pieces of 64 bytes: a trickling registry
        self.client = RegistryClient("127.0.0.1:1", credential=None, transport=httpx.MockTransport(self._serve))

    def _serve(self, request: httpx.Request) -> httpx.Response:
        digest = request.url.path.rsplit("/", 1)[-1]
        data = self.served.get(digest, self.blobs[digest])
        if not self.pause_s:
            return httpx.Response(200, content=data)

        def trickle():
            for offset in range(0, len(data), 64):
                time.sleep(self.pause_s)
                yield data[offset:offset + 64]
        return httpx.Response(200, content=trickle())

    def add(self, blob: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        self.blobs[digest] = blob
        return {"digest": digest, "size": len(blob)}


def _everything(path: PurePosixPath) -> bool:
    return path.name.endswith(".txt")


def _read(registry: MemoryRegistry, *layers: bytes) -> dict[str, object]:
    descriptors = [registry.add(blob) for blob in layers]
    files = read_layer_files(registry.client, "repo", descriptors, wanted=_everything, max_file_bytes=1024, label="test",
                             progress=False)
    return {path: (found.data if found.data is not None else found.kind) for path, found in files.items()}


@pytest.mark.parametrize("layers, expected", [
    ([[("a/one.txt", b"1")], [("a/one.txt", b"2")]], {"a/one.txt": b"2"}),  # a later layer wins
    ([[("a/one.txt", b"1"), ("a/two.txt", b"2")], [("a/.wh.one.txt", b"")]], {"a/two.txt": b"2"}),
    ([[("a/b/one.txt", b"1"), ("c.txt", b"3")], [("a/.wh.b", b"")]], {"c.txt": b"3"}),  # a whited-out directory
    ([[("a/one.txt", b"1"), ("a/b/two.txt", b"2"), ("x.txt", b"x")], [("a/.wh..wh..opq", b""), ("a/new.txt", b"n")]],
     {"a/new.txt": b"n", "x.txt": b"x"}),  # opaque: the lower layers' a/ is gone, this layer's stays
    ([[("a/one.txt", b"1")], [("a", b"file now")]], {}),  # a file replacing a directory
    ([[("a/one.txt", b"1")], [("a", "->elsewhere")]], {}),  # a link replacing a directory
    ([[("one.txt", b"1")], [("one.txt", "->two.txt")]], {"one.txt": "symbolic link"}),
    ([[("one.txt", b"1"), ("two.txt", "=>one.txt")]], {"one.txt": b"1", "two.txt": b"1"}),
    ([[("one.txt", b"1")], [("two.txt", "=>one.txt")]], {"one.txt": b"1", "two.txt": "hard link"}),
    ([[("./a/one.txt", b"1"), ("skip.bin", b"s")]], {"a/one.txt": b"1"}),  # only wanted members kept
    ([[(".wh.one.txt", b""), ("one.txt", b"1")]], {"one.txt": b"1"}),  # a whiteout hides lower layers only
])
def test_layers_apply_in_order(layers, expected) -> None:
    assert _read(MemoryRegistry(), *[layer(members) for members in layers]) == expected


def test_plain_zstd_and_multi_member_gzip_layers_are_read_by_their_first_bytes() -> None:
    plain = gzip.decompress(layer([("a.txt", b"plain")]))
    zstd = zstandard.ZstdCompressor().compress(gzip.decompress(layer([("b.txt", b"zstd")])))
    tar = gzip.decompress(layer([("c.txt", b"c" * 900), ("d.txt", b"members")]))
    members = gzip.compress(tar[:700], mtime=0) + gzip.compress(tar[700:], mtime=0)  # as pigz may write
    assert _read(MemoryRegistry(), plain, zstd, members) == {"a.txt": b"plain", "b.txt": b"zstd",
                                                             "c.txt": b"c" * 900, "d.txt": b"members"}


@pytest.mark.parametrize("tamper, message", [
    (lambda blob: blob + b"extra", "sends more than the .* bytes its descriptor declares"),
    (lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]), "is corrupt"),
    (lambda blob: blob[:-4], "is corrupt"),
])
def test_a_layer_that_differs_from_its_descriptor_is_refused(tamper, message) -> None:
    registry = MemoryRegistry()
    blob = layer([("a.txt", b"x" * 100)])
    descriptor = registry.add(blob)
    registry.served[descriptor["digest"]] = tamper(blob)
    with pytest.raises(OciError, match=message) as refused:
        read_layer_files(registry.client, "repo", [descriptor], wanted=_everything, max_file_bytes=1024,
                         label="base", progress=False)
    assert refused.value.field == descriptor["digest"]


@pytest.mark.parametrize("blob, descriptor, message", [
    (layer([("/abs.txt", b"1")]), None, "member '/abs.txt' is absolute"),
    (layer([("a/../../up.txt", b"1")]), None, "leaves the tar's root"),
    (layer([("a/.wh.", b"")]), None, "whiteout 'a/.wh.' names nothing"),
    (layer([("big.txt", b"x" * 2000)]), None, "big.txt is 2000 bytes; at most 1024"),
    (b"not a tar at all" * 64, None, "is not a readable tar layer"),
    (layer([("a.txt", b"x" * 4000)])[:-40], None, "is not a readable tar layer"),  # gzip cut inside a member
    (b"\x1f\x8b" + b"\x00" * 64, None, "is not a readable tar layer: not a valid gzip stream"),
    (b"\x28\xb5\x2f\xfd" + b"\xff" * 64, None, "is not a valid zstd stream"),
    (layer([("a.txt", b"1")]), {"digest": "sha256:" + "0" * 64, "size": -1}, "no valid digest and size"),
    (layer([("a.txt", b"1")]), {"digest": 5, "size": 10}, "no valid digest and size"),
])
def test_hostile_layers_are_refused(blob, descriptor, message) -> None:
    registry = MemoryRegistry()
    added = registry.add(blob)
    with pytest.raises(OciError, match=message):
        read_layer_files(registry.client, "repo", [descriptor or added], wanted=_everything, max_file_bytes=1024,
                         label="base", progress=False)


def test_progress_names_each_layer(capsys) -> None:
    registry = MemoryRegistry()
    descriptors = [registry.add(layer([("a.txt", b"1")])), registry.add(layer([("b.txt", b"2")]))]
    read_layer_files(registry.client, "repo", descriptors, wanted=_everything, max_file_bytes=16, label="base")
    err = capsys.readouterr().err
    assert "base layer 1/2" in err and "base layer 2/2" in err and "members" in err



def test_the_whole_read_is_bounded_by_its_deadline() -> None:
    registry = MemoryRegistry(pause_s=0.05)
    descriptor = registry.add(layer([("a.txt", bytes(range(256)) * 40)]))  # about 40 pieces: 2 s
    started = time.monotonic()
    with pytest.raises(OciError, match="reading the layers passed their deadline") as refused:
        read_layer_files(registry.client, "repo", [descriptor], wanted=_everything, max_file_bytes=1 << 20,
                         label="base", progress=False, deadline=started + 0.3)
    assert refused.value.field == "deadline" and time.monotonic() - started < 1.5
