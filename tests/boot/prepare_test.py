"""boot prepare/verify through the real huggingface_hub against a loopback hub that may be
hostile: the checkpoint lock decides what is expected, never the hub."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from attest.lock import PARTIAL_DIR, VERIFIED_MARKER
from boot.checkpoint.receipt import RECEIPT
from boot.checkpoint.sources import prepare
from boot.cli import main as boot_main
from boot.errors import BootError
from boot.settings import REVISION, BootSettings
from tests.fixtures.deepseek import SHARDS, boot_env, tiny_repo, write_lock
from tests.fixtures.hub import HubRepo, LoopbackHub
from tests.fixtures.tools import hold_run_lock


def _env(base: Path, hub: LoopbackHub | None, **extra: str) -> dict[str, str]:
    return boot_env(base, **({"HF_ENDPOINT": hub.url} if hub else {}), **extra)


def _prepare(base: Path, hub: LoopbackHub | None, **extra: str):
    with mock.patch.dict(os.environ, _env(base, hub, **extra), clear=True):
        return prepare(BootSettings.from_env())


def _reviewed(base: Path, repo: HubRepo | None = None) -> dict[str, str]:
    """Settings that pin a reviewed lock of the honest repository."""
    path = base / "locks" / "checkpoint.lock.json"
    sha = write_lock(path, repo or tiny_repo())
    return {"CHECKPOINT_LOCK": str(path), "CHECKPOINT_LOCK_SHA256": sha}


def _receipt(base: Path) -> dict | None:
    path = base / "state" / RECEIPT
    return json.loads(path.read_text()) if path.exists() else None


def _outside(base: Path) -> list[str]:
    """Every path under `base` outside the model, state, lock and hub-cache folders."""
    kept = {"model", "state", "locks", "hf-home", "fresh-model"}
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.relative_to(base).parts[0] not in kept)


def test_prepare_downloads_only_the_lock_and_hashes_in_the_same_pass(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        report = _prepare(tmp_path, hub, **_reviewed(tmp_path))
        assert sum(hub.downloads.values()) == 5
    assert (report.files, report.downloaded, report.hashed, report.trust) == (5, 5, 0, "reviewed")
    receipt = _receipt(tmp_path)
    assert receipt["revision"] == REVISION and receipt["status"] == "verified" and receipt["trust"] == "reviewed"
    assert sorted(receipt["files"]) == sorted(tiny_repo().files)
    assert set(receipt["files"][SHARDS[0]]) == {"size", "mtime_ns", "ctime_ns", "inode", "device"}
    assert (tmp_path / "model" / SHARDS[1]).read_bytes() == b"\x02" * 8192
    assert not (tmp_path / "model" / ".omni-partial").exists()
    assert not list((tmp_path / "state").glob("*.tmp")) and not list((tmp_path / "state").glob(".*"))
    assert oct((tmp_path / "state" / "receipt.key").stat().st_mode & 0o777) == "0o600"


def test_without_a_lock_a_development_run_trusts_on_first_use_and_says_so(tmp_path: Path, capsys) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        report = _prepare(tmp_path, hub)
        assert report.trust == "trust-on-first-use"
        kept = json.loads((tmp_path / "state" / "checkpoint.lock.json").read_text())
        assert kept["trust"] == "trust-on-first-use" and len(kept["files"]) == 5
        assert _receipt(tmp_path)["trust"] == "trust-on-first-use"
        assert "TRUST ON FIRST USE" in capsys.readouterr().err
        # The kept lock is the truth from now on: a hub that changes a file is refused.
        hub.repo.files["tokenizer.json"] = b'{"version": "2.0"}'
        with pytest.raises(BootError, match="hub metadata differs from the checkpoint lock for tokenizer.json"):
            _prepare(tmp_path, hub, MODEL_PATH=str(tmp_path / "fresh-model"))


def _lying(**kwargs) -> HubRepo:
    repo = tiny_repo()
    for key, value in kwargs.items():
        setattr(repo, key, value)
    return repo


HOSTILE = [
    (
        "traversal ../",
        lambda: _lying(listed_only={"../../../../tmp/omni-x": b"x"}),
        "'..' component",
        "../../../../tmp/omni-x",
    ),
    (
        "traversal ../state",
        lambda: _lying(listed_only={"../state/verification.json": b"{}"}),
        "'..' component",
        "../state/verification.json",
    ),
    ("absolute name", lambda: _lying(listed_only={"/etc/omni-evil": b"x"}), "is absolute", "/etc/omni-evil"),
    (
        "backslash name",
        lambda: _lying(listed_only={"..\\..\\evil.py": b"x"}),
        "contains a backslash",
        "..\\..\\evil.py",
    ),
    ("NUL in name", lambda: _lying(listed_only={"evil\u0000.py": b"x"}), "NUL or control character", "evil\x00.py"),
    (
        "extra file only in the listing",
        lambda: _lying(listed_only={"modeling_evil.py": b"import os"}),
        "the hub lists modeling_evil.py, which the checkpoint lock does not",
        "modeling_evil.py",
    ),
    (
        "file missing from the listing",
        lambda: _lying(unlisted={"tokenizer.json"}),
        "the hub does not list tokenizer.json",
        "tokenizer.json",
    ),
    (
        "wrong size in metadata",
        lambda: _lying(metadata_overrides={"tokenizer.json": {"size": 3}}),
        "hub metadata differs from the checkpoint lock for tokenizer.json: size lock 18, hub 3",
        "tokenizer.json",
    ),
    (
        "wrong sha256 in metadata",
        lambda: _lying(metadata_overrides={SHARDS[0]: {"sha256": "ab" * 32}}),
        f"hub metadata differs from the checkpoint lock for {SHARDS[0]}: sha256 lock",
        SHARDS[0],
    ),
    ("another commit", lambda: _lying(reported_commit="0" * 40), "not the pinned revision", "revision"),
    (
        "wrong bytes, matching metadata",
        lambda: _lying(served_instead={SHARDS[0]: b"\x07" * 4096}),
        f"{SHARDS[0]}: no verified download after 2 attempts; last: {SHARDS[0]}: the hub served other bytes",
        SHARDS[0],
    ),
    (
        "longer body",
        lambda: _lying(served_instead={"config.json": b"{}" * 500}),
        "the hub sent more than the lock's",
        "config.json",
    ),
    ("truncated body", lambda: _lying(truncated={SHARDS[1]}), f"{SHARDS[1]}: ", SHARDS[1]),
    (
        "malformed metadata",
        lambda: _lying(raw_metadata=b'{"sha": "' + REVISION.encode() + b'", "siblings": [1]}'),
        "is malformed at siblings.0",
        "HF_ENDPOINT",
    ),
    ("metadata not JSON", lambda: _lying(raw_metadata=b"<html>"), "is not valid JSON", "HF_ENDPOINT"),
    (
        "metadata with NaN size",
        lambda: _lying(raw_metadata=b'{"sha": "x", "siblings": [{"size": NaN}]}'),
        "NaN is not a JSON number",
        "HF_ENDPOINT",
    ),
    ("stalled body", lambda: _lying(stalled={SHARDS[1]: 3.0}), "no bytes for 0.5 s (DOWNLOAD_STALL_S)", SHARDS[1]),
]


@pytest.mark.parametrize("name,repo,message,field", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_a_hostile_hub_is_refused_and_writes_nothing_outside_the_roots(
    tmp_path: Path, name, repo, message, field
) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)  # a good receipt exists first: a failure must withdraw it
    assert _receipt(tmp_path)["status"] == "verified"
    before = _outside(tmp_path)
    fresh = tmp_path / "fresh-model"
    with LoopbackHub(repo()) as hub, pytest.raises(BootError) as caught:
        _prepare(tmp_path, hub, MODEL_PATH=str(fresh), DOWNLOAD_STALL_S="0.5", DOWNLOAD_ATTEMPTS="2", **pinned)
    assert message in str(caught.value) and caught.value.field == field, str(caught.value)
    assert _receipt(tmp_path) is None
    assert _outside(tmp_path) == before and not Path("/tmp/omni-x").exists() and not Path("/etc/omni-evil").exists()
    for path in fresh.rglob("*"):  # only whole, verified files ever land in the model root
        if path.is_file() and path.parent.name != ".omni-partial":
            assert path.read_bytes() == tiny_repo().files[str(path.relative_to(fresh))]


def test_a_transient_hub_failure_is_retried_and_reported(tmp_path: Path, capsys) -> None:
    with LoopbackHub(_lying(failures_before_success={"config.json": 1})) as hub:
        report = _prepare(tmp_path, hub, **_reviewed(tmp_path))
        assert hub.downloads["config.json"] == 2
    assert report.downloaded == 5
    assert "download attempt 1/3 failed: config.json: the hub answered HTTP 503" in capsys.readouterr().err


def test_a_corrupt_file_from_an_earlier_run_is_healed_by_the_next_honest_run(tmp_path: Path, capsys) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
        (tmp_path / "model" / SHARDS[0]).write_bytes(b"\x09" * 4096)  # same size, other bytes
        report = _prepare(tmp_path, hub, **pinned)
        assert hub.downloads[SHARDS[0]] == 2 and hub.downloads[SHARDS[1]] == 1
    assert (report.downloaded, report.hashed) == (1, 1)
    assert (tmp_path / "model" / SHARDS[0]).read_bytes() == b"\x01" * 4096
    assert f"fetching {SHARDS[0]} again: Hash mismatch" in capsys.readouterr().err


def test_an_in_place_edit_with_the_mtime_restored_is_caught_by_ctime(tmp_path: Path, capsys) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    shard = tmp_path / "model" / SHARDS[1]
    before = shard.stat()
    time.sleep(0.01)
    with shard.open("r+b") as handle:
        handle.write(b"\x03")
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # `touch -d` back
    assert shard.stat().st_mtime_ns == before.st_mtime_ns and shard.stat().st_size == before.st_size
    with mock.patch.dict(os.environ, _env(tmp_path, None, **pinned), clear=True):
        assert boot_main(["verify"]) == 2
    refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert refusal["field"] == SHARDS[1] and f"Hash mismatch: {SHARDS[1]}" in refusal["error"]
    assert _receipt(tmp_path) is None


@pytest.mark.parametrize("edit", ["identity", "lock binding", "added digest", "revision"])
def test_a_hand_edited_receipt_is_refused(tmp_path: Path, capsys, edit: str) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    path = tmp_path / "state" / RECEIPT
    receipt = json.loads(path.read_text())
    if edit == "identity":
        receipt["files"][SHARDS[0]]["ctime_ns"] += 1
    elif edit == "lock binding":
        receipt["lock_sha256"] = "0" * 64
    elif edit == "added digest":
        receipt["files"][SHARDS[0]]["sha256"] = "ab" * 32
    else:
        receipt["revision"] = "0" * 40
    path.write_text(json.dumps(receipt))
    with mock.patch.dict(os.environ, _env(tmp_path, None, **pinned), clear=True):
        assert boot_main(["verify"]) == 2
        refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
        assert "the receipt is refused" in refusal["error"] and refusal["field"] == RECEIPT
        assert path.exists()  # refusing to use it is not a reason to withdraw it
        # prepare does not trust it either: every file is hashed again.
        report = prepare(BootSettings.from_env())
    assert (report.hashed, report.reused) == (5, 0)


def test_verify_full_hashes_against_the_lock_never_the_receipt(tmp_path: Path, capsys) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    with mock.patch.dict(os.environ, _env(tmp_path, None, **pinned), clear=True):
        assert boot_main(["verify"]) == 0
        err = capsys.readouterr().err
        assert "0 downloaded and hashed as they arrived, 0 hashed from disk" in err and "5 unchanged" in err
        assert boot_main(["verify", "--full"]) == 0
        err = capsys.readouterr().err
        assert "0 downloaded and hashed as they arrived, 5 hashed from disk" in err and "0 unchanged" in err
    # A lock that expects other bytes: --full refuses although the receipt would vouch.
    other = tiny_repo()
    other.files[SHARDS[0]] = b"\x05" * 4096
    lock = tmp_path / "locks" / "other.lock.json"
    sha = write_lock(lock, other)
    with mock.patch.dict(
        os.environ, _env(tmp_path, None, CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha), clear=True
    ):
        assert boot_main(["verify", "--full"]) == 2
    assert f"Hash mismatch: {SHARDS[0]}" in json.loads(capsys.readouterr().err.splitlines()[-1])["error"]


@pytest.mark.parametrize(
    "planted,refused",
    [
        ("modeling_evil.py", True),
        ("sub/extra.safetensors", True),
        ("extra_config.json", True),
        ("notes.md", False),
        (".cache/huggingface/x.metadata", False),
    ],
)
def test_files_the_lock_does_not_list(tmp_path: Path, capsys, planted: str, refused: bool) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    target = tmp_path / "model" / planted
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("planted")
    with mock.patch.dict(os.environ, _env(tmp_path, None, **pinned), clear=True):
        code = boot_main(["verify", "--full"])
    err = capsys.readouterr().err
    if refused:
        assert code == 2 and planted in json.loads(err.splitlines()[-1])["error"]
        assert _receipt(tmp_path) is None
    else:
        assert code == 0 and f"not in the checkpoint lock (not loaded by the engine): ['{planted}']" in err


def test_a_symlink_inside_the_model_root_is_refused(tmp_path: Path, capsys) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    outside = tmp_path / "outside.json"
    outside.write_bytes((tmp_path / "model" / "tokenizer.json").read_bytes())
    (tmp_path / "model" / "tokenizer.json").unlink()
    (tmp_path / "model" / "tokenizer.json").symlink_to(outside)
    with mock.patch.dict(os.environ, _env(tmp_path, None, **pinned), clear=True):
        assert boot_main(["verify", "--full"]) == 2
    assert "symlink" in json.loads(capsys.readouterr().err.splitlines()[-1])["error"]
    assert _receipt(tmp_path) is None


@pytest.mark.parametrize(
    "change,field,message",
    [
        ("sha", "CHECKPOINT_LOCK_SHA256", "has sha256"),
        ("missing", "CHECKPOINT_LOCK", "the pinned checkpoint lock is missing"),
        ("revision", "checkpoint lock.revision", "is for revision"),
        ("duplicate", "CHECKPOINT_LOCK.files", "listed twice"),
        ("traversal", "CHECKPOINT_LOCK.files.0.path", "'..' component"),
    ],
)
def test_lock_refusals(tmp_path: Path, change: str, field: str, message: str) -> None:
    pinned = _reviewed(tmp_path)
    lock = Path(pinned["CHECKPOINT_LOCK"])
    if change == "sha":
        pinned["CHECKPOINT_LOCK_SHA256"] = "cd" * 32
    elif change == "missing":
        lock.unlink()
    elif change == "revision":
        pinned["CHECKPOINT_LOCK_SHA256"] = write_lock(lock, tiny_repo(), revision="1" * 40)
    else:
        document = json.loads(lock.read_text())
        if change == "duplicate":
            document["files"].append(document["files"][0])
        else:
            document["files"][0]["path"] = "../escape.json"
        lock.write_text(json.dumps(document))
        pinned["CHECKPOINT_LOCK_SHA256"] = __import__("hashlib").sha256(lock.read_bytes()).hexdigest()
    with LoopbackHub(tiny_repo()) as hub, pytest.raises(BootError) as caught:
        _prepare(tmp_path, hub, **pinned)
    assert caught.value.field == field and message in str(caught.value), str(caught.value)
    assert not (tmp_path / "model").exists() or not any((tmp_path / "model").iterdir())


@pytest.mark.parametrize("exists", [False, True])
def test_verify_with_a_wrong_model_path_names_it_and_keeps_the_receipt(tmp_path: Path, capsys, exists: bool) -> None:
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    wrong = tmp_path / "no-such-model"
    if exists:  # e.g. an empty volume mounted at the default path
        (wrong / "notes").mkdir(parents=True)
    with mock.patch.dict(os.environ, _env(tmp_path, None, MODEL_PATH=str(wrong), **pinned), clear=True):
        assert boot_main(["verify"]) == 2
    refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert refusal["field"] == "MODEL_PATH" and str(wrong) in refusal["error"]
    assert _receipt(tmp_path)["status"] == "verified"


def test_verify_without_a_lock_says_to_prepare(tmp_path: Path, capsys) -> None:
    (tmp_path / "model").mkdir()
    with mock.patch.dict(os.environ, boot_env(tmp_path), clear=True):
        assert boot_main(["verify"]) == 2
    assert "run `boot prepare` first" in capsys.readouterr().err


def test_skip_prepare_and_skip_verify(tmp_path: Path) -> None:
    with pytest.raises(BootError, match="SKIP_PREPARE=1 but .*config.json is missing"):
        _prepare(tmp_path, None, SKIP_PREPARE="1")
    with LoopbackHub(tiny_repo()) as hub:
        assert _prepare(tmp_path, hub, SKIP_VERIFY="1", **_reviewed(tmp_path)) is None
        assert hub.downloads["config.json"] == 1
    assert _receipt(tmp_path) is None
    assert _prepare(tmp_path, None, SKIP_PREPARE="1") is None


def _rank(base: Path, rank: int, **extra: str) -> None:
    # No os.environ patching: one test runs a rank in a thread beside rank 0.
    prepare(BootSettings.from_env(_env(base, None, NNODES="3", NODE_RANK=str(rank), **extra)))


def test_other_ranks_wait_for_rank_0s_verdict_bound_to_the_same_lock(tmp_path: Path) -> None:
    pinned = _reviewed(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # config.json alone proves nothing
    with pytest.raises(BootError, match=r"Rank 1: no verified checkpoint from rank 0 .* within 1 s \(no verdict"):
        _rank(tmp_path, 1, RANK_WAIT_TIMEOUT_S="1", **pinned)
    (tmp_path / "model" / "config.json").unlink()
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, NNODES="3", **pinned)
    _rank(tmp_path, 2, RANK_WAIT_TIMEOUT_S="1", **pinned)
    # Another lock on this rank: it keeps waiting, then names both.
    other = tiny_repo()
    other.files["tokenizer.json"] = b'{"version": "9.9"}'
    lock = tmp_path / "locks" / "other.lock.json"
    sha = write_lock(lock, other)
    with pytest.raises(BootError, match="rank 0's verdict is bound to lock .*, this rank's is " + sha):
        _rank(tmp_path, 1, RANK_WAIT_TIMEOUT_S="1", CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha)
    # A file whose bytes changed after rank 0 verified it: this rank (no RANK_KEY_FILE: it hashes
    # every file itself) does not start (tests/boot/ranks_test.py: the same with a key).
    shard = tmp_path / "model" / SHARDS[0]
    shard.write_bytes(b"\x00" * shard.stat().st_size)
    with pytest.raises(BootError, match=f"Hash mismatch: {SHARDS[0]}") as refused:
        _rank(tmp_path, 1, RANK_WAIT_TIMEOUT_S="1", **pinned)
    assert refused.value.field == SHARDS[0]


def test_a_waiting_rank_starts_once_rank_0_publishes(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    errors: list[BaseException] = []

    def rank_one() -> None:
        try:
            with mock.patch("boot.checkpoint.ranks.POLL_S", 0.05):
                _rank(tmp_path, 1, RANK_WAIT_TIMEOUT_S="300")  # an event wait, sized for a loaded machine
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    waiter = threading.Thread(target=rank_one)
    with LoopbackHub(tiny_repo()) as hub:
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and not (tmp_path / "model" / VERIFIED_MARKER).exists()
        _prepare(tmp_path, hub, NNODES="3")  # trust on first use: rank 1 takes the lock rank 0 published
    waiter.join(300)
    assert not waiter.is_alive() and errors == []


def test_the_lock_command_writes_a_reviewed_lock_and_never_overwrites(tmp_path: Path, capsys) -> None:
    from boot.lock_command import main as lock_main

    output = tmp_path / "locks" / "deepseek_spark.checkpoint.lock.json"
    with (
        LoopbackHub(tiny_repo()) as hub,
        mock.patch.dict(os.environ, {"HF_ENDPOINT": hub.url, "BUILD_WORKING_DIRECTORY": str(tmp_path)}),
    ):
        assert lock_main(["--output", "locks/deepseek_spark.checkpoint.lock.json"]) == 0
        digest = capsys.readouterr().out.strip()
        assert __import__("hashlib").sha256(output.read_bytes()).hexdigest() == digest
        lock = json.loads(output.read_text())
        assert lock["trust"] == "reviewed" and lock["revision"] == REVISION and len(lock["files"]) == 5
        # The same bytes the test derives independently from the repository.
        write_lock(tmp_path / "expected.json", tiny_repo())
        assert lock["files"] == json.loads((tmp_path / "expected.json").read_text())["files"]
        assert lock_main(["--output", str(output)]) == 2
        assert "exists; pass --force" in capsys.readouterr().err
        assert lock_main(["--output", str(output), "--revision", "main"]) == 2
        assert "--revision must be an immutable" in capsys.readouterr().err
    with (
        LoopbackHub(_lying(listed_only={"../evil.py": b"x"})) as hub,
        mock.patch.dict(os.environ, {"HF_ENDPOINT": hub.url}),
    ):
        assert lock_main(["--output", str(tmp_path / "other.json")]) == 2
    assert "'..' component" in capsys.readouterr().err and not (tmp_path / "other.json").exists()


@pytest.mark.parametrize(
    "field, value, reason",
    [("revision", "0" * 40, "is for revision"), ("lock_sha256", "0" * 64, "is bound to checkpoint lock")],
)
def test_a_correctly_signed_receipt_for_another_revision_or_lock_is_refused(
    tmp_path: Path, capsys, field: str, value: str, reason: str
) -> None:
    """Signed with the real key (as a receipt written by another configuration would be): only
    the binding checks can refuse it."""
    from boot.checkpoint.receipt import Receipt, save_receipt

    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    state = tmp_path / "state"
    receipt = Receipt.model_validate({k: v for k, v in json.loads((state / RECEIPT).read_text()).items() if k != "mac"})
    save_receipt(state, receipt.model_copy(update={field: value}))
    with mock.patch.dict(os.environ, _env(tmp_path, None, **pinned), clear=True):
        assert boot_main(["verify"]) == 2
        refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
        assert refusal["field"] == RECEIPT and reason in refusal["error"], refusal
        report = prepare(BootSettings.from_env())
    assert (report.hashed, report.reused) == (5, 0)


def test_a_file_whose_locked_digest_changed_is_hashed_again_not_reused(tmp_path: Path, capsys) -> None:
    """The receipt vouches for identities under one lock; a lock expecting other bytes for a
    file (same size) must not inherit that vouching."""
    pinned = _reviewed(tmp_path)
    with LoopbackHub(tiny_repo()) as hub:
        _prepare(tmp_path, hub, **pinned)
    other = tiny_repo()
    other.files[SHARDS[0]] = b"\x05" * len(other.files[SHARDS[0]])
    lock = tmp_path / "locks" / "other.lock.json"
    sha = write_lock(lock, other)
    with mock.patch.dict(
        os.environ, _env(tmp_path, None, CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha), clear=True
    ):
        assert boot_main(["verify"]) == 2
    refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert "is bound to checkpoint lock" in refusal["error"] and refusal["field"] == RECEIPT


def test_a_second_prepare_on_one_model_path_is_refused_naming_the_first_and_publishes_nothing(
    tmp_path: Path, capsys
) -> None:
    """A restarted pod while the old one still terminates: the second rank 0 names the first's
    pid and writes nothing the first run's ranks would read; once the first is gone it runs."""
    model = tmp_path / "model"
    model.mkdir()
    holder = hold_run_lock(model / PARTIAL_DIR)
    try:
        with LoopbackHub(tiny_repo()) as hub:
            env = _env(tmp_path, hub, NNODES="3", NODE_RANK="0", **_reviewed(tmp_path))
            with mock.patch.dict(os.environ, env, clear=True):
                assert boot_main(["prepare"]) == 2
            refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
            assert refusal["field"] == "MODEL_PATH" and f"in use by another run (pid {holder.pid}" in refusal["error"]
            assert sorted(p.name for p in model.iterdir()) == [PARTIAL_DIR]  # no verdict, no refusal marker
            assert sum(hub.downloads.values()) == 0
    finally:
        holder.kill()
        holder.wait()
    with LoopbackHub(tiny_repo()) as hub:
        report = _prepare(tmp_path, hub, **_reviewed(tmp_path))
    assert report.downloaded == 5 and not (model / PARTIAL_DIR).exists()
