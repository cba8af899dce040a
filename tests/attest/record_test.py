"""attest.record piece by piece: where RECORD rows land, which rows are refused, what the
installed-files check refuses, wheels, and the command line."""

from __future__ import annotations

import io
import json
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest

from attest import record
from attest.errors import AttestError
from tests.fixtures.wheels import build_wheel, record_row


@pytest.mark.parametrize(
    "raw, landed",
    [
        ("pkg/mod.py", "pkg/mod.py"),
        ("mod.py", "mod.py"),
        ("/usr/bin/tool", None),
        ("../../bin/tool", None),
        ("pkg/../../escape", None),
        ("pkg-1.data/scripts/tool", None),
        ("pkg-1.data/headers/x.h", None),
        ("pkg-1.data/purelib/pkg/a.py", "pkg/a.py"),
        ("pkg-1.data/platlib/pkg/a.so", "pkg/a.so"),
        ("pkg-1.data/purelib/", None),
        ("pkg-1.data/purelib", None),
    ],
)
def test_where_a_record_row_lands_in_the_site(raw: str, landed) -> None:
    assert record._site_path(raw) == landed


def _rows(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


GOOD = record_row("pkg/a.py", b"a").strip()


def test_rows_outside_the_site_and_installer_files_are_counted_or_left_out() -> None:
    rows, outside = record.parse_record(
        _rows(
            GOOD,
            "../../bin/tool,sha256=x,1",
            "pkg-1.data/scripts/t,sha256=x,1",
            "pkg-1.dist-info/INSTALLER,,",
            "pkg-1.dist-info/RECORD,,",
            "",
            record_row("pkg/INSTALLER", b"pkg's own file").strip(),
        ),
        "RECORD",
    )
    assert outside == 2
    assert [row.path for row in rows] == ["pkg/a.py", "pkg/INSTALLER"]
    assert rows[0].size == 1 and rows[0].algorithm == "sha256"


@pytest.mark.parametrize(
    "data, field, message",
    [
        (b"\xff\xfe", "RECORD", "is not a UTF-8 CSV file"),
        (_rows(GOOD, "pkg/b.py,sha256=x"), "RECORD", "RECORD line 2 has 2 fields"),
        (_rows(GOOD, "pkg/b.py,md5=abc,3"), "pkg/b.py", "line 2: pkg/b.py has no usable hash and size"),
        (_rows("pkg/b.py,sha256=,3"), "pkg/b.py", "line 1: pkg/b.py has no usable hash"),
        (_rows("pkg/b.py,sha256=abc,"), "pkg/b.py", "found 'sha256=abc',''"),
        (_rows("pkg/b.py,sha256=abc,-3"), "pkg/b.py", "no usable hash and size"),
        (_rows("pkg/sub.dist-info/RECORD,,"), "pkg/sub.dist-info/RECORD", "no usable hash"),
        (_rows("pkg/\x00evil,sha256=abc,3"), "RECORD line 1", ""),
    ],
)
def test_malformed_rows_are_refused_by_line_and_path(data: bytes, field: str, message: str) -> None:
    with pytest.raises(AttestError) as caught:
        record.parse_record(data, "RECORD")
    assert caught.value.field == field and message in str(caught.value), (caught.value.field, str(caught.value))


def test_the_row_limit_has_two_sides() -> None:
    with mock.patch.object(record, "MAX_ROWS", 2):
        assert len(record.parse_record(_rows(GOOD, GOOD), "RECORD")[0]) == 2
        with pytest.raises(AttestError, match="lists more than 2 files"):
            record.parse_record(_rows(GOOD, GOOD, GOOD), "RECORD")


def _site(tmp_path: Path) -> tuple[Path, list]:
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "a.py").write_bytes(b"a")
    (site / "top.py").write_bytes(b"top")
    rows, outside = record.parse_record(_rows(GOOD, record_row("top.py", b"top").strip()), "RECORD")
    return site, rows


def test_an_intact_installation_counts_every_byte(tmp_path: Path) -> None:
    site, rows = _site(tmp_path)
    (site / "pkg" / "__pycache__").mkdir()
    (site / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    (site / "pkg-1.dist-info").mkdir()
    (site / "pkg-1.dist-info" / "INSTALLER").write_text("pip\n")
    (site / "unrelated.py").write_text("another distribution's top-level module")
    check = record.verify_installed(site, rows, 3, "pkg-1.dist-info")
    assert (check.files, check.bytes, check.outside_site) == (2, 4, 3)


@pytest.mark.parametrize(
    "breaker, field, message",
    [
        (lambda s: (s / "pkg" / "a.py").write_bytes(b"b"), "pkg/a.py", "does not match its RECORD entry"),
        (lambda s: (s / "pkg" / "new.py").write_text("planted"), "pkg/new.py", "not listed in pkg-1.dist-info/RECORD"),
        (
            lambda s: (s / "pkg" / "link.py").symlink_to(s / "top.py"),
            "pkg/link.py",
            "is a symlink inside the installed",
        ),
        # Importable without source: only bytecode inside __pycache__ is Python's own cache.
        (lambda s: (s / "pkg" / "b.pyc").write_bytes(b"compiled"), "pkg/b.pyc", "not listed in pkg-1.dist-info/RECORD"),
        (
            lambda s: ((s / "pkg" / "__pycache__").mkdir(), (s / "pkg" / "__pycache__" / "notes.txt").write_text("x")),
            "pkg/__pycache__/notes.txt",
            "not listed in pkg-1.dist-info/RECORD",
        ),
    ],
)
def test_a_changed_planted_or_linked_file_is_refused(tmp_path: Path, breaker, field: str, message: str) -> None:
    site, rows = _site(tmp_path)
    breaker(site)
    with pytest.raises(AttestError) as caught:
        record.verify_installed(site, rows, 0, "pkg-1.dist-info")
    assert caught.value.field == field and message in str(caught.value)


def test_a_row_with_the_right_digest_but_the_wrong_size_is_refused(tmp_path: Path) -> None:
    site, rows = _site(tmp_path)
    rows[0] = record.RecordRow(rows[0].path, rows[0].algorithm, rows[0].digest, rows[0].size + 1)
    with pytest.raises(AttestError, match=r"\(2 bytes\), found sha256=.* \(1 bytes\)"):
        record.verify_installed(site, rows, 0, "pkg-1.dist-info")


def test_wheels_give_the_canonical_digest_and_malformed_ones_are_refused(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, "pkg", "1", {"pkg/a.py": b"a"})
    digest = record.wheel_canonical_sha256(wheel)
    assert len(digest) == 64
    not_zip = tmp_path / "bad.whl"
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(AttestError, match="is not a wheel"):
        record.wheel_canonical_sha256(not_zip)
    for records in ([], ["a-1.dist-info/RECORD", "b-1.dist-info/RECORD"]):
        other = tmp_path / f"n{len(records)}.whl"
        with zipfile.ZipFile(other, "w") as archive:
            archive.writestr("x/y-1.dist-info/RECORD", "")  # nested: not the wheel's own RECORD
            for name in records:
                archive.writestr(name, GOOD + "\n")
        with pytest.raises(AttestError, match=f"has {len(records)} top-level .dist-info/RECORD files"):
            record.wheel_canonical_sha256(other)


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = record.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_the_command_line(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, "pkg", "1", {"pkg/a.py": b"a"})
    code, out, _ = _main([str(wheel)])
    assert code == 0 and json.loads(out) == {"path": str(wheel), "record_sha256": record.wheel_canonical_sha256(wheel)}
    dist_info = tmp_path / "site" / "pkg-1.dist-info"
    dist_info.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        (dist_info / "RECORD").write_bytes(archive.read("pkg-1.dist-info/RECORD"))
    code, out, _ = _main([str(dist_info)])
    assert code == 0 and json.loads(out)["record_sha256"] == record.wheel_canonical_sha256(wheel)
    assert _main(["--help"])[0] == 0 and _main(["-h"])[0] == 0 and "usage:" in _main(["-h"])[2]
    assert _main(["x", "--help"])[0] == 0 and _main(["-h", "x"])[0] == 0  # help wins wherever it is
    assert _main([])[0] == 2 and _main(["a", "b"])[0] == 2
    code, out, err = _main([str(tmp_path / "missing.dist-info")])
    assert code == 2 and out == "" and json.loads(err)["ok"] is False
