"""tools/dev/podman_group: the generated LeaderWorkerSet's group as LWS v0.9.0 makes it (names,
hostnames, labels, the group key, the variables and their order), the edits podman needs and no
other, and a refusal naming the flag or file for each bad input, nothing written."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools.deploy import GROUP_KEY_LABEL, DeployError, expand_env, group_key, group_pods, k8s_expand
from tools.dev.podman_group.cli import podman_pods, read_lws

RUNNER = Path(os.environ["SPARK_MANIFESTS"])
PODS = ["deepseek-spark-0", "deepseek-spark-0-1", "deepseek-spark-0-2"]


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("deploy") / "deepseek.yaml"
    done = subprocess.run(
        [str(RUNNER), "--repository", "registry.example/omni/deepseek", "--model-pvc", "deepseek-models"]
        + ["--network", "host", "--dist-port", "20000", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("xdg"))},
    )
    assert done.returncode == 0, done.stderr
    return output


def test_the_group_is_what_lws_makes(manifests: Path) -> None:
    lws = read_lws(manifests)
    pods = group_pods(lws)
    assert [p["metadata"]["name"] for p in pods] == PODS
    key = group_key("default", "deepseek-spark-0")
    assert key == "d3976582595c7a1faa2ca979e15d10cdc0682357"  # sha1("default/deepseek-spark-0")
    for index, pod in enumerate(pods):
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[GROUP_KEY_LABEL] == key and labels["leaderworkerset.sigs.k8s.io/worker-index"] == str(index)
        assert labels["leaderworkerset.sigs.k8s.io/name"] == "deepseek-spark"
        assert labels["leaderworkerset.sigs.k8s.io/group-index"] == "0"
        assert labels["app.kubernetes.io/component"] == ("leader" if index == 0 else "worker")  # the template's kept
        assert annotations["leaderworkerset.sigs.k8s.io/size"] == "3"
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (PODS[index], "deepseek-spark")
        env = pod["spec"]["containers"][0]["env"]
        assert env[:3] == [
            {"name": "LWS_LEADER_ADDRESS", "value": "deepseek-spark-0.deepseek-spark.default"},
            {"name": "LWS_GROUP_SIZE", "value": "3"},
            {"name": "LWS_WORKER_INDEX", "value": str(index)},
        ]
        template = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate" if index == 0 else "workerTemplate"]
        assert env[3:] == template["spec"]["containers"][0]["env"]  # the container's own, in order, untouched
    assert "leaderworkerset.sigs.k8s.io/leader-name" not in pods[0]["metadata"]["annotations"]
    assert [p["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/leader-name"] for p in pods[1:]] == [PODS[0]] * 2


@pytest.mark.parametrize("version", [(4, 3), (4, 7), (5, 4)])
def test_the_edits_and_only_those(manifests: Path, version: tuple[int, int]) -> None:
    lws = read_lws(manifests)
    untouched = group_pods(lws)
    pods, made = podman_pods(copy.deepcopy(lws), "127.0.0.1", version)
    old = version < (4, 7)
    assert made == ["leader-address", "expansion", "empty-dirs"] + (["annotations", "ports"] if old else [])
    for index, (pod, before) in enumerate(zip(pods, untouched)):
        (container,), (original,) = pod["spec"]["containers"], before["spec"]["containers"]
        values = {e["name"]: e.get("value") for e in container["env"]}
        assert (values["NNODES"], values["NODE_RANK"], values["DIST_INIT_ADDR"]) == ("3", str(index), "127.0.0.1:20000")
        assert values["LWS_LEADER_ADDRESS"] == "127.0.0.1"
        empty = {v["name"] for v in before["spec"]["volumes"] if "emptyDir" in v}
        assert {v["name"] for v in pod["spec"]["volumes"]} == {
            f"{PODS[index]}-{name}" if name in empty else name
            for name in {v["name"] for v in before["spec"]["volumes"]}
        }
        assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in pod["spec"]["volumes"]}
        long = {k for k, v in before["metadata"]["annotations"].items() if len(v) > 63}
        assert long and (set(pod["metadata"]["annotations"]) == set(before["metadata"]["annotations"]) - long) == old
        assert ("ports" in container) == ("ports" in original and not old)
        # Nothing else moved: the edited fields put back give the untouched pod.
        for field in ("env", "volumeMounts", "ports"):
            container.pop(field, None), original.pop(field, None)
        for spec in (pod["spec"], before["spec"]):
            spec.pop("volumes")
        pod["metadata"].pop("annotations"), before["metadata"].pop("annotations")
        assert pod == before


@pytest.mark.parametrize("version", [(4, 3), (4, 6), (5, 4)])
def test_an_init_container_gets_the_group_edits_and_is_left_off_only_where_podman_restarts_it(
    manifests: Path, tmp_path: Path, version: tuple[int, int]
) -> None:
    """--model-source registry's init container: LWS injects its variables there too, so the
    leader address and the expansion reach it; podman before 4.6 would restart it forever."""
    output = tmp_path / "pulled.yaml"
    done = subprocess.run(
        [str(RUNNER), "--repository", "registry.example/omni/deepseek", "--model-source", "registry"]
        + ["--model-image", "registry.example/models/ds@sha256:" + "5" * 64, "--network", "host"]
        + ["--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")},
    )
    assert done.returncode == 0, done.stderr
    pods, made = podman_pods(read_lws(output), "127.0.0.1", version)
    assert ("init-containers" in made) == (version < (4, 6))
    for index, pod in enumerate(pods):
        if version < (4, 6):
            assert "initContainers" not in pod["spec"]
            continue
        (init,) = pod["spec"]["initContainers"]
        values = {e["name"]: e.get("value") for e in init["env"]}
        assert (values["NNODES"], values["NODE_RANK"], values["LWS_LEADER_ADDRESS"]) == ("3", str(index), "127.0.0.1")
        volumes = {v["name"] for v in pod["spec"]["volumes"]}
        assert f"{PODS[index]}-models" in volumes and {m["name"] for m in init["volumeMounts"]} <= volumes


def test_the_expansion_is_the_kubelets() -> None:
    assert k8s_expand("$$(A)$(A)$(B)", {"A": "x"}) == "$(A)x$(B)"
    container = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(C)"}, {"name": "C", "value": "3"}]}
    expand_env(container)
    assert [e["value"] for e in container["env"]] == ["1", "1-$(C)", "3"]  # only variables defined earlier
    with pytest.raises(DeployError) as refused:
        expand_env({"env": [{"name": "S", "valueFrom": {"secretKeyRef": {}}}, {"name": "B", "value": "$(S)"}]})
    assert refused.value.field == "B"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.dev.podman_group.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BUILD_WORKING_DIRECTORY": str(cwd)},
    )


def test_the_command_writes_the_pods_and_names_each_edit(manifests: Path, tmp_path: Path) -> None:
    done = _run(str(manifests), "--podman-version", "4.3.1", "--output", "group.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p["metadata"]["name"] for p in yaml.safe_load_all((tmp_path / "group.yaml").read_text())] == PODS
    assert "emptyDir volumes renamed" in done.stderr and "podman < 4.7" in done.stderr
    again = _run(str(manifests), "--podman-version", "5.4", "--output", "group.yaml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # its own output it replaces


def _pod_network(manifests: Path, tmp_path: Path) -> Path:
    documents = list(yaml.safe_load_all(manifests.read_text()))
    for document in documents:
        if document and document["kind"] == "LeaderWorkerSet":
            del document["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["hostNetwork"]
    (tmp_path / "pod-network.yaml").write_text(yaml.safe_dump_all(documents))
    return tmp_path / "pod-network.yaml"


REFUSALS = [
    (lambda m, t: [str(t / "missing.yaml")], "missing.yaml"),
    (lambda m, t: [str(_write(t, "x.yaml", "a: [1"))], "x.yaml"),
    (lambda m, t: [str(_write(t, "none.yaml", "kind: Service\n"))], "none.yaml"),
    (lambda m, t: [str(_write(t, "two.yaml", m.read_text() + "---\n" + m.read_text()))], "two.yaml"),
    (lambda m, t: [str(_write(t, "big.yaml", "#" * (4 << 20) + "\n"))], "big.yaml"),
    (lambda m, t: [str(_pod_network(m, t))], "--network"),
    (lambda m, t: [str(m), "--leader-address", "leader.example"], "--leader-address"),
    (lambda m, t: [str(m), "--podman-version", "five"], "--podman-version"),
    (lambda m, t: [str(m), "--output", str(_write(t, "mine.yaml", "kind: Pod\n"))], "--output"),
    (lambda m, t: [str(m), "--output", str(t)], "--output"),
]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


@pytest.mark.parametrize(("args", "field"), REFUSALS)
def test_each_bad_input_is_refused_naming_it(manifests: Path, tmp_path: Path, args, field: str) -> None:
    argv = args(manifests, tmp_path)
    if "--podman-version" not in argv:
        argv += ["--podman-version", "5.4"]
    before = sorted(p.name for p in tmp_path.iterdir())
    done = _run(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("{")]
    refusal = json.loads(line)
    assert refusal["ok"] is False and field in refusal["field"], refusal
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, not even a temporary file
    if (tmp_path / "mine.yaml").exists():
        assert (tmp_path / "mine.yaml").read_text() == "kind: Pod\n"
