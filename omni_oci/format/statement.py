"""In-toto v1 statements, the one builder and the one subject reader, and the provenance
identities (who built, by which build type, with which toolkit): the image's SLSA provenance
(tools/oci/build/provenance.py), the model artifact's (omni_oci/model/push.py) and the statements
Sigstore bundles carry (signing/bundles.py) are made here, and every verifier reads a
statement's subjects here (https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md).
"""

from __future__ import annotations

from typing import Any, Iterable

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# The predicate types of an image's evidence, each as the verifiers name it.
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"  # what `cosign verify` looks for
SPDX_PREDICATE = "https://spdx.dev/Document"  # `cosign verify-attestation --type spdxjson`
CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"  # `cosign verify-attestation --type cyclonedx`

# The provenance identities, one name each: the builder every Omni statement names, the build
# type of an image and of a model artifact, and the toolkit version images are labelled with.
TOOLKIT_VERSION = "0.1.0"
BUILDER_ID = "https://omni.invalid/builders/bazel"
IMAGE_BUILD_TYPE = "https://omni.invalid/build-types/bazel-oci-image/v1"
MODEL_BUILD_TYPE = "https://omni.invalid/build-types/model-artifact/v1"


def statement(subjects: Iterable[tuple[str, str]], predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    """A statement about each (name, "sha256:<hex>") subject; an empty name is left out, as the
    spec allows for a subject named by its digest alone."""
    listed = []
    for name, digest in subjects:
        entry: dict[str, Any] = {"name": name} if name else {}
        entry["digest"] = {"sha256": digest.split(":", 1)[1]}
        listed.append(entry)
    return {"_type": STATEMENT_TYPE, "subject": listed, "predicateType": predicate_type, "predicate": predicate}


def subject_digests(document: dict[str, Any]) -> list[str]:
    """The sha256 hex digests an untrusted statement names, whatever else its subjects hold."""
    subjects = document.get("subject")
    if not isinstance(subjects, list):
        return []
    found = []
    for subject in subjects:
        digest = subject.get("digest") if isinstance(subject, dict) else None
        if isinstance(digest, dict) and isinstance(digest.get("sha256"), str):
            found.append(digest["sha256"])
    return found


def resolved(document: dict[str, Any], name: str) -> dict[str, str]:
    """The digest a verified SLSA provenance records for its resolved dependency `name` ({} when
    it names none)."""
    for entry in document["predicate"]["buildDefinition"]["resolvedDependencies"]:
        if entry["name"] == name:
            return entry.get("digest", {})
    return {}
