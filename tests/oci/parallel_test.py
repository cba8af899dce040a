"""omni_oci/remote/parallel.py, the one parallel sender of image push, model push and pull:
results in the items' order whatever order they end in, one progress line per item with its note,
the first failure (in the items' order) raised only after the work in flight has ended."""

from __future__ import annotations

import threading
import time

import pytest

from omni_oci.remote.parallel import blob_progress, in_parallel


def test_results_keep_the_items_order_and_each_item_is_one_line() -> None:
    lines: list[str] = []

    def work(item: int) -> tuple[int, int, str]:
        time.sleep(0.01 * (5 - item))  # later items end first
        return item * 10, 1000, f"item {item}"

    results = in_parallel([1, 2, 3, 4], work, jobs=4, progress=blob_progress(4000, 4, lines.append))
    assert results == [10, 20, 30, 40]
    assert len(lines) == 4 and lines[-1].startswith("4/4 blobs, 0.00/0.00 GB")
    assert sorted(line.rsplit("(", 1)[1] for line in lines) == ["item 1)", "item 2)", "item 3)", "item 4)"]


def test_at_most_jobs_items_run_at_once() -> None:
    running, peak, guard = [0], [0], threading.Lock()

    def work(item: int) -> tuple[None, int, str]:
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with guard:
            running[0] -= 1
        return None, 0, ""

    in_parallel(list(range(8)), work, jobs=2, progress=blob_progress(0, 8, None))
    assert peak[0] == 2


def test_a_failure_is_raised_after_the_work_in_flight_has_ended() -> None:
    started: list[int] = []
    ended: list[int] = []

    def work(item: int) -> tuple[None, int, str]:
        started.append(item)
        if item == 0:
            time.sleep(0.01)
            raise ValueError("the first blob failed")
        time.sleep(0.05)
        ended.append(item)
        return None, 0, ""

    with pytest.raises(ValueError, match="the first blob failed"):
        in_parallel([0, 1, 2, 3, 4, 5], work, jobs=3, progress=blob_progress(0, 6, None))
    # No thread is left writing behind the refusal: whatever started has ended (the rest never starts).
    assert 1 in started and sorted(ended) == sorted(item for item in started if item != 0)


def test_no_progress_sink_prints_nothing(capsys) -> None:
    in_parallel([1], lambda item: (item, 1, "x"), jobs=1, progress=blob_progress(1, 1, None))
    assert capsys.readouterr() == ("", "")
