"""attest.files.exclusive_run: one run at a time in a working directory. A second run is refused
at once naming the holder's pid (never a race for the same partial files); a killed holder
blocks nobody; links are refused; the holder cleans up its lock before it lets go."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from attest.errors import AttestError
from attest.files import RUN_LOCK, exclusive_run
from tests.fixtures.tools import hold_run_lock


def test_a_second_run_is_refused_naming_the_holder_and_a_killed_holder_blocks_nobody(tmp_path: Path) -> None:
    work = tmp_path / "work"
    holder = hold_run_lock(work)
    try:
        with pytest.raises(AttestError, match=rf"in use by another run \(pid {holder.pid}, holding ") as refused:
            with exclusive_run(work, what="it", field="F"):
                pytest.fail("ran beside the holder")
        assert refused.value.field == "F"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    ran = []
    with exclusive_run(work, what="it", field="F"):  # the kernel let go with the killed holder
        ran.append((work / RUN_LOCK).read_text())
    assert ran == [f"{os.getpid()}\n"]
    assert not work.exists()  # lock file and empty directory removed by the holder


def test_what_the_block_leaves_in_the_directory_stays(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with exclusive_run(work, what="it", field="F"):
        (work / "resume.part").write_bytes(b"kept")
    assert sorted(p.name for p in work.iterdir()) == ["resume.part"]


@pytest.mark.parametrize("plant", ["directory link", "lock link", "directory is a file"])
def test_links_and_files_in_the_way_are_refused(tmp_path: Path, plant: str) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    victim.write_text("the user's")
    if plant == "directory link":
        work.symlink_to(elsewhere)
    elif plant == "lock link":
        work.mkdir()
        (work / RUN_LOCK).symlink_to(victim)
    else:
        work.write_text("a file")
    with pytest.raises(AttestError) as refused:
        with exclusive_run(work, what="it", field="F"):
            pytest.fail("ran through a link")
    assert refused.value.field == "F"
    assert victim.read_text() == "the user's"


def test_a_lock_file_replaced_while_locking_is_locked_again(tmp_path: Path, monkeypatch) -> None:
    """A holder unlinks its lock file as it ends: a run that locked that old file must notice."""
    work = tmp_path / "work"
    work.mkdir()
    real_flock = __import__("fcntl").flock
    swapped = []

    def flock_then_swap(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        if not swapped:  # the first lock taken is on a file that is then replaced
            swapped.append(True)
            os.unlink(work / RUN_LOCK)
            (work / RUN_LOCK).write_text("")

    monkeypatch.setattr("fcntl.flock", flock_then_swap)
    with exclusive_run(work, what="it", field="F"):  # a wrong lock would hang here: Bazel's timeout
        held = os.stat(work / RUN_LOCK).st_ino
        assert (work / RUN_LOCK).read_text() == f"{os.getpid()}\n"
    assert swapped and held
