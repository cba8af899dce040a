"""attest.tree: the descriptor walk that never follows a symlink, and what it refuses."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from attest.errors import AttestError
from attest.tree import open_regular, parent_dir, place, stat_regular, walk_files


def _open(root: Path, name: str) -> None:
    with open_regular(root, name):
        pass


def _refused(call, *args, **kwargs) -> AttestError:
    with pytest.raises(AttestError) as caught:
        call(*args, **kwargs)
    return caught.value


@pytest.mark.parametrize("make_root", [lambda p: None, lambda p: p.write_text("a file")], ids=["missing", "a file"])
def test_a_root_that_is_not_a_directory_is_refused_by_name(tmp_path: Path, make_root) -> None:
    root = tmp_path / "root"
    make_root(root)
    with pytest.raises(AttestError) as caught:
        with parent_dir(root, "a/b"):
            pass
    assert caught.value.field == str(root) and "cannot be opened as a directory" in str(caught.value)


def test_place_creates_parents_0755_and_renames_into_them(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    temporary = tmp_path / "tmp"
    temporary.write_text("data")
    previous = os.umask(0o022)
    try:
        place(temporary, root, "a/b/c.bin")
    finally:
        os.umask(previous)
    assert (root / "a/b/c.bin").read_text() == "data" and not temporary.exists()
    assert stat.S_IMODE((root / "a").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "a/b").stat().st_mode) == 0o755


def test_place_refuses_a_directory_destination_and_a_parent_it_cannot_create(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dir").mkdir(parents=True)
    temporary = tmp_path / "tmp"
    temporary.write_text("data")
    refusal = _refused(place, temporary, root, "dir")
    assert refusal.field == "dir" and "exists as a directory" in str(refusal)
    long_name = "n" * 300 + "/file"  # longer than NAME_MAX: mkdir fails with something other than EEXIST
    refusal = _refused(place, temporary, root, long_name)
    assert refusal.field == long_name and "cannot be created" in str(refusal)
    (root / "plain").write_text("x")
    refusal = _refused(place, temporary, root, "plain/file")
    assert "a symlink or non-directory lies on its path" in str(refusal)
    assert temporary.read_text() == "data" and sorted(p.name for p in root.iterdir()) == ["dir", "plain"]


def test_reading_never_creates_and_names_what_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    refusal = _refused(_open, root, "a/b.bin")
    assert refusal.field == "a/b.bin" and str(refusal) == "a/b.bin is missing"
    assert list(root.iterdir()) == []  # the walk did not create `a`
    assert stat_regular(root, "a/b.bin") is None and stat_regular(root, "c.bin") is None


def test_a_fifo_or_a_symlink_is_not_a_regular_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "fifo")
    (root / "real").write_text("x")
    (root / "link").symlink_to(root / "real")
    refusal = _refused(stat_regular, root, "fifo")
    assert refusal.field == "fifo" and str(refusal) == "fifo is not a regular file"
    refusal = _refused(stat_regular, root, "link")  # not "missing": a link is refused, not skipped
    assert "a symlink or non-directory lies on its path" in str(refusal)
    assert stat_regular(root, "real").st_size == 1


def test_walk_skips_only_top_level_names_and_reports_links_without_entering(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub" / "skip").mkdir(parents=True)
    (root / "skip").mkdir()
    (root / "skip" / "inner").write_text("x")
    (root / "sub" / "skip" / "kept").write_text("x")
    (root / "top").write_text("x")
    (root / "sub" / "dirlink").symlink_to(tmp_path)
    (root / "filelink").symlink_to(root / "top")
    found = sorted(walk_files(root, skip_files=frozenset({"top"}), skip_dirs=frozenset({"skip"})))
    assert found == [("filelink", True), ("sub/dirlink", True), ("sub/skip/kept", False)]
    assert sorted(walk_files(root)) == [
        ("filelink", True),
        ("skip/inner", False),
        ("sub/dirlink", True),
        ("sub/skip/kept", False),
        ("top", False),
    ]


# A name skipped as a file hides nothing when it is a directory, and the reverse (issue #68).
@pytest.mark.parametrize(
    ("make", "skip_files", "skip_dirs", "found"),
    [
        ("dir-under-file-name", {"marker"}, set(), [("marker/evil.py", False)]),
        ("file-under-dir-name", set(), {"partial"}, [("partial", False)]),
        ("link-under-dir-name", set(), {"partial"}, [("partial", True)]),
        ("nested-dir-under-file-name", {"marker"}, set(), [("marker/deep/evil.py", False)]),
    ],
)
def test_working_names_hide_only_what_they_name(
    tmp_path: Path, make: str, skip_files: set, skip_dirs: set, found: list
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    if make == "dir-under-file-name":
        (root / "marker").mkdir()
        (root / "marker" / "evil.py").write_text("x")
    elif make == "file-under-dir-name":
        (root / "partial").write_text("x")
    elif make == "link-under-dir-name":
        (root / "partial").symlink_to(tmp_path)
    else:
        (root / "marker" / "deep").mkdir(parents=True)
        (root / "marker" / "deep" / "evil.py").write_text("x")
    assert sorted(walk_files(root, frozenset(skip_files), frozenset(skip_dirs))) == found
