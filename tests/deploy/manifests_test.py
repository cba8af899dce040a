"""The Kubernetes manifests `bazel run //deploy:<image>` generates: read from the built images
(the shipped images with test pins, tests/deploy), validated against the Kubernetes JSON schemas
of every supported cluster version (kubernetes-validate, strict) and the LeaderWorkerSet CRD
pinned in tests/data/lws, and refused, naming the flag or pin, for every bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from attest.errors import AttestError
from attest.pins import load_pins
from tests.fixtures.manifests import (
    CLUSTER_VERSIONS,
    SECRETS,
    TEST_PINS,
    UNPINNED_RUNNER,
    digest,
    generate,
    generated,
    lws_schema,
    pod_spec,
    refusal,
    validate_core,
)
from tests.fixtures.pins import qwen_pins
from tools.deploy import DeployError, Options, read_contract, resources
from tools.oci.build.image import assemble, load_pins_checked
from tools.oci.push_record import record_push


def as_pod_template(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}


def assert_hardened(spec: dict, *, groups: list[int] | None) -> dict:
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000 and security["runAsGroup"] == 1000
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security.get("supplementalGroups") == groups
    (container,) = spec["containers"]
    own = container["securityContext"]
    assert own["readOnlyRootFilesystem"] is True and own["allowPrivilegeEscalation"] is False
    assert own["privileged"] is False and own["runAsNonRoot"] is True and own["capabilities"]["drop"] == ["ALL"]
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    for path in ("/cache", "/tmp"):
        assert volumes[mounts[path]["name"]] == {"name": mounts[path]["name"], "emptyDir": {}}
    return container


def test_the_qwen_deployment_is_what_the_image_says(tmp_path: Path) -> None:
    text, items = generated(
        "qwen_mi300x",
        "--repository",
        "registry.example/omni/qwen",
        "--namespace",
        "llm",
        "--model-pvc",
        "qwen-models",
        "--secret",
        "qwen-api",
    )
    deployment, service = items
    assert [deployment["kind"], service["kind"]] == ["Deployment", "Service"]
    for value in SECRETS.values():
        assert value not in text
    spec = pod_spec(deployment)
    container = assert_hardened(spec, groups=[44, 110])
    assert container["image"] == "registry.example/omni/qwen@" + digest("qwen_mi300x")
    guaranteed = {"cpu": "16", "memory": "128Gi", "amd.com/gpu": 1}
    assert container["resources"] == {"limits": guaranteed, "requests": guaranteed}  # QoS Guaranteed
    env = {item["name"]: item for item in container["env"]}
    assert env["QWEN_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "qwen-api", "key": "api-key", "optional": False}
    assert env["QWEN_BIND_HOST"]["value"] == "0.0.0.0" and env["QWEN_CONTAINER_INTERNAL_ONLY"]["value"] == "1"
    # The launcher refuses to start without the model's id and revision: both from the pins.
    model = json.loads(TEST_PINS["qwen_mi300x"].read_text())["model"]
    assert (env["MODEL_ID"]["value"], env["MODEL_REVISION"]["value"]) == (model["id"], model["revision"])
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert set(mounts) == {"/cache", "/models", "/tmp", "/dev/shm"}  # every declared volume, and shm
    assert mounts["/models"]["readOnly"] is True
    model = next(v for v in spec["volumes"] if v["name"] == mounts["/models"]["name"])
    assert model["persistentVolumeClaim"] == {"claimName": "qwen-models", "readOnly": True}
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": 8103}
    assert container["readinessProbe"]["exec"]["command"][-2:] == ["attest.edge.status", "ready"]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600  # a 27B load from a cold cache
    assert deployment["spec"]["strategy"] == {"type": "Recreate"} and deployment["spec"]["replicas"] == 1
    assert service["spec"]["ports"][0]["port"] == 8103 and service["spec"]["type"] == "ClusterIP"
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == "llm"
    pins = load_pins(TEST_PINS["qwen_mi300x"])
    notes = deployment["spec"]["template"]["metadata"]["annotations"]
    assert notes["omni.image.digest"] == digest("qwen_mi300x")
    assert (
        notes["omni.base.digest"],
        notes["omni.engine.commit"],
        notes["omni.model.revision"],
        notes["omni.speculator.revision"],
    ) == (pins.base.digest, pins.engine.commit, pins.model.revision, pins.speculator.revision)
    for resource in items:
        validate_core(resource)


def test_the_deepseek_group_is_a_leader_worker_set_of_three() -> None:
    text, items = generated(
        "deepseek_spark",
        "--image",
        "registry.example/omni/ds@" + digest("deepseek_spark"),
        "--model-pvc",
        "ds-models",
        "--hf-token-secret",
        "hub-token",
    )
    lws, service = items
    for value in SECRETS.values():
        assert value not in text
    jsonschema.Draft7Validator(lws_schema()).validate(lws)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 3 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = assert_hardened(pod_spec(lws, "leader"), groups=None)
    worker = assert_hardened(pod_spec(lws, "worker"), groups=None)
    for container in (leader, worker):
        assert container["image"] == "registry.example/omni/ds@" + digest("deepseek_spark")
        assert container["resources"] == {
            "limits": {"nvidia.com/gpu": 1},  # Burstable: no memory limit on unified memory (docs/running.md)
            "requests": {"cpu": "16", "memory": "24Gi", "nvidia.com/gpu": 1},
        }
        env = {item["name"]: item for item in container["env"]}
        assert env["NNODES"]["value"] == "$(LWS_GROUP_SIZE)" and env["NODE_RANK"]["value"] == "$(LWS_WORKER_INDEX)"
        assert env["DIST_INIT_ADDR"]["value"] == "$(LWS_LEADER_ADDRESS):20000"
        assert env["API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "deepseek-spark-api-key"
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hub-token", "key": "token", "optional": False}
    for container in (leader, worker):  # the probes themselves: tests/deploy/cluster_test.py
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(container)
    assert "ports" in leader and "ports" not in worker  # workers serve no HTTP
    leader_models = next(m for m in leader["volumeMounts"] if m["mountPath"] == "/models")
    worker_models = next(m for m in worker["volumeMounts"] if m["mountPath"] == "/models")
    assert leader_models["readOnly"] is False and worker_models["readOnly"] is True  # only rank 0 downloads
    assert pod_spec(lws, "leader")["securityContext"]["fsGroup"] == 1000
    mounts = {"/cache", "/models", "/state", "/tmp", "/dev/shm", "/etc/omni/rank-key"}
    assert {m["mountPath"] for m in leader["volumeMounts"]} == mounts
    for role in ("leader", "worker"):  # the verdict's key: a Secret every rank mounts, outside the model volume
        (key,) = [v for v in pod_spec(lws, role)["volumes"] if v["name"] == "rank-key"]
        assert key["secret"] == {
            "secretName": "deepseek-spark-rank-key",
            "items": [{"key": "key", "path": "key"}],
            "defaultMode": 0o444,
            "optional": False,
        }
    assert env["RANK_KEY_FILE"]["value"] == "/etc/omni/rank-key/key"
    label = "metadata.labels['leaderworkerset.sigs.k8s.io/group-key']"
    assert env["RANK_GROUP"]["valueFrom"] == {"fieldRef": {"fieldPath": label}}
    startup = leader["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 21600 + 3600  # download + load deadlines
    assert service["spec"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": "deepseek-spark",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    assert pod_spec(lws, "leader")["containers"][0]["ports"][0]["containerPort"] == service["spec"]["ports"][0]["port"]
    validate_core(service)
    for role in ("leader", "worker"):
        validate_core(as_pod_template(template[f"{role}Template"]))


def test_the_lws_schema_check_can_fail() -> None:
    _, (lws, _) = generated("deepseek_spark", "--repository", "registry.example/omni/ds", "--model-pvc", "m")
    lws["spec"]["leaderWorkerTemplate"]["size"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(lws_schema()).validate(lws)
    broken = as_pod_template(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
    broken["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, CLUSTER_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    "flags, spec_check",
    [
        (
            ("--network", "host"),
            lambda spec, _: spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet",
        ),
        (
            ("--rdma-network", "rdma-200g"),
            lambda spec, notes: (
                notes["k8s.v1.cni.cncf.io/networks"] == "rdma-200g"
                and spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
            ),
        ),
        (
            ("--model-host-path", "/srv/models"),
            lambda spec, _: (
                {"path": "/srv/models", "type": "Directory"} in [v.get("hostPath") for v in spec["volumes"]]
            ),
        ),
    ],
)
def test_network_and_model_flags(flags: tuple[str, ...], spec_check) -> None:
    model = () if "--model-host-path" in flags else ("--model-pvc", "m")
    _, (lws, _) = generated("deepseek_spark", "--repository", "r.example/ds", *model, *flags)
    for role in ("leader", "worker"):
        template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
        assert spec_check(template["spec"], template["metadata"]["annotations"])
        validate_core(as_pod_template(template))
    jsonschema.Draft7Validator(lws_schema()).validate(lws)


def test_the_image_comes_from_the_last_push_of_that_digest(tmp_path: Path) -> None:
    record_dir = tmp_path / "state"
    os.environ["XDG_STATE_HOME"] = str(record_dir)
    try:
        record_push("push.example/omni/qwen@" + digest("qwen_mi300x"), digest("qwen_mi300x"))
        record_push("push.example/omni/other@sha256:" + "7" * 64, "sha256:" + "7" * 64)
    finally:
        del os.environ["XDG_STATE_HOME"]
    _, (deployment, _) = generated("qwen_mi300x", "--model-pvc", "m", state=record_dir)
    assert pod_spec(deployment)["containers"][0]["image"] == "push.example/omni/qwen@" + digest("qwen_mi300x")
    record = record_dir / "omni" / "pushes" / (digest("qwen_mi300x").split(":")[1] + ".json")
    record.write_text(json.dumps({"digest": digest("qwen_mi300x"), "reference": "push.example/x@sha256:" + "7" * 64}))
    assert refusal(generate("qwen_mi300x", "--model-pvc", "m", state=record_dir))["field"] == str(record)


def test_an_unpinned_image_is_refused_as_a_release_build_refuses_it() -> None:
    with pytest.raises(AttestError) as release:
        load_pins_checked(Path("images/qwen_mi300x.pins.json"), release=True)
    refused = refusal(
        generate("qwen_mi300x", "--model-pvc", "m", "--repository", "r.example/q", runner=UNPINNED_RUNNER)
    )
    assert refused == {"ok": False, "error": str(release.value), "field": release.value.field}


QWEN = ("--repository", "r.example/q", "--model-pvc", "m")


@pytest.mark.parametrize(
    "flags, field, says",
    [
        (("--image", "r.example/q:latest", "--model-pvc", "m"), "--image", "has no digest"),
        (("--image", "r.example/q@sha256:" + "0" * 64, "--model-pvc", "m"), "--image", "but this target built"),
        (("--image", "R.example/Q@sha256:" + "0" * 64, "--model-pvc", "m"), "--image", "lower case"),
        (("--model-pvc", "m"), "--image", "was never pushed from here"),
        (("--repository", "r.example/q:tag", "--model-pvc", "m"), "--repository", "REGISTRY/REPO only"),
        (("--repository", "r.example/q"), "--model-pvc", "exactly one of"),
        (QWEN + ("--model-host-path", "/srv"), "--model-pvc", "exactly one of"),
        (("--repository", "r.example/q", "--model-host-path", "srv/models"), "--model-host-path", "absolute"),
        (("--repository", "r.example/q", "--model-host-path", "/srv/../etc"), "--model-host-path", "without '..'"),
        (QWEN + ("--namespace", "Prod_NS"), "--namespace", "not a DNS label"),
        (QWEN + ("--secret", "bad secret"), "--secret", "not a Kubernetes object name"),
        (QWEN + ("--network", "host"), "--network", "multi-node group only"),
        (QWEN + ("--rank-key-secret", "k"), "--rank-key-secret", "multi-node group only"),
        (QWEN + ("--env", "QWEN_API_KEY=x"), "QWEN_API_KEY", "comes from the Secret"),
        (QWEN + ("--env", "QWEN_PORT=9000"), "QWEN_PORT", "exposed port"),
        (QWEN + ("--env", "MODEL_REVISION=" + "a" * 40), "MODEL_REVISION", "pinned model.revision"),
        (QWEN + ("--env", "MODEL_ID=other/model"), "MODEL_ID", "pinned model.id"),
        (QWEN + ("--env", "MY_HUB_TOKEN=abc"), "MY_HUB_TOKEN", "put it in a Secret"),
        (QWEN + ("--env", f"NOTES=see {SECRETS['API_KEY']}"), "NOTES", "put it in a Secret"),
        (QWEN + ("--env", "BAD-NAME=1"), "--env", "not a variable name"),
        (QWEN + ("--env", "QWEN_SERVED_MODEL_NAME=a\nb"), "QWEN_SERVED_MODEL_NAME", "control character"),
        (QWEN + ("--env", "QWEN_SERVED_MODEL_NAME=Qwen\u202e72B"), "QWEN_SERVED_MODEL_NAME", "control character"),
        (QWEN + ("--env", "LWS_WORKER_INDEX=1"), "LWS_WORKER_INDEX", "LeaderWorkerSet injects"),
        (QWEN + ("--startup-timeout", "-5"), "--startup-timeout", "expected a whole number"),
        (QWEN + ("--startup-timeout", "1_000"), "--startup-timeout", "expected a whole number"),
        (QWEN + ("--startup-timeout", "\u0661\u0662"), "--startup-timeout", "expected a whole number"),
        (QWEN + ("--startup-timeout", str(2**31)), "--startup-timeout", "an int32 in the API"),
        # References follow the distribution grammar: nothing can end the header comment or a scalar.
        (("--repository", "r.example/q\nkind: Pod", "--model-pvc", "m"), "--repository", "control character"),
        (("--repository", "r.example/q #x", "--model-pvc", "m"), "--repository", "a space"),
        (("--repository", "r.example/a..b", "--model-pvc", "m"), "--repository", "lower-case components"),
        (("--repository", "r..example/q", "--model-pvc", "m"), "--repository", "not a host name"),
        (("--repository", "r.example:70000/q", "--model-pvc", "m"), "--repository", "outside 1..65535"),
        (("--image", "r.example/q@sha256:" + "0" * 64 + "\n---", "--model-pvc", "m"), "--image", "control char"),
        (("--image", "r.example/q:-t@sha256:" + "0" * 64, "--model-pvc", "m"), "--image", "the tag '-t'"),
        # Names label by label, host paths that are no system tree.
        (QWEN + ("--secret", "a..b"), "--secret", "not a Kubernetes object name (a DNS subdomain"),
        (QWEN + ("--secret", "a.-b"), "--secret", "not a Kubernetes object name (a DNS subdomain"),
        (QWEN + ("--secret", "a" * 254), "--secret", "at most 253 characters"),
        (("--repository", "r.example/q", "--model-pvc", ".".join(["a" * 63] * 5)), "--model-pvc", "at most 253"),
        *[
            (("--repository", "r.example/q", "--model-host-path", path), "--model-host-path", says)
            for path, says in [
                ("/", "is /: name the model's own directory"),
                ("//", "is /: name the model's own directory"),
                ("/var/", "is /var: name the model's own directory"),
                ("/etc", "system tree /etc"),
                ("//etc//ssl", "system tree /etc"),
                ("/proc/1/root", "system tree /proc"),
                ("/var/lib/kubelet/pods", "system tree /var/lib/kubelet"),
                ("/usr/./share", "system tree /usr"),
                ("/srv/models\n", "control character"),
            ]
        ],
        # Variables that would make the loader or Python run other code.
        *[
            (QWEN + ("--env", f"{name}=/tmp/x"), name, "changes which code")
            for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONSTARTUP", "PATH", "BASH_ENV")
        ],
    ],
)
def test_bad_flags_are_refused_naming_them(flags: tuple[str, ...], field: str, says: str) -> None:
    refused = refusal(generate("qwen_mi300x", *flags))
    assert refused["field"] == field and says in refused["error"], refused
    assert not any(value in json.dumps(refused) for value in SECRETS.values())


def test_operator_values_reach_the_container_verbatim_and_paths_normalised() -> None:
    """`$(NAME)` in an --env value is written `$$(NAME)`: Kubernetes then passes it unexpanded,
    so no value can copy a Secret's variable; strings YAML readers could take for numbers or
    booleans stay strings."""
    values = {
        "EXTRA": "$(QWEN_API_KEY)",
        "HF_ENDPOINT": "http://127.0.0.1:9/$(HF_TOKEN)/",
        "OCTAL": "0o17",
        "FLOAT": "1e3",
        "BOOL": "on",
        "DOLLARS": "a$$b$",
    }
    flags = [item for name, value in values.items() for item in ("--env", f"{name}={value}")]
    text, (deployment, _) = generated("qwen_mi300x", *QWEN, *flags)
    env = {item["name"]: item.get("value") for item in pod_spec(deployment)["containers"][0]["env"]}
    assert {name: env[name] for name in values} == {name: value.replace("$", "$$") for name, value in values.items()}
    for line in ("0o17", "1e3", "on"):
        assert f'value: "{line}"' in text
    _, (lws, _) = generated(
        "deepseek_spark", "--repository", "r.example/ds", "--model-host-path", "//srv//models/./qwen/"
    )
    volumes = [volume.get("hostPath") for volume in pod_spec(lws, "leader")["volumes"]]
    assert {"path": "/srv/models/qwen", "type": "Directory"} in volumes


def test_a_push_record_whose_reference_would_inject_yaml_is_refused(tmp_path: Path) -> None:
    record_dir = tmp_path / "state"
    record = record_dir / "omni" / "pushes" / (digest("qwen_mi300x").split(":")[1] + ".json")
    record.parent.mkdir(parents=True)
    planted = "push.example/q@" + digest("qwen_mi300x") + "\n---\nkind: Pod"
    record.write_text(json.dumps({"digest": digest("qwen_mi300x"), "reference": planted}))
    refused = refusal(generate("qwen_mi300x", "--model-pvc", "m", state=record_dir))
    assert refused["field"] == str(record) and "control character" in refused["error"]


def test_output_replaces_only_what_deploy_wrote(tmp_path: Path) -> None:
    target = tmp_path / "qwen.yaml"
    assert generate("qwen_mi300x", *QWEN, "--output", str(target)).returncode == 0
    first = target.read_text()
    assert first.startswith("# Generated by Omni's deploy")
    assert generate("qwen_mi300x", *QWEN, "--namespace", "prod", "--output", str(target)).returncode == 0
    assert "namespace: prod" in target.read_text()
    edited = first.replace("replicas: 1", "replicas: 3").encode()  # marker and seal line kept, body edited
    assert edited != first.encode()
    for foreign in (b"my notes\n", b"# Generated by hand\n", first.encode()[:20], edited, first.encode() + b"# mine\n"):
        target.write_bytes(foreign)
        refused = refusal(generate("qwen_mi300x", *QWEN, "--output", str(target)))
        assert refused["field"] == "--output" and "left as it is" in refused["error"]
        assert target.read_bytes() == foreign
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "elsewhere.yaml")
    (tmp_path / "elsewhere.yaml").write_text(first)
    assert refusal(generate("qwen_mi300x", *QWEN, "--output", str(link)))["field"] == "--output"


@pytest.mark.parametrize(
    "flags, field, says",
    [
        (("--dist-port", "80"), "--dist-port", "1024..65535"),
        (("--dist-port", "2e4"), "--dist-port", "expected a whole number"),
        (("--env", "NODE_RANK=0"), "NODE_RANK", "LeaderWorkerSet"),
        (("--env", "DOWNLOAD_DEADLINE_S=６０"), "DOWNLOAD_DEADLINE_S", "whole seconds"),
        (("--rdma-network", "Not_A_Name"), "--rdma-network", "not a Kubernetes object name"),
        (("--rank-key-secret", "a..b"), "--rank-key-secret", "not a Kubernetes object name"),
    ],
)
def test_bad_group_flags_are_refused_naming_them(flags: tuple[str, ...], field: str, says: str) -> None:
    refused = refusal(generate("deepseek_spark", "--repository", "r.example/ds", "--model-pvc", "m", *flags))
    assert refused["field"] == field and says in refused["error"], refused


def _layout(tmp_path: Path, pins: dict, **spec) -> Path:
    output = tmp_path / "layout"
    base_spec = {
        "os": "linux",
        "architecture": "amd64",
        "user": "1000:1000",
        "volumes": ["/cache", "/models", "/tmp"],
        "exposed_ports": ["8103/tcp"],
        "env": {"MODEL_PATH": "/models/qwen"},
        "entrypoint": ["/usr/bin/python3", "-I", "-S", "/opt/omni/bin/omni-run", "launcher"],
    }
    assemble(output, {**base_spec, **spec}, [], None, pins=pins)
    return output


def _options() -> Options:
    return Options(image="r.example/q@sha256:" + "0" * 64, model_pvc="m")


@pytest.mark.parametrize(
    "spec, pins, field, says",
    [
        ({"labels": {"omni.test_only": "the engine lane's CPU image"}}, {}, "omni.test_only", "engine lane"),
        ({}, {"engine__needs_root": True}, "engine.needs_root", "runs as root"),
        ({"user": "omni:omni"}, {}, "config.User", "numeric"),
        ({"env": {"MODEL_PATH": "/elsewhere/qwen"}}, {}, "MODEL_PATH", "none of the image's volumes"),
        ({"exposed_ports": ["8103/tcp", "9000/tcp"]}, {}, "config.ExposedPorts", "expected one API port"),
        ({"exposed_ports": ["8200/tcp"]}, {}, "config.ExposedPorts", "launcher listens on 8103"),
        ({"exposed_ports": ["8103/udp"]}, {}, "config.ExposedPorts", "not a TCP port"),
        ({"labels": {"omni.runtime.groups": "video:forty"}}, {}, "omni.runtime.groups", "name:gid"),
        ({"volumes": ["/cache", "/models"]}, {}, "config.Volumes", "no /tmp volume"),
        ({"entrypoint": ["/usr/bin/vllm"]}, {}, "config.Entrypoint", "Omni's shim ending in 'launcher'"),
        ({"entrypoint": ["/opt/omni/bin/omni-run", "boot"]}, {}, "config.Entrypoint", "ending in 'launcher'"),
    ],
)
def test_images_that_cannot_be_deployed_so_are_refused(
    tmp_path: Path, spec: dict, pins: dict, field: str, says: str
) -> None:
    with pytest.raises(DeployError) as refused:
        resources(read_contract(_layout(tmp_path, qwen_pins(**pins), **spec)), _options())
    assert refused.value.field == field and says in str(refused.value)


def test_every_hardware_profile_has_a_deployment_target() -> None:
    from typing import get_args

    from attest.pins import HardwarePin
    from tools.deploy import TARGETS

    assert set(get_args(HardwarePin.model_fields["profile"].annotation)) == set(TARGETS)


def test_the_cpu_profile_asks_for_no_gpu_and_validates(tmp_path: Path) -> None:
    """The test-only CPU image (--test-image): the same generator; no GPU requested, tolerated or
    selected by, only the architecture; Burstable, sized for a small machine."""
    layout = _layout(
        tmp_path, qwen_pins(hardware={"profile": "cpu_x86_64", "gpu_arch": ""}), labels={"omni.test_only": "lane"}
    )
    with pytest.raises(DeployError, match="--test-image"):
        read_contract(layout)
    items = resources(read_contract(layout, test_image=True), _options())
    deployment = items[0]
    spec = pod_spec(deployment)
    assert "gpu" not in json.dumps(spec) and "tolerations" not in spec
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "6Gi"}}
    assert qos_class(spec) == "Burstable"
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    for item in items:
        kubernetes_validate.validate(item, CLUSTER_VERSIONS[-1], strict=True)


def test_a_synthetic_image_passes_the_same_checks(tmp_path: Path) -> None:
    """The refusal table's base case is deployable: each row fails for its own reason."""
    items = resources(read_contract(_layout(tmp_path, qwen_pins())), _options())
    assert [item["kind"] for item in items] == ["Deployment", "Service"]


def test_a_layout_without_the_baked_document_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "plain"
    assemble(output, {"os": "linux", "architecture": "amd64", "user": "1000:1000"}, [], None)
    with pytest.raises(DeployError) as refused:
        read_contract(output)
    assert refused.value.field == "etc/omni/image.json" and "only an omni_image" in str(refused.value)


def test_the_leader_startup_budget_reads_boot_settings_as_boot_does() -> None:
    """A value boot takes (fractional seconds) is taken; the budget is its whole-second ceiling."""
    _, (lws, _) = generated(
        "deepseek_spark",
        "--repository",
        "r.example/ds",
        "--model-pvc",
        "m",
        "--env",
        "DOWNLOAD_DEADLINE_S=1800.5",
        "--env",
        "READY_TIMEOUT_S=600",
    )
    startup = pod_spec(lws, "leader")["containers"][0]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 2410  # ceil(2400.5) to the next period


MODEL_IMAGE = "registry.example/models/ds@sha256:" + "5" * 64
# Image volumes (volumes[].image) exist in the API from 1.31: the versions validated with them.
IMAGE_VOLUME_VERSIONS = tuple(v for v in CLUSTER_VERSIONS if int(v.split(".")[1]) >= 31)


def test_the_model_artifact_is_an_image_volume_every_rank_verifies_itself(capfd) -> None:
    completed = generate("deepseek_spark", "--repository", "r.example/ds", "--model-image", MODEL_IMAGE)
    assert completed.returncode == 0, completed.stderr
    assert "ImageVolume feature gate" not in completed.stderr  # 1.35, the default: on by default
    lws, _ = list(yaml.safe_load_all(completed.stdout))
    jsonschema.Draft7Validator(lws_schema()).validate(lws)
    for role in ("leader", "worker"):
        template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
        spec = pod_spec(lws, role)
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        assert volumes["model"]["image"] == {"reference": MODEL_IMAGE, "pullPolicy": "IfNotPresent"}
        assert volumes["models"] == {"name": "models", "emptyDir": {}}
        (container,) = spec["containers"]
        mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
        assert mounts["/models/DeepSeek-V4.1-Flash"] == {
            "name": "model",
            "mountPath": "/models/DeepSeek-V4.1-Flash",
            "readOnly": True,
        }
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert env["MODEL_SOURCE"] == "image" and "HF_TOKEN" not in env
        assert "fsGroup" not in spec["securityContext"]  # nothing is written to the model: no chown
        for version in IMAGE_VOLUME_VERSIONS:
            kubernetes_validate.validate(as_pod_template(template), version, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):  # 1.30 has no image volumes: deploy refuses it
        kubernetes_validate.validate(as_pod_template(template), "1.30", strict=True)
    older = ("--model-image", MODEL_IMAGE, "--kubernetes-version", "1.33")
    chosen = generate("deepseek_spark", "--repository", "r.example/ds", *older, "--model-source", "image")
    assert chosen.returncode == 0 and "ImageVolume feature gate" in chosen.stderr
    _, (pulled, _) = generated("deepseek_spark", "--repository", "r.example/ds", *older)  # below 1.35: pulled
    assert "initContainers" in pod_spec(pulled, "leader")
    _, (deployment, _) = generated("qwen_mi300x", *QWEN_IMAGE, "--model-image", MODEL_IMAGE)
    qwen = pod_spec(deployment)
    assert {"name": "model", "mountPath": "/models/qwen", "readOnly": True} in qwen["containers"][0]["volumeMounts"]
    for version in IMAGE_VOLUME_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)


def test_below_image_volumes_each_rank_pulls_the_artifact_in_an_init_container_of_its_own_image() -> None:
    flags = ("--model-image", MODEL_IMAGE, "--image-pull-secret", "regcred", "--image-pull-secret", "other")
    for version in CLUSTER_VERSIONS:
        pinned = ("--kubernetes-version", version) + (
            ("--model-source", "registry") if int(version.split(".")[1]) >= 35 else ()
        )
        _, (lws, _) = generated("deepseek_spark", "--repository", "r.example/ds", *flags, *pinned)
        for role in ("leader", "worker"):
            template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
            kubernetes_validate.validate(as_pod_template(template), version, strict=True)
    jsonschema.Draft7Validator(lws_schema()).validate(lws)
    for role in ("leader", "worker"):
        spec = pod_spec(lws, role)
        (init,) = spec["initContainers"]
        (container,) = spec["containers"]
        assert init["image"] == container["image"] and init["args"] == ["prepare"] and init["env"] == container["env"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "nvidia.com/gpu" not in json.dumps(init["resources"]) and "Probe" not in json.dumps(init)
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert env["MODEL_SOURCE"] == "registry" and env["MODEL_ARTIFACT"] == MODEL_IMAGE
        assert env["REGISTRY_AUTH_FILE"] == "/etc/omni/registry-auth/config.json" and "HF_TOKEN" not in env
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        assert volumes["models"] == {"name": "models", "emptyDir": {}}  # this pod's own copy: no shared volume
        assert volumes["registry-auth"]["secret"]["secretName"] == "regcred"  # the first pull secret
        assert volumes["registry-auth"]["secret"]["items"] == [{"key": ".dockerconfigjson", "path": "config.json"}]
        mounts = {mount["name"]: mount for mount in init["volumeMounts"]}
        assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": False}
        assert {"state", "registry-auth"} <= set(mounts) and not {"dshm", "rank-key"} & set(mounts)
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]  # writable for the pull
    cache = generated(
        "deepseek_spark", "--repository", "r.example/ds", "--model-source", "registry", "--model-image", MODEL_IMAGE,
        "--model-host-path", "/var/cache/omni-models",
    )[1][0]  # fmt: skip
    volumes = {volume["name"]: volume for volume in pod_spec(cache, "worker")["volumes"]}
    assert volumes["models"]["hostPath"]["path"] == "/var/cache/omni-models"  # a node's own cache
    assert "registry-auth" not in volumes  # no pull secret: the registry's anonymous access
    qwen = refusal(generate("qwen_mi300x", *QWEN_IMAGE, "--model-source", "registry", "--model-image", MODEL_IMAGE))
    assert qwen["field"] == "--model-source" and "carries no puller" in qwen["error"]
    old = refusal(generate("qwen_mi300x", *QWEN_IMAGE, "--model-image", MODEL_IMAGE, "--kubernetes-version", "1.30"))
    assert old["field"] == "--kubernetes-version" and "registry" not in old["error"]  # only what qwen can use


QWEN_IMAGE = ("--repository", "r.example/qwen")


@pytest.mark.parametrize(
    "flags, field, says",
    [
        (("--model-image", "registry.example/models/ds:v1"), "--model-image", "by digest"),
        (("--model-image", "Registry.example/X@sha256:" + "5" * 64), "--model-image", ""),
        (("--model-image", MODEL_IMAGE, "--model-pvc", "m"), "--model-pvc", "exactly one of"),
        (("--model-pvc", "m", "--model-host-path", "/srv/m"), "--model-pvc", "exactly one of"),
        (("--model-source", "image", "--kubernetes-version", "1.30"), "--model-image", "the image pins none"),
        (("--model-source", "registry"), "--model-image", "the image pins none"),
        (("--model-source", "pvc"), "--model-pvc", "needs --model-pvc"),
        (("--model-source", "host-path"), "--model-host-path", "needs --model-host-path"),
        (("--model-source", "hub", "--model-pvc", "m"), "--model-source", "expected one of image, registry"),
        (("--model-source", "image", "--model-image", MODEL_IMAGE, "--model-pvc", "m"), "--model-pvc", "mounts the"),
        (("--model-source", "registry", "--model-image", MODEL_IMAGE, "--model-pvc", "m"), "--model-pvc", "own copy"),
        (("--model-source", "pvc", "--model-pvc", "m", "--model-image", MODEL_IMAGE), "--model-pvc", "exactly one of"),
        (
            ("--model-source", "image", "--model-image", MODEL_IMAGE, "--kubernetes-version", "1.30"),
            "--kubernetes-version",
            "1.31 or later",
        ),
        (("--model-image", MODEL_IMAGE, "--kubernetes-version", "1.x"), "--kubernetes-version", "1.MINOR"),
        (("--model-pvc", "m", "--kubernetes-version", "2.0"), "--kubernetes-version", "1.MINOR"),
        (("--model-image", MODEL_IMAGE, "--hf-token-secret", "t"), "--hf-token-secret", "nothing is downloaded"),
        (("--model-image", MODEL_IMAGE, "--env", "MODEL_SOURCE=hub"), "MODEL_SOURCE", "manifest sets it"),
        *(
            (("--model-image", MODEL_IMAGE, *source, "--env", f"{name}={value}"), name, "with the model artifact")
            for source in ((), ("--model-source", "registry"))
            for name, value in (
                ("SKIP_PREPARE", "1"),
                ("SKIP_VERIFY", "1"),
                ("CHECKPOINT_LOCK", "/tmp/other.lock.json"),
                ("CHECKPOINT_LOCK_SHA256", "0" * 64),
            )
        ),
        *(
            (("--model-image", MODEL_IMAGE, "--model-source", "registry", "--env", f"{name}=x"), name, "manifest sets")
            for name in ("MODEL_ARTIFACT", "REGISTRY_AUTH_FILE")
        ),
        (
            ("--model-image", MODEL_IMAGE, "--model-source", "registry", "--hf-token-secret", "t"),
            "--hf-token-secret",
            "nothing is downloaded",
        ),
    ],
)
def test_bad_model_image_flags_are_refused_naming_them(flags: tuple[str, ...], field: str, says: str) -> None:
    refused = refusal(generate("deepseek_spark", "--repository", "r.example/ds", *flags))
    assert refused["field"] == field and says in refused["error"], refused


def test_the_skips_stay_the_operators_beside_a_model_volume_of_their_own() -> None:
    """Only an image volume fixes them: with a PVC an operator may still skip re-hashing."""
    completed = generate("deepseek_spark", "--repository", "r.example/ds", "--model-pvc", "m", "--env", "SKIP_VERIFY=1")
    assert completed.returncode == 0, completed.stderr


def test_the_pinned_artifact_is_the_default_model_volume_and_another_digest_is_refused(tmp_path: Path) -> None:
    import argparse

    from tools.deploy.cli import model_image

    artifact = {"repository": "registry.example/models/qwen", "tag": "v1", "digest": "sha256:" + "6" * 64}
    pins = qwen_pins(model={"id": "Qwen/Qwen3.8-27B", "revision": "a" * 40, "artifact": artifact})
    contract = read_contract(_layout(tmp_path, pins))

    def chosen(**flags: str) -> str:
        return model_image(
            contract,
            argparse.Namespace(
                **{"model_image": "", "model_pvc": "", "model_host_path": "", "model_source": "", **flags}
            ),
        )

    assert chosen() == "registry.example/models/qwen@sha256:" + "6" * 64
    assert chosen(model_pvc="m") == ""  # an explicit volume wins
    assert chosen(model_host_path="/srv/cache", model_source="registry").endswith("6" * 64)  # a cache to pull into
    assert chosen(model_image="mirror.example/q@sha256:" + "6" * 64) == "mirror.example/q@sha256:" + "6" * 64
    with pytest.raises(DeployError) as refused:
        chosen(model_image=MODEL_IMAGE)
    assert refused.value.field == "--model-image"
    items = resources(contract, Options(image="r.example/q@sha256:" + "0" * 64, model_image=chosen()))
    notes = items[0]["spec"]["template"]["metadata"]["annotations"]
    assert notes["omni.model.artifact"] == "registry.example/models/qwen@sha256:" + "6" * 64


def qos_class(spec: dict) -> str:
    """The QoS class Kubernetes gives the pod (extended resources such as GPUs do not count)."""
    containers = spec["containers"]
    kinds = ("cpu", "memory")
    if not any(
        c.get("resources", {}).get(part, {}).get(k)
        for c in containers
        for part in ("requests", "limits")
        for k in kinds
    ):
        return "BestEffort"
    if all(
        c["resources"].get("limits", {}).get(k)
        and c["resources"]["limits"][k] == c["resources"].get("requests", {}).get(k, c["resources"]["limits"][k])
        for c in containers
        for k in kinds
    ):
        return "Guaranteed"
    return "Burstable"


SCHEDULING = (
    "--node-selector",
    "omni.example/pool=gpu-a",
    "--toleration",
    "dedicated=llm:NoExecute",
    "--toleration",
    "maintenance:PreferNoSchedule",
    "--image-pull-secret",
    "registry-cred",
    "--runtime-class",
    "nvidia",
    "--priority-class",
    "llm-serving",
)


def _pod_specs(items: list[dict]) -> list[dict]:
    return [
        pod_spec(item, role) if item["kind"] == "LeaderWorkerSet" else pod_spec(item)
        for item in items
        if item["kind"] in ("Deployment", "LeaderWorkerSet")
        for role in (("leader", "worker") if item["kind"] == "LeaderWorkerSet" else ("",))
    ]


def test_pods_tolerate_the_gpu_taint_select_the_gpu_model_and_are_never_best_effort() -> None:
    _, qwen = generated("qwen_mi300x", *QWEN_IMAGE, "--model-pvc", "m")
    _, spark = generated("deepseek_spark", "--repository", "r.example/ds", "--model-pvc", "m")
    for items, qos, taint, labels in (
        (
            qwen,
            "Guaranteed",
            "amd.com/gpu",
            {"amd.com/gpu.device-id": ["74a1", "74a9", "74b5", "74bd"], "kubernetes.io/arch": ["amd64"]},
        ),
        (
            spark,
            "Burstable",
            "nvidia.com/gpu",
            {
                "nvidia.com/gpu.compute.major": ["12"],
                "nvidia.com/gpu.compute.minor": ["1"],
                "kubernetes.io/arch": ["arm64"],
            },
        ),
    ):
        for spec in _pod_specs(items):
            assert qos_class(spec) == qos
            assert {"key": taint, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
            (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
            assert {e["key"]: e["values"] for e in term["matchExpressions"] if e["operator"] == "In"} == labels
    deployment = qwen[0]
    startup = pod_spec(deployment)["containers"][0]["startupProbe"]
    assert deployment["spec"]["progressDeadlineSeconds"] >= startup["periodSeconds"] * startup["failureThreshold"]
    assert (
        qos_class({"containers": [{"resources": {"limits": {"amd.com/gpu": 1}}}]}) == "BestEffort"
    )  # the check can fail


def test_the_scheduling_flags_reach_every_pod_and_validate() -> None:
    _, items = generated(
        "deepseek_spark",
        "--repository",
        "r.example/ds",
        "--model-pvc",
        "m",
        *SCHEDULING,
        "--cpu",
        "12",
        "--memory",
        "48Gi",
        "--no-gpu-affinity",
    )
    lws = items[0]
    for role in ("leader", "worker"):
        spec = pod_spec(lws, role)
        assert spec["nodeSelector"] == {"omni.example/pool": "gpu-a"}
        assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoExecute"} in spec["tolerations"]
        assert {"key": "maintenance", "operator": "Exists", "effect": "PreferNoSchedule"} in spec["tolerations"]
        assert spec["imagePullSecrets"] == [{"name": "registry-cred"}]
        assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("nvidia", "llm-serving")
        assert "affinity" not in spec
        assert spec["containers"][0]["resources"]["requests"] == {"cpu": "12", "memory": "48Gi", "nvidia.com/gpu": 1}
        validate_core(as_pod_template(lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]))
    jsonschema.Draft7Validator(lws_schema()).validate(lws)
    _, qwen = generated("qwen_mi300x", *QWEN_IMAGE, "--model-pvc", "m", *SCHEDULING)
    validate_core(qwen[0])


@pytest.mark.parametrize(
    "flags, field, says",
    [
        (("--cpu", "0"), "--cpu", "positive"),
        (("--cpu", "2 cores"), "--cpu", "quantity"),
        (("--memory", "128GB"), "--memory", "quantity"),
        (("--memory=-1Gi",), "--memory", "quantity"),
        (("--node-selector", "pool"), "--node-selector", "KEY=VALUE"),
        (("--node-selector", "bad key=x"), "--node-selector", "label key"),
        (("--node-selector", "Example.COM/pool=x"), "--node-selector", "label key"),
        (("--node-selector", "pool=" + "v" * 64), "--node-selector", "label value"),
        (("--node-selector", "pool=a\nb"), "--node-selector", "label value"),
        (("--toleration", "gpu"), "--toleration", "KEY[=VALUE]:EFFECT"),
        (("--toleration", "gpu:Never"), "--toleration", "EFFECT"),
        (("--toleration", "gp u:NoSchedule"), "--toleration", "label key"),
        (("--toleration", "k=v v:NoSchedule"), "--toleration", "label value"),
        (("--image-pull-secret", "Cred"), "--image-pull-secret", "DNS subdomain"),
        (("--runtime-class", "a..b"), "--runtime-class", "DNS subdomain"),
        (("--priority-class", "x" * 254), "--priority-class", "DNS subdomain"),
    ],
)
def test_bad_scheduling_flags_are_refused_naming_them(flags: tuple[str, ...], field: str, says: str) -> None:
    refused = refusal(generate("qwen_mi300x", *QWEN_IMAGE, "--model-pvc", "m", *flags))
    assert refused["field"] == field and says in refused["error"], refused


def test_opt_in_network_policy_and_disruption_budget_select_the_deployments_pods() -> None:
    _, plain = generated("qwen_mi300x", *QWEN_IMAGE, "--model-pvc", "m")
    assert [item["kind"] for item in plain] == ["Deployment", "Service"]  # opt-in only
    _, qwen = generated(
        "qwen_mi300x",
        *QWEN_IMAGE,
        "--model-pvc",
        "m",
        "--network-policy",
        "--pod-disruption-budget",
        "--api-from-namespace",
        "kubernetes.io/metadata.name=gateway",
    )
    deployment, _, policy, budget = qwen
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for item in (policy, budget):
        validate_core(item)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items() and budget["spec"]["selector"]["matchLabels"] == selector
    api, internal = policy["spec"]["ingress"]
    assert api == {
        "ports": [{"protocol": "TCP", "port": 8103}],
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}],
    }
    assert internal == {"from": [{"podSelector": {"matchLabels": selector}}]}
    assert budget["spec"]["maxUnavailable"] == 0
    _, spark = generated(
        "deepseek_spark",
        "--repository",
        "r.example/ds",
        "--model-pvc",
        "m",
        "--network-policy",
        "--pod-disruption-budget",
    )
    lws, service, policy, budget = spark
    group = {"leaderworkerset.sigs.k8s.io/name": "deepseek-spark"}  # every rank: LWS labels each pod so
    assert policy["spec"]["podSelector"]["matchLabels"] == group == budget["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["ingress"][0] == {"ports": [{"protocol": "TCP", "port": 8888}]}  # the API from anywhere
    assert policy["spec"]["ingress"][1] == {"from": [{"podSelector": {"matchLabels": group}}]}  # dist-init, NCCL
    for item in (policy, budget):
        validate_core(item)


@pytest.mark.parametrize(
    "flags, field",
    [
        (("--api-from-namespace", "team=a"), "--api-from-namespace"),
        (("--network-policy", "--api-from-namespace", "team"), "--api-from-namespace"),
        (("--network-policy", "--api-from-namespace", "bad key=a"), "--api-from-namespace"),
    ],
)
def test_bad_policy_flags_are_refused_naming_them(flags: tuple[str, ...], field: str) -> None:
    assert refusal(generate("qwen_mi300x", *QWEN_IMAGE, "--model-pvc", "m", *flags))["field"] == field
