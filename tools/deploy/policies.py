"""Opt-in policies around an Omni deployment: a NetworkPolicy that admits the API port from
anywhere (or from the namespaces a selector names) and every other port (the process group's
dist-init store, NCCL) only from the deployment's own pods, and a PodDisruptionBudget that
keeps voluntary evictions (drains) from taking a serving pod down. Pure functions."""

from __future__ import annotations

from typing import Any


def network_policy(
    name: str, namespace: str, selector: dict[str, str], port: int, api_from: dict[str, str], labels: dict[str, str]
) -> dict[str, Any]:
    """`selector` picks the deployment's pods (the multi-node group's every rank)."""
    api_peer = [{"namespaceSelector": {"matchLabels": dict(api_from)}}] if api_from else []
    api_rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    if api_peer:
        api_rule["from"] = api_peer
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],
            "ingress": [api_rule, {"from": [{"podSelector": {"matchLabels": dict(selector)}}]}],
        },
    }


def disruption_budget(name: str, namespace: str, selector: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    """No voluntary eviction of a serving pod: a drain waits until the operator moves it."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": dict(selector)}},
    }
