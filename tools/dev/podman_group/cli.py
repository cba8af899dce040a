"""podman_group: the DeepSeek group's Pods, for `podman kube play` on one machine.

    bazel run //deploy:deepseek_spark -- --image REG/omni/deepseek@sha256:... \\
        --model-pvc deepseek-models --network host --output deepseek.yaml
    bazel run //tools/dev/podman_group -- deepseek.yaml --output group.yaml
    podman kube play group.yaml

Reads the LeaderWorkerSet tools/deploy wrote (`--network host`: the ranks share this host's
network, as they share the nodes' on a cluster), and writes its group's Pods as the LWS v0.9.0
controller makes them (lws.py), leader first, with the edits podman needs and nothing else
(EDITS), each one printed. The PersistentVolumeClaim and the two Secrets are yours to create
first (docs/running.md#try-it-locally-with-podman).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from attest.edge.refusal import refusing_main
from attest.files import write_atomic
from attest.reader import read_file
from tools.deploy.errors import DeployError
from tools.deploy.lws import expand_env, group_pods

MAX_INPUT_BYTES = 4 << 20
HEADER = "# The group's Pods for podman, written by tools/dev/podman_group from"
OLD_PODMAN = (4, 7)
# podman before 4.6 gives init containers the pod's restartPolicy (podman #16343, fixed by #18481):
# under Always a finished init container is restarted until kube play gives up.
OLD_INIT_PODMAN = (4, 6)
OLD_PODMAN_ANNOTATION_MAX = 63
VERSION_RE = re.compile(r"^(\d{1,4})\.(\d{1,4})(?:\.\d{1,6})?$")
EDITS = {
    # Cluster DNS resolves LWS's leader name to the leader pod's address, with hostNetwork its
    # node's; podman has no cluster DNS, and 4.3 drops hostAliases under hostNetwork.
    "leader-address": "LWS_LEADER_ADDRESS: the leader's DNS name -> its node's address (--leader-address)",
    # podman expands $(VAR) only in command and args; the kubelet does it in env values too.
    "expansion": "env values: $(VAR) expanded as the kubelet expands them (NNODES, NODE_RANK, DIST_INIT_ADDR)",
    # podman names an emptyDir's volume after it and reuses a volume of that name, so pods on one
    # host would share /tmp, /state and /cache; in Kubernetes each pod's emptyDir is its own.
    "empty-dirs": "emptyDir volumes renamed <pod>-<volume>, with their mounts",
    # podman before 4.7 refuses a Pod annotation value over 63 characters (a label's limit;
    # Kubernetes allows 256 KiB of annotations in all).
    "annotations": "podman < 4.7: pod annotations longer than 63 characters (omni.image.digest, ...) left off",
    # podman before 4.7 publishes every containerPort, then refuses that under hostNetwork; a
    # hostNetwork pod serves on its node's port as it is, with or without `ports`.
    "ports": "podman < 4.7: the containers' `ports` left off",
    # The init container is the serving image's `boot prepare`; `boot run` prepares the same way
    # first (boot.checkpoint.from_registry), so without it each rank's own container pulls its copy.
    "init-containers": "podman < 4.6: initContainers left off (podman restarts them forever); boot run's own "
    "prepare pulls each rank's copy instead",
}


def read_lws(path: Path) -> dict[str, Any]:
    """The one LeaderWorkerSet in deploy's output at `path`, read once and bounded."""
    data = read_file(path, label=str(path), max_bytes=MAX_INPUT_BYTES).data
    try:
        documents = [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.YAMLError as exc:
        raise DeployError(f"{path} is not YAML: {exc}", field=str(path)) from None
    sets = [d for d in documents if isinstance(d, dict) and d.get("kind") == "LeaderWorkerSet"]
    if len(sets) != 1:
        raise DeployError(f"{path} holds {len(sets)} LeaderWorkerSets; expected the one deploy writes", field=str(path))
    lws = sets[0]
    try:
        templates = lws["spec"]["leaderWorkerTemplate"]
        specs = [templates[role]["spec"] for role in ("leaderTemplate", "workerTemplate") if role in templates]
    except (KeyError, TypeError):
        raise DeployError(f"{path}: the LeaderWorkerSet has no leaderWorkerTemplate", field=str(path)) from None
    if not specs or not all(spec.get("hostNetwork") is True for spec in specs):
        raise DeployError(
            f"{path}: the group's pods are not on the host's network; generate with --network host, so the "
            "ranks on one machine reach rank 0 as the nodes' do",
            field="--network",
        )
    return lws


def podman_version(text: str = "") -> tuple[int, int]:
    """`text` (--podman-version), else what the podman on PATH says it is."""
    if not text:
        try:
            text = subprocess.run(
                ["podman", "version", "--format", "{{.Client.Version}}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            raise DeployError(
                "podman did not say its version; pass --podman-version X.Y", field="--podman-version"
            ) from None
    match = VERSION_RE.fullmatch(text)
    if not match:
        raise DeployError(f"--podman-version {text!r}: expected X.Y or X.Y.Z", field="--podman-version")
    return int(match.group(1)), int(match.group(2))


def leader_address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise DeployError(f"--leader-address {text!r}: expected an IP address", field="--leader-address") from None


def podman_pods(lws: dict[str, Any], address: str, version: tuple[int, int]) -> tuple[list[dict[str, Any]], list[str]]:
    """The group's Pods with EDITS made, and the keys of those made."""
    pods = group_pods(lws)
    made = ["leader-address", "expansion", "empty-dirs"]
    if version < OLD_PODMAN:
        made += ["annotations", "ports"]
    if version < OLD_INIT_PODMAN and any("initContainers" in pod["spec"] for pod in pods):
        made.append("init-containers")
        for pod in pods:
            pod["spec"].pop("initContainers", None)
    for pod in pods:
        _own_empty_dirs(pod)
        if version < OLD_PODMAN:
            annotations = pod["metadata"]["annotations"]
            for name in [n for n, value in annotations.items() if len(value) > OLD_PODMAN_ANNOTATION_MAX]:
                del annotations[name]
        # LWS's webhook injects its variables into init containers too (--model-source registry's).
        for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            if version < OLD_PODMAN:
                container.pop("ports", None)
            (item,) = [e for e in container["env"] if e["name"] == "LWS_LEADER_ADDRESS"]
            item["value"] = address
            expand_env(container)
    return pods, made


def _own_empty_dirs(pod: dict[str, Any]) -> None:
    spec, prefix = pod["spec"], pod["metadata"]["name"] + "-"
    renamed = {v["name"]: prefix + v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    for volume in spec.get("volumes", []):
        volume["name"] = renamed.get(volume["name"], volume["name"])
    for container in spec["containers"] + spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])


def _replaceable(output: Path) -> None:
    """Never overwrite what this command did not write."""
    try:
        with output.open("rb") as handle:
            first = handle.readline(len(HEADER) + 1)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DeployError(f"--output {output}: {exc.strerror}", field="--output") from None
    if not first.startswith(HEADER.encode()):
        raise DeployError(
            f"--output {output} exists and podman_group did not write it; left as it is", field="--output"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="podman_group", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("manifests", type=Path, help="the YAML deploy wrote (--network host)")
    parser.add_argument("--output", default="-", help="where to write the Pods (default: standard output)")
    parser.add_argument(
        "--leader-address", default="127.0.0.1", help="the leader's node as the ranks reach it (default: 127.0.0.1)"
    )
    parser.add_argument("--podman-version", default="", metavar="X.Y", help="default: what `podman version` says")
    return parser


@refusing_main
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    base = Path(os.environ.get("BUILD_WORKING_DIRECTORY") or ".")  # where the user typed the paths
    address, version = leader_address(args.leader_address), podman_version(args.podman_version)
    pods, made = podman_pods(read_lws(base / args.manifests), address, version)
    text = f"{HEADER} {args.manifests}; regenerate, do not edit.\n" + yaml.safe_dump_all(pods, sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        output = base / args.output
        _replaceable(output)
        write_atomic(output, text.encode(), field="--output")
    names = ", ".join(pod["metadata"]["name"] for pod in pods)
    print(f"podman_group: wrote {names} (podman {version[0]}.{version[1]}); edits:", file=sys.stderr)
    for key in made:
        print(f"  - {EDITS[key]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
