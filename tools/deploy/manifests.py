"""Kubernetes resources for an Omni image, generated from its contract (tools/deploy/contract.py)
and the operator's choices (Options): a Deployment and Service for the single-GPU launcher
image, a LeaderWorkerSet and Service for the multi-node boot image. Pure functions: no I/O."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from attest.edge.status import MAIN_PID_VARIABLE, STATUS_FILE_VARIABLE
from attest.errors import AttestError
from attest.pins import release_refusal
from boot import settings as boot_settings
from boot.settings import HUB, IMAGE, REGISTRY
from launcher import settings as launcher_settings
from tools.deploy import lws
from tools.deploy.contract import ImageContract
from tools.deploy.errors import DeployError
from tools.deploy.inputs import INT32_MAX, Options, check_options, kubernetes_verbatim, resolve_model_source
from tools.deploy.pods import (
    RANK_KEY_DIR,
    RANK_KEY_SECRET_KEY,
    REGISTRY_AUTH_FILE,
    k8s_name,
    pod_spec,
    probes,
    rank_probes,
    status_file,
)
from tools.deploy.policies import disruption_budget, network_policy, scrape_annotations, service_monitor
from tools.deploy.targets import TARGETS, Target

__all__ = ["Options", "check_pins", "provenance", "resources"]

PART_OF = "omni"
API_KEY_SECRET_KEY = "api-key"
HF_TOKEN_SECRET_KEY = "token"


# A rollout is reported failed only after the pod's own start budget and this much more.
PROGRESS_MARGIN_S = 600
# The launcher verifies the checkpoint, then vLLM loads 27B and compiles its graphs into an
# empty /cache: an hour before the pod is declared stuck (--startup-timeout changes it).
LAUNCHER_STARTUP_S = 3600


def _setting(settings: tuple, name: str) -> Any:
    for setting in settings:
        if setting.variable == name:
            return setting
    raise DeployError(f"{name} is no longer a setting of this program; the deploy generator is out of step", field=name)


# From the model artifact (an image volume, or pulled by each pod), boot verifies every rank's copy
# against the image's pinned lock: no variable may skip that or name another lock (boot refuses
# the skips too, boot/checkpoint/from_image.py).
ARTIFACT_SOURCES = (IMAGE, REGISTRY)
ARTIFACT_FIXED = {
    "SKIP_PREPARE": "is refused with the model artifact: every rank verifies its own copy",
    "SKIP_VERIFY": "is refused with the model artifact: every rank verifies its own copy",
    "CHECKPOINT_LOCK": "is the image's pinned lock with the model artifact",
    "CHECKPOINT_LOCK_SHA256": "is the image's pinned lock with the model artifact",
}
REGISTRY_FIXED = {
    "MODEL_ARTIFACT": "is the artifact deploy names (--model-image, else the pin model.artifact)",
    "REGISTRY_AUTH_FILE": "is the mounted --image-pull-secret, used for the artifact too",
}


def _managed(target: Target, options: Options) -> dict[str, str]:
    """Variables the manifest sets itself or fixes, and why an operator may not."""
    if target.program == "launcher":
        names = {
            "QWEN_API_KEY": "comes from the Secret (--secret)",
            "QWEN_PORT": "is the image's exposed port",
            "QWEN_BIND_HOST": "is 0.0.0.0 so the Service reaches the pod",
            "QWEN_CONTAINER_INTERNAL_ONLY": "is 1: the pod network is cluster-internal",
            "MODEL_ID": "is the image's pinned model.id",
            "MODEL_REVISION": "is the image's pinned model.revision",
            STATUS_FILE_VARIABLE: "is where the probes read the launcher's verdict",
            MAIN_PID_VARIABLE: "is 1: the probe takes only the verdict of the container's main process",
        }
        settings = launcher_settings.SETTINGS
    else:
        names = {
            "API_KEY": "comes from the Secret (--secret)",
            "HF_TOKEN": "comes from --hf-token-secret",
            "MODEL_SOURCE": "follows --model-source",
            "SERVER_PORT": "is the image's exposed port",
            "NNODES": "comes from LeaderWorkerSet",
            "NODE_RANK": "comes from LeaderWorkerSet",
            "DIST_INIT_ADDR": "comes from LeaderWorkerSet",
            "HOST": "is 0.0.0.0 so the Service reaches the leader",
            "RANK_KEY_FILE": "is the mounted --rank-key-secret",
            "RANK_GROUP": "is the LeaderWorkerSet group key (downward API)",
            STATUS_FILE_VARIABLE: "is where the probes read boot's verdict",
            MAIN_PID_VARIABLE: "is 1: the probe takes only the verdict of the container's main process",
        }
        settings = boot_settings.SETTINGS
        if options.model_source in ARTIFACT_SOURCES:
            names.update(ARTIFACT_FIXED)
        if options.model_source == REGISTRY:
            names.update(REGISTRY_FIXED)
    for name in names:
        # The token's Secret; the probe's own variable; the registry stack's (omni_oci.remote.auth.credentials).
        if name not in ("HF_TOKEN", MAIN_PID_VARIABLE, "REGISTRY_AUTH_FILE"):
            _setting(settings, name)
    return names


def _target(contract: ImageContract) -> Target:
    target = TARGETS.get(contract.baked.pins.hardware.profile)
    if target is None:
        raise DeployError(
            f"no deployment is defined for hardware.profile {contract.baked.pins.hardware.profile!r} "
            f"(known: {', '.join(sorted(TARGETS))})",
            field="hardware.profile",
        )
    return target


def resolved(contract: ImageContract, options: Options) -> Options:
    """The options with their model source resolved for the image's target (--model-source's default)."""
    return replace(options, model_source=resolve_model_source(options, _target(contract).program))


def _check_options(contract: ImageContract, options: Options, secrets: tuple[str, ...]) -> tuple[Options, Target]:
    """The options with their model source resolved, each checked, and the image's target."""
    target, options = _target(contract), resolved(contract, options)
    check_options(
        options,
        single_pod=target.group_size == 1,
        program=target.program,
        managed=_managed(target, options),
        secrets=secrets,
    )
    return options, target


def _labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
    }


def provenance(contract: ImageContract) -> dict[str, str]:
    """The annotations that say what runs (the digest and every pin): on every resource and
    every pod template; kustomize's commonAnnotations under --output-dir."""
    pins = contract.baked.pins
    notes = {
        "omni.image.digest": contract.digest,
        "omni.base.digest": pins.base.digest,
        "omni.engine": pins.engine.name,
        "omni.engine.commit": pins.engine.commit,
        "omni.engine.record_sha256": pins.engine.record_sha256,
        "omni.model.id": pins.model.id,
        "omni.model.revision": pins.model.revision,
    }
    if pins.model.lock_sha256:
        notes["omni.model.lock_sha256"] = pins.model.lock_sha256
    if pins.model.artifact is not None:
        notes["omni.model.artifact"] = f"{pins.model.artifact.repository}@{pins.model.artifact.digest}"
    if pins.speculator is not None:
        notes["omni.speculator.id"] = pins.speculator.id
        notes["omni.speculator.revision"] = pins.speculator.revision
    return {key: value for key, value in notes.items() if value}


def _secret_env(variable: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": False}}}


def _operator_env(options: Options) -> list[dict[str, Any]]:
    """The operator's variables, as the container must see them: never expanded by Kubernetes."""
    return [{"name": name, "value": kubernetes_verbatim(value)} for name, value in sorted(options.env.items())]


def _port(contract: ImageContract) -> int:
    if len(contract.ports) != 1:
        raise DeployError(
            f"the image exposes {len(contract.ports)} ports; expected one API port", field="config.ExposedPorts"
        )
    return contract.ports[0]


def _service(name: str, namespace: str, port: int, selector: dict[str, str], labels: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def _launcher_resources(contract: ImageContract, options: Options, target: Target) -> list[dict[str, Any]]:
    name, port = k8s_name(contract.name), _port(contract)
    default_port = int(_setting(launcher_settings.SETTINGS, "QWEN_PORT").default)
    if port != default_port:
        raise DeployError(
            f"the image exposes {port} but the launcher listens on {default_port}", field="config.ExposedPorts"
        )
    env = [
        {"name": "QWEN_BIND_HOST", "value": "0.0.0.0"},
        {"name": "QWEN_CONTAINER_INTERNAL_ONLY", "value": "1"},
        # The launcher refuses to start without them; the pins are their one source.
        {"name": "MODEL_ID", "value": contract.baked.pins.model.id},
        {"name": "MODEL_REVISION", "value": contract.baked.pins.model.revision},
        {"name": STATUS_FILE_VARIABLE, "value": status_file(contract)},
        {"name": MAIN_PID_VARIABLE, "value": "1"},
        _secret_env("QWEN_API_KEY", options.secret or f"{name}-api-key", API_KEY_SECRET_KEY),
        *_operator_env(options),
    ]
    startup_s = options.startup_timeout_s or LAUNCHER_STARTUP_S
    labels = _labels(name, "server")
    pod = pod_spec(
        contract,
        options,
        target,
        env=env,
        probes=probes(contract, target.program, port, startup_s),
        model_writable=False,
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            # One GPU per pod: a rolling update would wait forever for a second one.
            "strategy": {"type": "Recreate"},
            # The default (600 s) would report a healthy start (checks, load, compile) as failed.
            "progressDeadlineSeconds": min(startup_s + PROGRESS_MARGIN_S, INT32_MAX),
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": labels, "annotations": provenance(contract) | scrape_annotations(port)},
                "spec": pod,
            },
        },
    }
    selector = {"app.kubernetes.io/name": name}
    return [
        deployment,
        _service(name, options.namespace, port, selector, labels),
        *_policies(name, options, port, selector, labels),
    ]


def _boot_startup_s(options: Options) -> int:
    """Rank 0 downloads (DOWNLOAD_DEADLINE_S), then SGLang loads (READY_TIMEOUT_S): boot's own
    limits, read by boot's own parsers so the manifest takes exactly what boot would."""
    total = 0.0
    for name in ("DOWNLOAD_DEADLINE_S", "READY_TIMEOUT_S"):
        setting = _setting(boot_settings.SETTINGS, name)
        try:
            total += setting.parse(options.env.get(name) or setting.default, name)
        except AttestError as exc:
            raise DeployError(f"--env {name}: expected whole seconds as boot reads them ({exc})", field=name) from None
    return math.ceil(total)


def _boot_pods(
    contract: ImageContract, options: Options, target: Target, env: list[dict[str, Any]], port: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leader's pod (the API, its probes, the writable model volume when it downloads) and
    the workers' (no HTTP: probes on the status; they only read what rank 0 verified)."""
    # RDMA registers (pins) memory: NCCL needs IPC_LOCK for it, and nothing more.
    capabilities = ("IPC_LOCK",) if options.rdma_network else ()
    startup_s = options.startup_timeout_s or _boot_startup_s(options)
    leader = pod_spec(
        contract,
        options,
        target,
        env=env,
        probes=probes(contract, target.program, port, startup_s),
        model_writable=options.model_source != IMAGE,
        capabilities=capabilities,
    )
    worker = pod_spec(
        contract,
        options,
        target,
        env=env,
        probes=rank_probes(contract, target.program, startup_s),
        model_writable=options.model_source == REGISTRY,  # each rank pulls its own copy
        capabilities=capabilities,
        serves_api=False,
    )
    return leader, worker


def _group_env(contract: ImageContract, options: Options, name: str) -> list[dict[str, Any]]:
    """What every rank of the group is told: its place in the group (from LWS's variables), the
    status probe's files, the secrets by reference, the model source and rank 0's key."""
    group = [
        {"name": "NNODES", "value": f"$({lws.GROUP_SIZE})"},
        {"name": "NODE_RANK", "value": f"$({lws.WORKER_INDEX})"},
        {"name": "DIST_INIT_ADDR", "value": f"$({lws.LEADER_ADDRESS}):{options.dist_port}"},
        {"name": "HOST", "value": "0.0.0.0"},
        {"name": STATUS_FILE_VARIABLE, "value": status_file(contract)},
        {"name": MAIN_PID_VARIABLE, "value": "1"},
        _secret_env("API_KEY", options.secret or f"{name}-api-key", API_KEY_SECRET_KEY),
    ]
    if options.hf_token_secret:
        group.append(_secret_env("HF_TOKEN", options.hf_token_secret, HF_TOKEN_SECRET_KEY))
    # From the artifact every rank verifies its own copy: an image volume's (boot.checkpoint.from_image)
    # or the one its init container pulled (boot.checkpoint.from_registry).
    source = options.model_source if options.model_source in ARTIFACT_SOURCES else HUB
    group.append({"name": "MODEL_SOURCE", "value": source})
    if source == REGISTRY:
        group.append({"name": "MODEL_ARTIFACT", "value": options.model_image})
        if options.scheduling.image_pull_secrets:
            group.append({"name": "REGISTRY_AUTH_FILE", "value": REGISTRY_AUTH_FILE})
    group += [
        {"name": "RANK_KEY_FILE", "value": f"{RANK_KEY_DIR}/{RANK_KEY_SECRET_KEY}"},
        {"name": "RANK_GROUP", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{lws.GROUP_KEY_LABEL}']"}}},
    ]
    return group


def _boot_resources(contract: ImageContract, options: Options, target: Target) -> list[dict[str, Any]]:
    name, port = k8s_name(contract.name), _port(contract)
    annotations = provenance(contract)
    if options.rdma_network:
        annotations["k8s.v1.cni.cncf.io/networks"] = options.rdma_network
    default_port = int(_setting(boot_settings.SETTINGS, "SERVER_PORT").default)
    if port != default_port:
        raise DeployError(f"the image exposes {port} but boot listens on {default_port}", field="config.ExposedPorts")
    env = _group_env(contract, options, name) + _operator_env(options)
    leader, worker = _boot_pods(contract, options, target, env, port)
    labels = _labels(name, "server")
    group_set = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            # Workers join the leader's process group while it loads: start them with it.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": target.group_size,
                # One lost rank breaks the whole NCCL group: restart the group, not the pod.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {
                        "labels": _labels(name, "leader"),
                        "annotations": annotations | scrape_annotations(port),
                    },
                    "spec": leader,
                },
                "workerTemplate": {
                    "metadata": {"labels": _labels(name, "worker"), "annotations": annotations},
                    "spec": worker,
                },
            },
        },
    }
    selector = {lws.NAME_LABEL: name, lws.WORKER_INDEX_LABEL: "0"}
    group = {lws.NAME_LABEL: name}  # every rank: the dist-init store and NCCL talk among them
    return [
        group_set,
        _service(name, options.namespace, port, selector, labels),
        *_policies(name, options, port, group, labels),
    ]


def _policies(
    name: str, options: Options, port: int, selector: dict[str, str], labels: dict[str, str]
) -> list[dict[str, Any]]:
    """The opt-in NetworkPolicy, PodDisruptionBudget and ServiceMonitor."""
    made = []
    if options.network_policy:
        made.append(network_policy(name, options.namespace, selector, port, options.api_from, labels))
    if options.disruption_budget:
        made.append(disruption_budget(name, options.namespace, selector, labels))
    if options.service_monitor:
        made.append(service_monitor(name, options.namespace, labels, options.service_monitor_labels, labels))
    return made


def check_pins(contract: ImageContract) -> None:
    """An image with an empty pin proves nothing about what runs: refused as a release build is."""
    pins = contract.baked.pins
    empty = pins.empty_pins()
    if empty:
        refusal = release_refusal(empty, f"{pins.image}.pins.json")
        raise DeployError(str(refusal), field=refusal.field)


def resources(contract: ImageContract, options: Options, secrets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every resource of the image's deployment; refused (DeployError) before anything is made."""
    check_pins(contract)
    options, target = _check_options(contract, options, secrets)
    made = (_launcher_resources if target.program == "launcher" else _boot_resources)(contract, options, target)
    for item in made:  # what runs, on every resource (kustomize's commonAnnotations do the same)
        item["metadata"]["annotations"] = provenance(contract)
    return made
