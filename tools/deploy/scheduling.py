"""Where a pod may run and what it is guaranteed: CPU and memory beside the GPU (never
BestEffort), the GPU taint's toleration, the GPU model's node affinity, and the operator's
node selector, tolerations, image pull secrets, runtime class and priority class, each checked
as the API server checks it, naming the flag."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tools.deploy.errors import DeployError
from tools.deploy.k8s_names import dns_subdomain, is_label_value, qualified_name
from tools.deploy.targets import Target

# A resource quantity as the API reads one: a decimal with a binary or decimal suffix.
QUANTITY_RE = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class Scheduling:
    cpu: str = ""  # default: the target's
    memory: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    runtime_class: str = ""
    priority_class: str = ""
    gpu_affinity: bool = True  # False: --no-gpu-affinity (nodes without the GPU operator's labels)


def label_pair(text: str, flag: str = "--node-selector") -> tuple[str, str]:
    """KEY=VALUE of a label (--node-selector, --api-from-namespace)."""
    key, equals, value = text.partition("=")
    if not equals:
        raise DeployError(f"{flag} {text!r}: expected KEY=VALUE", field=flag)
    if not is_label_value(value):
        raise DeployError(
            f"{flag} {text!r}: the value is not a label value (at most 63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit)",
            field=flag,
        )
    return qualified_name(flag, key), value


def toleration(text: str) -> dict[str, str]:
    """--toleration KEY[=VALUE]:EFFECT (no value: any value of the key)."""
    taint, colon, effect = text.rpartition(":")
    if not colon or effect not in TAINT_EFFECTS:
        raise DeployError(
            f"--toleration {text!r}: expected KEY[=VALUE]:EFFECT, EFFECT one of {', '.join(TAINT_EFFECTS)}",
            field="--toleration",
        )
    key, equals, value = taint.partition("=")
    qualified_name("--toleration", key)
    if equals and not is_label_value(value):
        raise DeployError(f"--toleration {text!r}: the value is not a label value", field="--toleration")
    if equals:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def quantity(flag: str, text: str) -> str:
    found = QUANTITY_RE.fullmatch(text)
    if found is None or float(found.group("number")) <= 0:
        raise DeployError(
            f"{flag} {text!r}: expected a positive Kubernetes quantity (e.g. 16, 500m, 128Gi)", field=flag
        )
    return text


def check_scheduling(scheduling: Scheduling) -> None:
    for flag, value in (("--cpu", scheduling.cpu), ("--memory", scheduling.memory)):
        if value:
            quantity(flag, value)
    for flag, names in (
        ("--image-pull-secret", scheduling.image_pull_secrets),
        ("--runtime-class", (scheduling.runtime_class,) if scheduling.runtime_class else ()),
        ("--priority-class", (scheduling.priority_class,) if scheduling.priority_class else ()),
    ):
        for name in names:
            dns_subdomain(flag, name)
    for key, value in scheduling.node_selector.items():
        label_pair(f"{key}={value}")


def container_resources(target: Target, scheduling: Scheduling) -> dict[str, Any]:
    """Requests (and limits, where the target is Guaranteed) of CPU, memory and the GPU."""
    cpu, memory = scheduling.cpu or target.cpu, scheduling.memory or target.memory
    gpu = {target.gpu_resource: 1} if target.gpu_resource else {}
    requests = {"cpu": cpu, "memory": memory, **gpu}
    limits = {"cpu": cpu, "memory": memory, **gpu} if target.guaranteed else gpu
    return {"limits": limits, "requests": requests} if limits else {"requests": requests}


def pod_fields(target: Target, scheduling: Scheduling) -> dict[str, Any]:
    """The pod spec's scheduling fields."""
    # GPU node pools carry the GPU's taint (the GPU operators, managed clusters): tolerate it.
    gpu_taint = (
        [{"key": target.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}] if target.gpu_resource else []
    )
    fields: dict[str, Any] = {}
    if gpu_taint or scheduling.tolerations:
        fields["tolerations"] = [*gpu_taint, *scheduling.tolerations]
    if scheduling.gpu_affinity:
        expressions = [{"key": key, "operator": "In", "values": list(values)} for key, values in target.affinity]
        fields["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions}]
                }
            }
        }
    if scheduling.node_selector:
        fields["nodeSelector"] = dict(sorted(scheduling.node_selector.items()))
    if scheduling.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": name} for name in scheduling.image_pull_secrets]
    if scheduling.runtime_class:
        fields["runtimeClassName"] = scheduling.runtime_class
    if scheduling.priority_class:
        fields["priorityClassName"] = scheduling.priority_class
    return fields
