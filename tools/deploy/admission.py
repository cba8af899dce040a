"""Admission policies bound to an image's pins: a Kyverno ClusterPolicy and a Sigstore
policy-controller ClusterImagePolicy that admit the image's repository only when the release
key signed it and signed an SLSA v1 provenance whose resolvedDependencies name exactly the
pinned values, and an SPDX SBOM attestation (docs/release.md#admission).

Every required value comes from the pins baked into the image (tools/deploy/contract.py), none
is typed: `requirements` reads them, the same names tools/oci/build/provenance.py writes and
omni_oci/signing/verify.py checks. The key-based signatures have no transparency-log entry, so
both policies turn the log (and the SCT, a certificate's) off, and say so in a comment.

The dialects differ, and each policy holds the same requirements in its own:
- policy-controller (and `cosign verify-attestation --policy`): CUE over the whole in-toto
  statement, so it also binds the subject to the image's digest.
- Kyverno: JMESPath conditions over the predicate alone (it merges the predicate into its
  context); the subject is not in reach, so every image of the repository must carry a signed
  provenance naming these pins, whatever its digest.
Pure functions; tools/deploy/cli.py writes the documents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from attest.pins import ImagePins
from omni_oci.format.reference import Reference
from omni_oci.format.statement import SLSA_PROVENANCE, SPDX_PREDICATE
from tools.deploy.errors import DeployError

KYVERNO, POLICY_CONTROLLER = "kyverno", "policy-controller"
CONTROLLERS = (KYVERNO, POLICY_CONTROLLER)
SPDX_VERSION = "SPDX-2.3"
OFFLINE_NOTE = (
    "Omni's release signatures are key-based and carry no transparency-log entry (offline, "
    "air-gapped registries): the log and SCT checks are off; the key is the trust root."
)
PEM_RE = re.compile(r"^-----BEGIN PUBLIC KEY-----\n[A-Za-z0-9+/=\n]+-----END PUBLIC KEY-----\n?$")


@dataclass(frozen=True)
class Requirement:
    """One resolvedDependencies entry the provenance must name: its name, the digest algorithm
    and value, and the pin that gave it."""

    dependency: str
    algorithm: str
    value: str
    pin: str


def requirements(pins: ImagePins) -> list[Requirement]:
    """What the provenance must name, from a fully pinned document (deploy refused empty pins)."""
    found = [Requirement("base", "sha256", pins.base.digest.split(":", 1)[1], "base.digest")]
    if pins.engine.commit:
        found.append(Requirement("engine", "gitCommit", pins.engine.commit, "engine.commit"))
    if pins.engine.record_sha256:
        found.append(Requirement("engine-record", "sha256", pins.engine.record_sha256, "engine.record_sha256"))
    found.append(Requirement("model", "gitCommit", pins.model.revision, "model.revision"))
    if pins.model.lock_sha256:
        found.append(Requirement("checkpoint-lock", "sha256", pins.model.lock_sha256, "model.lock_sha256"))
    if pins.model.artifact is not None:
        digest = pins.model.artifact.digest.split(":", 1)[1]
        found.append(Requirement("model-artifact", "sha256", digest, "model.artifact.digest"))
    if pins.speculator is not None:
        found.append(Requirement("speculator", "gitCommit", pins.speculator.revision, "speculator.revision"))
    return found


def public_key_pem(data: bytes, where: str) -> str:
    """The release key's public half, refused unless it is an ECDSA P-256 PEM public key (what
    cosign and Omni sign with): the policies carry it verbatim."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = data.decode("ascii", "replace")
    try:
        key = load_pem_public_key(data) if PEM_RE.match(text) else None
    except ValueError:
        key = None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        curve = getattr(getattr(key, "curve", None), "name", "")
        what = "not a PEM public key" if key is None else f"a {type(key).__name__} {curve}".rstrip()
        raise DeployError(
            f"--signing-key-pub {where} is {what}; expected the release key's ECDSA P-256 public key in PEM "
            "(-----BEGIN PUBLIC KEY-----)",
            field="--signing-key-pub",
        )
    return text if text.endswith("\n") else text + "\n"


def _name(image: Reference, pins: ImagePins) -> str:
    return f"omni-{pins.image.replace('_', '-')}-{image.digest.split(':', 1)[1][:12]}"


def _repository(image: Reference) -> str:
    return f"{image.registry}/{image.repository}"


# --- policy-controller: CUE over the statement ----------------------------------------------


def _positions(pins: ImagePins) -> list[str]:
    """The names of the provenance's first resolvedDependencies, in the order
    tools/oci/build/provenance.py writes them for these pins (admission_test evaluates the CUE
    against a statement that builder made, so the two cannot drift apart unnoticed)."""
    names = ["base", "engine", "engine-record", "model"]
    names += ["checkpoint-lock"] if pins.model.lock_sha256 is not None else []
    names += ["model-artifact"] if pins.model.artifact is not None else []
    return names + (["speculator"] if pins.speculator is not None else [])


def provenance_cue(digest: str, pins: ImagePins) -> str:
    """The CUE a provenance statement must satisfy: about this digest, its first dependencies the
    pinned ones in the builder's order, and no later dependency of such a name with another digest.
    Written with direct constraints only: cosign and policy-controller compile the policy on its
    own before unifying it with the statement, so a comprehension over the statement's fields
    would see an empty list (measured with cosign 2.5 and 3.1)."""
    required = {item.dependency: item for item in requirements(pins)}

    def digest_of(name: str) -> str:
        item = required.get(name)
        return f'digest: {{{item.algorithm}: "{item.value}"}}' if item else ""

    prefix = [
        f'  {{name: "{name}", {digest_of(name)}}},' + (f"  // {required[name].pin}" if name in required else "")
        for name in _positions(pins)
    ]
    guards = [f'    if name == "{name}" {{{digest_of(name)}}}' for name in required]
    lines = [
        "// Omni: the signed SLSA provenance names exactly the pinned values (tools/deploy --admission).",
        f'predicateType: "{SLSA_PROVENANCE}"',
        f'subject: [{{name: string, digest: {{sha256: "{digest.split(":", 1)[1]}"}}}}]',
        "predicate: buildDefinition: resolvedDependencies: [",
        *prefix,
        "  ...{",
        "    name: string",
        *guards,
        "  },",
        "]",
    ]
    return "\n".join(lines) + "\n"


def sbom_cue() -> str:
    return (
        "// Omni: the image's SPDX SBOM is attested (tools/deploy --admission).\n"
        f'predicateType: "{SPDX_PREDICATE}"\n'
        f'predicate: spdxVersion: "{SPDX_VERSION}"\n'
    )


def cluster_image_policy(image: Reference, pins: ImagePins, key_pem: str, labels: dict[str, str]) -> dict[str, Any]:
    """policy-controller's ClusterImagePolicy (policy.sigstore.dev/v1beta1). A key authority with
    no `ctlog` is verified without the transparency log (policy-controller's validator)."""
    return {
        "apiVersion": "policy.sigstore.dev/v1beta1",
        "kind": "ClusterImagePolicy",
        "metadata": {
            "name": _name(image, pins),
            "labels": labels,
            "annotations": {"omni.admission/offline": OFFLINE_NOTE},
        },
        "spec": {
            "images": [{"glob": f"{_repository(image)}@**"}, {"glob": f"{_repository(image)}:**"}],
            "authorities": [
                {
                    "name": "omni-release-key",
                    "key": {"data": key_pem, "hashAlgorithm": "sha256"},
                    "attestations": [
                        {
                            "name": "pinned-provenance",
                            "predicateType": SLSA_PROVENANCE,
                            "policy": {"type": "cue", "data": provenance_cue(image.digest, pins)},
                        },
                        {
                            "name": "spdx-sbom",
                            "predicateType": SPDX_PREDICATE,
                            "policy": {"type": "cue", "data": sbom_cue()},
                        },
                    ],
                }
            ],
        },
    }


# --- Kyverno: JMESPath conditions over the predicate -----------------------------------------


def provenance_conditions(required: list[Requirement]) -> list[dict[str, str]]:
    """Kyverno conditions: each pinned dependency named exactly once, with the pinned digest."""
    conditions = []
    for item in required:
        named = f"buildDefinition.resolvedDependencies[?name=='{item.dependency}']"
        conditions.append(
            {
                "key": f"{{{{ to_string(length({named})) }}}}",
                "operator": "Equals",
                "value": "1",
                "message": f"the provenance must name {item.dependency} once",
            }
        )
        conditions.append(
            {
                "key": f"{{{{ {named} | [0].digest.{item.algorithm} }}}}",
                "operator": "Equals",
                "value": item.value,
                "message": f"the provenance's {item.dependency} is not the pinned {item.pin} {item.value}",
            }
        )
    return conditions


def _attestors(key_pem: str) -> list[dict[str, Any]]:
    keys = {"publicKeys": key_pem, "signatureAlgorithm": "sha256", "rekor": {"ignoreTlog": True}}
    return [{"count": 1, "entries": [{"keys": {**keys, "ctlog": {"ignoreSCT": True}}}]}]


def cluster_policy(image: Reference, pins: ImagePins, key_pem: str, labels: dict[str, str]) -> dict[str, Any]:
    """Kyverno's ClusterPolicy (kyverno.io/v1) with one verifyImages rule over Pods."""
    sbom = [{"key": "{{ spdxVersion }}", "operator": "Equals", "value": SPDX_VERSION, "message": "no SPDX SBOM"}]
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": _name(image, pins),
            "labels": labels,
            "annotations": {"omni.admission/offline": OFFLINE_NOTE},
        },
        "spec": {
            "background": False,
            "webhookTimeoutSeconds": 30,
            "rules": [
                {
                    "name": "pinned-release",
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "verifyImages": [
                        {
                            "imageReferences": [f"{_repository(image)}@*", f"{_repository(image)}:*"],
                            "failureAction": "Enforce",
                            "type": "Cosign",
                            "required": True,
                            "verifyDigest": True,
                            "mutateDigest": False,
                            "attestors": _attestors(key_pem),
                            "attestations": [
                                {
                                    "type": SLSA_PROVENANCE,
                                    "attestors": _attestors(key_pem),
                                    "conditions": [{"all": provenance_conditions(requirements(pins))}],
                                },
                                {
                                    "type": SPDX_PREDICATE,
                                    "attestors": _attestors(key_pem),
                                    "conditions": [{"all": sbom}],
                                },
                            ],
                        }
                    ],
                }
            ],
        },
    }


def admission_policies(
    controllers: list[str], image: str, pins: ImagePins, key_pem: str, labels: dict[str, str]
) -> list[dict[str, Any]]:
    """The asked-for policies for `image` (REGISTRY/REPO@sha256:...), in CONTROLLERS order."""
    ref = Reference.parse(image)
    if not ref.digest:
        raise DeployError(f"--admission: {image} has no digest; a policy names the image by digest", field="--image")
    builders = {KYVERNO: cluster_policy, POLICY_CONTROLLER: cluster_image_policy}
    return [builders[name](ref, pins, key_pem, labels) for name in CONTROLLERS if name in controllers]


def cue_policies(document: dict[str, Any]) -> dict[str, str]:
    """predicate type -> the CUE of a ClusterImagePolicy, as `cosign verify-attestation --policy`
    takes it (the docs and the tests evaluate them so)."""
    return {
        item["predicateType"]: item["policy"]["data"]
        for authority in document["spec"]["authorities"]
        for item in authority["attestations"]
    }
