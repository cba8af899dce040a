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
from attest.reader import read_file
from boot.settings import IMAGE, REGISTRY
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from tools.deploy.admission import admission_policies, public_key_pem
from tools.deploy.contract import ImageContract, read_contract
from tools.deploy.emit import render
from tools.deploy.errors import DeployError
from tools.deploy.flags import parser
from tools.deploy.inputs import IMAGE_VOLUMES_DEFAULT_ON, whole_number
from tools.deploy.kustomize import generated_by_deploy, write_base
from tools.deploy.manifests import Options, check_pins, provenance, resolved, resources
from tools.deploy.scheduling import Scheduling, label_pair, toleration
from tools.oci.push_record import last_push

MAX_KEY_BYTES = 16 * 1024  # a PEM public key is a few hundred bytes


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


def _output_path(path: str) -> Path:
    # `bazel run` starts in the runfiles; a relative path means the caller's directory.
    base = Path(os.environ.get("BUILD_WORKING_DIRECTORY") or ".")
    return base / path


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


def _admission(args: argparse.Namespace, contract: ImageContract, image: str, items: list[dict]) -> list[dict]:
    """The admission policies asked for, every check done before anything is written."""
    if not args.admission:
        if args.signing_key_pub:
            raise DeployError("--signing-key-pub is used only with --admission", field="--signing-key-pub")
        return []
    if not args.signing_key_pub:
        raise DeployError("--admission needs --signing-key-pub PEM: the release key's public half", field="--admission")
    read = read_file(Path(args.signing_key_pub), label="--signing-key-pub", max_bytes=MAX_KEY_BYTES)
    key = public_key_pem(read.data, args.signing_key_pub)
    made = admission_policies(
        args.admission, image, contract.baked.pins, key, dict(items[0]["metadata"].get("labels", {}))
    )
    for item in made:
        item["metadata"]["annotations"] = {**item["metadata"]["annotations"], **provenance(contract)}
    return made


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
    args = parser(__doc__).parse_args(argv)
    try:
        contract = read_contract(args.layout, test_image=args.test_image)
        check_pins(contract)
        options = resolved(contract, _options(contract, args))  # --model-source's default for this image
        items = resources(contract, options, known_secrets())
        items += _admission(args, contract, options.image, items)
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
