"""omni_oci/remote/copy.py: a blob handed to an upload from an untrusted source is hashed in
order, the piece that completes it handed on only once its digest is right, and a cut read
resumed from the byte it reached. First with a source scripted in memory (every offset an
upload may ask for), then between two real docker-registries through a proxy that cuts."""

from __future__ import annotations

import hashlib
import os
from typing import Iterator

import pytest

from omni_oci.format.errors import OciError
from omni_oci.remote.copy import RESUMES, FileBlob, HashedSource, RegistryBlob
from omni_oci.remote.pieces import Pieces
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.fault_proxy import FaultProxy, Step
from tests.fixtures.registry import LoopbackRegistry

DATA = os.urandom(10_000)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()
PIECE = 1000


class Scripted(HashedSource):
    """DATA (or `served`) in pieces of PIECE bytes; `cut_at` breaks a read once at each offset."""

    def __init__(
        self, served: bytes = DATA, cut_at: tuple[int, ...] = (), final: bool = False, piece: int = PIECE
    ) -> None:
        super().__init__(DIGEST, len(DATA), "scripted")
        self.served, self.cuts, self.final, self.piece = served, list(cut_at), final, piece
        self.opened: list[int] = []

    def _open(self, offset: int) -> Iterator[bytes]:
        self.opened.append(offset)
        for start in range(offset, len(self.served), self.piece):
            if self.cuts and start >= self.cuts[0]:
                self.cuts.pop(0)
                raise OciError("cut", field="blob", final=self.final)
            yield self.served[start : start + self.piece]

    def _resumable(self, exc: OciError) -> bool:
        return not exc.final


def _chunks(source: HashedSource, chunk: int) -> bytes:
    """What uploads.py's chunked path reads: each chunk a fresh from_offset, taken with Pieces."""
    return b"".join(
        b"".join(Pieces(source.from_offset(start)).upto(min(chunk, len(DATA) - start)))
        for start in range(0, len(DATA), chunk)
    )


def test_the_whole_blob_in_one_read() -> None:
    source = Scripted()
    assert b"".join(source.from_offset(0)) == DATA and source.opened == [0]


@pytest.mark.parametrize("chunk", [2500, 1000, 999, 7])
def test_chunks_at_any_boundary_read_the_source_once(chunk: int) -> None:
    """A chunk boundary inside a piece is served from the piece kept, not by reading again."""
    source = Scripted()
    assert _chunks(source, chunk) == DATA and source.opened == [0]


def test_an_upload_going_back_past_the_kept_piece_reads_and_hashes_again_from_zero() -> None:
    source = Scripted()
    first = Pieces(source.from_offset(0))
    assert b"".join(first.upto(5000)) == DATA[:5000]
    assert b"".join(source.from_offset(2500)) == DATA[2500:]
    assert source.opened == [0, 0]


def test_a_cut_read_resumes_at_the_byte_it_reached() -> None:
    source = Scripted(cut_at=(3000, 7000))
    assert b"".join(source.from_offset(0)) == DATA and source.opened == [0, 3000, 7000]


def test_cuts_past_the_allowance_and_final_refusals_end_the_copy() -> None:
    with pytest.raises(OciError, match="cut"):
        b"".join(Scripted(cut_at=tuple(1000 * (n + 1) for n in range(RESUMES + 1))).from_offset(0))
    final = Scripted(cut_at=(3000,), final=True)
    with pytest.raises(OciError, match="cut"):
        b"".join(final.from_offset(0))
    assert final.opened == [0]


BAD_SOURCES = [
    ("other bytes", DATA[:-1] + bytes([DATA[-1] ^ 1]), f"hash to sha256:[0-9a-f]{{64}}, not {DIGEST}"),
    ("more bytes", DATA + b"x", "more than its 10000 bytes"),
    ("fewer bytes", DATA[:-10], "ended at byte 9990 of 10000"),
]


@pytest.mark.parametrize(("case", "served", "says"), BAD_SOURCES, ids=[row[0] for row in BAD_SOURCES])
def test_a_wrong_source_is_refused_before_its_last_piece_is_handed_on(case: str, served: bytes, says: str) -> None:
    handed = bytearray()
    with pytest.raises(OciError, match=says) as refused:
        for piece in Scripted(served, piece=1001).from_offset(0):  # the last piece crosses the size
            handed += piece
    assert refused.value.final and refused.value.field == DIGEST
    assert len(handed) < len(DATA)  # the upload never had every byte


def test_a_file_is_checked_the_same_way_and_never_through_a_link(tmp_path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_bytes(DATA)
    bad.write_bytes(DATA[::-1])
    assert b"".join(FileBlob(good, DIGEST, len(DATA)).pieces()) == DATA
    with pytest.raises(OciError, match="hash to"):
        b"".join(FileBlob(bad, DIGEST, len(DATA)).pieces())
    (tmp_path / "link").symlink_to(good)
    with pytest.raises(OciError, match="cannot be read"):
        b"".join(FileBlob(tmp_path / "link", DIGEST, len(DATA)).pieces())


def test_a_chunked_copy_between_registries_resumes_a_cut_source_read() -> None:
    """Chunks of 1 MB up, the source read cut at 1.5 MB: the copy resumes by Range, one read."""
    blob = os.urandom(3 << 20)
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with LoopbackRegistry() as source, LoopbackRegistry() as target:
        with RegistryClient(source.host) as client:
            client.upload("a/blob", digest, blob, len(blob))
        host, port = source.host.split(":")
        with (
            FaultProxy((host, int(port)), [Step("cut", after=(3 << 20) // 2)]) as proxy,
            RegistryClient(proxy.host, credential=None) as reader,
            RegistryClient(target.host, credential=None) as writer,
        ):
            writer.chunked_threshold = writer.chunk_size = 1 << 20
            copied = RegistryBlob(reader, "a/blob", digest, len(blob))
            writer.upload("b/blob", digest, copied, len(blob))
        assert copied.resumed == 1
        assert proxy.to_client < len(blob) + (1 << 20)  # the cut cost what was in flight
        with RegistryClient(target.host, credential=None) as client:
            assert b"".join(client.stream_blob("b/blob", digest, len(blob))) == blob
