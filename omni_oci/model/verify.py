"""verify: a pushed model artifact checked without pulling its files: the cosign signature and
the signed provenance of this digest, the lock it carries (the expected one, when given, and
the one the provenance names), and its layers against that lock (paths, order, sizes, the
files' digests, media types), the config's layer list, and the model signature it carries
(model.sig: verified with the same key, its files the lock's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attest.errors import AttestError
from attest.hashing import SHA256
from attest.lock import ARTIFACT_SIGNATURE, CheckpointLock
from attest.reader import loads_object
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from omni_oci.format.statement import MODEL_BUILD_TYPE
from omni_oci.model import oms
from omni_oci.model.artifact import (
    MODEL_ARTIFACT,
    check_manifest,
    lock_descriptor,
    parse_manifest,
    signature_descriptor,
)
from omni_oci.model.errors import ModelError
from omni_oci.model.pull import ExpectedLock, fetch_lock, fetch_signature
from omni_oci.remote.registry import RegistryClient, client_for
from omni_oci.signing.keys import load_public_key
from omni_oci.signing.verify import signed_provenance

MAX_CONFIG_BYTES = 4 << 20


def signed(client: RegistryClient, ref: Reference, public_key: Path, layout: str = "auto") -> tuple[dict, str]:
    """The signature of `ref.digest`, then its provenance statement (both verified), from the
    Sigstore bundles or cosign's legacy tags (`layout`: auto, bundles, legacy), and which."""
    key = load_public_key(public_key)
    return signed_provenance(client, ref, key, layout)


def _diff_ids(client: RegistryClient, ref: Reference, manifest: dict[str, Any], modelpack: bool) -> list[str]:
    config = manifest["config"]
    try:
        data = client.blob(
            ref.repository, config.get("digest", ""), size=config.get("size"), max_bytes=MAX_CONFIG_BYTES
        )
        document = loads_object(data, label="the artifact's config")
        return document["modelfs"]["diffIds"] if modelpack else document["rootfs"]["diff_ids"]
    except (OciError, AttestError) as exc:
        raise ModelError(str(exc), field="config") from None
    except (KeyError, TypeError):
        raise ModelError("the artifact's config has no layer list", field="config") from None


def verify_artifact(
    reference: str,
    public_key: Path,
    expected: ExpectedLock | None,
    *,
    client: RegistryClient | None = None,
    layout: str = "auto",
) -> dict[str, Any]:
    ref = Reference.parse(reference)
    if not ref.digest:
        raise ModelError(f"{reference}: verify a digest (REGISTRY/REPO@sha256:...), not a tag", field="reference")
    with client_for(ref.registry, client) as client:
        # Signature first: nothing the artifact holds is read before the signed payload names it.
        statement, accepted = signed(client, ref, public_key, layout)
        definition = statement["predicate"]["buildDefinition"]
        model = (definition.get("externalParameters") or {}).get("model") or {}
        if definition.get("buildType") != MODEL_BUILD_TYPE or not isinstance(model.get("lock_sha256"), str):
            raise ModelError("the provenance is not a model artifact's", field="provenance.buildType")
        if expected is not None and model["lock_sha256"] != expected.sha256:
            raise ModelError(
                f"the provenance names the checkpoint lock {model['lock_sha256']}; expected {expected.sha256}",
                field="provenance.lock_sha256",
            )
        data, _ = client.manifest(ref.repository, ref.digest)
        manifest, modelpack = parse_manifest(data, str(ref))
        lock, lock_bytes = fetch_lock(client, ref.repository, manifest, expected or ExpectedLock(model["lock_sha256"]))
        layers = check_manifest(manifest, lock, model["lock_sha256"])
        carried = signature_descriptor(manifest, lock)
        own = [carried] if carried is not None else []
        digests = [layer["digest"] for layer in [*layers, *own, lock_descriptor(manifest)]]
        if _diff_ids(client, ref, manifest, modelpack) != digests:
            raise ModelError("the config's layer list differs from the manifest's layers", field="config")
        signature = fetch_signature(client, ref.repository, carried)
        model_signature = checked_model_signature(signature, lock, public_key) if signature is not None else None
    return {
        "ok": True,
        "reference": str(ref),
        "kind": MODEL_ARTIFACT if modelpack else "image",
        "subject": (manifest.get("subject") or {}).get("digest", ""),
        "repo": lock.repo,
        "revision": lock.revision,
        "lock_sha256": model["lock_sha256"],
        "lock_trust": f"{lock.trust} by {lock.signed_by}" if lock.signed_by else lock.trust,
        "files": len(layers),
        "bytes": sum(item.size for item in lock.files),
        "lock_bytes": len(lock_bytes),
        "signatures": accepted,
        "model_signature": model_signature,
    }


def checked_model_signature(signature: bytes, lock: CheckpointLock, public_key: Path) -> str:
    """The carried model signature, verified with the key and compared with the lock: the same
    paths, and each LFS file's sha256 (the others' sha256 the lock does not hold: pull checks
    their bytes against its git sha1, model_signing verify against the signature)."""
    key = load_public_key(public_key)
    facts = oms.verified(signature, key, ARTIFACT_SIGNATURE)
    signed, listed = facts.resources, lock.by_path
    problems = [f"{path}: in the lock, not in the signature" for path in sorted(listed.keys() - signed.keys())]
    problems += [f"{path}: in the signature, not in the lock" for path in sorted(signed.keys() - listed.keys())]
    problems += [
        f"{path}: the signature says sha256:{signed[path]}, the lock sha256:{item.digest}"
        for path, item in sorted(listed.items())
        if item.algorithm == SHA256 and path in signed and signed[path] != item.digest
    ]
    if problems:
        raise ModelError(
            f"{ARTIFACT_SIGNATURE} does not sign the lock's files: {'; '.join(problems[:5])}", field=ARTIFACT_SIGNATURE
        )
    return f"{ARTIFACT_SIGNATURE} verified: OpenSSF Model Signing v1.0, {len(signed)} files, key {oms.key_hint(key)}"
