"""omni_oci/remote/layers/files.py in memory: layers apply as a runtime applies them (a later layer
wins, whiteouts, opaque directories, a file replacing a directory, hard links), each layer is
bounded by its descriptor and checked against its digest, and only wanted members are kept."""

from __future__ import annotations

import gzip
import hashlib
import random
import struct
import tarfile
import time
import zlib

import httpx
import pytest
import zstandard

from omni_oci.format.errors import OciError
from omni_oci.remote.layers.files import read_layer_files
from omni_oci.remote.layers.stream import READ_BYTES
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.vendor_base import layer


class MemoryRegistry:
    """Omni's own RegistryClient over a transport that serves blobs held in memory; `served`
    may give other bytes than the digest names."""

    def __init__(self, pause_s: float = 0.0, *, announced: bool = True) -> None:
        self.blobs: dict[str, bytes] = {}
        self.served: dict[str, bytes] = {}
        self.pause_s = pause_s  # between pieces of 64 bytes: a trickling registry
        self.announced = announced  # a Content-Length (else a body whose end only the stream knows)
        self.client = RegistryClient("127.0.0.1:1", credential=None, transport=httpx.MockTransport(self._serve))

    def _serve(self, request: httpx.Request) -> httpx.Response:
        digest = request.url.path.rsplit("/", 1)[-1]
        data = self.served.get(digest, self.blobs[digest])
        if not self.pause_s:
            return httpx.Response(200, content=data if self.announced else iter([data]))

        def trickle():
            for offset in range(0, len(data), 64):
                time.sleep(self.pause_s)
                yield data[offset : offset + 64]

        return httpx.Response(200, content=trickle())

    def add(self, blob: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        self.blobs[digest] = blob
        return {"digest": digest, "size": len(blob)}


def _everything(path: str) -> bool:
    return path.endswith(".txt")


def _read(registry: MemoryRegistry, *layers: bytes) -> dict[str, object]:
    descriptors = [registry.add(blob) for blob in layers]
    files = read_layer_files(
        registry.client, "repo", descriptors, wanted=_everything, max_file_bytes=1024, label="test", progress=False
    )
    return {path: (found.data if found.data is not None else found.kind) for path, found in files.items()}


def _tar(*members: tuple[str, bytes]) -> bytes:
    return gzip.decompress(layer(list(members)))


@pytest.mark.parametrize(
    "layers, expected",
    [
        ([[("a/one.txt", b"1")], [("a/one.txt", b"2")]], {"a/one.txt": b"2"}),  # a later layer wins
        ([[("a/one.txt", b"1"), ("a/two.txt", b"2")], [("a/.wh.one.txt", b"")]], {"a/two.txt": b"2"}),
        ([[("a/b/one.txt", b"1"), ("c.txt", b"3")], [("a/.wh.b", b"")]], {"c.txt": b"3"}),  # a whited-out directory
        (
            [
                [("a/one.txt", b"1"), ("a/b/two.txt", b"2"), ("x.txt", b"x")],
                [("a/.wh..wh..opq", b""), ("a/new.txt", b"n")],
            ],
            {"a/new.txt": b"n", "x.txt": b"x"},
        ),  # opaque: the lower layers' a/ is gone, this layer's stays
        ([[("a/one.txt", b"1")], [("a", b"file now")]], {}),  # a file replacing a directory
        ([[("a/one.txt", b"1")], [("a", "->elsewhere")]], {}),  # a link replacing a directory
        ([[("one.txt", b"1")], [("one.txt", "->two.txt")]], {"one.txt": "symbolic link"}),
        ([[("one.txt", b"1"), ("two.txt", "=>one.txt")]], {"one.txt": b"1", "two.txt": b"1"}),
        ([[("one.txt", b"1")], [("two.txt", "=>one.txt")]], {"one.txt": b"1", "two.txt": b"1"}),  # to a lower layer
        ([[("one.bin", b"1")], [("two.txt", "=>one.bin")]], {"two.txt": "hard link"}),  # to a file not kept
        ([[("./a/one.txt", b"1"), ("skip.bin", b"s")]], {"a/one.txt": b"1"}),  # only wanted members kept
        ([[(".wh.one.txt", b""), ("one.txt", b"1")]], {"one.txt": b"1"}),  # a whiteout hides lower layers only
        ([[("a/one.txt", b"1"), ("a", b"file now")]], {}),  # a directory replaced in the same layer
        ([[("a/one.txt", b"1"), ("a", "->b")]], {}),  # ... by a link
        ([[("a", "->b")], [("a/one.txt", b"1")]], "written through the symbolic link a"),
        ([[("a", "->/abs"), ("a/.wh.x", b"")]], "written through the symbolic link a"),
        ([[("f.txt", b"1"), ("f.txt/x.txt", b"2")]], "written through the regular file f.txt"),
        ([[("a/one.txt", b"1"), ("a/.wh.one.txt", b"")]], "which its own layer wrote"),
        ([[("l", "->x"), ("h.txt", "=>l/y.txt")]], "written through the symbolic link l"),
    ],
)
def test_layers_apply_in_order(layers, expected) -> None:
    blobs = [layer(members) for members in layers]
    if isinstance(expected, str):  # a refusal, naming the member
        with pytest.raises(OciError, match=expected):
            _read(MemoryRegistry(), *blobs)
        return
    assert _read(MemoryRegistry(), *blobs) == expected


def test_plain_zstd_and_multi_member_gzip_layers_are_read_by_their_first_bytes() -> None:
    plain = _tar(("a.txt", b"plain"))
    zstd = zstandard.ZstdCompressor().compress(_tar(("b.txt", b"zstd")))
    tar = _tar(("c.txt", b"c" * 900), ("d.txt", b"members"))
    members = gzip.compress(tar[:700], mtime=0) + gzip.compress(tar[700:], mtime=0)  # as pigz may write
    assert _read(MemoryRegistry(), plain, zstd, members) == {
        "a.txt": b"plain",
        "b.txt": b"zstd",
        "c.txt": b"c" * 900,
        "d.txt": b"members",
    }


def _gzip_member(
    data: bytes,
    *,
    flags: int = 0,
    extra: bytes = b"",
    name: bytes = b"",
    comment: bytes = b"",
    size: int | None = None,
    crc: int | None = None,
    header_crc: int | None = None,
) -> bytes:
    """One gzip member with the optional header fields of RFC 1952 that gzip.compress never writes."""
    header = b"\x1f\x8b\x08" + bytes([flags]) + b"\x00" * 4 + b"\x00\xff"
    if flags & 0x04:
        header += struct.pack("<H", len(extra)) + extra
    if flags & 0x08:
        header += name + b"\x00"
    if flags & 0x10:
        header += comment + b"\x00"
    if flags & 0x02:
        header += struct.pack("<H", zlib.crc32(header) & 0xFFFF if header_crc is None else header_crc)
    deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    trailer = struct.pack("<II", zlib.crc32(data) if crc is None else crc, len(data) if size is None else size)
    return header + body + trailer


def test_gzip_headers_with_every_optional_field_are_read() -> None:
    tar = _tar(("a.txt", b"a" * 700), ("b.txt", b"fields"))
    blob = _gzip_member(
        tar[:600], flags=0x04 | 0x08 | 0x10 | 0x02, extra=b"XY\x02\x00ok", name=b"layer.tar", comment=b"made by hand"
    ) + _gzip_member(tar[600:], flags=0x08, name=b"rest")
    assert _read(MemoryRegistry(), blob) == {"a.txt": b"a" * 700, "b.txt": b"fields"}


def test_members_across_decompressed_pieces_are_read_and_skipped_whole() -> None:
    noise = random.Random(7).randbytes  # incompressible: pieces of exactly READ_BYTES come out
    members = [
        ("skip-1.bin", noise(READ_BYTES - 700)),
        ("a.txt", b"straddles a piece boundary " * 30),
        ("skip-2.bin", noise(3 * READ_BYTES + 5)),
        ("b.txt", b"after three pieces skipped"),
    ]
    expected = {"a.txt": b"straddles a piece boundary " * 30, "b.txt": b"after three pieces skipped"}
    assert _read(MemoryRegistry(), layer(members)) == expected
    assert _read(MemoryRegistry(), zstandard.ZstdCompressor().compress(_tar(*members))) == expected


def test_multi_frame_zstd_layers_are_read_to_their_last_frame() -> None:
    tar = _tar(("a.txt", b"first frame " * 40), ("b.txt", b"second frame"))
    compressor = zstandard.ZstdCompressor()
    blob = compressor.compress(tar[:1024]) + compressor.compress(tar[1024:])  # as zstd:chunked writes
    assert _read(MemoryRegistry(), blob) == {"a.txt": b"first frame " * 40, "b.txt": b"second frame"}


def _pax_bomb() -> bytes:
    """A pax header record that claims 64 MB: tarfile would read it whole."""
    record = tarfile.TarInfo("PaxHeaders/a.txt")
    record.type, record.size = tarfile.XHDTYPE, 64 << 20
    return gzip.compress(record.tobuf(tarfile.USTAR_FORMAT) + b"\x00" * 4096, mtime=0)


def _invalid_header_after(tar: bytes) -> bytes:
    """`tar` with its end-of-archive blocks replaced by a header whose checksum is wrong, then a member."""
    end = -(-len(tar.rstrip(b"\x00")) // 512) * 512  # the last member's data block ends here
    invalid = bytearray(_tar(("hidden.txt", b"after a bad header"))[:512])
    invalid[148:156] = b"0000000\x00"  # a checksum that does not match
    return gzip.compress(tar[:end] + bytes(invalid) + _tar(("c.txt", b"3")), mtime=0)


@pytest.mark.parametrize(
    "tamper, announced, message",
    [
        (lambda blob: blob + b"extra", True, "announces '[0-9]+' bytes, not the [0-9]+ expected"),
        (lambda blob: blob + b"extra", False, "sends more than the [0-9]+ bytes expected"),
        (lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]), True, "the streamed blob is corrupt"),
        (lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]), False, "the streamed blob is corrupt"),
        (lambda blob: blob[:-4], True, "announces '[0-9]+' bytes, fewer than the [0-9]+ expected"),
        (lambda blob: blob[:-4], False, "ended after [0-9]+ of [0-9]+ bytes"),
    ],
)
def test_a_layer_that_differs_from_its_descriptor_is_refused(tamper, announced: bool, message) -> None:
    registry = MemoryRegistry(announced=announced)
    blob = layer([("a.txt", b"x" * 100)])
    descriptor = registry.add(blob)
    registry.served[descriptor["digest"]] = tamper(blob)
    with pytest.raises(OciError, match=message) as refused:
        read_layer_files(
            registry.client, "repo", [descriptor], wanted=_everything, max_file_bytes=1024, label="base", progress=False
        )
    assert refused.value.field == descriptor["digest"]


@pytest.mark.parametrize(
    "blob, descriptor, message",
    [
        (layer([("/abs.txt", b"1")]), None, "member '/abs.txt' is absolute"),
        (layer([("a/../../up.txt", b"1")]), None, "leaves the tar's root"),
        (layer([("a/.wh.", b"")]), None, "whiteout 'a/.wh.' names nothing"),
        (layer([("big.txt", b"x" * 2000)]), None, "big.txt is 2000 bytes; at most 1024"),
        (b"not a tar at all" * 64, None, "the tar header at byte 0 has a checksum field .* not plain octal"),
        (layer([("a.txt", b"x" * 4000)])[:-40], None, "is not a readable tar layer"),  # gzip cut inside a member
        (b"\x1f\x8b" + b"\x00" * 64, None, "is not a readable tar layer: not a valid gzip stream"),
        (b"\x28\xb5\x2f\xfd" + b"\xff" * 64, None, "is not a valid zstd stream"),
        (b"\x1f\x8b\x08\x20" + b"\x00" * 64, None, "not a valid gzip stream: reserved header flags are set"),
        (b"\x1f\x8b\x08\x08" + b"\x00" * 6 + b"n" * 70_000, None, "file name is longer than 511 bytes"),
        (b"\x1f\x8b\x08\x08" + b"\x00" * 6 + b"n" * 100, None, "file name is longer than 511 bytes or cut short"),
        (b"\x1f\x8b\x08\x00\x00", None, "the gzip stream ends inside a member"),
        (_gzip_member(_tar(("a.txt", b"1")), size=7), None, "not a valid gzip stream: .*Incorrect checksum"),
        (_gzip_member(_tar(("a.txt", b"1")), crc=7), None, "not a valid gzip stream: .*Incorrect checksum"),
        (
            _gzip_member(_tar(("a.txt", b"1")), flags=0x02, header_crc=7),
            None,
            "not a valid gzip stream: .*Incorrect checksum",
        ),
        (_gzip_member(_tar(("a.txt", b"1"))) + b"garbage!", None, "what follows a member is not another gzip member"),
        (_gzip_member(_tar(("a.txt", b"1"))) + b"\x00" * 16, None, "what follows a member is not another gzip member"),
        (_gzip_member(_tar(("a.txt", b"1")))[:-3], None, "the gzip stream ends inside a member"),
        (_pax_bomb(), None, "a header record of 67108864 bytes; at most 1048576 are read"),
        (_invalid_header_after(_tar(("a.txt", b"1"))), None, "the tar header at byte 1024 has a bad checksum"),
        (layer([("a.txt", b"1")]), {"digest": "sha256:" + "0" * 64, "size": -1}, "no valid digest and size"),
        (layer([("a.txt", b"1")]), {"digest": 5, "size": 10}, "no valid digest and size"),
    ],
)
def test_hostile_layers_are_refused(blob, descriptor, message) -> None:
    registry = MemoryRegistry()
    added = registry.add(blob)
    with pytest.raises(OciError, match=message):
        read_layer_files(
            registry.client,
            "repo",
            [descriptor or added],
            wanted=_everything,
            max_file_bytes=1024,
            label="base",
            progress=False,
        )


def test_progress_names_each_layer(capsys) -> None:
    registry = MemoryRegistry()
    descriptors = [registry.add(layer([("a.txt", b"1")])), registry.add(layer([("b.txt", b"2")]))]
    read_layer_files(registry.client, "repo", descriptors, wanted=_everything, max_file_bytes=16, label="base")
    err = capsys.readouterr().err
    assert "base layer 1/2" in err and "base layer 2/2" in err and "members" in err


def test_the_whole_read_is_bounded_by_its_deadline() -> None:
    registry = MemoryRegistry(pause_s=0.05)
    descriptor = registry.add(layer([("a.txt", bytes(range(256)) * 500)]))  # about 500 pieces: 25 s
    started = time.monotonic()
    with pytest.raises(OciError, match="reading the layers passed their deadline") as refused:
        read_layer_files(
            registry.client,
            "repo",
            [descriptor],
            wanted=_everything,
            max_file_bytes=1 << 20,
            label="base",
            progress=False,
            deadline=started + 0.3,
        )
    assert refused.value.field == "deadline"
    ended_by_deadline(time.monotonic() - started, 0.3, 25)
