"""The operator's choices for a deployment (Options) and the checks every one of them passes
before a manifest is made: Kubernetes names label by label, a host path that is no system
tree, numbers the API accepts, and variables that cannot load code or copy a Secret."""

from __future__ import annotations

import posixpath
import re
import unicodedata
from dataclasses import dataclass, field

from attest.reader import UNSHOWN_CATEGORIES
from boot.settings import IMAGE, REGISTRY
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from tools.deploy.errors import DeployError
from tools.deploy.k8s_names import dns_label, dns_subdomain
from tools.deploy.scheduling import Scheduling, check_scheduling, label_pair

# Variable names are what the shell and Kubernetes accept; secrets never go in plain `value`s.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_NAME_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
INT32_MAX = 2**31 - 1
# Variables that make the dynamic loader, Python or a shell run other code than the image's.
LOADER_VARIABLES = frozenset(
    {
        "PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONEXECUTABLE",
        "PYTHONBREAKPOINT",
        "PYTHONINSPECT",
        "PYTHONWARNINGS",
        "BASH_ENV",
        "ENV",
    }
)
# Host trees a model volume must never be: writable for rank 0, they would hand it the node.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/kubelet",
    "/var/log",
    "/var/run",
)
# Kubernetes image volumes (volumes[].image): alpha in 1.31, beta in 1.33, on by default from
# 1.35 (the ImageVolume feature gate); a cluster older than 1.31 has no such field.
IMAGE_VOLUMES_SINCE = (1, 31)
IMAGE_VOLUMES_DEFAULT_ON = (1, 35)
DEFAULT_KUBERNETES_VERSION = "1.35"
# Where the checkpoint comes from (--model-source): the artifact as an image volume, the artifact
# pulled by each pod's init container (boot.checkpoint.from_registry), a claim or a host directory.
MODEL_SOURCES = (IMAGE, REGISTRY, "pvc", "host-path")  # boot's names for what it sees
KUBERNETES_VERSION_RE = re.compile(r"^1\.([0-9]{1,2})$")
# Whole top-level directories: a model lives in a directory of its own below them.
TOP_LEVEL = ("/", "/home", "/mnt", "/media", "/opt", "/srv", "/tmp", "/var")


@dataclass(frozen=True)
class Options:
    image: str  # REGISTRY/REPO@sha256:..., already checked against the image's digest
    namespace: str = "default"
    secret: str = ""  # default: <name>-api-key
    model_pvc: str = ""
    model_host_path: str = ""
    hf_token_secret: str = ""
    rank_key_secret: str = ""  # multi-node: default <name>-rank-key
    network: str = "pod"  # pod, host
    rdma_network: str = ""  # a Multus NetworkAttachmentDefinition
    dist_port: int = 20000
    startup_timeout_s: int = 0  # 0: the target's own budget
    env: dict[str, str] = field(default_factory=dict)
    model_image: str = ""  # REGISTRY/REPO@sha256:...: the model artifact (an image volume or pulled)
    model_source: str = ""  # one of MODEL_SOURCES (resolve_model_source)
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
    scheduling: Scheduling = field(default_factory=Scheduling)
    network_policy: bool = False
    api_from: dict[str, str] = field(default_factory=dict)  # namespace labels admitted to the API port
    disruption_budget: bool = False
    service_monitor: bool = False  # a prometheus-operator ServiceMonitor for the Service
    service_monitor_labels: dict[str, str] = field(default_factory=dict)  # what a Prometheus selects

    @property
    def kubernetes_minor(self) -> int:
        return kubernetes_minor(self.kubernetes_version)


def kubernetes_minor(version: str) -> int:
    found = KUBERNETES_VERSION_RE.fullmatch(version)
    if found is None:
        raise DeployError(
            f"--kubernetes-version {version!r}: expected the cluster's 1.MINOR (e.g. 1.35)",
            field="--kubernetes-version",
        )
    return int(found.group(1))


def resolve_model_source(options: Options, program: str) -> str:
    """--model-source, else what the other flags and the cluster imply: a claim or host directory
    when one is named; the artifact as an image volume where the cluster mounts one by default
    (and always for the launcher, whose image carries no puller); below that, pulled by boot."""
    if options.model_source:
        return options.model_source
    if options.model_pvc:
        return "pvc"
    if options.model_host_path:
        return "host-path"
    if options.model_image:
        default_on = (1, options.kubernetes_minor) >= IMAGE_VOLUMES_DEFAULT_ON
        return IMAGE if program != "boot" or default_on else REGISTRY
    return ""


def check_model_image(options: Options, program: str) -> None:
    """The model artifact's reference (by digest) and, for an image volume, a cluster that can mount it."""
    try:
        ref = Reference.parse(options.model_image)
    except OciError as exc:
        raise DeployError(f"--model-image: {exc}", field="--model-image") from None
    if not ref.digest:
        raise DeployError(
            f"--model-image {options.model_image!r}: name the artifact by digest (REGISTRY/REPO@sha256:...)",
            field="--model-image",
        )
    if options.model_source == IMAGE and (1, options.kubernetes_minor) < IMAGE_VOLUMES_SINCE:
        raise DeployError(
            f"--kubernetes-version {options.kubernetes_version}: image volumes (the model artifact) need Kubernetes "
            f"1.31 or later; use {'--model-source registry (each pod pulls it), ' if program == 'boot' else ''}"
            "--model-pvc or --model-host-path",
            field="--kubernetes-version",
        )


def check_model_source(options: Options, *, single_pod: bool, program: str) -> None:
    """One place the checkpoint comes from, with what that place needs."""
    source, flag = options.model_source, "--model-source"
    if not source:
        raise DeployError(
            "name where the checkpoint is: exactly one of --model-image REGISTRY/REPO@sha256:... (the default when "
            "the image pins model.artifact), --model-pvc NAME or --model-host-path PATH",
            field="--model-pvc",
        )
    if source not in MODEL_SOURCES:
        raise DeployError(f"{flag} {source!r}: expected one of {', '.join(MODEL_SOURCES)}", field=flag)
    named = {"pvc": options.model_pvc, "host-path": options.model_host_path}
    if source in named and not named[source]:
        raise DeployError(f"{flag} {source} needs --model-{source} (none given)", field=f"--model-{source}")
    if source in ("pvc", "host-path") and (options.model_image or (options.model_pvc and options.model_host_path)):
        raise DeployError(
            "name where the checkpoint is with exactly one of --model-pvc, --model-host-path or --model-image",
            field="--model-pvc",
        )
    if source in (IMAGE, REGISTRY):
        _check_artifact_source(options, single_pod=single_pod, program=program)


def _check_artifact_source(options: Options, *, single_pod: bool, program: str) -> None:
    source, flag = options.model_source, "--model-source"
    if not options.model_image:
        raise DeployError(
            f"{flag} {source} needs the model artifact: --model-image REGISTRY/REPO@sha256:... (the image pins none)",
            field="--model-image",
        )
    check_model_image(options, program)
    if source == IMAGE and (options.model_pvc or options.model_host_path):
        raise DeployError(
            f"{flag} image mounts the artifact itself: --model-pvc and --model-host-path are for pvc, host-path, "
            "or registry (a cache the pods pull into)",
            field="--model-pvc" if options.model_pvc else "--model-host-path",
        )
    if source == REGISTRY and program != "boot":
        raise DeployError(
            f"{flag} registry: the {program}'s image carries no puller; use image (an image volume), pvc or host-path",
            field=flag,
        )
    if source == REGISTRY and options.model_pvc and not single_pod:
        raise DeployError(
            f"{flag} registry with --model-pvc: every rank pulls its own copy, and a claim may be shared by the "
            "ranks; use the default emptyDir or --model-host-path (a node's own cache)",
            field="--model-pvc",
        )
    if options.hf_token_secret:
        raise DeployError(f"--hf-token-secret: the model comes from its artifact ({flag} {source}); nothing is "
                          "downloaded from the hub", field="--hf-token-secret")  # fmt: skip


def model_host_path(value: str) -> str:
    """The host directory, normalised; refused when relative, climbing, or a system tree."""
    flag = "--model-host-path"
    if any(unicodedata.category(char) in UNSHOWN_CATEGORIES for char in value):
        raise DeployError(f"{flag} {value!r} has a control character", field=flag)
    if not value.startswith("/") or ".." in value.split("/"):
        raise DeployError(f"{flag} {value!r} must be an absolute path without '..'", field=flag)
    path = posixpath.normpath(value)
    path = "/" + path.lstrip("/")  # normpath keeps a leading '//'
    if path in TOP_LEVEL:
        raise DeployError(f"{flag} {value!r} is {path}: name the model's own directory below it", field=flag)
    for tree in SYSTEM_TREES:
        if path == tree or path.startswith(tree + "/"):
            raise DeployError(f"{flag} {value!r} is in the host's system tree {tree}", field=flag)
    return path


def kubernetes_verbatim(value: str) -> str:
    """`value` as Kubernetes must write it for the container to see it unchanged: every `$`
    doubled, so no `$(NAME)` expands (and copies a Secret or another variable into it)."""
    return value.replace("$", "$$")


def check_env(name: str, value: str, managed: dict[str, str], secrets: tuple[str, ...]) -> None:
    if not ENV_NAME_RE.fullmatch(name):
        raise DeployError(f"--env {name!r}: not a variable name", field="--env")
    if name in managed:
        raise DeployError(f"--env {name}: the manifest sets it ({name} {managed[name]})", field=name)
    if name.startswith("LWS_"):
        raise DeployError(f"--env {name}: LeaderWorkerSet injects the LWS_ variables", field=name)
    if name in LOADER_VARIABLES or name.startswith("LD_"):
        raise DeployError(
            f"--env {name}: it changes which code the loader, Python or the shell runs; the image fixes it", field=name
        )
    if SECRET_NAME_RE.search(name) or any(secret and secret in value for secret in secrets):
        raise DeployError(
            f"--env {name}: a secret never goes in a manifest's plain value; put it in a Secret", field=name
        )
    if any(unicodedata.category(char) in UNSHOWN_CATEGORIES for char in value):
        raise DeployError(f"--env {name}: the value has a control character", field=name)


def check_options(
    options: Options, *, single_pod: bool, program: str, managed: dict[str, str], secrets: tuple[str, ...]
) -> None:
    """Every operator choice, refused naming its flag before anything is made."""
    dns_label("--namespace", options.namespace)
    for flag, value in (
        ("--secret", options.secret),
        ("--model-pvc", options.model_pvc),
        ("--hf-token-secret", options.hf_token_secret),
        ("--rank-key-secret", options.rank_key_secret),
        ("--rdma-network", options.rdma_network),
    ):
        if value:
            dns_subdomain(flag, value)
    options.kubernetes_minor  # noqa: B018 - refused here when it is not 1.MINOR
    check_model_source(options, single_pod=single_pod, program=program)
    if options.model_host_path:
        model_host_path(options.model_host_path)
    if options.network not in ("pod", "host"):
        raise DeployError(f"--network {options.network!r}: expected pod or host", field="--network")
    if single_pod and (options.network != "pod" or options.rdma_network):
        raise DeployError("--network and --rdma-network are for the multi-node group only", field="--network")
    if single_pod and options.rank_key_secret:
        raise DeployError("--rank-key-secret is for the multi-node group only", field="--rank-key-secret")
    if options.service_monitor_labels and not options.service_monitor:
        raise DeployError("--service-monitor-label needs --service-monitor", field="--service-monitor-label")
    if not 1024 <= options.dist_port <= 65535:
        raise DeployError(f"--dist-port {options.dist_port} is outside 1024..65535", field="--dist-port")
    if not 0 <= options.startup_timeout_s <= INT32_MAX:
        raise DeployError(
            f"--startup-timeout {options.startup_timeout_s} is outside 1..{INT32_MAX} seconds (an int32 in the API)",
            field="--startup-timeout",
        )
    check_scheduling(options.scheduling)
    if options.api_from and not options.network_policy:
        raise DeployError("--api-from-namespace is for --network-policy", field="--api-from-namespace")
    for key, value in options.api_from.items():
        label_pair(f"{key}={value}", "--api-from-namespace")
    for name, value in options.env.items():
        check_env(name, value, managed, secrets)


def whole_number(flag: str, text: str) -> int:
    """A flag's whole number: ASCII digits only (int() also takes '1_000', ' 7', '+7' and other
    scripts' digits, which the API and a reviewer would read differently)."""
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        raise DeployError(f"{flag} {text!r}: expected a whole number (ASCII digits)", field=flag)
    return int(text)
