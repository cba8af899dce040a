"""MODEL_SOURCE=registry through a real registry (docker-registry with htpasswd, on loopback):
`boot prepare` pulls the pinned artifact into this rank's own MODEL_PATH with no hub, each file
hashed once as it arrives, and leaves a receipt the next start re-uses without any network; a
tampered blob is refused naming its file, a cut pull resumes with only the rest, a file changed
on disk is fetched again; and every input that is not the pinned artifact is refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attest.lock import ARTIFACT_LOCK, PARTIAL_DIR, WORKING_FILES
from boot.checkpoint.receipt import RECEIPT
from omni_oci.model.pack import load_lock_bytes
from omni_oci.model.push import push_checkpoint
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.deepseek import SHARDS, boot_env, tiny_repo, write_lock
from tests.fixtures.fault_proxy import FaultProxy, Step
from tests.fixtures.pins import write_baked
from tests.fixtures.registry import LoopbackRegistry, free_port, only_credentials

USER, PASSWORD = "omni", "registry-source-secret"


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry({USER: PASSWORD}) as served:
        yield served


class World:
    """The tiny checkpoint pushed as an artifact, its pinned lock, and a rank's paths."""

    def __init__(self, base: Path, registry: LoopbackRegistry, repository: str) -> None:
        self.base, self.registry = base, registry
        repo = tiny_repo()
        self.source = base / "checkpoint"
        for name, data in repo.files.items():
            (self.source / name).parent.mkdir(parents=True, exist_ok=True)
            (self.source / name).write_bytes(data)
        self.lock_path = base / "locks" / "checkpoint.lock.json"
        self.lock_sha = write_lock(self.lock_path, repo)
        lock, data = load_lock_bytes(self.lock_path)
        with RegistryClient(registry.host) as client:
            report = push_checkpoint(
                self.source, lock, data, f"{registry.host}/{repository}", platform="linux/arm64", client=client
            )
        self.reference = f"{registry.host}/{repository}@{report.digest}"
        self.manifest = json.loads(self._blob_path(report.digest).read_bytes())
        self.model = base / "model"

    def _blob_path(self, digest: str) -> Path:
        hexdigest = digest.split(":", 1)[1]
        return self.registry.dir / "storage/docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def layer_blob(self, path: str) -> Path:
        """The stored blob of the layer holding `path` (the registry's own file)."""
        for layer in self.manifest["layers"]:
            if layer.get("annotations", {}).get("org.opencontainers.image.title") == path:
                return self._blob_path(layer["digest"])
        raise AssertionError(f"no layer for {path}")

    def boot(self, command: str = "prepare", **settings: str) -> subprocess.CompletedProcess:
        env = boot_env(
            self.base,
            MODEL_SOURCE="registry",
            MODEL_ARTIFACT=self.reference,
            CHECKPOINT_LOCK=str(self.lock_path),
            CHECKPOINT_LOCK_SHA256=self.lock_sha,
            DOWNLOAD_WORKERS="1",
            HOME=str(self.base / "home"),
            OMNI_REGISTRY_HOST=self.registry.host,
            OMNI_REGISTRY_USERNAME=USER,
            OMNI_REGISTRY_PASSWORD=PASSWORD,
            # No hub at all: a request to it would fail at once.
            HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
            PYTHONPATH=os.pathsep.join(sys.path),
        )
        env.update(settings)
        return subprocess.run(
            [sys.executable, "-m", "boot", command], env=env, capture_output=True, text=True, timeout=120
        )

    def pulled(self) -> dict[str, bytes]:
        return {
            str(path.relative_to(self.model)): path.read_bytes()
            for path in sorted(self.model.rglob("*"))
            if path.is_file() and path.name != ARTIFACT_LOCK
        }


@pytest.fixture
def world(tmp_path: Path, registry, monkeypatch, request) -> World:
    only_credentials(tmp_path / "home", monkeypatch, registry.host, USER, PASSWORD)
    return World(tmp_path, registry, f"models/{request.node.name.lower()[:40].strip('_-[]')}")


def _refusal(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 2, done.stderr[-3000:]
    return json.loads(done.stderr.strip().splitlines()[-1])


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_each_rank_pulls_its_own_copy_then_a_restart_reuses_the_receipt_offline(world: World) -> None:
    said = _ok(world.boot(NNODES="3", NODE_RANK="2", RANK_WAIT_TIMEOUT_S="1"))  # no wait for rank 0
    assert "5 downloaded and hashed as they arrived, 0 hashed from disk" in said
    assert world.pulled() == {name: (world.source / name).read_bytes() for name in tiny_repo().files}
    assert (world.model / ARTIFACT_LOCK).read_bytes() == world.lock_path.read_bytes()
    receipt = json.loads((world.base / "state" / RECEIPT).read_text())
    assert sorted(receipt["files"]) == sorted(tiny_repo().files) and receipt["lock_sha256"] == world.lock_sha
    # The restart: the registry is not reachable, and nothing needs it.
    offline = world.reference.replace(world.registry.host, f"127.0.0.1:{free_port()}")
    said = _ok(world.boot(MODEL_ARTIFACT=offline))
    assert "0 downloaded" in said and "0 hashed from disk" in said and "5 unchanged since the receipt" in said
    _ok(world.boot("verify", MODEL_ARTIFACT=offline))


def test_a_file_changed_on_disk_is_fetched_again_and_named(world: World) -> None:
    _ok(world.boot())
    shard = world.model / SHARDS[1]
    stat = shard.stat()
    shard.write_bytes(b"\x07" * stat.st_size)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the mtime put back; the ctime moved
    refusal = _refusal(world.boot("verify"))
    assert refusal["field"] == SHARDS[1]
    said = _ok(world.boot())
    assert f"fetching {SHARDS[1]} again" in said and "1 downloaded" in said
    assert "0 hashed from disk" in said and "4 unchanged since the receipt" in said  # checked once, not again
    assert shard.read_bytes() == (world.source / SHARDS[1]).read_bytes()


def test_a_tampered_blob_is_refused_naming_its_file_and_nothing_is_complete(world: World) -> None:
    blob = world.layer_blob(SHARDS[0])
    data = bytearray(good := blob.read_bytes())
    data[600] ^= 0xFF  # inside the file's bytes, after the tar header: same size, another digest
    blob.write_bytes(bytes(data))
    try:
        refusal = _refusal(world.boot())
    finally:  # the blob store is the registry's, shared by the module's tests
        blob.write_bytes(good)
    assert refusal["field"] == SHARDS[0] and "the lock says" in refusal["error"], refusal
    assert not (world.model / ARTIFACT_LOCK).exists() and not (world.model / SHARDS[0]).exists()
    assert not (world.model / PARTIAL_DIR).exists()  # the refused shard's bytes are not kept
    assert not (world.base / "state" / RECEIPT).exists()
    assert _refusal(world.boot("verify"))["field"] == ARTIFACT_LOCK


def test_a_cut_pull_is_named_and_the_next_start_fetches_only_the_rest(world: World) -> None:
    host, port = world.registry.host.split(":")
    with FaultProxy((host, int(port)), [Step("cut", after=12000)]) as proxy:
        through = world.reference.replace(world.registry.host, proxy.host)
        refusal = _refusal(world.boot(MODEL_ARTIFACT=through, OMNI_REGISTRY_HOST=proxy.host))
    assert refusal["field"] in tiny_repo().files and "broke off" in refusal["error"], refusal
    assert not (world.model / ARTIFACT_LOCK).exists()
    said = _ok(world.boot())
    downloaded = int(said.split(" downloaded and hashed")[0].rsplit(" ", 1)[1])
    assert 1 <= downloaded < len(tiny_repo().files), said
    assert world.pulled() == {name: (world.source / name).read_bytes() for name in tiny_repo().files}


def _baked(world: World, digest: str) -> str:
    """The image's baked pins (the shipped DeepSeek pins) naming this lock and an artifact."""
    pins = json.loads(Path("images/deepseek_spark.pins.json").read_text())
    repository = world.reference.split("@")[0]
    pins["model"].update(lock_sha256=world.lock_sha, artifact={"repository": repository, "digest": digest})
    return str(write_baked(world.base / "image.json", pins))


def test_the_pinned_artifact_is_the_default_and_another_digest_is_refused(world: World) -> None:
    pinned = world.reference.split("@")[1]
    said = _ok(world.boot(MODEL_ARTIFACT="", OMNI_IMAGE_JSON=_baked(world, pinned)))
    assert f"pulling {world.reference} into" in said and "5 downloaded" in said
    other = world.reference.split("@")[0] + "@sha256:" + "7" * 64
    refusal = _refusal(world.boot(MODEL_ARTIFACT=other, OMNI_IMAGE_JSON=_baked(world, pinned)))
    assert refusal["field"] == "MODEL_ARTIFACT" and "is not the artifact the image pins" in refusal["error"]


REFUSALS = [
    # (name, settings or a change of the world, field, what the refusal says)
    ("no artifact named", {"MODEL_ARTIFACT": ""}, "MODEL_ARTIFACT", "needs the model artifact"),
    ("a tag", {"MODEL_ARTIFACT": "127.0.0.1:1/models/x:latest"}, "MODEL_ARTIFACT", "by digest"),
    ("not a reference", {"MODEL_ARTIFACT": "Not A Reference@@"}, "MODEL_ARTIFACT", "MODEL_ARTIFACT"),
    ("SKIP_VERIFY", {"SKIP_VERIFY": "1"}, "SKIP_VERIFY", "MODEL_SOURCE=registry"),
    ("SKIP_PREPARE", {"SKIP_PREPARE": "1"}, "SKIP_PREPARE", "MODEL_SOURCE=registry"),
    ("no lock", {"CHECKPOINT_LOCK": "/nonexistent/lock.json"}, "CHECKPOINT_LOCK", "missing"),
    ("another lock pinned", {"CHECKPOINT_LOCK_SHA256": "0" * 64}, "CHECKPOINT_LOCK_SHA256", "pins"),
    ("wrong password", {"OMNI_REGISTRY_PASSWORD": "wrong"}, "registry", "refused the credentials"),
    ("a stray file", "stray", "stray.bin", "does not list"),
    # Issue #68: a directory under a working file's name is walked like any other.
    *[
        (f"a file under {name}/", f"hidden:{name}", f"{name}/modeling_evil.py", "does not list")
        for name in sorted(WORKING_FILES)
    ],
    ("another lock carried", "other-lock", ARTIFACT_LOCK, "expected"),
]


@pytest.mark.parametrize(("name", "change", "field", "says"), REFUSALS, ids=[row[0] for row in REFUSALS])
def test_what_is_not_the_pinned_artifact_is_refused_by_name(world: World, name, change, field, says) -> None:
    settings = change if isinstance(change, dict) else {}
    if change == "stray":
        world.model.mkdir()
        (world.model / "stray.bin").write_bytes(b"planted")
    if isinstance(change, str) and change.startswith("hidden:"):
        (world.model / change.split(":", 1)[1]).mkdir(parents=True)
        (world.model / field).write_text("import os  # planted")
    if change == "other-lock":  # the pinned lock is another one (a revision the artifact is not of)
        repo = tiny_repo()
        repo.files["tokenizer.json"] = b'{"version": "2.0"}'
        settings["CHECKPOINT_LOCK_SHA256"] = write_lock(world.lock_path, repo)
    refusal = _refusal(world.boot(**settings))
    assert refusal["field"] == field, refusal
    assert says in refusal["error"], refusal
    assert not (world.model / ARTIFACT_LOCK).is_file() and not (world.base / "state" / RECEIPT).exists()
