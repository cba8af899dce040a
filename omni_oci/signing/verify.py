"""An image's verification without pulling its large layers: the signature, then the signed
provenance, both as Sigstore bundles referring to the image (bundles.py) where there are any,
else cosign's legacy `sha256-<hex>.sig` and `.att` tags; then the manifest, the config and the
small layer holding the baked pins, each bounded, and that all of them agree: the provenance's
subject is this digest, its pins and resolved dependencies are the baked pins, the labels are
the baked pins, the baked layer list is the manifest's.

Threat model: the registry serves every byte; nothing it serves is parsed or decompressed
before the signed payload names the manifest digest, and the only trusted input is the
caller's public key. `tools/oci:verify` is the command over `verify_image`.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import Path
from typing import Any

from attest.documents import parse_document
from attest.pins import ImagePins
from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.image_contract import BAKED_PATH, pin_labels
from omni_oci.format.layout import TITLE
from omni_oci.format.reference import Reference
from omni_oci.format.statement import SLSA_PROVENANCE, STATEMENT_TYPE, resolved, subject_digests
from omni_oci.remote.registry import RegistryClient, client_for
from omni_oci.signing import dsse
from omni_oci.signing.bundles import (
    CYCLONEDX_PREDICATE,
    MAX_BUNDLE_BYTES,
    SIGN_PREDICATE,
    SPDX_PREDICATE,
    signed_statements,
)
from omni_oci.signing.keys import load_public_key, verify
from omni_oci.signing.legacy import DSSE_TYPE, PREDICATE_ANNOTATION, SIGNATURE_ANNOTATION, SIMPLESIGNING_TYPE, tag_for

# What verify reads, each bounded: signature payloads, the config, the (compressed) pins
# layer and what it may decompress to.
MAX_SIGNED_BYTES = 1 << 20
MAX_CONFIG_BYTES = 8 << 20
MAX_PINS_LAYER_BYTES = 1 << 20
MAX_PINS_UNCOMPRESSED = 8 << 20
MAX_ATTESTATION_LAYERS = 8  # DSSE layers of a legacy `.att` image read at most


def _json(data: bytes, what: str) -> dict[str, Any]:
    return refusing_object(data, what, field=what)


def _descriptor(value: Any, what: str) -> dict[str, Any]:
    """A descriptor with a sha256 digest and a non-negative integer size."""
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("digest"), str)
        or not isinstance(value.get("size"), int)
        or isinstance(value.get("size"), bool)
        or value["size"] < 0
    ):
        raise OciError(f"{what} is not a descriptor with a digest and a size", field=what)
    return value


def _layers(manifest: dict[str, Any], what: str) -> list[dict[str, Any]]:
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise OciError(f"{what} has no layers", field=what)
    return [_descriptor(layer, f"{what} layer {index}") for index, layer in enumerate(layers)]


def _tag_manifest(client: RegistryClient, repository: str, tag: str) -> dict[str, Any]:
    try:
        data, _ = client.manifest(repository, tag)
    except OciError:
        raise OciError(
            f"no {tag} in {client.registry}/{repository}: the image is not signed/attested there", field=tag
        ) from None
    return _json(data, tag)


def _annotations(layer: dict[str, Any]) -> dict[str, Any]:
    annotations = layer.get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def _single_layer(client: RegistryClient, repository: str, tag: str, media_type: str) -> tuple[bytes, dict]:
    manifest = _tag_manifest(client, repository, tag)
    layers = [layer for layer in _layers(manifest, tag) if layer.get("mediaType") == media_type]
    if len(layers) != 1:
        raise OciError(f"{tag} must hold exactly one {media_type} layer", field=tag)
    blob = client.blob(repository, layers[0]["digest"], size=layers[0]["size"], max_bytes=MAX_SIGNED_BYTES)
    return blob, _annotations(layers[0])


def _gunzip_bounded(blob: bytes, limit: int, what: str) -> bytes:
    """Decompress at most `limit` bytes: a small bomb cannot take memory or time."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(blob, limit + 1)
    except zlib.error as exc:
        raise OciError(f"{what} is not a gzip stream: {exc}", field=what) from None
    if len(data) > limit:
        raise OciError(f"{what} decompresses to more than {limit} bytes", field=what)
    if not inflater.eof:
        raise OciError(f"{what} is a truncated gzip stream", field=what)
    return data


def baked_pins(client: RegistryClient, repository: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], int]:
    layers = _layers(manifest, "manifest")
    pins_layer = layers[-1]
    annotations = pins_layer.get("annotations") if isinstance(pins_layer.get("annotations"), dict) else {}
    if (
        annotations.get(TITLE) != BAKED_PATH
        or sum(
            1
            for layer in layers
            if isinstance(layer.get("annotations"), dict) and layer["annotations"].get(TITLE) == BAKED_PATH
        )
        != 1
    ):
        raise OciError(f"the image has no final layer annotated {TITLE}={BAKED_PATH}", field=BAKED_PATH)
    blob = client.blob(repository, pins_layer["digest"], size=pins_layer["size"], max_bytes=MAX_PINS_LAYER_BYTES)
    archive = _gunzip_bounded(blob, MAX_PINS_UNCOMPRESSED, f"the pins layer {pins_layer['digest']}")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.extractfile(BAKED_PATH.lstrip("/"))
            data = member.read(MAX_PINS_UNCOMPRESSED) if member is not None else None
    except (tarfile.TarError, KeyError):
        data = None
    if data is None:
        raise OciError(f"the pins layer does not hold {BAKED_PATH}", field=BAKED_PATH)
    return _json(data, BAKED_PATH), len(blob)


def check_signature(client: RegistryClient, ref: Reference, key: Any) -> None:
    """The simple-signing signature verifies with `key` and names this manifest digest."""
    payload, annotations = _single_layer(client, ref.repository, tag_for(ref.digest, "sig"), SIMPLESIGNING_TYPE)
    if not verify(key, payload, str(annotations.get(SIGNATURE_ANNOTATION, ""))):
        raise OciError("the image signature does not verify with the given public key", field="signature")
    critical = _json(payload, "signature payload").get("critical")
    signed = critical.get("image", {}).get("docker-manifest-digest") if isinstance(critical, dict) else None
    if signed != ref.digest:
        raise OciError(f"the signature is for {signed}, not {ref.digest}", field="signature")


def _legacy_name(predicate: str) -> tuple[str, str, int]:
    """How a legacy attestation is named in refusals (its text, its field) and its read bound."""
    if predicate == SLSA_PROVENANCE:
        return "provenance", "provenance", MAX_SIGNED_BYTES
    if predicate == SPDX_PREDICATE:
        return "SBOM", "sbom", MAX_BUNDLE_BYTES
    return f"{predicate!r} attestation", "attestation", MAX_SIGNED_BYTES


def _envelope_statement(envelope_bytes: bytes, key: Any, what: str, field: str) -> dict[str, Any]:
    """The in-toto statement of a DSSE envelope whose signature verifies with `key`."""
    envelope = _json(envelope_bytes, f"{what} envelope")
    return _json(dsse.opened(envelope, key, f"the {what}", field), f"{what} statement")


def legacy_attestations(client: RegistryClient, ref: Reference, key: Any) -> dict[str, dict[str, Any]]:
    """predicate type -> verified statement about this digest, one per DSSE layer of cosign's
    legacy `.att` image (its `predicateType` annotation). The SLSA v1 provenance must be there;
    a layer that fails any check, or a second layer of one predicate type, refuses the image."""
    tag = tag_for(ref.digest, "att")
    layers = [
        layer
        for layer in _layers(_tag_manifest(client, ref.repository, tag), tag)
        if layer.get("mediaType") == DSSE_TYPE
    ]
    predicates = [str(_annotations(layer).get(PREDICATE_ANNOTATION, "")) for layer in layers]
    if predicates.count(SLSA_PROVENANCE) != 1:
        raise OciError(
            f"{tag} must hold exactly one {DSSE_TYPE} layer annotated {PREDICATE_ANNOTATION}={SLSA_PROVENANCE}",
            field=tag,
        )
    if len(layers) > MAX_ATTESTATION_LAYERS or len(set(predicates)) != len(predicates):
        raise OciError(
            f"{tag} must hold at most {MAX_ATTESTATION_LAYERS} {DSSE_TYPE} layers, one per predicate type", field=tag
        )
    statements: dict[str, dict[str, Any]] = {}
    for layer, predicate in zip(layers, predicates):
        what, field, bound = _legacy_name(predicate)
        blob = client.blob(ref.repository, layer["digest"], size=layer["size"], max_bytes=bound)
        statement = _envelope_statement(blob, key, what, field)
        if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != predicate:
            if predicate == SLSA_PROVENANCE:
                raise OciError("the attestation is not an in-toto v1 SLSA provenance v1 statement", field=field)
            raise OciError(f"the {what} is not an in-toto v1 statement of {predicate}", field=field)
        subjects = subject_digests(statement)
        if ref.digest.split(":", 1)[1] not in subjects:
            raise OciError(f"the {what} is about {subjects}, not {ref.digest}", field=f"{field}.subject")
        statements[predicate] = statement
    return statements


LAYOUTS = ("auto", "bundles", "legacy")


def signatures(client: RegistryClient, ref: Reference, key: Any, layout: str = "auto") -> dict[str, dict] | None:
    """The image signature: from the Sigstore bundles referring to the digest (every bundle's
    statement, by predicate type), or cosign's legacy `.sig` tag (None). `auto` prefers bundles
    where there are any; `bundles` and `legacy` read only that layout."""
    statements = None if layout == "legacy" else signed_statements(client, ref.repository, ref.digest, key)
    if statements is None and layout == "bundles":
        raise OciError(f"no Sigstore bundle refers to {ref.digest} (--layout bundles)", field="bundle")
    if statements is None:
        check_signature(client, ref, key)
    elif SIGN_PREDICATE not in statements:
        raise OciError(f"no bundle signs {ref.digest} with {SIGN_PREDICATE}", field="bundle.predicateType")
    return statements


def attested(client: RegistryClient, ref: Reference, key: Any, statements: dict | None) -> dict[str, dict]:
    """Every verified statement from the same layout as the signature (the bundles', else the
    legacy `.att`'s), the provenance among them."""
    if statements is None:
        return legacy_attestations(client, ref, key)
    if SLSA_PROVENANCE not in statements:
        raise OciError(f"no bundle attests the provenance of {ref.digest} ({SLSA_PROVENANCE})", field="provenance")
    return statements


def accepted_layout(statements: dict | None) -> str:
    """How a verify names the layout it accepted (what `signatures` returned)."""
    return "legacy tags" if statements is None else "sigstore bundles"


def signed_provenance(
    client: RegistryClient, ref: Reference, key: Any, layout: str = "auto"
) -> tuple[dict[str, Any], str]:
    """The signature, then the provenance statement about this digest (both verified), and the
    layout they were read from."""
    statements = signatures(client, ref, key, layout)
    return attested(client, ref, key, statements)[SLSA_PROVENANCE], accepted_layout(statements)


def _check_provenance(statement: dict[str, Any], baked: dict[str, Any]) -> None:
    """The signed provenance names the very pins baked into the image: the same document, and the
    same engine commit, model revision, base and model artifact."""
    pins = baked["pins"]
    if statement["predicate"]["buildDefinition"]["externalParameters"].get("pins") != pins:
        raise OciError("the provenance's pins differ from the pins baked into the image", field="provenance.pins")
    artifact = pins["model"].get("artifact")
    for name, digest_key, pinned in (
        ("engine", "gitCommit", pins["engine"]["commit"]),
        ("engine-record", "sha256", pins["engine"].get("record_sha256", "")),
        ("model", "gitCommit", pins["model"]["revision"]),
        ("base", "sha256", baked["base_digest"].split(":", 1)[-1]),
        *((("model-artifact", "sha256", artifact["digest"].split(":", 1)[-1]),) if artifact else ()),
    ):
        recorded = resolved(statement, name).get(digest_key, "")
        if recorded != pinned:
            raise OciError(
                f"provenance {name} is {recorded or 'unrecorded'}, the image pins {pinned or 'nothing'}",
                field=f"provenance.{name}",
            )


def verify_image(
    reference: str, public_key: Path, client: RegistryClient | None = None, layout: str = "auto"
) -> dict[str, Any]:
    ref = Reference.parse(reference)
    if not ref.digest:
        raise OciError(f"{reference}: verify a digest (REGISTRY/REPO@sha256:...), not a tag", field="reference")
    key = load_public_key(public_key)
    with client_for(ref.registry, client) as client:
        # The signature first: nothing the image holds is parsed or decompressed before the
        # signed payload names this manifest digest (which in turn names every blob's digest).
        statements = signatures(client, ref, key, layout)

        manifest_bytes, _ = client.manifest(ref.repository, ref.digest)
        manifest = _json(manifest_bytes, "manifest")
        config_descriptor = _descriptor(manifest.get("config"), "manifest config")
        config = _json(
            client.blob(
                ref.repository, config_descriptor["digest"], size=config_descriptor["size"], max_bytes=MAX_CONFIG_BYTES
            ),
            "config",
        )
        baked, baked_size = baked_pins(client, ref.repository, manifest)

        evidence = attested(client, ref, key, statements)
        statement = evidence[SLSA_PROVENANCE]

        pins = baked["pins"]
        typed_pins = parse_document(ImagePins, pins, label=f"{BAKED_PATH} pins")
        _check_provenance(statement, baked)
        labels = (config.get("config") or {}).get("Labels") or {}
        for label, value in pin_labels(pins).items():
            if labels.get(label) != value:
                raise OciError(f"label {label} is {labels.get(label)!r}, the baked pins say {value!r}", field=label)
        if baked["layers"] != [layer["digest"] for layer in manifest["layers"][:-1]]:
            raise OciError("the baked layer list differs from the manifest's layers", field=BAKED_PATH)
    empty = typed_pins.empty_pins()
    return {
        "ok": True,
        "reference": str(ref),
        "image": baked["image"],
        "engine": pins["engine"],
        "model": pins["model"],
        "model_trust": model_trust(typed_pins),
        "base_digest": baked["base_digest"],
        "bytes_fetched_from_layers": baked_size,
        "pinned": not empty,
        "unpinned": empty,
        "runtime": baked.get("runtime"),
        "signatures": accepted_layout(statements),
        "sbom_signed": SPDX_PREDICATE in evidence,
        "cyclonedx_signed": CYCLONEDX_PREDICATE in evidence,
    }


def model_trust(pins: ImagePins) -> str:
    """What the pins say vouches for the model's files: a publisher's signature, or the lock."""
    signature = pins.model.signature
    if signature is not None:
        who = f"{signature.signer} ({signature.identity})" if signature.identity else signature.signer
        return f"publisher-signed by {who} (model.sig sha256 {signature.sha256})"
    return "the pinned checkpoint lock" if pins.model.lock_sha256 else "the pinned revision"
