"""The podman lane: the release the engine lane built, pushed and verified (tests/system/conftest.py),
run from the Deployment Omni generates for it, by a real container engine (Debian's podman on
runc, the project's deploy/podman/containers.conf).

The image and its model artifact are copied to a private registry (docker-registry with
htpasswd); `tools/deploy` writes the Deployment (`--test-image`, the flags a user would pass for
this machine); podman plays it as written. The only edits are those a real cluster would make,
listed in EDITS. Then, read from inside the running container: uid 1000, a read-only root, no
capabilities, no new privileges, the model read-only; the exec readiness probe is not ready
before acceptance and is ready after; a chat completion through the pod's port returns tokens;
the engine killed inside the pod is restarted by podman and becomes ready again on the same,
re-verified model. Refusals under the real image: a tampered model never becomes ready and its
log names the file; a missing Secret stops the pod with podman's own error; an image whose
digest is not the one this target built is refused by deploy.

podman has no kubelet: it runs no probe on its own without systemd's timers, so the test runs
the generated exec probe itself (`podman exec`), as the kubelet would; it has no scheduler and
no image-pull-secret handling (the same credentials go to `--authfile`).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.engine_lane import READY_TIMEOUT_S, SERVED
from tests.fixtures.podman import Podman, wait_until
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.release_lane import SKOPEO, ReleaseLane, ok, record, timed

USER, PASSWORD = "omni-pull", "pull-Pa55-w0rd"
PULL_SECRET = "omni-registry"
API_KEY = "podman-" + secrets.token_hex(16)
EDITS = (
    # Kubernetes mounts the artifact itself (an `image` volume); podman before 5.3 cannot, so the
    # same artifact, by digest, is mounted read-only from podman's own storage (`podman image
    # mount`: the containers/storage mount CRI-O serves image volumes with) as a hostPath.
    "model volume: `image` -> hostPath of `podman image mount` of the same digest (podman < 5.3 only)",
    # The refusal row: a fallback volume holding a tampered copy of the artifact's files.
    "model volume: `image` -> hostPath of a tampered copy (the tampered-model row only)",
)
# What this machine needs that a GPU node does not, as flags and settings a user passes too.
DEPLOY_FLAGS = (
    "--env",
    "VLLM_CPU_KVCACHE_SPACE=1",
    "--env",
    "VLLM_CPU_OMP_THREADS_BIND=nobind",
    "--env",
    "QWEN_MAX_MODEL_LEN=1024",
    "--env",
    f"QWEN_SERVED_MODEL_NAME={SERVED}",
)


def _copy(source: str, registry: LoopbackRegistry, repository: str) -> str:
    """`source` (REF@DIGEST on the lane's registry) copied to the private registry, digest kept."""
    digest = source.rsplit("@", 1)[1]
    copied = subprocess.run(
        [SKOPEO, "copy", "--quiet", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false"]
        + ["--dest-creds", f"{USER}:{PASSWORD}", f"docker://{source}", f"docker://{registry.host}/{repository}:lane"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    ok(copied, f"skopeo copy of {source}")
    return f"{registry.host}/{repository}@{digest}"


@pytest.fixture(scope="module")
def private(lane: ReleaseLane, released, model_artifact):
    """The release and its model artifact in a registry that wants credentials."""
    started = time.monotonic()
    with LoopbackRegistry(users={USER: PASSWORD}) as registry:
        image = _copy(released["reference"], registry, "omni/qwen-cpu-tiny")
        model = _copy(model_artifact[1], registry, "models/tiny")
        timed("podman_registry_copy_s", started)
        yield {"registry": registry, "image": image, "model": model}


@pytest.fixture(scope="module")
def podman(private, tmp_path_factory):
    engine = Podman()
    auth = engine.root / "auth.json"
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    # The image pull secret's .dockerconfigjson, which podman reads as its --authfile.
    auth.write_text(json.dumps({"auths": {private["registry"].host: {"auth": pair}}}))
    engine.authfile = auth
    try:
        yield engine
    finally:
        engine.close()


def _generate(lane: ReleaseLane, output: Path, *flags: str):
    return lane.bazel(
        "run", "--config=release", "//tests/deploy:qwen_cpu_tiny", "--", "--test-image", *flags, "--output", str(output)
    )


@pytest.fixture(scope="module")
def manifests(lane: ReleaseLane, private, model_artifact, tmp_path_factory) -> dict[str, Any]:
    output = tmp_path_factory.mktemp("manifests") / "qwen.yaml"
    flags = ("--image", private["image"], "--model-image", private["model"], "--image-pull-secret", PULL_SECRET)
    # The attestation pinned, as the docs tell a user to (the sha256 build_attestation printed).
    attestation = ("--env", f"QWEN_CHECKPOINT_MANIFEST_SHA256={model_artifact[0].manifest_sha256}")
    ok(_generate(lane, output, *flags, *DEPLOY_FLAGS, *attestation), "tools/deploy")
    documents = [d for d in yaml.safe_load_all(output.read_text()) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    return {"path": output, "deployment": deployment, "documents": documents}


def _container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _api_key_secret(engine: Podman, deployment: dict, value: str) -> str:
    """The Secret the container's QWEN_API_KEY names, created as docs/running.md tells podman users."""
    ref = next(e for e in _container(deployment)["env"] if e["name"] == "QWEN_API_KEY")["valueFrom"]["secretKeyRef"]
    engine.secret(ref["name"], {ref["key"]: value})
    return ref["name"]


def _played(engine: Podman, manifests: dict, model_source: Path | None, work: Path) -> Path:
    """The YAML podman plays: as generated, but for EDITS when podman lacks image volumes."""
    if engine.image_volumes and model_source is None:
        return manifests["path"]
    documents = json.loads(json.dumps(manifests["documents"]))
    for document in documents:
        if document["kind"] != "Deployment":
            continue
        for volume in document["spec"]["template"]["spec"]["volumes"]:
            if "image" in volume:
                del volume["image"]
                volume["hostPath"] = {"path": str(model_source), "type": "Directory"}
    played = work / "played.yaml"
    played.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return played


def _model_source(engine: Podman, private: dict) -> Path | None:
    """The artifact pulled by digest with the pull secret's credentials, as a node pulls it; on
    podman < 5.3, where it is mounted from: its own storage's read-only mount (else None: the
    `image` volume itself)."""
    engine("pull", "--tls-verify=false", "--authfile", str(engine.authfile), private["model"])
    if engine.image_volumes:
        return None
    return Path(engine("image", "mount", private["model"]).stdout.strip())


def _pod_container(engine: Podman, deployment: dict) -> str:
    """The Deployment's container as podman named it (4.3: NAME-pod-0-CONTAINER, 5: NAME-pod-CONTAINER)."""
    suffix = f"-{_container(deployment)['name']}"
    names = engine("ps", "--all", "--format", "{{.Names}}").stdout.split()
    found = [n for n in names if n.startswith(deployment["metadata"]["name"] + "-pod") and n.endswith(suffix)]
    assert len(found) == 1, names
    return found[0]


def _reports(engine: Podman, container: str) -> list[dict]:
    """The launcher's reports in the container's log, one per start (the model verified, the
    engine's command decided)."""
    found = []
    for line in engine.logs(container).splitlines():
        if line.startswith("{") and '"decision"' in line:
            found.append(json.loads(line))
    return found


def _ready(engine: Podman, container: str, deployment: dict) -> bool:
    probe = _container(deployment)["readinessProbe"]["exec"]["command"]
    return engine.exec(container, *probe, timeout=30).returncode == 0


def _chat(engine: Podman, container: str, port: int) -> dict:
    code = f"""
import json, urllib.request
request = urllib.request.Request(
    "http://127.0.0.1:{port}/v1/chat/completions",
    data=json.dumps({{"model": "{SERVED}", "max_tokens": 8, "temperature": 0,
                     "messages": [{{"role": "user", "content": "Say something."}}]}}).encode(),
    headers={{"Authorization": "Bearer {API_KEY}", "Content-Type": "application/json"}},
)
print(urllib.request.urlopen(request, timeout=120).read().decode())
"""
    done = engine.python(container, code)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


INSIDE = """
import json, os
status = dict(line.split(":", 1) for line in open("/proc/1/status").read().splitlines() if ":" in line)
mounts = {line.split()[4]: line.split()[5].split(",") for line in open("/proc/self/mountinfo")}
def writable(path):
    try:
        open(os.path.join(path, ".omni-write-test"), "w").close()
        return True
    except OSError:
        return False
print(json.dumps({
    "uid": status["Uid"].split(), "gid": status["Gid"].split(),
    "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(),
    "root_writable": writable("/"), "root_options": mounts["/"],
    "model_writable": writable(os.environ["MODEL_PATH"]), "model_options": mounts.get(os.environ["MODEL_PATH"], []),
}))
"""


def test_the_generated_deployment_serves_under_podman(lane, private, manifests, podman, tmp_path: Path) -> None:
    deployment = manifests["deployment"]
    container_spec = _container(deployment)
    assert container_spec["image"] == private["image"]
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}]
    _api_key_secret(podman, deployment, API_KEY)
    source = _model_source(podman, private)
    played = _played(podman, manifests, source, tmp_path)
    started = time.monotonic()
    try:
        _serves(podman, played, deployment, started)
    finally:
        podman("kube", "down", str(played), check=False)


def _serves(podman: Podman, played: Path, deployment: dict, started: float) -> None:
    container_spec = _container(deployment)
    play = podman("kube", "play", "--replace", "--tls-verify=false", "--authfile", str(podman.authfile), str(played))
    timed("podman_kube_play_s", started)
    container = _pod_container(podman, deployment)
    # The launcher's report (the model verified, the engine's command chosen) is out, and vLLM
    # is loading: the generated exec probe says not ready before the server accepts.
    wait_until(lambda: bool(_reports(podman, container)), 300, "the launcher's report")
    assert not _ready(podman, container, deployment)
    ready_s = wait_until(lambda: _ready(podman, container, deployment), READY_TIMEOUT_S, "the pod's readiness")
    timed("podman_play_to_ready_s", started)
    inside = json.loads(podman.python(container, INSIDE).stdout)
    assert inside["uid"] == ["1000"] * 4 and inside["gid"] == ["1000"] * 4, inside
    assert inside["cap_eff"] == inside["cap_bnd"] == "0000000000000000" and inside["no_new_privs"] == "1", inside
    assert not inside["root_writable"] and "ro" in inside["root_options"], inside
    assert not inside["model_writable"], inside
    if podman.image_volumes:
        # podman 5.4 mounts an `image` volume without the ro flag readOnly asks for (its files
        # are root's, so uid 1000 still cannot write them); Kubernetes mounts it ro.
        record("podman_image_volume_mount_options", inside["model_options"])
    else:
        assert "ro" in inside["model_options"], inside
    port = container_spec["ports"][0]["containerPort"]
    answer = _chat(podman, container, port)
    assert answer["usage"]["completion_tokens"] > 0 and answer["choices"][0]["message"]["content"], answer
    _restarted_after_the_engine_is_killed(podman, container, deployment, port)
    assert ready_s > 0 and play.returncode == 0


PROCESSES = """
import os
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        line = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
        parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        continue
    if pid != os.getpid() and parent != os.getpid():
        print(pid, parent, line[:160])
"""
# Children of the engine's PID 1 that are not its engine core: multiprocessing's helpers.
NOT_THE_ENGINE = ("resource_tracker", "semaphore_tracker", "forkserver")


def _processes(engine: Podman, container: str) -> list[tuple[int, int, str]]:
    """(pid, parent, command line) of every process in the container but the listing's own."""
    rows = []
    for line in engine.python(container, PROCESSES).stdout.splitlines():
        pid, parent, command = (line.split(" ", 2) + [""])[:3]
        rows.append((int(pid), int(parent), command))
    return rows


def _engine_pid(rows: list[tuple[int, int, str]]) -> int:
    """vLLM's engine core: the launcher exec()s vLLM, which is PID 1 (a signal from inside the
    pod cannot end PID 1), and its engine runs in a child process, titled VLLM::EngineCore where
    setproctitle could; else PID 1's one child that is not a multiprocessing helper."""
    titled = [pid for pid, _, command in rows if "enginecore" in command.lower()]
    children = [pid for pid, parent, command in rows if parent == 1 and not any(h in command for h in NOT_THE_ENGINE)]
    found = titled or children
    assert found, f"no vLLM engine core process in the container: {rows}"
    return found[0]


def _restarted_after_the_engine_is_killed(engine: Podman, container: str, deployment: dict, port: int) -> None:
    """SIGKILL to the engine inside the pod: the server ends or fails its liveness check, podman
    restarts the container (the check run as the kubelet's timer would: `podman healthcheck
    run`), and the launcher verifies the same model again before the engine serves."""
    before = engine.restarts(container)
    listing = _processes(engine, container)
    pid = _engine_pid(listing)
    killed = engine.exec(
        container, "/usr/bin/python3", "-I", "-c", f"import os, signal; os.kill({pid}, signal.SIGKILL)"
    )
    assert killed.returncode == 0, killed.stderr
    started = time.monotonic()

    def restarted() -> bool:
        if engine.restarts(container) > before:
            return True
        engine("healthcheck", "run", container, check=False, timeout=60)
        return engine.restarts(container) > before

    # An event wait (a failure bound, not a speed): the restart takes longer beside other podman work.
    try:
        wait_until(restarted, 600, "podman restarting the container after the engine was killed")
    except AssertionError as exc:  # what ran, what runs, what podman saw: the next run's diagnosis
        health = engine("healthcheck", "run", container, check=False, timeout=60)
        raise AssertionError(
            f"{exc}; killed {pid} of {listing}; now {_processes(engine, container)}; healthcheck: "
            f"{health.returncode} {health.stdout.strip()} {health.stderr.strip()}; log: {engine.logs(container)[-3000:]}"
        ) from None
    timed("podman_kill_to_restart_s", started)
    wait_until(lambda: _ready(engine, container, deployment), READY_TIMEOUT_S, "readiness after the restart")
    timed("podman_kill_to_ready_s", started)
    assert _chat(engine, container, port)["usage"]["completion_tokens"] > 0
    assert len(_reports(engine, container)) >= 2, engine.logs(container)[-3000:]  # each start verified the model


# --- refusals under the real image -----------------------------------------------------------


def test_a_tampered_model_never_becomes_ready_and_its_log_names_the_file(
    private, manifests, podman, tmp_path: Path
) -> None:
    deployment = manifests["deployment"]
    engine = podman
    engine("pull", "--tls-verify=false", "--authfile", str(engine.authfile), private["model"])
    mounted = Path(engine("image", "mount", private["model"]).stdout.strip())
    tampered = tmp_path / "tampered"
    shutil.copytree(mounted, tampered, symlinks=True)
    shard = sorted(tampered.rglob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    tampered.chmod(0o755)
    _api_key_secret(engine, deployment, API_KEY)
    played = _played(engine, manifests, tampered, tmp_path)
    try:
        engine("kube", "play", "--replace", "--tls-verify=false", "--authfile", str(engine.authfile), str(played))
        container = _pod_container(engine, deployment)
        name = shard.relative_to(tampered).as_posix()
        wait_until(lambda: name in engine.logs(container), 300, f"a refusal naming {name}")
        assert not _ready(engine, container, deployment)
        refusal = next(line for line in engine.logs(container).splitlines() if name in line)
        assert json.loads(refusal)["ok"] is False, refusal
    finally:
        engine("kube", "down", str(played), check=False)


def test_a_missing_secret_stops_the_pod_with_podmans_own_error(private, manifests, podman, tmp_path: Path) -> None:
    deployment = manifests["deployment"]
    ref = next(e for e in _container(deployment)["env"] if e["name"] == "QWEN_API_KEY")["valueFrom"]["secretKeyRef"]
    podman("secret", "rm", ref["name"], check=False)
    played = _played(podman, manifests, _model_source(podman, private), tmp_path)
    try:
        refused = podman(
            "kube",
            "play",
            "--replace",
            "--tls-verify=false",
            "--authfile",
            str(podman.authfile),
            str(played),
            check=False,
        )
    finally:
        podman("kube", "down", str(played), check=False)
    assert refused.returncode != 0 and ref["name"] in refused.stderr, refused.stderr[-2000:]


def test_an_image_that_is_not_the_built_digest_is_refused(lane: ReleaseLane, private, tmp_path: Path) -> None:
    other = private["image"].rsplit("@", 1)[0] + "@" + private["model"].rsplit("@", 1)[1]
    refused = _generate(lane, tmp_path / "x.yaml", "--image", other)
    assert refused.returncode != 0 and '"field": "--image"' in refused.stdout + refused.stderr
    assert not (tmp_path / "x.yaml").exists()
