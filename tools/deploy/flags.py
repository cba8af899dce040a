"""The flags of `bazel run //deploy:<image>` (tools/deploy/cli.py), by group: image, model,
multi-node group, scheduling, opt-in policies, admission, output. Parsing only: cli.py checks
each value where it is used."""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.deploy.admission import CONTROLLERS
from tools.deploy.inputs import DEFAULT_KUBERNETES_VERSION, MODEL_SOURCES


def _env_pair(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def _scheduling_flags(parser: argparse.ArgumentParser) -> None:
    scheduling = parser.add_argument_group("scheduling (docs/running.md#scheduling-and-qos)")
    scheduling.add_argument("--cpu", default="", help="CPU requested (and the limit where the pod is Guaranteed)")
    scheduling.add_argument("--memory", default="", help="memory requested (and the limit where Guaranteed)")
    scheduling.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    scheduling.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE]:EFFECT",
        help="repeatable; the GPU taint's is set",
    )
    scheduling.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME", help="repeatable")
    scheduling.add_argument("--runtime-class", default="", metavar="NAME", help="RuntimeClass of every pod")
    scheduling.add_argument("--priority-class", default="", metavar="NAME", help="PriorityClass of every pod")
    policies = parser.add_argument_group("policies (opt-in)")
    policies.add_argument(
        "--network-policy",
        action="store_true",
        help="a NetworkPolicy: the API port from anywhere (or --api-from-namespace), every other port only "
        "from the deployment's own pods (hostNetwork pods bypass it)",
    )
    policies.add_argument(
        "--api-from-namespace", action="append", default=[], metavar="KEY=VALUE", help="namespace labels admitted"
    )
    policies.add_argument(
        "--pod-disruption-budget", action="store_true", help="a PodDisruptionBudget: no voluntary eviction"
    )
    policies.add_argument(
        "--service-monitor",
        action="store_true",
        help="a prometheus-operator ServiceMonitor scraping the API port's /metrics",
    )
    policies.add_argument(
        "--service-monitor-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="repeatable: a label on the ServiceMonitor (what your Prometheus's serviceMonitorSelector asks for)",
    )
    scheduling.add_argument(
        "--no-gpu-affinity",
        action="store_true",
        help="no node affinity for the GPU model (nodes without the GPU operator's labels)",
    )


def _admission_flags(parser: argparse.ArgumentParser) -> None:
    admission = parser.add_argument_group("admission (docs/release.md#admission)")
    admission.add_argument(
        "--admission",
        action="append",
        default=[],
        choices=CONTROLLERS,
        help="repeatable: a Kyverno ClusterPolicy and/or a policy-controller ClusterImagePolicy admitting the "
        "image's repository only when the release key signed it, its signed provenance names exactly the pins, "
        "and its SBOM is attested",
    )
    admission.add_argument(
        "--signing-key-pub", default="", metavar="PEM", help="with --admission: the release key's public half"
    )


def _output_flags(parser: argparse.ArgumentParser) -> None:
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--output",
        default="",
        help="write the YAML here (default: standard output); an existing file is replaced only if deploy wrote it",
    )
    output.add_argument(
        "--output-dir",
        default="",
        metavar="DIR",
        help="write a kustomize base here: one file per resource and kustomization.yaml (the image by digest, "
        "the what-runs annotations as commonAnnotations); only files deploy wrote are replaced",
    )


def _model_flags(parser: argparse.ArgumentParser) -> None:
    """Where the checkpoint comes from: an image volume, a claim or a host directory."""
    parser.add_argument(
        "--model-source",
        default="",
        metavar="|".join(MODEL_SOURCES),
        help="where the checkpoint comes from: image (the artifact as a read-only image volume), registry (each "
        "pod's init container pulls the artifact into an emptyDir, or into --model-host-path as a node cache), "
        "pvc or host-path (rank 0 downloads from the hub); default: pvc or host-path when named, else image from "
        "Kubernetes 1.35 and registry below it (the launcher's image: always image)",
    )
    parser.add_argument(
        "--model-image",
        default="",
        help="REGISTRY/REPO@sha256:... of the model artifact (tools/model), a mirror's repository allowed (default: "
        "the image's pin model.artifact, when neither --model-pvc nor --model-host-path is given, or with "
        "--model-source image or registry)",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=DEFAULT_KUBERNETES_VERSION,
        help=f"the cluster's 1.MINOR (default {DEFAULT_KUBERNETES_VERSION}); image volumes need 1.31 or later, "
        "and the ImageVolume feature gate before 1.35",
    )
    parser.add_argument("--model-pvc", default="", help="PersistentVolumeClaim holding the checkpoint volume")
    parser.add_argument(
        "--model-host-path",
        default="",
        help="host directory holding it instead (multi-node: the same shared filesystem on every node)",
    )
    parser.add_argument(
        "--hf-token-secret",
        default="",
        help="Secret with the hub token under key 'token' (multi-node rank 0 downloads)",
    )


def _group_flags(parser: argparse.ArgumentParser) -> None:
    """The multi-node group: its key, its network, rank 0's port."""
    parser.add_argument(
        "--rank-key-secret",
        default="",
        help="multi-node: Secret with the group's key under key 'key', authenticating rank 0's verdict "
        "(default: <image>-rank-key)",
    )
    parser.add_argument(
        "--network",
        default="pod",
        choices=("pod", "host"),
        help="multi-node: the pod network or the hosts' (hostNetwork)",
    )
    parser.add_argument(
        "--rdma-network",
        default="",
        help="multi-node: a Multus network (NetworkAttachmentDefinition) for RDMA; adds IPC_LOCK",
    )
    parser.add_argument("--dist-port", default="20000", help="multi-node: rank 0's process-group port")


def parser(description: str) -> argparse.ArgumentParser:
    """Every flag of `bazel run //deploy:<image>`; `description`: the command's own text."""
    parser = argparse.ArgumentParser(
        prog="deploy", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layout", type=Path, required=True, help=argparse.SUPPRESS)
    parser.add_argument("--label", default="deploy", help=argparse.SUPPRESS)
    parser.add_argument("--image", default="", help="REGISTRY/REPO@sha256:... (the built image's digest)")
    parser.add_argument("--repository", default="", help="REGISTRY/REPO: the built digest there")
    parser.add_argument("--namespace", default="default", help="namespace of every resource (default: default)")
    parser.add_argument(
        "--test-image",
        action="store_true",
        help="generate for an image labelled omni.test_only (the CPU engine image): local try-outs only",
    )
    parser.add_argument(
        "--secret", default="", help="Secret holding the API key under key 'api-key' (default: <image>-api-key)"
    )
    _model_flags(parser)
    _group_flags(parser)
    parser.add_argument(
        "--startup-timeout",
        default="0",
        metavar="SECONDS",
        help="how long the first /health may take (default: the image's own budget)",
    )
    _scheduling_flags(parser)
    parser.add_argument(
        "--env",
        action="append",
        type=_env_pair,
        default=[],
        metavar="NAME=VALUE",
        help="one more setting of the image (never a secret)",
    )
    _admission_flags(parser)
    _output_flags(parser)
    return parser
