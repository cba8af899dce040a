"""Opt-in resources around an Omni deployment: a NetworkPolicy that admits the API port from
anywhere (or from the namespaces a selector names) and every other port (the process group's
dist-init store, NCCL) only from the deployment's own pods, a PodDisruptionBudget that keeps
voluntary evictions (drains) from taking a serving pod down, and a prometheus-operator
ServiceMonitor that scrapes the API port's /metrics; with the scrape annotations every
serving pod carries. Pure functions."""

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


METRICS_PATH = "/metrics"  # vLLM's always, SGLang's with --enable-metrics; neither asks for the key
SCRAPE_INTERVAL = "30s"


def scrape_annotations(port: int) -> dict[str, str]:
    """The annotations annotation-based Prometheus scrape configurations read."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": METRICS_PATH}


def service_monitor(
    name: str, namespace: str, service_labels: dict[str, str], extra_labels: dict[str, str], labels: dict[str, str]
) -> dict[str, Any]:
    """Scrapes the Service's named `http` port; `extra_labels` are what a Prometheus's
    serviceMonitorSelector asks for (e.g. release=prometheus)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, **extra_labels}},
        "spec": {
            "selector": {"matchLabels": dict(service_labels)},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [{"port": "http", "path": METRICS_PATH, "scheme": "http", "interval": SCRAPE_INTERVAL}],
        },
    }
