"""boot prepare/verify through the real huggingface_hub against a loopback hub."""
from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from boot import verify as verify_module
from boot.cli import main as boot_main
from boot.errors import BootError
from boot.prepare import prepare
from boot.settings import REVISION, BootSettings
from tests.fixtures.deepseek import SHARDS, boot_env, tiny_repo
from tests.fixtures.hub import HubRepo, LoopbackHub


def _prepare(base: Path, hub: LoopbackHub | None, **extra: str):
    env = boot_env(base, **({"HF_ENDPOINT": hub.url} if hub else {}), **extra)
    with mock.patch.dict(os.environ, env, clear=True):
        return prepare(BootSettings.from_env())


def _receipt(base: Path) -> dict | None:
    path = base / "state" / "verification.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_prepare_downloads_the_pinned_revision_and_writes_a_receipt(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        report = _prepare(tmp_path, hub)
    assert report is not None and report.files == 5 and report.hashed == 5
    receipt = _receipt(tmp_path)
    assert receipt["revision"] == REVISION and receipt["status"] == "verified"
    assert sorted(f["name"] for f in receipt["files"]) == sorted(tiny_repo().files)
    assert (tmp_path / "model" / SHARDS[1]).read_bytes() == b"\x02" * 8192
    assert not list((tmp_path / "state").glob("*.tmp")) and not list((tmp_path / "state").glob(".*"))


def _lying(**kwargs) -> HubRepo:
    repo = tiny_repo()
    for key, value in kwargs.items():
        setattr(repo, key, value)
    return repo


REFUSALS = [
    ("wrong revision sha", lambda: _lying(reported_commit="0" * 40), "not the pinned revision", "revision"),
    ("wrong size", lambda: _lying(metadata_overrides={"tokenizer.json": {"size": 3}}), "Wrong file size: tokenizer.json",
     "tokenizer.json"),
    ("wrong sha256", lambda: _lying(metadata_overrides={SHARDS[0]: {"sha256": "ab" * 32}}),
     f"Hash mismatch: {SHARDS[0]} (sha256", SHARDS[0]),
    ("wrong git sha1", lambda: _lying(metadata_overrides={"config.json": {"blobId": "cd" * 20}}),
     "Hash mismatch: config.json (git-sha1", "config.json"),
    ("index shard not verified", lambda: tiny_repo(extra_index_shard="model-00003-of-00003.safetensors"),
     "weight index names shards that were not verified", "model.safetensors.index.json"),
]


@pytest.mark.parametrize("name,repo,message,field", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_prepare_refusals_leave_no_verified_receipt(tmp_path: Path, name, repo, message, field) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub)  # a good receipt exists first: a failure must withdraw it
    assert _receipt(tmp_path)["status"] == "verified"
    with LoopbackHub(repo()) as hub, pytest.raises(BootError) as caught:
        _prepare(tmp_path, hub, MODEL_PATH=str(tmp_path / "fresh-model"))
    assert message in str(caught.value) and caught.value.field == field
    assert _receipt(tmp_path) is None


def test_a_path_escaping_the_model_root_is_refused(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub)
    outside = tmp_path / "outside.json"
    outside.write_bytes((tmp_path / "model" / "tokenizer.json").read_bytes())
    (tmp_path / "model" / "tokenizer.json").unlink()
    (tmp_path / "model" / "tokenizer.json").symlink_to(outside)
    with mock.patch.dict(os.environ, boot_env(tmp_path), clear=True):
        code = boot_main(["verify", "--full"])
    assert code == 2 and _receipt(tmp_path) is None


def test_a_file_modified_while_hashed_is_refused(tmp_path: Path, monkeypatch) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub)
    real = verify_module.hash_files_parallel

    def tamper_during(*args, **kwargs):
        digests = real(*args, **kwargs)
        shard = tmp_path / "model" / SHARDS[0]
        os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1_000_000_000))
        return digests

    monkeypatch.setattr(verify_module, "hash_files_parallel", tamper_during)
    with mock.patch.dict(os.environ, boot_env(tmp_path), clear=True), pytest.raises(BootError) as caught:
        verify_module.verify_checkpoint(
            tmp_path / "model", verify_module.entries_from_receipt(tmp_path / "state", REVISION),
            state=tmp_path / "state", revision=REVISION, rehash_all=True, quiet=True)
    assert f"changed while it was hashed: {SHARDS[0]}" in str(caught.value)
    assert _receipt(tmp_path) is None


def test_receipt_reuse_rehashes_nothing_then_only_the_touched_file(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        assert _prepare(tmp_path, hub).hashed == 5
        second = _prepare(tmp_path, hub)
        assert (second.hashed, second.reused) == (0, 5)
        shard = tmp_path / "model" / SHARDS[1]
        os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 5_000_000_000))
        third = _prepare(tmp_path, hub)
    assert (third.hashed, third.reused, third.hashed_bytes) == (1, 4, 8192)


def test_verify_command_works_offline_from_the_receipt(tmp_path: Path, capsys) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub)
    # The hub is gone and HF_ENDPOINT unset: verify needs no network.
    with mock.patch.dict(os.environ, boot_env(tmp_path), clear=True):
        assert boot_main(["verify"]) == 0
        assert "(0 hashed, 5 unchanged" in capsys.readouterr().err
        assert boot_main(["verify", "--full"]) == 0
        assert "(5 hashed, 0 unchanged" in capsys.readouterr().err
        (tmp_path / "model" / SHARDS[0]).write_bytes(b"\x09" * 4096)
        assert boot_main(["verify"]) == 2
    assert f"Hash mismatch: {SHARDS[0]}" in json.loads(capsys.readouterr().err.splitlines()[-1])["error"]


def test_verify_without_a_receipt_says_to_prepare(tmp_path: Path, capsys) -> None:
    with mock.patch.dict(os.environ, boot_env(tmp_path), clear=True):
        assert boot_main(["verify"]) == 2
    assert "run `boot prepare` first" in capsys.readouterr().err


def test_skip_prepare_and_skip_verify(tmp_path: Path) -> None:
    with pytest.raises(BootError, match="SKIP_PREPARE=1 but .*config.json is missing"):
        _prepare(tmp_path, None, SKIP_PREPARE="1")
    with LoopbackHub(tiny_repo()) as hub:
        assert _prepare(tmp_path, hub, SKIP_VERIFY="1") is None
        assert hub.downloads["config.json"] == 1
    assert _receipt(tmp_path) is None
    assert _prepare(tmp_path, None, SKIP_PREPARE="1") is None


def test_other_ranks_wait_with_a_deadline(tmp_path: Path) -> None:
    with pytest.raises(BootError, match="Rank 1: .* never appeared within 1 s"):
        _prepare(tmp_path, None, NNODES="3", NODE_RANK="1", RANK_WAIT_TIMEOUT_S="1")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert _prepare(tmp_path, None, NNODES="3", NODE_RANK="2", RANK_WAIT_TIMEOUT_S="1") is None
