"""One pod of an Omni deployment: its security contexts, its volumes (the model's, emptyDirs,
/dev/shm in memory, the rank key's Secret), its probes and its container. Pure functions."""

from __future__ import annotations

import math
from typing import Any

from attest.edge.status import HEALTH_PATH
from boot.settings import IMAGE, REGISTRY
from tools.deploy.contract import ImageContract
from tools.deploy.errors import DeployError
from tools.deploy.inputs import Options, model_host_path
from tools.deploy.k8s_names import is_dns_label
from tools.deploy.scheduling import container_resources, pod_fields
from tools.deploy.targets import Target

# Grace for the engines to drain: both programs forward SIGTERM to the engine's process group.
TERMINATION_GRACE_S = 120
PROBE_PERIOD_S = 10
# attest.edge.status bounds its own run to 4 s; the kubelet kills it after this.
STATUS_PROBE_TIMEOUT_S = 5
STATUS_VOLUME = "/tmp"
STATUS_FILE = STATUS_VOLUME + "/omni-status.json"
RANK_KEY_SECRET_KEY = "key"
# Where every rank of the group reads the key that authenticates rank 0's verdict (boot.checkpoint.ranks):
# a Secret's volume, outside the model volume whose verdicts it authenticates.
RANK_KEY_DIR = "/etc/omni/rank-key"
# MODEL_SOURCE=registry: the first --image-pull-secret (a kubernetes.io/dockerconfigjson Secret)
# mounted as the registry stack's auth file, so the artifact is pulled as the image was.
REGISTRY_AUTH_DIR = "/etc/omni/registry-auth"
REGISTRY_AUTH_FILE = REGISTRY_AUTH_DIR + "/config.json"
DOCKER_CONFIG_KEY = ".dockerconfigjson"
MODEL_PULL_CONTAINER = "model-pull"


def k8s_name(image: str) -> str:
    name = image.replace("_", "-").lower()
    if not is_dns_label(name):
        raise DeployError(f"image name {image!r} does not make a Kubernetes name ({name!r})", field="image")
    return name


def _http_probe(port: int, period_s: int, timeout_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }


def status_command(contract: ImageContract, program: str, verb: str) -> list[str]:
    """The image's own entry shim running the status probe (attest.edge.status): the entrypoint is
    `<shim...> <program>`, so the probe is `<shim...> attest.edge.status <verb>`."""
    if len(contract.entrypoint) < 2 or contract.entrypoint[-1] != program:
        raise DeployError(
            f"the image's entrypoint is {list(contract.entrypoint)}; expected Omni's shim ending in {program!r}, "
            "which also runs the probes",
            field="config.Entrypoint",
        )
    return [*contract.entrypoint[:-1], "attest.edge.status", verb]


def _exec_probe(command: list[str], period_s: int, failures: int) -> dict[str, Any]:
    return {
        "exec": {"command": command},
        "periodSeconds": period_s,
        "timeoutSeconds": STATUS_PROBE_TIMEOUT_S,
        "failureThreshold": failures,
    }


def probes(contract: ImageContract, program: str, port: int, startup_s: int) -> dict[str, Any]:
    """The pod that serves the API (the launcher's, rank 0's)."""
    return {
        # Until the engine first answers: checkpoint checks, downloads and the model load.
        "startupProbe": _http_probe(port, PROBE_PERIOD_S, 5, math.ceil(startup_s / PROBE_PERIOD_S)),
        # Traffic only once the program's own verdict is in (attest.edge.status) and /health answers.
        "readinessProbe": _exec_probe(status_command(contract, program, "ready"), PROBE_PERIOD_S, 3),
        # A loaded engine under a long prefill answers slowly: 2.5 minutes of silence, not one.
        "livenessProbe": _http_probe(port, 30, 10, 5),
    }


def rank_probes(contract: ImageContract, program: str, startup_s: int) -> dict[str, Any]:
    """A rank > 0 serves no HTTP: its probes watch that boot and its engine still run."""
    live = status_command(contract, program, "live")
    return {
        "startupProbe": _exec_probe(live, PROBE_PERIOD_S, math.ceil(startup_s / PROBE_PERIOD_S)),
        "readinessProbe": _exec_probe(status_command(contract, program, "ready"), PROBE_PERIOD_S, 3),
        "livenessProbe": _exec_probe(live, PROBE_PERIOD_S, 3),
    }


def status_file(contract: ImageContract) -> str:
    """Where the program reports its verdict: in the image's /tmp volume (an emptyDir per pod)."""
    if STATUS_VOLUME not in contract.volumes:
        raise DeployError(
            f"the image declares no {STATUS_VOLUME} volume, where the probes read the program's verdict "
            f"(volumes: {', '.join(contract.volumes)})",
            field="config.Volumes",
        )
    return STATUS_FILE


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
        if path == model_mount and options.model_source == IMAGE:
            _image_volume(volumes, mounts, name, path, model_path, options.model_image)
            continue
        if path == model_mount:
            source = _model_volume(options, model_writable)
            mounts.append({"name": name, "mountPath": path, "readOnly": not model_writable})
        else:
            source = {"emptyDir": {}}
            mounts.append({"name": name, "mountPath": path})
        volumes.append({"name": name, **source})
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": target.shm_size}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if target.group_size > 1:
        secret = options.rank_key_secret or f"{k8s_name(contract.name)}-rank-key"
        items = [{"key": RANK_KEY_SECRET_KEY, "path": RANK_KEY_SECRET_KEY}]
        # 0444: the ranks run as the image's user, and workers have no fsGroup. optional: false
        # is Kubernetes' default, written out as on the secretKeyRefs: podman 4.3's kube play
        # dereferences it unchecked and crashes on a secret volume without it.
        secret_source = {"secretName": secret, "items": items, "defaultMode": 0o444, "optional": False}
        volumes.append({"name": "rank-key", "secret": secret_source})
        mounts.append({"name": "rank-key", "mountPath": RANK_KEY_DIR, "readOnly": True})
    if options.model_source == REGISTRY and options.scheduling.image_pull_secrets:
        items = [{"key": DOCKER_CONFIG_KEY, "path": "config.json"}]
        secret_source = {
            "secretName": options.scheduling.image_pull_secrets[0],
            "items": items,
            "defaultMode": 0o444,  # as the rank key's: read by the image's user, who has no fsGroup on workers
            "optional": False,
        }
        volumes.append({"name": "registry-auth", "secret": secret_source})
        mounts.append({"name": "registry-auth", "mountPath": REGISTRY_AUTH_DIR, "readOnly": True})
    return volumes, mounts


def _model_volume(options: Options, writable: bool) -> dict[str, Any]:
    """The model's volume: a claim, a host directory, or (registry alone) the pod's own emptyDir."""
    if options.model_pvc:
        return {"persistentVolumeClaim": {"claimName": options.model_pvc, "readOnly": not writable}}
    if options.model_host_path:
        return {"hostPath": {"path": model_host_path(options.model_host_path), "type": "Directory"}}
    return {"emptyDir": {}}  # MODEL_SOURCE=registry: the init container pulls into it


def model_pull_container(container: dict[str, Any]) -> dict[str, Any]:
    """MODEL_SOURCE=registry: the serving image's own `boot prepare` as the init container, so the
    pod's copy is pulled and verified (and its receipt written) before the server starts. Same
    image, variables, user and volumes; no GPU, no port, no probes, no /dev/shm, no rank key."""
    resources = {
        kind: {name: value for name, value in amounts.items() if name in ("cpu", "memory")}
        for kind, amounts in container["resources"].items()
    }
    return {
        "name": MODEL_PULL_CONTAINER,
        "image": container["image"],
        "imagePullPolicy": container["imagePullPolicy"],
        "args": ["prepare"],
        "env": container["env"],
        "resources": {kind: amounts for kind, amounts in resources.items() if amounts},
        "securityContext": {**container["securityContext"], "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [mount for mount in container["volumeMounts"] if mount["name"] not in ("dshm", "rank-key")],
    }


def _image_volume(volumes: list, mounts: list, name: str, path: str, model_path: str, reference: str) -> None:
    """The model artifact, pulled by the runtime by digest, read-only at MODEL_PATH itself (the
    artifact's files lie at its root); the image's volume above it stays an emptyDir."""
    if model_path != path:
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
    volumes.append({"name": "model", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}})
    mounts.append({"name": "model", "mountPath": model_path, "readOnly": True})


def _pod_security(contract: ImageContract, model_writable: bool) -> dict[str, Any]:
    """The pod's securityContext: the image's own non-root user and groups."""
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
    return security


def pod_spec(
    contract: ImageContract,
    options: Options,
    target: Target,
    *,
    env: list[dict[str, Any]],
    probes: dict[str, Any],
    model_writable: bool,
    capabilities: tuple[str, ...] = (),
    serves_api: bool = True,
) -> dict[str, Any]:
    volumes, mounts = _volumes(contract, options, target, model_writable=model_writable)
    security = _pod_security(contract, model_writable)
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
        "name": k8s_name(contract.name),
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "resources": container_resources(target, options.scheduling),
        "securityContext": container_security,
        "volumeMounts": mounts,
        **(
            {"ports": [{"name": "http", "containerPort": port, "protocol": "TCP"} for port in contract.ports]}
            if serves_api
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
        **({"initContainers": [model_pull_container(container)]} if options.model_source == REGISTRY else {}),
        "containers": [container],
        "volumes": volumes,
        **pod_fields(target, options.scheduling),
    }
    if options.network == "host":
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return spec
