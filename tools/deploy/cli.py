"""Kubernetes manifests for an Omni image, generated from the image itself.

    bazel run //deploy:qwen_mi300x -- --model-pvc qwen-models --output qwen.yaml
    bazel run --config=release //deploy:deepseek_spark -- --image REG/omni/deepseek@sha256:... \\
        --model-pvc deepseek-models --network host --output deepseek.yaml

The image reference is by digest: --image REF@sha256:... (it must be the digest of the image
this target built: build with the configuration you pushed), else --repository REGISTRY/REPO
with the built digest, else where `bazel run //images:<image> -- --push ...` last pushed that
digest. Everything else (user, groups, volumes, variables, port, pins) comes from the image's
config and its /etc/omni/image.json; an image with an empty pin is refused as
--config=release refuses it. No secret value is ever written: the API key (and the hub token)
come from Secrets by name.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attest.edge.redact import known_secrets, redacting_output
from attest.edge.refusal import refusing_main, report_refusal
from attest.errors import AttestError
from attest.files import write_atomic
from boot.settings import IMAGE, REGISTRY
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from tools.deploy.contract import ImageContract, read_contract
from tools.deploy.emit import render
from tools.deploy.errors import DeployError
from tools.deploy.inputs import DEFAULT_KUBERNETES_VERSION, IMAGE_VOLUMES_DEFAULT_ON, MODEL_SOURCES, whole_number
from tools.deploy.kustomize import generated_by_deploy, write_base
from tools.deploy.manifests import Options, check_pins, provenance, resolved, resources
from tools.deploy.scheduling import Scheduling, label_pair, toleration
from tools.oci.push_record import last_push


def _parsed(flag: str, text: str) -> Reference:
    try:
        return Reference.parse(text)
    except OciError as exc:
        raise DeployError(f"{flag} {text!r}: {exc}", field=flag) from None


def _image_reference(contract: ImageContract, image: str, repository: str) -> str:
    if image:
        ref = _parsed("--image", image)
        if not ref.digest:
            raise DeployError(
                f"--image {image!r} has no digest: a manifest names its image as REF@sha256:... so "
                "what runs is what was checked",
                field="--image",
            )
        if ref.digest != contract.digest:
            raise DeployError(
                f"--image names {ref.digest} but this target built {contract.digest}: build with the "
                "configuration that was pushed (e.g. bazel run --config=release //deploy:...)",
                field="--image",
            )
        return image
    if repository:
        ref = _parsed("--repository", repository)
        if ref.digest or ref.tag:
            raise DeployError(
                f"--repository {repository!r}: REGISTRY/REPO only (the digest is the built image's)",
                field="--repository",
            )
        return f"{repository}@{contract.digest}"
    pushed = last_push(contract.digest)
    if pushed is None:
        raise DeployError(
            f"{contract.digest} was never pushed from here: push it (bazel run //images:{contract.name} "
            "-- --push REGISTRY/REPO ...), or pass --image REF@sha256:... or --repository "
            "REGISTRY/REPO",
            field="--image",
        )
    return pushed


def _env_pair(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def _output_path(path: str) -> Path:
    # `bazel run` starts in the runfiles; a relative path means the caller's directory.
    base = Path(os.environ.get("BUILD_WORKING_DIRECTORY") or ".")
    return base / path


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deploy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    _output_flags(parser)
    return parser


def model_image(contract: ImageContract, args: argparse.Namespace) -> str:
    """--model-image, else the pinned artifact where no other model volume is named; a given one
    must be the pinned artifact's digest (a mirror's repository may differ)."""
    artifact = contract.baked.pins.model.artifact
    pinned = f"{artifact.repository}@{artifact.digest}" if artifact is not None and artifact.digest else ""
    if not args.model_image:
        wanted = args.model_source in (IMAGE, REGISTRY) or not (args.model_pvc or args.model_host_path)
        return pinned if wanted else ""
    if pinned and not args.model_image.endswith("@" + artifact.digest):
        raise DeployError(
            f"--model-image {args.model_image!r} is not the artifact the image pins ({pinned})", field="--model-image"
        )
    return args.model_image


def _scheduling(args: argparse.Namespace) -> Scheduling:
    return Scheduling(
        cpu=args.cpu,
        memory=args.memory,
        node_selector=dict(label_pair(text) for text in args.node_selector),
        tolerations=tuple(toleration(text) for text in args.toleration),
        image_pull_secrets=tuple(args.image_pull_secret),
        runtime_class=args.runtime_class,
        priority_class=args.priority_class,
        gpu_affinity=not args.no_gpu_affinity,
    )


def _image_volume_note(options: Options) -> None:
    if options.model_source == IMAGE and (1, options.kubernetes_minor) < IMAGE_VOLUMES_DEFAULT_ON:
        print(
            f"deploy: note: on Kubernetes {options.kubernetes_version} image volumes need the ImageVolume feature "
            "gate (kube-apiserver and kubelet) and a runtime that mounts them (containerd 2.1+, CRI-O 1.31+); "
            "see docs/models.md",
            file=sys.stderr,
        )


def _options(contract: ImageContract, args: argparse.Namespace) -> Options:
    """The flags, each checked, as the generator's options."""
    return Options(
        image=_image_reference(contract, args.image, args.repository),
        namespace=args.namespace,
        secret=args.secret,
        model_pvc=args.model_pvc,
        model_host_path=args.model_host_path,
        hf_token_secret=args.hf_token_secret,
        rank_key_secret=args.rank_key_secret,
        network=args.network,
        rdma_network=args.rdma_network,
        dist_port=whole_number("--dist-port", args.dist_port),
        startup_timeout_s=whole_number("--startup-timeout", args.startup_timeout),
        env=dict(args.env),
        model_image=model_image(contract, args),
        model_source=args.model_source,
        kubernetes_version=args.kubernetes_version,
        scheduling=_scheduling(args),
        network_policy=args.network_policy,
        api_from=dict(label_pair(text, "--api-from-namespace") for text in args.api_from_namespace),
        disruption_budget=args.pod_disruption_budget,
        service_monitor=args.service_monitor,
        service_monitor_labels=dict(label_pair(text, "--service-monitor-label") for text in args.service_monitor_label),
    )


def _write(args: argparse.Namespace, items: list[dict], rendered, image: str, contract: ImageContract) -> None:
    """A kustomize base (--output-dir), one file deploy owns (--output), or stdout."""
    kinds = ", ".join(f"{item['kind']}/{item['metadata']['name']}" for item in items)
    if args.output_dir:
        directory = _output_path(args.output_dir)
        files = write_base(directory, items, render=rendered, image=image, annotations=provenance(contract))
        print(f"deploy: wrote {kinds} to {directory} ({len(files)} files; kubectl apply -k)", file=sys.stderr)
    elif args.output:
        path = _output_path(args.output)
        if os.path.lexists(path) and generated_by_deploy(path) is None:
            raise DeployError(
                f"--output {path} exists and is not a manifest deploy wrote, or was changed since; it was left as "
                "it is (choose another path, or move it aside)",
                field="--output",
            )
        write_atomic(path, rendered(items).encode())
        print(f"deploy: wrote {kinds} to {path} (image {image})", file=sys.stderr)
    else:
        sys.stdout.write(rendered(items))


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()
    args = _parser().parse_args(argv)
    try:
        contract = read_contract(args.layout, test_image=args.test_image)
        check_pins(contract)
        options = resolved(contract, _options(contract, args))  # --model-source's default for this image
        items = resources(contract, options, known_secrets())
        _image_volume_note(options)
        pins = contract.baked.pins

        def rendered(documents: list[dict]) -> str:
            return render(
                documents,
                label=args.label,
                image=options.image,
                engine=pins.engine.name,
                model=f"{pins.model.id}@{pins.model.revision}",
            )

        _write(args, items, rendered, options.image, contract)
    except AttestError as exc:  # OciError included
        return report_refusal(exc)
    except OSError as exc:
        flag = "--output-dir" if args.output_dir else "--output"
        target = args.output_dir or args.output
        return report_refusal(DeployError(f"cannot write {target}: {exc}", field=flag))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
