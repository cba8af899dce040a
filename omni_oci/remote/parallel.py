"""The one parallel sender of blob work (image push, model push, model pull): up to `jobs` items at
a time, each reported on one progress line as it ends, results in the items' order; and the one
report of what a push sent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from attest.progress import Progress

Item = TypeVar("Item")
Result = TypeVar("Result")


def blob_progress(total: int, items: int, emit: Callable[[str], None] | None, unit: str = "blobs") -> Progress:
    """A line per item done, to `emit` (the caller's progress sink); quiet without one."""
    return Progress(total, items, "", unit=unit, enabled=emit is not None, interval_s=0, emit=emit or print)


def in_parallel(
    items: Sequence[Item], work: Callable[[Item], tuple[Result, int, str]], *, jobs: int, progress: Progress
) -> list[Result]:
    """`work(item)` for every item, `jobs` at a time; it returns (result, bytes moved, a note for
    the progress line). The first failure, in the items' order, is raised once the others in
    flight have ended (a thread cannot be stopped halfway through a write)."""

    def one(item: Item) -> Result:
        result, moved, note = work(item)
        progress.add(moved)
        progress.item_done(note)
        return result

    with ThreadPoolExecutor(max(1, min(jobs, len(items) or 1))) as pool:
        return list(pool.map(one, items))


@dataclass
class PushReport:
    """What one push sent, image or model artifact alike: its top manifest's digest (an image's
    or index's; a model artifact's plain image), each blob by how it got there, the bytes
    uploaded, the tags, whether it was signed; a model artifact also names its ModelPack
    manifest over the same blobs (`model_digest`) and whether it carries a model signature."""

    repository: str  # REGISTRY/REPO
    digest: str = ""
    uploaded: list[str] = field(default_factory=list)
    mounted: list[str] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)  # copied from the base's registry
    present: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    tags: list[str] = field(default_factory=list)
    signed: bool = False
    model_digest: str = ""
    model_signed: bool = False  # a model artifact carries its model signature (model.sig)

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"
