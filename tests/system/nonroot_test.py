"""The images run as uid 1000 on a read-only root filesystem, writing only to the volumes
they declare: each image is unpacked (umoci, as root), its rootfs bind-mounted read-only,
tmpfs or the test's directories mounted only at the declared volumes, and the entrypoint run
through `chroot --userspec=1000:1000` with the ROCm groups, in a mount namespace of its own.
Needs real root (mounts, chroot): tagged to run outside Bazel's sandbox."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from omni_oci.format.layout import read_blob, read_layout
from tests.fixtures.deepseek import tiny_repo, write_lock
from tests.fixtures.oci import UMOCI, confined, run, writable_copy
from tests.fixtures.qwen import TARGET_REVISION, attest_checkpoint, make_checkpoint, make_fake_vllm

USER = "1000:1000"
GROUPS = "44,110"  # video, render: what a ROCm deployment adds with --group-add


def _unpack(name: str, tmp_path: Path) -> tuple[Path, dict]:
    if os.geteuid() != 0:
        pytest.fail(f"this test needs real root (mounts, chroot, setuid); it runs as uid {os.geteuid()}")
    layout = writable_copy(Path("images") / f"{name}.layout", tmp_path / "layout")
    bundle = tmp_path / "bundle"
    unpacked = run([UMOCI, "unpack", "--image", f"{layout}:latest", str(bundle)])
    assert unpacked.returncode == 0, unpacked.stderr
    _, manifest, _ = read_layout(layout)
    return bundle / "rootfs", json.loads(read_blob(layout, manifest["config"]["digest"]))["config"]


def _listing(rootfs: Path) -> list[tuple[str, int, int]]:
    entries = []
    for directory, dirs, files in os.walk(rootfs):
        for name in dirs + files:
            path = Path(directory, name)
            info = path.lstat()
            entries.append((str(path.relative_to(rootfs)), info.st_mode, info.st_size if not dirs else 0))
    return sorted(entries)


def _confined(
    rootfs: Path, config: dict, argv: list[str], extra_env: dict[str, str], mounts: dict[str, str | Path]
) -> subprocess.CompletedProcess:
    """Run `argv` as uid 1000 in `rootfs` mounted read-only; `mounts` maps a path in the
    image to "tmpfs" (writable, owned by 1000) or ("ro", DIR) / ("rw", DIR) bind mounts."""
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    env.update(extra_env)
    return subprocess.run(
        confined(rootfs, argv, mounts, user=USER, groups=GROUPS), capture_output=True, text=True, timeout=120, env=env
    )


def _refusal(completed: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in completed.stderr, completed.stderr
    return json.loads(completed.stderr.strip().splitlines()[-1])


def test_the_images_declare_a_non_root_user_and_their_volumes(tmp_path: Path) -> None:
    for name, volumes in (
        ("qwen_mi300x", {"/cache", "/models", "/tmp"}),
        ("deepseek_spark", {"/cache", "/models", "/state", "/tmp"}),
    ):
        layout = Path("images") / f"{name}.layout"
        _, manifest, _ = read_layout(layout)
        config = json.loads(read_blob(layout, manifest["config"]["digest"]))["config"]
        assert config["User"] == USER and set(config["Volumes"]) == volumes
        env = dict(item.split("=", 1) for item in config["Env"])
        assert env["HOME"] == "/cache" and env["TMPDIR"] == "/tmp" and env["HF_HOME"].startswith("/cache/")
        labels = config["Labels"]
        assert labels["omni.runtime.user"] == USER and labels["omni.runtime.volumes"] == ",".join(sorted(volumes))
    qwen_labels = json.loads(
        read_blob(
            Path("images/qwen_mi300x.layout"), read_layout(Path("images/qwen_mi300x.layout"))[1]["config"]["digest"]
        )
    )["config"]["Labels"]
    assert qwen_labels["omni.runtime.groups"] == "video:44,render:110"


def test_the_launcher_decides_as_uid_1000_on_a_read_only_root(tmp_path: Path) -> None:
    rootfs, config = _unpack("qwen_mi300x", tmp_path)
    make_fake_vllm(rootfs / "usr" / "local" / "lib" / "python3.11" / "dist-packages")
    models = tmp_path / "models"
    make_checkpoint(models / "qwen")
    digest = attest_checkpoint(models / "qwen")
    before = _listing(rootfs)
    env = {
        "MODEL_ID": "Qwen/Qwen3.8-27B",
        "MODEL_REVISION": TARGET_REVISION,
        "QWEN_CHECKPOINT_MANIFEST_SHA256": digest,
        "QWEN_API_KEY": "k-nonroot",
    }
    volumes = {"/cache": "tmpfs", "/tmp": "tmpfs", "/models": ("ro", models)}
    who = _confined(
        rootfs,
        config,
        ["/usr/bin/python3", "-I", "-S", "-c", "import os; print(os.getuid(), os.getgid(), sorted(os.getgroups()))"],
        {},
        volumes,
    )
    assert who.stdout.strip().split(maxsplit=2) == ["1000", "1000", "[44, 110]"], who.stderr
    completed = _confined(rootfs, config, [*config["Entrypoint"], "--inspect-only"], env, volumes)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["decision"]["mode"] == "native_mtp"
    assert "HOME=/cache" in report["writable"] and "TMPDIR=/tmp" in report["writable"]
    assert _listing(rootfs) == before  # nothing written outside the declared volumes
    # No writable cache volume: refused, naming the variable and the path.
    unmounted = _confined(
        rootfs, config, [*config["Entrypoint"], "--inspect-only"], env, {"/tmp": "tmpfs", "/models": ("ro", models)}
    )
    assert unmounted.returncode == 2
    refusal = _refusal(unmounted)
    assert refusal["field"] == "HOME" and "/cache is not writable by uid 1000" in refusal["error"]


def test_boot_verifies_and_checks_health_as_uid_1000_on_a_read_only_root(tmp_path: Path) -> None:
    rootfs, config = _unpack("deepseek_spark_amd64_test", tmp_path)
    models = tmp_path / "models"
    repo = tiny_repo()
    for name, data in repo.files.items():
        (models / "DeepSeek-V4.1-Flash" / name).parent.mkdir(parents=True, exist_ok=True)
        (models / "DeepSeek-V4.1-Flash" / name).write_bytes(data)
    sha = write_lock(models / "checkpoint.lock.json", repo)
    env = {"CHECKPOINT_LOCK": "/models/checkpoint.lock.json", "CHECKPOINT_LOCK_SHA256": sha, "SERVER_PORT": "18999"}
    volumes = {"/cache": "tmpfs", "/tmp": "tmpfs", "/state": "tmpfs", "/models": ("ro", models)}
    before = _listing(rootfs)
    verified = _confined(rootfs, config, [*config["Entrypoint"], "verify", "--full"], env, volumes)
    assert verified.returncode == 0, verified.stderr
    assert "Verified 5 files against the reviewed checkpoint lock" in verified.stderr
    health = _confined(rootfs, config, [*config["Entrypoint"], "health"], env, volumes)
    assert health.returncode == 2 and _refusal(health)["field"] == "SERVER_PORT"
    assert _listing(rootfs) == before
    # The state volume missing (read-only root) or read-only: refused, naming STATE_PATH.
    for state in (None, ("ro", tmp_path)):
        mounts = {k: v for k, v in volumes.items() if k != "/state"}
        if state:
            mounts["/state"] = state
        refused = _confined(rootfs, config, [*config["Entrypoint"], "verify"], env, mounts)
        assert refused.returncode == 2, refused.stderr
        refusal = _refusal(refused)
        assert refusal["field"] == "STATE_PATH" and "/state is not writable by uid 1000" in refusal["error"]


@pytest.mark.parametrize("name", ["qwen_mi300x", "deepseek_spark_amd64_test"])
def test_the_probe_runs_from_the_images_own_shim_as_uid_1000(tmp_path: Path, name: str) -> None:
    """The manifests' exec probe: the entrypoint's shim with `attest.edge.status` (tools/deploy/pods.py)."""
    rootfs, config = _unpack(name, tmp_path)
    for mount_point in ("proc", "sys", "dev"):  # what a runtime creates for its mounts
        (rootfs / mount_point).mkdir(exist_ok=True)
    status = tmp_path / "tmp"
    status.mkdir()
    started = int(Path(f"/proc/{os.getpid()}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
    program = config["Entrypoint"][-1]
    document = {
        "schema_version": "1",
        "program": program,
        "stage": "starting",
        "processes": [[os.getpid(), started]],  # this test: running, and visible through the image's /proc
        "port": None,
        "reason": "",
        "written_ns": 1,
    }
    (status / "omni-status.json").write_text(json.dumps(document))
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    env["OMNI_STATUS_FILE"] = "/tmp/omni-status.json"

    def probe(verb: str) -> subprocess.CompletedProcess:
        argv = [*config["Entrypoint"][:-1], "attest.edge.status", verb]
        command = confined(rootfs, argv, {"/tmp": ("ro", status)}, user=USER, system=True)
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    live, ready = probe("live"), probe("ready")
    assert (live.returncode, live.stdout) == (0, "live\n"), live.stderr
    assert ready.returncode == 1 and ready.stdout == f"not ready: {program} has not accepted yet (stage starting)\n"
