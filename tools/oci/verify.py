"""Verify a pushed Omni image for its consumer, without pulling its large layers.

    bazel run //tools/oci:verify -- REGISTRY/REPO@sha256:... --key cosign.pub

It fetches the manifest and config, the small layer holding /etc/omni/image.json (the
baked pins), the cosign signature (`sha256-<hex>.sig`) and the signed provenance
(`sha256-<hex>.att`), checks both signatures with the public key, and checks that all of
them agree: the provenance's subject is this digest, its pins and resolved dependencies
are the baked pins, the labels are the baked pins, the baked layer list is the
manifest's. Exit 0 with a summary, or 2 with {"ok": false, "error", "field"}.
"""
from __future__ import annotations

import argparse
import base64
import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from attest.errors import report_refusal
from tools.oci.errors import OciError
from tools.oci.image import BAKED_DEST, TITLE, pin_labels
from tools.oci.provenance import PREDICATE_TYPE, STATEMENT_TYPE, resolved
from tools.oci.registry import Reference, RegistryClient
from tools.oci.sign import DSSE_TYPE, SIGNATURE_ANNOTATION, SIMPLESIGNING_TYPE, load_public_key, pae, tag_for, verify


def _refuse(message: str, field: str) -> OciError:
    return OciError(message, field=field)


def _single_layer(client: RegistryClient, repository: str, tag: str, media_type: str) -> tuple[bytes, dict]:
    try:
        data, _ = client.manifest(repository, tag)
    except OciError:
        raise _refuse(f"no {tag} in {client.registry}/{repository}: the image is not signed/attested there",
                      field=tag) from None
    manifest = json.loads(data)
    layers = [layer for layer in manifest.get("layers", []) if layer.get("mediaType") == media_type]
    if len(layers) != 1:
        raise _refuse(f"{tag} must hold exactly one {media_type} layer", field=tag)
    return client.blob(repository, layers[0]["digest"]), layers[0].get("annotations") or {}


def baked_pins(client: RegistryClient, repository: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], int]:
    layers = [layer for layer in manifest["layers"] if (layer.get("annotations") or {}).get(TITLE) == BAKED_DEST]
    if len(layers) != 1 or layers[-1] is not manifest["layers"][-1]:
        raise _refuse(f"the image has no final layer annotated {TITLE}={BAKED_DEST}", field=BAKED_DEST)
    blob = client.blob(repository, layers[0]["digest"])
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        member = tar.extractfile(BAKED_DEST.lstrip("/"))
        if member is None:
            raise _refuse(f"the pins layer does not hold {BAKED_DEST}", field=BAKED_DEST)
        return json.loads(member.read()), len(blob)


def verify_image(reference: str, public_key: Path, client: RegistryClient | None = None) -> dict[str, Any]:
    ref = Reference.parse(reference)
    if not ref.digest:
        raise _refuse(f"{reference}: verify a digest (REGISTRY/REPO@sha256:...), not a tag", field="reference")
    key = load_public_key(public_key)
    owned = client is None
    client = client or RegistryClient(ref.registry)
    try:
        manifest_bytes, _ = client.manifest(ref.repository, ref.digest)
        manifest = json.loads(manifest_bytes)
        config = json.loads(client.blob(ref.repository, manifest["config"]["digest"]))
        baked, baked_size = baked_pins(client, ref.repository, manifest)

        payload, annotations = _single_layer(client, ref.repository, tag_for(ref.digest, "sig"), SIMPLESIGNING_TYPE)
        if not verify(key, payload, annotations.get(SIGNATURE_ANNOTATION, "")):
            raise _refuse("the image signature does not verify with the given public key", field="signature")
        signed = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
        if signed != ref.digest:
            raise _refuse(f"the signature is for {signed}, not {ref.digest}", field="signature")

        envelope_bytes, _ = _single_layer(client, ref.repository, tag_for(ref.digest, "att"), DSSE_TYPE)
        envelope = json.loads(envelope_bytes)
        body = base64.b64decode(envelope["payload"])
        if not any(verify(key, pae(envelope["payloadType"], body), s.get("sig", "")) for s in envelope["signatures"]):
            raise _refuse("the provenance signature does not verify with the given public key", field="provenance")
        statement = json.loads(body)
        if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
            raise _refuse("the attestation is not an in-toto v1 SLSA provenance v1 statement", field="provenance")
        subjects = [s["digest"].get("sha256") for s in statement.get("subject", [])]
        if ref.digest.split(":", 1)[1] not in subjects:
            raise _refuse(f"the provenance is about {subjects}, not {ref.digest}", field="provenance.subject")

        pins = baked["pins"]
        if statement["predicate"]["buildDefinition"]["externalParameters"].get("pins") != pins:
            raise _refuse("the provenance's pins differ from the pins baked into the image", field="provenance.pins")
        for name, digest_key, pinned in (("engine", "gitCommit", pins["engine"]["commit"]),
                                         ("model", "gitCommit", pins["model"]["revision"]),
                                         ("base", "sha256", baked["base_digest"].split(":", 1)[-1])):
            recorded = resolved(statement, name).get(digest_key, "")
            if recorded != pinned:
                raise _refuse(f"provenance {name} is {recorded or 'unrecorded'}, the image pins {pinned or 'nothing'}",
                              field=f"provenance.{name}")
        labels = (config.get("config") or {}).get("Labels") or {}
        for label, value in pin_labels(pins).items():
            if labels.get(label) != value:
                raise _refuse(f"label {label} is {labels.get(label)!r}, the baked pins say {value!r}", field=label)
        if baked["layers"] != [layer["digest"] for layer in manifest["layers"][:-1]]:
            raise _refuse("the baked layer list differs from the manifest's layers", field=BAKED_DEST)
    finally:
        if owned:
            client.close()
    return {"ok": True, "reference": str(ref), "image": baked["image"], "engine": pins["engine"],
            "model": pins["model"], "base_digest": baked["base_digest"], "bytes_fetched_from_layers": baked_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", help="REGISTRY/REPO@sha256:...")
    parser.add_argument("--key", type=Path, required=True, help="the signer's PEM public key")
    args = parser.parse_args(argv)
    try:
        summary = verify_image(args.reference, args.key)
    except OciError as exc:
        return report_refusal(exc)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
