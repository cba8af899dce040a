"""A body's pieces split into runs of a given size without copying the body whole (the
registry's chunked uploads, the model pull's tar members)."""

from __future__ import annotations

from typing import Iterator


class Pieces:
    """A body's pieces read forward without copying them whole: a run of at most N bytes (the
    last piece split, its rest kept for the next run), or everything left."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces, self._held = pieces, b""

    def take(self, count: int) -> bytes:
        return b"".join(self.upto(count))

    def upto(self, count: int) -> Iterator[bytes]:
        """Pieces adding up to at most `count` bytes (fewer only at the end of the body)."""
        while count > 0:
            piece = self._held or next(self._pieces, b"")
            self._held = b""
            if not piece:
                return
            if len(piece) > count:
                piece, self._held = piece[:count], piece[count:]
            count -= len(piece)
            yield piece

    def rest(self) -> Iterator[bytes]:
        if self._held:
            yield self._held
            self._held = b""
        yield from self._pieces
