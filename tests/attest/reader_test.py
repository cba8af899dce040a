"""attest.reader: one bounded read of an untrusted file, strict JSON, each limit on both sides."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from attest.errors import AttestError
from attest.reader import loads, loads_object, read_file, read_json_file, refuse_nul


def _refused(call, *args, **kwargs) -> str:
    with pytest.raises(AttestError) as caught:
        call(*args, **kwargs)
    assert caught.value.field == "doc"
    return str(caught.value)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _nested_value(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "text, problem",
    [
        (_nested(65), "nests deeper than 64 levels"),
        ('{"a": ' + _nested(64) + "}", "nests deeper than 64 levels"),
        ("1" * 41, "an integer of 41 digits is out of range"),
        ("-" + "1" * 41, "an integer of 42 digits is out of range"),
        ("1." + "0" * 63, "a number of 65 characters is out of range"),
        ("1e400", "1e400 overflows a float"),
        ("-1e400", "-1e400 overflows a float"),
        ("NaN", "NaN is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ("{", "is not valid JSON"),
    ],
)
def test_strict_json_refuses_each_excess(text: str, problem: str) -> None:
    assert problem in _refused(loads, text, label="doc")


@pytest.mark.parametrize(
    "text, value",
    [
        (_nested(64), _nested_value(64)),
        ('{"a": ' + _nested(63) + "}", {"a": _nested_value(63)}),
        ("1" * 40, int("1" * 40)),
        ("-" + "1" * 40, -int("1" * 40)),
        ("1." + "0" * 62, 1.0),
        ("1e308", 1e308),
        ('"[[[[ {{{{ \\" ]]"', '[[[[ {{{{ " ]]'),  # brackets in strings are not nesting
    ],
)
def test_strict_json_accepts_each_limit_exactly(text: str, value) -> None:
    assert loads(text, label="doc") == value


def test_a_document_is_at_most_max_bytes_and_an_object_when_one_is_asked_for() -> None:
    assert loads("[1]  ", label="doc", max_bytes=5) == [1]
    assert "is 6 bytes; at most 5 allowed" in _refused(loads, "[1]   ", label="doc", max_bytes=5)
    assert "must contain a JSON object, got list" in _refused(loads_object, "[1]", label="doc")
    assert "is not valid UTF-8" in _refused(loads, b'"\xff"', label="doc")


def test_read_file_reads_max_bytes_exactly_and_refuses_one_more(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3_000_001)  # several read chunks
    read = read_file(path, label="doc", max_bytes=3_000_001)
    assert read.data == path.read_bytes() and read.sha256 == hashlib.sha256(read.data).hexdigest()
    assert read.path == path
    assert "is 3000001 bytes; at most 3000000 allowed" in _refused(read_file, path, label="doc", max_bytes=3_000_000)


def test_read_file_refuses_a_file_that_grows_past_its_bound_while_read() -> None:
    # /proc files stat as 0 bytes and then yield more: what a file growing after fstat looks like.
    assert "grew past 10 bytes while read" in _refused(read_file, "/proc/self/status", label="doc", max_bytes=10)
    assert read_file("/proc/self/status", label="doc", max_bytes=1 << 20).data.startswith(b"Name:")


def test_an_error_while_reading_is_a_refusal_naming_the_file() -> None:
    # /proc/self/mem stats as a regular file and fails its first read (EIO at address 0).
    assert "cannot be read: /proc/self/mem (Input/output error)" in _refused(
        read_file, "/proc/self/mem", label="doc", max_bytes=10
    )


def test_a_wide_document_is_not_deep_and_a_deep_one_after_it_is_still_deep() -> None:
    wide = "[" + "[]," * 100 + "[]]"
    assert len(loads(wide, label="doc")) == 101
    assert "nests deeper than 64 levels" in _refused(loads, "[" + "[]," * 40 + _nested(64) + "]", label="doc")


def test_a_json_error_is_cut_at_200_characters() -> None:
    key = "k" * 300
    message = _refused(loads, f'{{"{key}": 1, "{key}": 2}}', label="doc")
    assert message == "doc is not valid JSON: " + f"duplicate key {key!r}"[:200]


def test_read_file_refuses_empty_special_missing_and_linked_files(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert "is empty" in _refused(read_file, tmp_path / "empty", label="doc", max_bytes=10)
    assert read_file(tmp_path / "empty", label="doc", max_bytes=10, allow_empty=True).data == b""
    os.mkfifo(tmp_path / "fifo")
    assert "must be a regular file" in _refused(read_file, tmp_path / "fifo", label="doc", max_bytes=10)
    assert "must be a regular file" in _refused(read_file, tmp_path, label="doc", max_bytes=10)
    assert "cannot be opened: " + str(tmp_path / "missing") + " (No such file or directory)" in _refused(
        read_file, tmp_path / "missing", label="doc", max_bytes=10
    )
    (tmp_path / "real").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_json_file(tmp_path / "link", label="doc")[0] == {}
    message = _refused(read_json_file, tmp_path / "link", label="doc", follow_symlinks=False)
    assert "symlink loop, or a symlink where none is allowed" in message
    assert "path contains a NUL byte" in _refused(refuse_nul, "a\x00b", "doc")
