"""Kubernetes manifests generated from an Omni image's own contract and pins (`bazel run //deploy:<image>`).
A host tool: it reads the programs' settings tables and the image through tools.oci.

Its public API is `__all__` below; the modules' other names are its own. The command is
`tools.deploy.cli` (its `model_image` resolves the model volume's image the way the flags ask).
"""

from tools.deploy.admission import (
    CONTROLLERS,
    KYVERNO,
    POLICY_CONTROLLER,
    Requirement,
    admission_policies,
    cue_policies,
    public_key_pem,
    requirements,
)
from tools.deploy.contract import ImageContract, read_contract
from tools.deploy.emit import GENERATED_MARKER, dump, render
from tools.deploy.errors import DeployError
from tools.deploy.k8s_names import is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name, qualified_name
from tools.deploy.lws import GROUP_KEY_LABEL, expand_env, group_key, group_pods, k8s_expand
from tools.deploy.manifests import Options, resources
from tools.deploy.pods import TERMINATION_GRACE_S
from tools.deploy.targets import TARGETS, Target

__all__ = [
    "CONTROLLERS",
    "DeployError",
    "GENERATED_MARKER",
    "GROUP_KEY_LABEL",
    "ImageContract",
    "KYVERNO",
    "Options",
    "POLICY_CONTROLLER",
    "Requirement",
    "TARGETS",
    "TERMINATION_GRACE_S",
    "Target",
    "admission_policies",
    "cue_policies",
    "dump",
    "expand_env",
    "group_key",
    "group_pods",
    "is_dns_label",
    "is_dns_subdomain",
    "is_label_value",
    "is_qualified_name",
    "k8s_expand",
    "public_key_pem",
    "qualified_name",
    "read_contract",
    "render",
    "requirements",
    "resources",
]
