"""attest: strict documents, primitives, hashing and atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from attest.documents import CheckpointAttestation, parse_document
from attest.errors import AttestError
from attest.export_schemas import SCHEMAS
from attest.files import canonical_json, write_atomic
from attest.hashing import hash_files_parallel, sha256_file
from attest.primitives import (
    MAX_TMPDIR_BYTES,
    child_file,
    read_json_object,
    require_revision,
    require_sha256,
    require_writable_cache_env,
)
from attest.progress import Progress
from attest.speculation import DFlash2Gate, SpeculatorAttestation
from tests.fixtures.qwen import gate_document

GOOD = {
    "schema_version": "1",
    "model_id": "Qwen/Qwen3.8-27B",
    "revision": "AB" * 20,
    "config_sha256": "CD" * 32,
    "weight_index_sha256": "ef" * 32,
    "expected_shard_count": 3,
}


def test_documents_normalise_digests_to_lower_case() -> None:
    doc = parse_document(CheckpointAttestation, GOOD, label="attestation")
    assert doc.revision == "ab" * 20 and doc.config_sha256 == "cd" * 32
    assert doc.weight_index_path == "model.safetensors.index.json" and doc.shards is None


@pytest.mark.parametrize(
    "change,field,detail",
    [
        ({"extra": 1}, "attestation.extra", "unknown field"),
        ({"expected_shard_count": "3"}, "attestation.expected_shard_count", "valid integer"),
        ({"expected_shard_count": True}, "attestation.expected_shard_count", "valid integer"),
        ({"revision": "main"}, "attestation.revision", "40-character commit SHA"),
        ({"config_sha256": "cd" * 31}, "attestation.config_sha256", "64-character SHA-256"),
        ({"schema_version": 1}, "attestation.schema_version", "Input should be '1'"),
        ({"shards": [{"path": "a", "size": 0, "sha256": "00" * 32}]}, "attestation.shards.0.size", "greater than 0"),
        ({"shards": [{"path": "a", "size": 1}]}, "attestation.shards.0.sha256", "required field is missing"),
        (
            {"shards": [{"path": "", "size": 1, "sha256": "00" * 32}]},
            "attestation.shards.0.path",
            "at least 1 character",
        ),
    ],
)
def test_documents_are_strict(change: dict, field: str, detail: str) -> None:
    with pytest.raises(AttestError) as caught:
        parse_document(CheckpointAttestation, {**GOOD, **change}, label="attestation")
    assert caught.value.field == field and detail in str(caught.value)


def _speculator(size: object) -> dict:
    return {
        "schema_version": "1",
        "model_id": "m",
        "revision": "ab" * 20,
        "target": {"model_id": "t", "revision": "cd" * 20},
        "config_sha256": "00" * 32,
        "weight_files": [{"path": "model.safetensors", "size": size, "sha256": "11" * 32}],
    }


def _gate_with_samples_compared(count: object) -> dict:
    gate = gate_document()
    return {**gate, "parity": {**gate["parity"], "benchmark_samples_compared": count}}


# Both sides of every numeric limit in the speculation documents.
@pytest.mark.parametrize(
    "model,build,accepted,refused,field,detail",
    [
        (SpeculatorAttestation, _speculator, 0, -1, "doc.weight_files.0.size", "greater than or equal to 0"),
        (
            DFlash2Gate,
            _gate_with_samples_compared,
            0,
            -1,
            "doc.parity.benchmark_samples_compared",
            "greater than or equal to 0",
        ),
    ],
)
def test_speculation_document_limits_on_both_sides(model, build, accepted, refused, field, detail) -> None:
    parse_document(model, build(accepted), label="doc")
    with pytest.raises(AttestError) as caught:
        parse_document(model, build(refused), label="doc")
    assert caught.value.field == field and detail in str(caught.value)


def test_gate_fixture_is_a_valid_gate_and_schemas_forbid_extras() -> None:
    parse_document(DFlash2Gate, gate_document(), label="gate")
    for name, model in SCHEMAS.items():
        schema = model.model_json_schema()
        assert schema["additionalProperties"] is False, name
        assert schema["properties"]["schema_version"]["const"] == "1", name


def test_schema_export_target_matches_the_models() -> None:
    for name, model in SCHEMAS.items():
        exported = json.loads(Path(f"attest/{name}.schema.json").read_text())
        assert exported == json.loads(json.dumps(model.model_json_schema())), name


@pytest.mark.parametrize("value", ["", "main", "g" * 40, "a" * 39, "a" * 41])
def test_require_revision_refuses(value: str) -> None:
    with pytest.raises(AttestError, match="PIN must be an immutable 40-character commit SHA") as caught:
        require_revision(value, "PIN")
    assert caught.value.field == "PIN"


def test_require_sha256_strips_and_lowercases() -> None:
    assert require_sha256(" " + "AB" * 32 + "\n", "X") == "ab" * 32
    with pytest.raises(AttestError):
        require_sha256("ab" * 31, "X")


def test_read_json_object_bounds(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"a": 1}')
    assert read_json_object(path, label="doc") == {"a": 1}
    path.write_text('{"a": "' + "x" * 100 + '"}')
    with pytest.raises(AttestError, match="is 109 bytes; at most 50 allowed"):
        read_json_object(path, label="doc", max_bytes=50)


def test_child_file_refuses_symlink_escape_and_dirs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "secret").write_text("x")
    (root / "link").symlink_to(tmp_path / "secret")
    (root / "ok").write_text("y")
    assert child_file(root, "ok", label="f") == root / "ok"
    for relative, message in [
        ("link", "escapes the checkpoint root"),
        ("sub", "not a non-empty local file"),
        ("", "safe path relative"),
        ("/etc/passwd", "safe path relative"),
        ("sub/../../secret", "safe path relative"),
        ("missing", "is missing"),
    ]:
        with pytest.raises(AttestError, match=message.replace("(", r"\(")):
            child_file(root, relative, label="f")


def test_parallel_hashing_matches_single_and_reports_progress(tmp_path: Path) -> None:
    paths = []
    for index in range(6):
        path = tmp_path / f"f{index}"
        path.write_bytes(os.urandom(1000 + index))
        paths.append(path)
    digests = hash_files_parallel(paths, label="t", workers=3)
    assert digests == {path: sha256_file(path) for path in paths}
    lines: list[str] = []
    progress = Progress(10, 1, "verifying", enabled=True, emit=lines.append)
    progress.add(10)
    progress.item_done()
    assert lines[-1].startswith("verifying: 1/1 files, 0.00/0.00 GB")


def test_write_atomic_sets_mode_from_the_first_byte_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state" / "secret"
    write_atomic(target, b"one", mode=0o600)
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    write_atomic(target, canonical_json({"b": 1, "a": 2}), mode=0o600)
    assert target.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert [p.name for p in target.parent.iterdir()] == ["secret"]
    write_atomic(tmp_path / "plain", b"x")
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644  # the default: readable, not executable


def test_a_failed_atomic_write_raises_and_leaves_the_old_file_alone(tmp_path: Path) -> None:
    target = tmp_path / "doc.json"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "text, not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["doc.json"]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "dir", b"new")  # cannot replace a non-empty directory
    assert (tmp_path / "dir" / "inside").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "doc.json"]


REQUIRED = frozenset({"schema_version", "model_id"})


def _json_of_size(size: int) -> bytes:
    head = b'{"schema_version": "1", "model_id": "m", "pad": "'
    return head + b"x" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize(
    "content,replaceable",
    [
        (b'{"schema_version": "1", "model_id": "m"}', True),  # exactly the required keys
        (b'{"schema_version": "1", "model_id": "m", "extra": 1}', True),
        (b'{"schema_version": "1"}', False),
        (b"[]", False),
        (b"not json", False),
        (_json_of_size(16 << 20), True),  # the documents' read bound (MAX_JSON_BYTES): 16 MiB is still read
        (_json_of_size((16 << 20) + 1), False),  # one byte more is not read, so not known to be ours
    ],
    ids=["exact keys", "more keys", "missing key", "array", "not json", "16 MiB", "16 MiB + 1"],
)
def test_only_a_document_of_the_same_kind_is_replaceable(tmp_path: Path, content: bytes, replaceable: bool) -> None:
    from attest.files import require_replaceable

    path = tmp_path / "out.json"
    path.write_bytes(content)
    if replaceable:
        require_replaceable(path, REQUIRED, what="a test document", field="--output")
        return
    with pytest.raises(AttestError) as caught:
        require_replaceable(path, REQUIRED, what="a test document", field="--output")
    assert caught.value.field == "--output" and "is not a test document; it was left as it is" in str(caught.value)
    assert path.read_bytes() == content


def test_read_document_checks_the_pin_on_the_bytes_it_parses(tmp_path: Path) -> None:
    from attest.documents import load_document, read_document

    path = tmp_path / "attestation.json"
    path.write_bytes(json.dumps(GOOD).encode())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    document, found = read_document(CheckpointAttestation, path, label="attestation")
    assert isinstance(document, CheckpointAttestation) and found == digest
    assert read_document(CheckpointAttestation, path, label="attestation", pinned_sha256=digest)[1] == digest
    assert isinstance(load_document(CheckpointAttestation, path, label="attestation"), CheckpointAttestation)
    for pin_field, field in (("PIN_VARIABLE", "PIN_VARIABLE"), ("", "attestation")):
        with pytest.raises(AttestError) as caught:
            read_document(
                CheckpointAttestation, path, label="attestation", pinned_sha256="00" * 32, pin_field=pin_field
            )
        assert caught.value.field == field and f"found {digest}" in str(caught.value)


def test_the_first_invalid_field_in_schema_order_is_the_one_reported() -> None:
    with pytest.raises(AttestError) as caught:
        parse_document(
            CheckpointAttestation, {**GOOD, "revision": "main", "expected_shard_count": 0}, label="attestation"
        )
    assert caught.value.field == "attestation.revision"


def test_an_unexpected_error_is_one_bounded_redacted_json_line(capsys, monkeypatch) -> None:
    from attest.edge.refusal import report_unexpected

    monkeypatch.setenv("HF_TOKEN", "hf_sekret_value")
    message = "x" * 499 + "yz" + " hf_sekret_value"
    assert report_unexpected(RuntimeError(message), secrets=("also-secret",)) == 2
    line = json.loads(capsys.readouterr().err)
    # The exception text is cut at 500 characters: exactly the first 500, no more.
    assert line == {"ok": False, "error": "internal error: RuntimeError: " + "x" * 499 + "y", "field": "internal"}
    assert report_unexpected(KeyError("also-secret hf_sekret_value")) == 2
    assert "sekret" not in capsys.readouterr().err
    assert report_unexpected(KeyError("also-secret"), secrets=("also-secret",)) == 2
    assert "also-secret" not in capsys.readouterr().err


@pytest.mark.parametrize("secret,hidden", [("abc", False), ("abcd", True)])
def test_secrets_shorter_than_four_characters_are_switches_not_secrets(secret: str, hidden: bool) -> None:
    from attest.edge.redact import redactor

    assert (redactor([secret])(f"value={secret}") == "value=[REDACTED]") is hidden


TRICKY_SECRET = "it's \"ké\\y"  # a quote of each kind, a backslash, a space and a non-ASCII letter


def test_every_escaped_spelling_of_a_secret_is_known_longest_first() -> None:
    from attest.edge.redact import secret_forms

    forms = secret_forms(TRICKY_SECRET)
    assert set(forms) == {
        TRICKY_SECRET,
        "it%27s%20%22k%C3%A9%5Cy",  # URL-encoded
        "it's \\\"k\\u00e9\\\\y",  # JSON, ASCII-only
        "it's \\\"ké\\\\y",  # JSON, UTF-8
        "'it'\"'\"'s \"ké\\y'",  # shell-quoted
        "it'\"'\"'s \"ké\\y",  # shell-quoted, inside the outer quotes
        "it's \"k\\xe9\\\\y",  # unicode_escape
        "it\\'s \"ké\\\\y",  # Python repr
    }
    assert [len(form) for form in forms] == sorted((len(form) for form in forms), reverse=True)
    assert secret_forms("abcd") == ["abcd"] and secret_forms("a b'c")[0] == "'a b'\"'\"'c'"


def test_the_redactor_hides_the_secret_in_every_encoding_that_prints_it() -> None:
    import shlex
    from urllib.parse import quote

    from attest.edge.redact import redactor

    redact = redactor([TRICKY_SECRET, ""])
    for printed in (
        TRICKY_SECRET,
        json.dumps({"key": TRICKY_SECRET}),
        json.dumps(TRICKY_SECRET, ensure_ascii=False),
        repr(TRICKY_SECRET),
        shlex.join(["--key", TRICKY_SECRET]),
        f"https://h/?k={quote(TRICKY_SECRET)}",
        TRICKY_SECRET.encode("unicode_escape").decode(),
    ):
        hidden = redact(printed)
        assert "[REDACTED]" in hidden and "k\\" not in hidden and "ké" not in hidden and "%C3" not in hidden, hidden


@pytest.mark.parametrize(
    "name,problem",
    [
        ("", "is empty"),
        ("a" * 1025, "is longer than 1024 bytes"),
        ("é" * 512 + "a", "is longer than 1024 bytes"),  # bytes, not characters
        ("a\x1fb", "contains a NUL or control character"),
        ("a\x00b", "contains a NUL or control character"),
        ("a\x7fb", "contains a NUL or control character"),
        ("a\u0085b", "(U+0085: Unicode Cc"),  # C1 control (NEL)
        ("a\x80b", "(U+0080: Unicode Cc"),  # C1 control
        ("evil\u202etxt.py", "(U+202E"),  # right-to-left override: prints as 'evilyp.txt'
        ("a\u200bb", "(U+200B"),  # zero-width space (Cf)
        ("a\u2028b", "(U+2028"),  # line separator (Zl)
        ("a\u2029b", "(U+2029"),  # paragraph separator (Zp)
        ("a\\b", "contains a backslash"),
        ("/a", "is absolute"),
        ("a//b", "has an empty, '.' or '..' component"),
        ("a/./b", "has an empty, '.' or '..' component"),
        ("a/../b", "has an empty, '.' or '..' component"),
        ("a/", "has an empty, '.' or '..' component"),
    ],
)
def test_unsafe_file_names_are_refused_with_the_reason(name: str, problem: str) -> None:
    from attest.primitives import safe_relative_name

    with pytest.raises(AttestError) as caught:
        safe_relative_name(name, "listing.path")
    assert caught.value.field == "listing.path" and problem in str(caught.value)


@pytest.mark.parametrize("name", [None, 5, b"bytes"])
def test_a_name_that_is_not_text_is_refused(name) -> None:
    from attest.primitives import safe_relative_name

    with pytest.raises(AttestError, match="is empty"):
        safe_relative_name(name, "listing.path")


@pytest.mark.parametrize("name", ["a" * 1024, "é" * 512, "a b", "a\u00e9b", "dir/sub/file.bin", "...", "a..b"])
def test_plain_relative_names_up_to_1024_bytes_are_accepted(name: str) -> None:
    from attest.primitives import safe_relative_name

    assert safe_relative_name(name, "listing.path") == name


def test_a_refused_revision_or_digest_shows_80_characters_of_what_was_given() -> None:
    from attest.primitives import require_sha256

    for check in (require_revision, require_sha256):
        with pytest.raises(AttestError) as caught:
            check("z" * 100, "PIN")
        assert str(caught.value).endswith(f"got {'z' * 80!r}")


@pytest.mark.parametrize(
    "raw, problem",
    [
        ("file:///models/x", "must be a local directory, not a URL"),
        ("s3://bucket/x", "must be a local directory, not a URL"),
        ("hf:org/model", "must be a local directory, not a URL"),
        ("/models/s3://x", "does not exist"),  # a colon inside an absolute path is a (missing) local path
        ("relative/dir", "must be an absolute local path"),
    ],
)
def test_a_local_root_is_an_absolute_path_never_a_url(raw: str, problem: str) -> None:
    from attest.primitives import local_root

    with pytest.raises(AttestError) as caught:
        local_root(Path(raw), label="MODEL_PATH")
    assert caught.value.field == "MODEL_PATH" and problem in str(caught.value)


def test_local_root_and_child_file_name_a_symlink_loop(tmp_path: Path) -> None:
    from attest.primitives import local_root

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(AttestError, match="MODEL_PATH is a symlink loop"):
        local_root(tmp_path / "loop", label="MODEL_PATH")
    with pytest.raises(AttestError, match="f is a symlink loop: loop"):
        child_file(tmp_path, "loop", label="f")
    (tmp_path / "file").write_text("x")
    with pytest.raises(AttestError, match="MODEL_PATH is not a directory"):
        local_root(tmp_path / "file", label="MODEL_PATH")
    assert local_root(tmp_path, label="MODEL_PATH") == tmp_path.resolve()


def test_writable_dir_creates_only_when_asked_and_names_the_variable(tmp_path: Path) -> None:
    from attest.primitives import require_writable_cache_env, writable_dir

    later = tmp_path / "a" / "b"
    assert writable_dir(later, "HF_HOME", create=False) == later and not (tmp_path / "a").exists()
    assert writable_dir(later, "HF_HOME", create=True) == later and later.is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(AttestError) as caught:
        writable_dir(tmp_path / "file" / "sub", "HF_HOME", create=False, default_used=True)
    assert caught.value.field == "HF_HOME"
    assert str(caught.value).startswith(
        f"HF_HOME (default) {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is not a "
        "directory: mount a writable volume at"
    )
    with pytest.raises(AttestError, match=r"HF_HOME .* cannot be created \(") as created:
        writable_dir(tmp_path / "file" / "sub", "HF_HOME", create=True)
    assert created.value.field == "HF_HOME"
    assert require_writable_cache_env({"HF_HOME": str(later), "TMPDIR": "", "OTHER": "/x"}) == [f"HF_HOME={later}"]
    with pytest.raises(AttestError) as cache:
        require_writable_cache_env({"XDG_CACHE_HOME": str(tmp_path / "file")})
    assert cache.value.field == "XDG_CACHE_HOME"


def test_writable_dir_refuses_a_read_only_place(tmp_path: Path) -> None:
    from attest.primitives import writable_dir

    if os.geteuid() == 0:  # root may write anywhere: what a read-only mount answers is simulated
        from unittest import mock

        with (
            mock.patch("os.access", return_value=False),
            pytest.raises(AttestError, match=f"TMPDIR {tmp_path / 'new'} is not writable by uid 0"),
        ):
            writable_dir(tmp_path / "new", "TMPDIR", create=False)
        return
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o500)
    with pytest.raises(AttestError, match="is not writable by uid"):
        writable_dir(readonly / "new", "TMPDIR", create=False)


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_tmpdir_must_leave_room_for_the_engine_sockets(extra: int, refused: bool) -> None:
    import shutil
    import tempfile

    assert MAX_TMPDIR_BYTES == 70  # 107-byte socket path - "/" - a 36-character uuid
    base = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: the test's own tmp_path may be longer
    try:
        # Multi-byte characters count as bytes: "é" is two.
        tmpdir = base / ("t" * (MAX_TMPDIR_BYTES + extra - len(str(base).encode()) - 2 - 8)) / ("é" * 4)
        tmpdir.mkdir(parents=True)
        assert len(str(tmpdir).encode()) == MAX_TMPDIR_BYTES + extra
        if refused:
            with pytest.raises(AttestError, match=f"TMPDIR is {MAX_TMPDIR_BYTES + 1} bytes long") as caught:
                require_writable_cache_env({"TMPDIR": str(tmpdir)})
            assert caught.value.field == "TMPDIR" and "at most 70 bytes (e.g. /tmp)" in str(caught.value)
        else:
            assert require_writable_cache_env({"TMPDIR": str(tmpdir)}) == [f"TMPDIR={tmpdir}"]
    finally:
        shutil.rmtree(base)
