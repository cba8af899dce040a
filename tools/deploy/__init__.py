"""Kubernetes manifests generated from an Omni image's own contract and pins (`bazel run //deploy:<image>`).
A host tool: it reads attest, boot and launcher settings and tools.oci, and must not import an engine (`vllm`, `sglang`) or `tests`.

Its public API is `__all__` below; the modules' other names are its own. The command is
`tools.deploy.cli` (its `model_image` resolves the model volume's image the way the flags ask).
"""

from tools.deploy.contract import ImageContract, read_contract
from tools.deploy.emit import GENERATED_MARKER, dump, render
from tools.deploy.errors import DeployError
from tools.deploy.lws import GROUP_KEY_LABEL, expand_env, group_key, group_pods, k8s_expand
from tools.deploy.manifests import Options, resources
from tools.deploy.names import is_label_value, is_qualified_name, qualified_name
from tools.deploy.targets import TARGETS, Target

__all__ = [
    "GENERATED_MARKER",
    "GROUP_KEY_LABEL",
    "TARGETS",
    "DeployError",
    "ImageContract",
    "Options",
    "Target",
    "dump",
    "expand_env",
    "group_key",
    "group_pods",
    "is_label_value",
    "is_qualified_name",
    "k8s_expand",
    "qualified_name",
    "read_contract",
    "render",
    "resources",
]
