"""A rehearsal of the DeepSeek group on loopback, no cluster: three boot processes started with
exactly the environment the generated LeaderWorkerSet gives each pod (LWS's injected variables
first, leader address 127.0.0.1 and indices 0-2, then the container's own with Kubernetes'
$(VAR) expansion and the Secret resolved), a loopback hub serving the tiny checkpoint, and a
stand-in SGLang per rank (tests/fixtures/fake_sglang_group.py) that records its argv.

What a pod gets from its image and node rather than from the manifest is named in POD_EXTRAS:
paths (each volume a folder), the GPU tool, the stand-in engine, the baked checkpoint lock, and
one API port per rank (three pods share one loopback here)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from attest.edge.status import MAIN_PID_VARIABLE, judge
from attest.lock import REFUSED_MARKER, VERIFIED_MARKER
from tests.fixtures.bounds import LOAD_SLACK_S, ended_long_before
from tests.fixtures.deepseek import SHARDS, tiny_repo
from tests.fixtures.hub import LoopbackHub
from tests.fixtures.processes import READY_WAIT_S
from tests.fixtures.qwen import make_fake_tool
from tests.fixtures.registry import free_port
from tools.deploy import GROUP_KEY_LABEL, group_key, k8s_expand, read_contract

RUNNER = Path(os.environ["SPARK_MANIFESTS"])
LAYOUT = Path("tests/deploy/deepseek_spark_pinned.layout")
LOCK = Path("tests/deploy/deepseek_spark.checkpoint.lock.json")
PINS = json.loads(Path("tests/deploy/deepseek_spark.pins.json").read_text())
KEY = "rehearsal-api-key-never-printed-5d1c"
RANK_KEY = "7e" * 32
SECRETS = {"deepseek-spark-api-key": {"api-key": KEY}, "deepseek-spark-rank-key": {"key": RANK_KEY}}
POD_LABELS = {GROUP_KEY_LABEL: group_key("default", "deepseek-spark-0")}  # as LWS labels group 0
FIELD_LABEL = re.compile(r"^metadata\.labels\['([^']+)'\]$")
GROUP = 3


def pod_env(container: dict, index: int) -> dict[str, str]:
    """What the container's process sees: the image's variables, then LeaderWorkerSet's (which
    it puts ahead of the container's list), then the container's list in order."""
    injected = [("LWS_LEADER_ADDRESS", "127.0.0.1"), ("LWS_GROUP_SIZE", str(GROUP)), ("LWS_WORKER_INDEX", str(index))]
    env = dict(read_contract(LAYOUT).env)
    defined: dict[str, str] = {}
    for name, value in injected:
        defined[name] = env[name] = value
    for item in container["env"]:
        if "fieldRef" in item.get("valueFrom", {}):  # the downward API: this pod's labels
            value = POD_LABELS[FIELD_LABEL.fullmatch(item["valueFrom"]["fieldRef"]["fieldPath"]).group(1)]
        elif "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            value = SECRETS[ref["name"]][ref["key"]]
        else:
            value = k8s_expand(item["value"], defined)
        defined[item["name"]] = env[item["name"]] = value
    return env


def remap(env: dict[str, str], container: dict, volumes: dict[str, Path]) -> dict[str, str]:
    """Each volume is a folder here: variables that point into a mount point into its folder."""
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"] if m["name"] in volumes}
    result = {}
    for name, value in env.items():
        for mount in sorted(mounts, key=len, reverse=True):
            if value == mount or value.startswith(mount + "/"):
                value = str(mounts[mount]) + value[len(mount) :]
                break
        result[name] = value
    return result


class Group:
    def __init__(self, tmp_path: Path, hub: LoopbackHub, *flags: str, engine_env: dict[str, str] | None = None) -> None:
        self.tmp = tmp_path
        self.markers = tmp_path / "markers"
        self.markers.mkdir()
        self.dist_port = free_port()
        completed = subprocess.run(
            [
                str(RUNNER),
                "--repository",
                "registry.example/omni/deepseek",
                "--model-pvc",
                "deepseek-models",
                "--dist-port",
                str(self.dist_port),
                "--env",
                f"HF_ENDPOINT={hub.url}",
                "--env",
                "RANK_WAIT_TIMEOUT_S=600",
                "--env",
                "MAX_RUNNING_REQUESTS=2",
                "--env",
                "WARMUP_PROMPT_WORDS=12",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")},
        )
        assert completed.returncode == 0, completed.stderr
        (self.lws, _) = yaml.safe_load_all(completed.stdout)
        self.processes: list[subprocess.Popen] = []
        self.outputs: dict[int, Path] = {}
        self.probe_envs: dict[int, dict[str, str]] = {}
        bin_dir = tmp_path / "bin"
        make_fake_tool(bin_dir, "nvidia-smi", "NVIDIA GB10, 122880")
        self.pythonpath = os.pathsep.join(p for p in sys.path if p)
        engine = bin_dir / "engine-python"
        # Drops `-m sglang.launch_server` and runs the stand-in with the test's own path.
        engine.write_text(
            f'#!/bin/sh\nshift 2\nPYTHONPATH="{self.pythonpath}" exec "{sys.executable}" '
            f'-m tests.fixtures.fake_sglang_group "$@"\n'
        )
        engine.chmod(0o755)
        self.pod_extras = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "SGLANG_PYTHON": str(engine),
            "CHECKPOINT_LOCK": str(LOCK.resolve()),
            "CHECKPOINT_LOCK_SHA256": PINS["model"]["lock_sha256"],
            "PYTHONPATH": self.pythonpath,
            "FAKE_SGLANG_MARKERS": str(self.markers),
            **(engine_env or {}),
        }
        self.envs: dict[int, dict[str, str]] = {}
        self.model_volume = tmp_path / "pvc-deepseek-models"

    def env(self, index: int) -> dict[str, str]:
        role = "leader" if index == 0 else "worker"
        template = self.lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
        (container,) = template["spec"]["containers"]
        volumes = {"models": self.model_volume, "rank-key": self.tmp / f"pod-{index}" / "rank-key"}
        (secret,) = [v["secret"] for v in template["spec"]["volumes"] if v["name"] == "rank-key"]
        volumes["rank-key"].mkdir(parents=True, exist_ok=True)
        for item in secret["items"]:  # the Secret's volume: one file per item
            (volumes["rank-key"] / item["path"]).write_text(SECRETS[secret["secretName"]][item["key"]])
        for name in ("state", "cache", "tmp"):
            volumes[name] = self.tmp / f"pod-{index}" / name
            volumes[name].mkdir(parents=True, exist_ok=True)
        env = remap(pod_env(container, index), container, volumes)
        return {**env, **self.pod_extras, "SERVER_PORT": str(free_port())}

    def start(self, index: int, command: str = "run") -> subprocess.Popen:
        output = self.tmp / f"pod-{index}-{command}.log"
        self.envs[index] = self.env(index)
        with output.open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "boot", command], env=self.envs[index], stdout=log, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        # Here each rank is a process, not a container: its boot stands for the container's PID 1,
        # which the manifest's OMNI_STATUS_MAIN_PID=1 names for the probe.
        assert self.envs[index][MAIN_PID_VARIABLE] == "1"
        self.probe_envs[index] = {**self.envs[index], MAIN_PID_VARIABLE: str(process.pid)}
        self.outputs[index] = output
        return process

    def lead_then_stop(self, workers: list[subprocess.Popen]) -> list[int]:
        """Rank 0 started, the waiting workers joined on its verdict, then SIGTERM to rank 0: every exit code."""
        leader = self.start(0)
        wait_until(lambda: "Ready: API on port" in self.log(0), "rank 0 to be ready", timeout=2 * READY_WAIT_S)
        wait_until(lambda: all((self.markers / f"joined-{rank}").exists() for rank in (1, 2)), "ranks to join")
        for rank in (1, 2):
            assert f"Rank {rank}: checkpoint verified by rank 0 against the reviewed lock" in self.log(rank)
        leader.send_signal(signal.SIGTERM)
        return [process.wait(timeout=300) for process in (leader, *workers)]  # a hang bound, sized for load

    def status(self, index: int) -> Path:
        """The rank's verdict for its probes, where the manifest's OMNI_STATUS_FILE points in its pod."""
        return Path(self.envs[index]["OMNI_STATUS_FILE"])

    def probe(self, index: int, verb: str) -> subprocess.CompletedProcess:
        """The manifest's exec probe, run as the kubelet runs it: in the pod's environment."""
        (container,) = self.lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
        assert container["readinessProbe"]["exec"]["command"][-2:] == ["attest.edge.status", "ready"]
        return subprocess.run(
            [sys.executable, "-m", "attest.edge.status", verb],
            env=self.probe_envs[index],
            capture_output=True,
            text=True,
        )

    def log(self, index: int) -> str:
        return self.outputs[index].read_text()

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def wait_until(check, what: str, timeout: float = READY_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_pod_environment_is_what_the_manifest_and_lws_give(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        group = Group(tmp_path, hub)
    for index in range(GROUP):
        env = group.env(index)
        assert (env["NNODES"], env["NODE_RANK"], env["DIST_INIT_ADDR"]) == (
            "3",
            str(index),
            f"127.0.0.1:{group.dist_port}",
        )
        assert env["API_KEY"] == KEY and env["MODEL_PATH"] == str(group.model_volume / "DeepSeek-V4.1-Flash")
        assert Path(env["RANK_KEY_FILE"]).read_text() == RANK_KEY
        assert env["RANK_GROUP"] == POD_LABELS["leaderworkerset.sigs.k8s.io/group-key"]
    assert k8s_expand("$$(LWS_GROUP_SIZE) $(UNDEFINED) $(A)", {"A": "x"}) == "$(LWS_GROUP_SIZE) $(UNDEFINED) x"


def test_three_ranks_agree_on_the_group_and_stop_with_the_leader(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        group = Group(tmp_path, hub)
        try:
            workers = [group.start(1), group.start(2)]  # before the leader: they wait for its verdict
            time.sleep(1)
            assert not list(group.markers.glob("argv-*")), "a rank started SGLang before rank 0's verdict"
            codes = group.lead_then_stop(workers)
            argvs = {rank: json.loads((group.markers / f"argv-{rank}.json").read_text()) for rank in range(GROUP)}
        finally:
            group.close()
    assert codes == [0, 0, 0]
    assert (group.markers / "ended-0").read_text() == "sigterm"
    assert [(group.markers / f"ended-{rank}").read_text() for rank in (1, 2)] == ["rank 0 went away"] * 2

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    assert {rank: flag(argv, "--node-rank") for rank, argv in argvs.items()} == {0: "0", 1: "1", 2: "2"}
    for name in ("--nnodes", "--dist-init-addr", "--tp-size", "--ep-size", "--model-path"):
        assert len({flag(argv, name) for argv in argvs.values()}) == 1, name
    assert flag(argvs[0], "--nnodes") == "3" and flag(argvs[0], "--dist-init-addr") == f"127.0.0.1:{group.dist_port}"
    assert flag(argvs[0], "--model-path") == str(group.model_volume / "DeepSeek-V4.1-Flash")
    assert sum(hub.downloads.values()) == len(tiny_repo().files)  # rank 0 alone downloaded
    for index in range(GROUP):
        assert KEY not in group.log(index)


def test_ranks_refuse_at_once_when_rank_0_refuses_the_checkpoint(tmp_path: Path) -> None:
    corrupt = tiny_repo()
    corrupt.served_instead = {SHARDS[1]: b"\x09" * 8192}  # the hub's metadata matches, the bytes do not
    with LoopbackHub(corrupt) as hub:
        group = Group(tmp_path, hub)
        try:
            stale = group.model_volume / "DeepSeek-V4.1-Flash" / REFUSED_MARKER
            stale.parent.mkdir(parents=True)
            stale.write_text(json.dumps({"schema_version": "1", "error": "an earlier run's", "field": "x"}))
            workers = [group.start(1), group.start(2)]
            time.sleep(1)
            assert all(w.poll() is None for w in workers), "a worker took an earlier run's refusal for this one's"
            started = time.monotonic()
            leader = group.start(0)
            codes = [process.wait(timeout=600) for process in (leader, *workers)]
            took = time.monotonic() - started
        finally:
            group.close()
    assert codes == [2, 2, 2]
    ended_long_before(took, 600, what="rank 0's refusal reaching the others")  # not RANK_WAIT_TIMEOUT_S
    leader_refusal = json.loads(group.log(0).strip().splitlines()[-1])
    assert leader_refusal["field"] == SHARDS[1]
    for rank in (1, 2):
        refusal = json.loads(group.log(rank).strip().splitlines()[-1])
        assert refusal["field"] == SHARDS[1] and "rank 0 refused the checkpoint" in refusal["error"]
    assert not list(group.markers.glob("argv-*")), "SGLang started on a checkpoint rank 0 refused"


def test_workers_take_no_forged_stale_or_replanted_verdict(tmp_path: Path) -> None:
    """With the rank key the manifest mounts: an earlier run's verdict (stale, then re-planted while
    the group starts) and a forged one (no valid MAC) leave the workers waiting; this run's rank 0's
    verdict starts them."""
    with LoopbackHub(tiny_repo()) as hub:
        group = Group(tmp_path, hub, "--env", "RANK_START_SPREAD_S=1")
        verdict = group.model_volume / "DeepSeek-V4.1-Flash" / VERIFIED_MARKER
        try:
            assert group.start(0, "prepare").wait(timeout=300) == 0  # an earlier run's rank 0
            earlier = verdict.read_bytes()
            assert json.loads(earlier)["group"] == POD_LABELS["leaderworkerset.sigs.k8s.io/group-key"]
            time.sleep(1.5)  # past RANK_START_SPREAD_S: that verdict is stale for the ranks started now
            workers = [group.start(1), group.start(2)]
            forged = json.loads(earlier) | {"rank0_started_ns": time.time_ns()}
            for planted in (earlier, json.dumps(forged).encode(), earlier):  # stale, forged, re-planted
                time.sleep(1)
                verdict.write_bytes(planted)
            time.sleep(1.5)
            assert all(worker.poll() is None for worker in workers)
            assert not list(group.markers.glob("argv-*")), "a rank started on a verdict that is not this run's"
            codes = group.lead_then_stop(workers)
        finally:
            group.close()
    assert codes == [0, 0, 0]


# What the rehearsal sets: rank 0 stops the group 2 s into a health loss; boot polls every 5 s.
HEALTH_LOSS_S = 2
WATCH_POLL_S = 5
# The named bound: a rank dies -> rank 0's /health fails at its next poll, the loss lasts
# HEALTH_LOSS_TIMEOUT_S, rank 0 stops SGLang, the other ranks see rank 0 go (docs/running.md).
GROUP_DOWN_BOUND_S = WATCH_POLL_S + HEALTH_LOSS_S + WATCH_POLL_S + 3


def test_the_leader_turns_ready_only_after_acceptance_and_a_dead_rank_takes_the_group_down(tmp_path: Path) -> None:
    with LoopbackHub(tiny_repo()) as hub:
        group = Group(
            tmp_path,
            hub,
            "--env",
            f"HEALTH_LOSS_TIMEOUT_S={HEALTH_LOSS_S}",
            engine_env={"FAKE_SGLANG_CHAT_DELAY_S": "0.2"},  # acceptance takes a few seconds
        )
        try:
            workers = [group.start(1), group.start(2)]
            leader = group.start(0)
            seen_healthy_unaccepted = False
            deadline = time.monotonic() + 2 * READY_WAIT_S
            while True:
                assert time.monotonic() < deadline, "rank 0 never turned ready"
                reason = judge(group.status(0), "ready") if group.status(0).exists() else "no file yet"
                if reason == "":
                    break
                seen_healthy_unaccepted |= "has not accepted yet" in reason and "Fresh inference passed" in group.log(0)
                time.sleep(0.05)
            # Ready only once smoke, warm-up and the batch check had passed, never while they ran.
            assert "Batch output sanity check passed: batch of 2" in group.log(0)
            assert seen_healthy_unaccepted, "the leader was never seen answering /health before acceptance"
            probe = group.probe(0, "ready")
            assert (probe.returncode, probe.stdout) == (0, "ready\n")
            for rank in (1, 2):
                wait_until(lambda rank=rank: judge(group.status(rank), "ready") == "", f"rank {rank} ready")
                assert group.probe(rank, "live").returncode == 0
            engine = json.loads(group.status(2).read_text())["processes"][1][0]
            os.kill(engine, signal.SIGKILL)  # rank 2's SGLang dies
            started = time.monotonic()
            codes = [process.wait(timeout=GROUP_DOWN_BOUND_S + 10 * LOAD_SLACK_S) for process in (leader, *workers)]
            took = time.monotonic() - started
        finally:
            group.close()
    # The documented bound, plus what a loaded machine adds to three processes' ends; without the
    # watch the group would serve on without rank 2 for ever.
    assert took < GROUP_DOWN_BOUND_S + LOAD_SLACK_S, f"the group took {took:.1f} s to go down"
    assert codes[0] == 2 and codes[2] != 0, codes  # rank 0 refuses (group lost); rank 2's engine was killed
    refusal = json.loads(group.log(0).strip().splitlines()[-1])
    assert refusal["field"] == "HEALTH_LOSS_TIMEOUT_S" and "stopping the group" in refusal["error"]
    assert (group.markers / "ended-1").read_text() == "rank 0 went away"
    assert judge(group.status(0), "ready").startswith("boot is lost: /health has failed")
    probe = group.probe(0, "ready")
    assert probe.returncode == 1 and probe.stdout.startswith("not ready: boot is lost")
    for rank in (1, 2):
        assert "no longer running" in judge(group.status(rank), "live")
