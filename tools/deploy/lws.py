"""LeaderWorkerSet's facts, the one home: the labels and variables deploy's manifests name, the
group's pods as the LWS v0.9.0 controller and its pod webhook make them, and the kubelet's
$(VAR) expansion (what tools/dev/podman_group plays where neither exists).

Each fact cites its source in kubernetes-sigs/lws at v0.9.0:
- pods: the leader StatefulSet is named after the set, its pod `<set>-<group>`; each group's
  worker StatefulSet is named after the leader pod, ordinals from 1, so workers are
  `<set>-<group>-<index>` (pkg/controllers/leaderworkerset_controller.go, pod_controller.go);
  a StatefulSet pod's hostname is its name and its subdomain the service, the set's name with
  the default SubdomainShared policy.
- labels and annotations: the leader template gets name, worker-index 0 and the revision
  hash, and the size annotation; the webhook adds group-index and the group key,
  sha1("<namespace>/<leader pod>") (pkg/webhooks/pod_webhook.go genGroupUniqueKey); the worker
  template gets name, group-index, the leader's group key and revision hash, the size and
  leader-name annotations, and the webhook its worker-index.
- variables: LWS_LEADER_ADDRESS `<set>-<group>.<subdomain>.<namespace>`, LWS_GROUP_SIZE and
  LWS_WORKER_INDEX, put ahead of the container's own list (pkg/utils/pod/pod_utils.go
  AddLWSVariables, addEnvVarsIfNotExists).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

from tools.deploy.errors import DeployError

PREFIX = "leaderworkerset.sigs.k8s.io/"
NAME_LABEL, GROUP_INDEX_LABEL = PREFIX + "name", PREFIX + "group-index"
WORKER_INDEX_LABEL, GROUP_KEY_LABEL = PREFIX + "worker-index", PREFIX + "group-key"
REVISION_LABEL = PREFIX + "template-revision-hash"
SIZE_ANNOTATION, LEADER_NAME_ANNOTATION = PREFIX + "size", PREFIX + "leader-name"
# What LWS injects into every container, ahead of the container's own variables, so `$(NAME)`
# in those expands.
LEADER_ADDRESS, GROUP_SIZE, WORKER_INDEX = "LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"
EXPANSION = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def group_key(namespace: str, leader: str) -> str:
    return hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()


def group_pods(lws: dict[str, Any], group: int = 0) -> list[dict[str, Any]]:
    """Group `group`'s pods, leader first, as the controller and webhook create them."""
    name, namespace = lws["metadata"]["name"], lws["metadata"].get("namespace", "default")
    template = lws["spec"]["leaderWorkerTemplate"]
    size = int(template["size"])
    leader = f"{name}-{group}"
    # LWS hashes its ControllerRevision; nothing in a pod reads the value, so any stable one serves.
    revision = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
    common = {
        NAME_LABEL: name,
        GROUP_INDEX_LABEL: str(group),
        GROUP_KEY_LABEL: group_key(namespace, leader),
        REVISION_LABEL: revision,
    }
    pods = [
        _pod(template.get("leaderTemplate") or template["workerTemplate"], leader, namespace, name, 0, size, common)
    ]
    for index in range(1, size):
        extra = {LEADER_NAME_ANNOTATION: leader}
        pods.append(_pod(template["workerTemplate"], f"{leader}-{index}", namespace, name, index, size, common, extra))
    return pods


def _pod(
    template: dict[str, Any],
    pod_name: str,
    namespace: str,
    subdomain: str,
    index: int,
    size: int,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec = copy.deepcopy(template["spec"])
    spec["hostname"], spec["subdomain"] = pod_name, subdomain
    leader = f"{labels[NAME_LABEL]}-{labels[GROUP_INDEX_LABEL]}"
    injected = [
        {"name": LEADER_ADDRESS, "value": f"{leader}.{subdomain}.{namespace}"},
        {"name": GROUP_SIZE, "value": str(size)},
        {"name": WORKER_INDEX, "value": str(index)},
    ]
    for container in spec["containers"] + spec.get("initContainers", []):
        own = [item for item in container.get("env", []) if item["name"] not in {i["name"] for i in injected}]
        container["env"] = copy.deepcopy(injected) + own
    metadata = copy.deepcopy(template.get("metadata", {}))
    metadata["name"], metadata["namespace"] = pod_name, namespace
    metadata["labels"] = {**metadata.get("labels", {}), **labels, WORKER_INDEX_LABEL: str(index)}
    metadata["annotations"] = {**metadata.get("annotations", {}), SIZE_ANNOTATION: str(size), **(annotations or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def k8s_expand(value: str, defined: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
    a variable defined earlier in the list is replaced, $$ is a literal $, anything else stays.
    Written here because no package on PyPI implements it."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return EXPANSION.sub(one, value)


def expand_env(container: dict[str, Any]) -> None:
    """The kubelet's expansion written into the container's `value`s, in order, for a runtime
    without it (podman expands only command and args). A value naming a variable that comes
    from a Secret or the downward API cannot be known here: refused."""
    defined: dict[str, str] = {}
    pending: set[str] = set()
    for item in container.get("env", []):
        if "value" not in item:
            pending.add(item["name"])
            continue
        for match in EXPANSION.finditer(item["value"]):
            if match.group(1) in pending:
                raise DeployError(
                    f"{item['name']} names {match.group(1)}, which comes from a Secret or the pod: only the "
                    "kubelet can expand it",
                    field=item["name"],
                )
        item["value"] = defined[item["name"]] = k8s_expand(item["value"], defined)
