"""attest: strict documents, primitives, hashing and atomic writes."""
from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from attest.documents import CheckpointAttestation, parse_document
from attest.export_schemas import SCHEMAS
from attest.speculation import DFlash2Gate
from attest.errors import AttestError
from attest.files import canonical_json, write_atomic
from attest.hashing import Progress, hash_files_parallel, sha256_file
from attest.primitives import child_file, read_json_object, require_revision, require_sha256
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


@pytest.mark.parametrize("change,field,detail", [
    ({"extra": 1}, "attestation.extra", "unknown field"),
    ({"expected_shard_count": "3"}, "attestation.expected_shard_count", "valid integer"),
    ({"expected_shard_count": True}, "attestation.expected_shard_count", "valid integer"),
    ({"revision": "main"}, "attestation.revision", "40-character commit SHA"),
    ({"config_sha256": "cd" * 31}, "attestation.config_sha256", "64-character SHA-256"),
    ({"schema_version": 1}, "attestation.schema_version", "Input should be '1'"),
    ({"shards": [{"path": "a", "size": 0, "sha256": "00" * 32}]}, "attestation.shards.0.size", "greater than 0"),
    ({"shards": [{"path": "a", "size": 1}]}, "attestation.shards.0.sha256", "required field is missing"),
])
def test_documents_are_strict(change: dict, field: str, detail: str) -> None:
    with pytest.raises(AttestError) as caught:
        parse_document(CheckpointAttestation, {**GOOD, **change}, label="attestation")
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
    for relative, message in [("link", "escapes the checkpoint root"), ("sub", "not a non-empty local file"),
                              ("", "safe path relative"), ("/etc/passwd", "safe path relative"),
                              ("sub/../../secret", "safe path relative"), ("missing", "is missing")]:
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
    stream = io.StringIO()
    progress = Progress(total_bytes=10, total_files=1, label="verifying", stream=stream, enabled=True)
    progress.add_bytes(10)
    progress.file_done()
    assert "verifying: 1/1 files" in stream.getvalue() and stream.getvalue().endswith("\n")


def test_write_atomic_sets_mode_from_the_first_byte_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state" / "secret"
    write_atomic(target, b"one", mode=0o600)
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    write_atomic(target, canonical_json({"b": 1, "a": 2}), mode=0o600)
    assert target.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert [p.name for p in target.parent.iterdir()] == ["secret"]
