"""Kubernetes resources for an Omni image, generated from its contract (tools/deploy/contract.py)
and the operator's choices (Options): a Deployment and Service for the single-GPU launcher
image, a LeaderWorkerSet and Service for the multi-node boot image. Pure functions: no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from attest.errors import AttestError
from attest.pins import release_refusal
from boot import settings as boot_settings
from launcher import settings as launcher_settings
from tools.deploy.contract import ImageContract
from tools.deploy.errors import DeployError
from tools.deploy.inputs import DNS_LABEL_RE, Options, check_options, kubernetes_verbatim, model_host_path

__all__ = ["Options", "check_pins", "resources"]

PART_OF = "omni"
API_KEY_SECRET_KEY = "api-key"
HF_TOKEN_SECRET_KEY = "token"
RANK_KEY_SECRET_KEY = "key"
# Where every rank of the group reads the key that authenticates rank 0's verdict (boot.ranks):
# a Secret's volume, outside the model volume whose verdicts it authenticates.
RANK_KEY_DIR = "/etc/omni/rank-key"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
HEALTH_PATH = "/health"  # vLLM and SGLang both serve it without the API key
# What LeaderWorkerSet injects into every container, ahead of the container's own variables,
# so `$(NAME)` in those expands (kubernetes-sigs/lws, pkg/utils/pod: AddLWSVariables).
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# Grace for the engines to drain: both programs forward SIGTERM to the engine's process group.
TERMINATION_GRACE_S = 120
PROBE_PERIOD_S = 10


@dataclass(frozen=True)
class Target:
    """How one hardware profile (the pin `hardware.profile`) is deployed."""

    gpu_resource: str
    group_size: int
    # /dev/shm for the engine's worker processes (vLLM's and SGLang's docs ask for a large one).
    shm_size: str
    program: str  # "launcher" or "boot": which settings the manifest speaks


TARGETS = {
    "mi300x_single": Target(gpu_resource="amd.com/gpu", group_size=1, shm_size="16Gi", program="launcher"),
    "dgx_spark_x3": Target(gpu_resource="nvidia.com/gpu", group_size=3, shm_size="32Gi", program="boot"),
}
# The launcher verifies the checkpoint, then vLLM loads 27B and compiles its graphs into an
# empty /cache: an hour before the pod is declared stuck (--startup-timeout changes it).
LAUNCHER_STARTUP_S = 3600


def _k8s_name(image: str) -> str:
    name = image.replace("_", "-").lower()
    if not DNS_LABEL_RE.fullmatch(name):
        raise DeployError(f"image name {image!r} does not make a Kubernetes name ({name!r})", field="image")
    return name


def _setting(settings: tuple, name: str) -> Any:
    for setting in settings:
        if setting.variable == name:
            return setting
    raise DeployError(f"{name} is no longer a setting of this program; the deploy generator is out of step", field=name)


def _managed(target: Target) -> dict[str, str]:
    """Variables the manifest sets itself, and why an operator may not."""
    if target.program == "launcher":
        names = {
            "QWEN_API_KEY": "comes from the Secret (--secret)",
            "QWEN_PORT": "is the image's exposed port",
            "QWEN_BIND_HOST": "is 0.0.0.0 so the Service reaches the pod",
            "QWEN_CONTAINER_INTERNAL_ONLY": "is 1: the pod network is cluster-internal",
        }
        settings = launcher_settings.SETTINGS
    else:
        names = {
            "API_KEY": "comes from the Secret (--secret)",
            "HF_TOKEN": "comes from --hf-token-secret",
            "SERVER_PORT": "is the image's exposed port",
            "NNODES": "comes from LeaderWorkerSet",
            "NODE_RANK": "comes from LeaderWorkerSet",
            "DIST_INIT_ADDR": "comes from LeaderWorkerSet",
            "HOST": "is 0.0.0.0 so the Service reaches the leader",
            "RANK_KEY_FILE": "is the mounted --rank-key-secret",
            "RANK_GROUP": "is the LeaderWorkerSet group key (downward API)",
        }
        settings = boot_settings.SETTINGS
    for name in names:
        if name != "HF_TOKEN":
            _setting(settings, name)
    return names


def _check_options(contract: ImageContract, options: Options, secrets: tuple[str, ...]) -> Target:
    target = TARGETS.get(contract.baked.pins.hardware.profile)
    if target is None:
        raise DeployError(
            f"no deployment is defined for hardware.profile {contract.baked.pins.hardware.profile!r} "
            f"(known: {', '.join(sorted(TARGETS))})",
            field="hardware.profile",
        )
    check_options(options, single_pod=target.group_size == 1, managed=_managed(target), secrets=secrets)
    return target


def _labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
    }


def _provenance(contract: ImageContract) -> dict[str, str]:
    """Pod annotations that say what runs: the digest and every pin."""
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
    if pins.speculator is not None:
        notes["omni.speculator.id"] = pins.speculator.id
        notes["omni.speculator.revision"] = pins.speculator.revision
    return {key: value for key, value in notes.items() if value}


def _secret_env(variable: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": False}}}


def _http_probe(port: int, period_s: int, timeout_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }


def _probes(port: int, startup_s: int) -> dict[str, Any]:
    return {
        # Until the engine first answers: checkpoint checks, downloads and the model load.
        "startupProbe": _http_probe(port, PROBE_PERIOD_S, 5, math.ceil(startup_s / PROBE_PERIOD_S)),
        "readinessProbe": _http_probe(port, PROBE_PERIOD_S, 5, 3),
        # A loaded engine under a long prefill answers slowly: 2.5 minutes of silence, not one.
        "livenessProbe": _http_probe(port, 30, 10, 5),
    }


def _volumes(
    contract: ImageContract, options: Options, target: Target, *, model_writable: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One volume per volume the image declares (the model's from the flags, the rest emptyDir),
    and /dev/shm in memory."""
    model_path = contract.env.get("MODEL_PATH", "")
    model_mount = next(
        (path for path in contract.volumes if model_path == path or model_path.startswith(path.rstrip("/") + "/")), ""
    )
    if not model_mount:
        raise DeployError(
            f"MODEL_PATH {model_path!r} is under none of the image's volumes ({', '.join(contract.volumes)})",
            field="MODEL_PATH",
        )
    volumes, mounts = [], []
    for path in contract.volumes:
        name = path.strip("/").replace("/", "-").replace("_", "-").lower() or "root"
        if path == model_mount:
            source = (
                {"persistentVolumeClaim": {"claimName": options.model_pvc, "readOnly": not model_writable}}
                if options.model_pvc
                else {"hostPath": {"path": model_host_path(options.model_host_path), "type": "Directory"}}
            )
            mounts.append({"name": name, "mountPath": path, "readOnly": not model_writable})
        else:
            source = {"emptyDir": {}}
            mounts.append({"name": name, "mountPath": path})
        volumes.append({"name": name, **source})
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": target.shm_size}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if target.group_size > 1:
        secret = options.rank_key_secret or f"{_k8s_name(contract.name)}-rank-key"
        items = [{"key": RANK_KEY_SECRET_KEY, "path": RANK_KEY_SECRET_KEY}]
        # 0444: the ranks run as the image's user, and workers have no fsGroup.
        volumes.append({"name": "rank-key", "secret": {"secretName": secret, "items": items, "defaultMode": 0o444}})
        mounts.append({"name": "rank-key", "mountPath": RANK_KEY_DIR, "readOnly": True})
    return volumes, mounts


def _pod_spec(
    contract: ImageContract,
    options: Options,
    target: Target,
    *,
    env: list[dict[str, Any]],
    probes: dict[str, Any],
    model_writable: bool,
    capabilities: tuple[str, ...] = (),
) -> dict[str, Any]:
    volumes, mounts = _volumes(contract, options, target, model_writable=model_writable)
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": contract.uid,
        "runAsGroup": contract.gid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if contract.groups:
        security["supplementalGroups"] = [gid for _, gid in contract.groups]
    if model_writable:  # a fresh volume is root's: the download needs it group-writable
        security["fsGroup"] = contract.gid
        security["fsGroupChangePolicy"] = "OnRootMismatch"
    container_security: dict[str, Any] = {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if capabilities:
        container_security["capabilities"]["add"] = list(capabilities)
    container = {
        "name": _k8s_name(contract.name),
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "resources": {"limits": {target.gpu_resource: 1}, "requests": {target.gpu_resource: 1}},
        "securityContext": container_security,
        "volumeMounts": mounts,
        **(
            {"ports": [{"name": "http", "containerPort": port, "protocol": "TCP"} for port in contract.ports]}
            if probes
            else {}
        ),
        **probes,
    }
    spec: dict[str, Any] = {
        # No Kubernetes API token and no service-link variables (they could shadow a setting).
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": security,
        "containers": [container],
        "volumes": volumes,
    }
    if options.network == "host":
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return spec


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
    name, port = _k8s_name(contract.name), _port(contract)
    default_port = int(_setting(launcher_settings.SETTINGS, "QWEN_PORT").default)
    if port != default_port:
        raise DeployError(
            f"the image exposes {port} but the launcher listens on {default_port}", field="config.ExposedPorts"
        )
    env = [
        {"name": "QWEN_BIND_HOST", "value": "0.0.0.0"},
        {"name": "QWEN_CONTAINER_INTERNAL_ONLY", "value": "1"},
        _secret_env("QWEN_API_KEY", options.secret or f"{name}-api-key", API_KEY_SECRET_KEY),
        *_operator_env(options),
    ]
    startup_s = options.startup_timeout_s or LAUNCHER_STARTUP_S
    labels = _labels(name, "server")
    pod = _pod_spec(contract, options, target, env=env, probes=_probes(port, startup_s), model_writable=False)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            # One GPU per pod: a rolling update would wait forever for a second one.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {"metadata": {"labels": labels, "annotations": _provenance(contract)}, "spec": pod},
        },
    }
    return [deployment, _service(name, options.namespace, port, {"app.kubernetes.io/name": name}, labels)]


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


def _boot_resources(contract: ImageContract, options: Options, target: Target) -> list[dict[str, Any]]:
    name, port = _k8s_name(contract.name), _port(contract)
    default_port = int(_setting(boot_settings.SETTINGS, "SERVER_PORT").default)
    if port != default_port:
        raise DeployError(f"the image exposes {port} but boot listens on {default_port}", field="config.ExposedPorts")
    group = [
        {"name": "NNODES", "value": f"$({LWS_GROUP_SIZE})"},
        {"name": "NODE_RANK", "value": f"$({LWS_WORKER_INDEX})"},
        {"name": "DIST_INIT_ADDR", "value": f"$({LWS_LEADER_ADDRESS}):{options.dist_port}"},
        {"name": "HOST", "value": "0.0.0.0"},
        _secret_env("API_KEY", options.secret or f"{name}-api-key", API_KEY_SECRET_KEY),
    ]
    if options.hf_token_secret:
        group.append(_secret_env("HF_TOKEN", options.hf_token_secret, HF_TOKEN_SECRET_KEY))
    group += [
        {"name": "RANK_KEY_FILE", "value": f"{RANK_KEY_DIR}/{RANK_KEY_SECRET_KEY}"},
        {"name": "RANK_GROUP", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LWS_GROUP_KEY_LABEL}']"}}},
    ]
    env = group + _operator_env(options)
    # RDMA registers (pins) memory: NCCL needs IPC_LOCK for it, and nothing more.
    capabilities = ("IPC_LOCK",) if options.rdma_network else ()
    annotations = _provenance(contract)
    if options.rdma_network:
        annotations["k8s.v1.cni.cncf.io/networks"] = options.rdma_network
    leader = _pod_spec(
        contract,
        options,
        target,
        env=env,
        probes=_probes(port, options.startup_timeout_s or _boot_startup_s(options)),
        model_writable=True,
        capabilities=capabilities,
    )
    # Workers serve no HTTP: no probes; they only read the checkpoint rank 0 verified.
    worker = _pod_spec(contract, options, target, env=env, probes={}, model_writable=False, capabilities=capabilities)
    labels = _labels(name, "server")
    lws = {
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
                    "metadata": {"labels": _labels(name, "leader"), "annotations": annotations},
                    "spec": leader,
                },
                "workerTemplate": {
                    "metadata": {"labels": _labels(name, "worker"), "annotations": annotations},
                    "spec": worker,
                },
            },
        },
    }
    selector = {LWS_NAME_LABEL: name, LWS_WORKER_INDEX_LABEL: "0"}
    return [lws, _service(name, options.namespace, port, selector, labels)]


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
    target = _check_options(contract, options, secrets)
    if target.program == "launcher":
        return _launcher_resources(contract, options, target)
    return _boot_resources(contract, options, target)
