"""What a real GPU cluster needs beyond valid YAML (docs/running.md#on-a-real-cluster): probes
whose readiness is the program's own verdict (attest.edge.status) on every container, metrics for
Prometheus (scrape annotations, the opt-in ServiceMonitor checked against the pinned
prometheus-operator CRD), and the kustomize base of --output-dir, rendered by the real
`kubectl kustomize` and compared with the single-file output."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.fixtures.manifests import (
    LAYOUTS,
    digest,
    generate,
    generated,
    lws_schema,
    pod_spec,
    refusal,
    service_monitor_schema,
    validate_core,
)
from tools.deploy import read_contract

SPARK = ("--repository", "registry.example/omni/ds", "--model-pvc", "ds-models")
QWEN = ("--repository", "registry.example/omni/qwen", "--model-pvc", "qwen-models")
STATUS_FILE = "/tmp/omni-status.json"


def containers(items: list[dict]) -> dict[str, dict]:
    """Every container of every pod template, by role."""
    found = {}
    for item in items:
        if item["kind"] == "Deployment":
            found["server"] = pod_spec(item)["containers"][0]
        if item["kind"] == "LeaderWorkerSet":
            for role in ("leader", "worker"):
                found[role] = pod_spec(item, role)["containers"][0]
    return found


def shim(name: str) -> list[str]:
    """The image's own entry shim (its entrypoint less the program)."""
    return list(read_contract(LAYOUTS[name]).entrypoint[:-1])


def test_every_container_has_probes_and_readiness_is_the_programs_verdict() -> None:
    for name, flags, serving in (("qwen_mi300x", QWEN, "server"), ("deepseek_spark", SPARK, "leader")):
        _, items = generated(name, *flags)
        found = containers(items)
        for role, container in found.items():
            assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(container), (name, role)
            env = {item["name"]: item.get("value") for item in container["env"]}
            assert env["OMNI_STATUS_FILE"] == STATUS_FILE  # in the pod's own /tmp emptyDir
            assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
            ready = container["readinessProbe"]
            assert ready["exec"]["command"] == [*shim(name), "attest.edge.status", "ready"], role
            assert ready["timeoutSeconds"] >= 5  # attest.edge.status bounds itself to 4 s
        api = found[serving]
        port = api["ports"][0]["containerPort"]
        # Liveness stays the engine's own /health: distinct from readiness, which waits for acceptance.
        assert api["livenessProbe"]["httpGet"] == {"path": "/health", "port": port}
        assert api["startupProbe"]["httpGet"] == {"path": "/health", "port": port}
        for item in items:
            if item["kind"] == "LeaderWorkerSet":
                jsonschema.Draft7Validator(lws_schema()).validate(item)
            else:
                validate_core(item)
    worker = found["worker"]
    live = [*shim("deepseek_spark"), "attest.edge.status", "live"]
    assert worker["livenessProbe"]["exec"]["command"] == live and worker["startupProbe"]["exec"]["command"] == live
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 21600 + 3600  # the leader's budget


def test_pod_templates_pass_strict_validation_with_exec_probes() -> None:
    _, items = generated("deepseek_spark", *SPARK)
    (lws,) = [item for item in items if item["kind"] == "LeaderWorkerSet"]
    for role in ("leader", "worker"):
        template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
        validate_core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template})


def test_serving_pods_carry_scrape_annotations_and_sglang_serves_metrics() -> None:
    _, qwen = generated("qwen_mi300x", *QWEN)
    _, spark = generated("deepseek_spark", *SPARK)
    (deployment,) = [item for item in qwen if item["kind"] == "Deployment"]
    notes = deployment["spec"]["template"]["metadata"]["annotations"]
    assert (notes["prometheus.io/scrape"], notes["prometheus.io/port"], notes["prometheus.io/path"]) == (
        "true",
        "8103",
        "/metrics",
    )
    (lws,) = [item for item in spark if item["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["leaderTemplate"]["metadata"]["annotations"]["prometheus.io/port"] == "8888"
    assert "prometheus.io/scrape" not in template["workerTemplate"]["metadata"]["annotations"]  # no HTTP there


@pytest.mark.parametrize("name,flags", [("qwen_mi300x", QWEN), ("deepseek_spark", SPARK)])
def test_the_service_monitor_selects_the_service_and_fits_the_crd(name: str, flags: tuple[str, ...]) -> None:
    _, items = generated(
        name, *flags, "--namespace", "llm", "--service-monitor", "--service-monitor-label", "release=prometheus"
    )
    by_kind = {item["kind"]: item for item in items}
    monitor, service = by_kind["ServiceMonitor"], by_kind["Service"]
    jsonschema.Draft7Validator(service_monitor_schema()).validate(monitor)
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["metadata"]["namespace"] == "llm" and monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    _, plain = generated(name, *flags)
    assert "ServiceMonitor" not in {item["kind"] for item in plain}  # opt-in


def test_the_service_monitor_schema_check_can_fail() -> None:
    _, items = generated("qwen_mi300x", *QWEN, "--service-monitor")
    (monitor,) = [item for item in items if item["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["scheme"] = "gopher"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(service_monitor_schema()).validate(monitor)


@pytest.mark.parametrize(
    "flags,field,says",
    [
        (("--service-monitor-label", "release=prometheus"), "--service-monitor-label", "needs --service-monitor"),
        (("--service-monitor", "--service-monitor-label", "release"), "--service-monitor-label", "KEY=VALUE"),
        (("--service-monitor", "--service-monitor-label", "bad-=x"), "--service-monitor-label", "not a label key"),
        (("--service-monitor", "--service-monitor-label", "a=b c"), "--service-monitor-label", "not a label value"),
    ],
)
def test_bad_metrics_flags_are_refused_naming_them(flags: tuple[str, ...], field: str, says: str) -> None:
    found = refusal(generate("qwen_mi300x", *QWEN, *flags))
    assert found["field"] == field and says in found["error"], found


# --- kustomize ---------------------------------------------------------------------------


def kustomized(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: tools/setup installs it"
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


def _sorted(items: list[dict]) -> list[dict]:
    return sorted(items, key=lambda item: (item["kind"], item["metadata"]["name"]))


@pytest.mark.parametrize(
    "name,flags",
    [
        ("qwen_mi300x", QWEN),
        ("qwen_mi300x", (*QWEN, "--network-policy", "--pod-disruption-budget", "--service-monitor")),
        (
            "deepseek_spark",
            (*SPARK, "--network-policy", "--service-monitor", "--rdma-network", "rdma", "--namespace", "llm"),
        ),
        ("deepseek_spark", ("--image", "mirror.example:5000/omni/ds@{digest}", "--model-pvc", "m")),
    ],
)
def test_kubectl_kustomize_of_the_output_dir_is_the_single_file_output(
    tmp_path: Path, name: str, flags: tuple[str, ...]
) -> None:
    flags = tuple(flag.format(digest=digest(name)) for flag in flags)
    _, single = generated(name, *flags)
    completed = generate(name, *flags, "--output-dir", str(tmp_path / "base"))
    assert completed.returncode == 0 and completed.stdout == "", completed.stderr
    base = yaml.safe_load((tmp_path / "base" / "kustomization.yaml").read_text())
    (image,) = base["images"]
    assert image["digest"] == digest(name)  # the image by digest
    assert base["commonAnnotations"]["omni.image.digest"] == digest(name)
    assert len(base["resources"]) == len(single)
    for file in base["resources"]:
        assert (tmp_path / "base" / file).read_text().startswith("# Generated by Omni's deploy")
    assert _sorted(kustomized(tmp_path / "base")) == _sorted(single)


def test_a_site_overlay_patches_the_base_without_editing_it(tmp_path: Path) -> None:
    assert generate("qwen_mi300x", *QWEN, "--output-dir", str(tmp_path / "base")).returncode == 0
    overlay = tmp_path / "site"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["../base"],
                "images": [{"name": "registry.example/omni/qwen", "newName": "mirror.site/omni/qwen"}],
                "labels": [{"pairs": {"site": "lab-3"}}],
                "patches": [  # the example of docs/running.md#kustomize
                    {
                        "patch": yaml.safe_dump(
                            {
                                "apiVersion": "apps/v1",
                                "kind": "Deployment",
                                "metadata": {"name": "qwen-mi300x"},
                                "spec": {"template": {"spec": {"nodeSelector": {"rack": "r7"}}}},
                            }
                        )
                    }
                ],
            }
        )
    )
    (deployment,) = [item for item in kustomized(overlay) if item["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "mirror.site/omni/qwen@" + digest("qwen_mi300x")  # the digest stays
    assert deployment["metadata"]["labels"]["site"] == "lab-3"
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"rack": "r7"}
    assert deployment["spec"]["template"]["spec"]["affinity"]  # the generated GPU affinity stays


def test_the_output_dir_replaces_only_what_deploy_wrote(tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert generate("qwen_mi300x", *QWEN, "--service-monitor", "--output-dir", str(base)).returncode == 0
    assert (base / "servicemonitor-qwen-mi300x.yaml").exists()
    assert generate("qwen_mi300x", *QWEN, "--output-dir", str(base)).returncode == 0
    assert not (base / "servicemonitor-qwen-mi300x.yaml").exists()  # not listed any more: removed
    assert sorted(p.name for p in base.iterdir()) == [
        "deployment-qwen-mi300x.yaml",
        "kustomization.yaml",
        "service-qwen-mi300x.yaml",
    ]
    (base / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    found = refusal(generate("qwen_mi300x", *QWEN, "--network-policy", "--output-dir", str(base)))
    assert found["field"] == "--output-dir" and "notes.txt" in found["error"]
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before  # nothing written, nothing removed
    afile = tmp_path / "a-file"
    afile.write_text("x")
    found = refusal(generate("qwen_mi300x", *QWEN, "--output-dir", str(afile)))
    assert found["field"] == "--output-dir" and "not a directory" in found["error"]


def _base_with(tmp_path: Path, change) -> tuple[Path, dict[str, bytes]]:
    """A base deploy wrote, then `change(base)`; what it holds afterwards."""
    base = tmp_path / "base"
    assert generate("qwen_mi300x", *QWEN, "--service-monitor", "--output-dir", str(base)).returncode == 0
    change(base)
    return base, {p.name: p.read_bytes() for p in sorted(base.iterdir())}


def _copy(base: Path) -> None:  # the user's copy of a generated file, under another name
    shutil.copyfile(base / "deployment-qwen-mi300x.yaml", base / "my-deployment.yaml")


def _edit(name: str):
    def edit(base: Path) -> None:
        path = base / name
        path.write_text(path.read_text().replace("qwen-mi300x", "qwen-mine", 1))

    return edit


def _link(base: Path) -> None:
    (base / "service-qwen-mi300x.yaml").unlink()
    (base / "service-qwen-mi300x.yaml").symlink_to(base / "deployment-qwen-mi300x.yaml")


@pytest.mark.parametrize(
    "change, named",
    [
        (_copy, "my-deployment.yaml"),
        (_edit("servicemonitor-qwen-mi300x.yaml"), "servicemonitor-qwen-mi300x.yaml"),  # would be removed as stale
        (_edit("deployment-qwen-mi300x.yaml"), "deployment-qwen-mi300x.yaml"),  # would be replaced
        (_edit("kustomization.yaml"), "kustomization.yaml"),
        (_link, "service-qwen-mi300x.yaml"),
    ],
    ids=[
        "a copy under another name",
        "an edited file a rerun drops",
        "an edited file",
        "an edited kustomization",
        "a link",
    ],  # fmt: skip
)
def test_nothing_of_the_users_in_an_output_dir_is_removed_or_replaced(tmp_path: Path, change, named: str) -> None:
    base, before = _base_with(tmp_path, change)
    found = refusal(generate("qwen_mi300x", *QWEN, "--output-dir", str(base)))  # without --service-monitor
    assert found["field"] == "--output-dir" and named in found["error"], found
    assert {p.name: p.read_bytes() for p in sorted(base.iterdir())} == before


def test_output_dir_refuses_a_tag_kustomize_would_drop_and_excludes_output(tmp_path: Path) -> None:
    tagged = f"registry.example/omni/qwen:v1@{digest('qwen_mi300x')}"
    flags = ("--image", tagged, "--model-pvc", "m", "--output-dir", str(tmp_path / "base"))
    found = refusal(generate("qwen_mi300x", *flags))
    assert found["field"] == "--output-dir" and "tag" in found["error"]
    assert not (tmp_path / "base").exists()
    both = generate("qwen_mi300x", *QWEN, "--output", str(tmp_path / "x.yaml"), "--output-dir", str(tmp_path / "d"))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
