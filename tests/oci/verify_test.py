"""tools/oci/verify.py against a registry the test scripts in memory: one genuine signed and
attested image verifies; then each way a hostile registry or a careless signer can make an
image disagree with its evidence is refused, naming the field. (The loopback registry tests in
oci_hostile_test and pins_test cover the HTTP side; here every byte is the test's to change.)"""

from __future__ import annotations

import base64
import copy
import gzip
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attest.errors import AttestError
from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.image_contract import BAKED_PATH
from omni_oci.format.layout import (
    OCI_CONFIG,
    OCI_MANIFEST,
    TITLE,
    canonical,
    descriptor,
    read_blob,
    read_layout,
    sha256_digest,
)
from omni_oci.format.statement import SLSA_PROVENANCE
from omni_oci.remote.referrers import push_referrer
from omni_oci.signing import verify as verify_module
from omni_oci.signing.bundles import (
    BUNDLE_TYPE,
    CONTENT_ANNOTATION,
    PREDICATE_ANNOTATION,
    SIGN_PREDICATE,
    SPDX_PREDICATE,
    bundle,
    statement,
)
from omni_oci.signing.keys import load_private_key, sign
from omni_oci.signing.legacy import (
    DSSE_TYPE,
    SIGNATURE_ANNOTATION,
    SIMPLESIGNING_TYPE,
    dsse_envelope,
    push_attestation,
    push_image_signature,
    simple_signing_payload,
    tag_for,
)
from omni_oci.signing.legacy import PREDICATE_ANNOTATION as LEGACY_PREDICATE
from omni_oci.signing.verify import verify_image
from tests.fixtures.oci import make_image, make_layer
from tests.fixtures.pins import key_pair, qwen_pins
from tests.fixtures.qwen import VLLM_COMMIT
from tools.oci import verify as verify_command
from tools.oci.build.provenance import build_statement

SIGSTORE_SCHEMA = Path("tests/data/sigstore/Bundle.schema.json")
SIGSTORE_SCHEMA_SHA256 = "6f94437aaf57685129ce60d26ea27beb3d2540764637958374d205563f14d46d"
REGISTRY = "registry.test"
REPO = "omni/qwen"


class _Answer:
    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code, self.content, self.headers = status_code, content, {"Content-Type": "application/json"}
        self.links: dict[str, dict[str, str]] = {}  # one page: no Link header

    def json(self) -> Any:
        return json.loads(self.content)


class MemoryRegistry:
    """What verify_image asks of a RegistryClient, served from dictionaries the test edits."""

    def __init__(self) -> None:
        self.registry = REGISTRY
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}
        self.closed = False

    def has_blob(self, repository: str, digest: str) -> bool:
        return digest in self.blobs

    def upload(self, repository: str, digest: str, content: bytes, size: int) -> None:
        assert sha256_digest(content) == digest and len(content) == size
        self.blobs[digest] = content

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> str:
        self.manifests[reference] = data
        self.manifests[sha256_digest(data)] = data
        return sha256_digest(data)

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        if reference not in self.manifests:
            raise OciError(f"no manifest {reference}", field=reference)
        return self.manifests[reference], OCI_MANIFEST

    def blob(self, repository: str, digest: str, *, size: int | None = None, max_bytes: int = 1 << 30) -> bytes:
        self.requested.append((digest, size, max_bytes))
        if size is not None and size > max_bytes:
            raise OciError(f"blob {digest} declares {size} bytes; at most {max_bytes}", field=digest)
        if digest not in self.blobs:  # as the registry client reports a 404
            raise OciError(f"{REGISTRY}/{repository}: blob {digest} is not there (HTTP 404)", field=digest)
        return self.blobs[digest]

    requested: list = []

    def request(self, method: str, path: str, *, repository: str, headers: dict | None = None) -> "_Answer":
        """The referrers API (none here) and the fallback tag, as omni_oci/remote/referrers.py asks."""
        reference = path.rsplit("/", 1)[1]
        if "/referrers/" in path or reference not in self.manifests:
            return _Answer(404, b"{}")
        return _Answer(200, self.manifests[reference])

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("keys")
    private, public = key_pair(work, "signer")
    other_private, other_public = key_pair(work, "other")
    return {"key": load_private_key(private), "public": public, "other": load_private_key(other_private)}


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> dict[str, Any]:
    """An image made with Omni's own tools: its layout, digest, pins and provenance statement."""
    work = tmp_path_factory.mktemp("image")
    pins = qwen_pins()
    make_image(
        work / "base", [make_layer(work, "base", {"/usr/bin/tool": "#!/bin/true\n"})], os="linux", architecture="amd64"
    )
    base_digest = read_layout(work / "base")[0]
    layer = make_layer(work, "app", {"/opt/omni/app/x.py": "x = 1\n"})
    result = make_image(work / "layout", [layer], base=work / "base", pins=pins, entrypoint=["/bin/true"])
    statement = build_statement("qwen_mi300x", result["digest"], pins, "a" * 40, {}, "", base_digest)
    return {
        "layout": work / "layout",
        "digest": result["digest"],
        "pins": pins,
        "statement": statement,
        "base_digest": base_digest,
    }


def _world(
    genuine: dict[str, Any],
    keys: dict[str, Any],
    *,
    statement: dict[str, Any] | None = None,
    signer=None,
    signed_digest: str | None = None,
) -> MemoryRegistry:
    registry = MemoryRegistry()
    registry.requested = []
    layout = genuine["layout"]
    for path in (layout / "blobs" / "sha256").iterdir():
        registry.blobs["sha256:" + path.name] = path.read_bytes()
    _, _, manifest_bytes = read_layout(layout)
    registry.put_manifest(REPO, genuine["digest"], manifest_bytes, OCI_MANIFEST)
    key = signer or keys["key"]
    if signed_digest is None:
        push_image_signature(registry, REPO, genuine["digest"], key)
    else:  # a genuine signature, but of another image's digest, stored under this one's tag
        payload = simple_signing_payload(f"{REGISTRY}/{REPO}", signed_digest)
        _single_layer_image(
            registry,
            tag_for(genuine["digest"], "sig"),
            payload,
            SIMPLESIGNING_TYPE,
            {SIGNATURE_ANNOTATION: sign(key, payload)},
        )
    push_attestation(registry, REPO, genuine["digest"], dsse_envelope(key, statement or genuine["statement"]))
    return registry


def _single_layer_image(
    registry: MemoryRegistry, tag: str, payload: bytes, media_type: str, annotations: dict[str, str], *, layers: int = 1
) -> None:
    config = canonical({"architecture": "", "os": "", "rootfs": {"type": "layers", "diff_ids": []}})
    for blob in (payload, config):
        registry.upload(REPO, sha256_digest(blob), blob, len(blob))
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, config),
            "layers": [descriptor(media_type, payload, annotations=annotations)] * layers,
        }
    )
    registry.put_manifest(REPO, tag, manifest, OCI_MANIFEST)


def _reference(genuine: dict[str, Any]) -> str:
    return f"{REGISTRY}/{REPO}@{genuine['digest']}"


def test_a_genuine_image_verifies_reading_only_small_blobs(genuine, keys) -> None:
    registry = _world(genuine, keys)
    summary = verify_image(_reference(genuine), keys["public"], client=registry)
    assert summary["ok"] is True and summary["image"] == "qwen_mi300x"
    assert summary["engine"] == genuine["pins"]["engine"] and summary["model"] == genuine["pins"]["model"]
    assert summary["pinned"] is True and summary["unpinned"] == []
    assert summary["bytes_fetched_from_layers"] > 0
    # Only the config, the pins layer and the two signed payloads: never the application layer.
    _, manifest, _ = read_layout(genuine["layout"])
    fetched = {digest for digest, _, _ in registry.requested}
    assert manifest["layers"][0]["digest"] not in fetched
    assert manifest["config"]["digest"] in fetched and manifest["layers"][-1]["digest"] in fetched
    bounds = {digest: limit for digest, _, limit in registry.requested}
    assert bounds[manifest["config"]["digest"]] == verify_module.MAX_CONFIG_BYTES
    assert bounds[manifest["layers"][-1]["digest"]] == verify_module.MAX_PINS_LAYER_BYTES
    assert not registry.closed  # a client the caller passed is the caller's to close


def test_a_tag_reference_and_an_unsigned_image_are_refused(genuine, keys) -> None:
    with pytest.raises(OciError, match="verify a digest") as refused:
        verify_image(f"{REGISTRY}/{REPO}:latest", keys["public"], client=MemoryRegistry())
    assert refused.value.field == "reference"
    registry = _world(genuine, keys)
    del registry.manifests[tag_for(genuine["digest"], "sig")]
    with pytest.raises(OciError, match="is not signed/attested there") as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == tag_for(genuine["digest"], "sig")


def _statement(genuine: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    statement = copy.deepcopy(genuine["statement"])
    change(statement)
    return statement


def _dependency(statement: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"] if d["name"] == name)


STATEMENT_CASES = [
    (
        "statement type",
        lambda s: s.__setitem__("_type", "https://in-toto.io/Statement/v0.1"),
        "provenance",
        "not an in-toto v1 SLSA provenance v1 statement",
    ),
    (
        "predicate type",
        lambda s: s.__setitem__("predicateType", "https://slsa.dev/provenance/v0.2"),
        "provenance",
        "not an in-toto v1 SLSA provenance v1 statement",
    ),
    (
        "subject",
        lambda s: s["subject"][0]["digest"].__setitem__("sha256", "0" * 64),
        "provenance.subject",
        "the provenance is about",
    ),
    (
        "pins",
        lambda s: s["predicate"]["buildDefinition"]["externalParameters"]["pins"]["model"].__setitem__(
            "id", "Qwen/Other"
        ),
        "provenance.pins",
        "the provenance's pins differ",
    ),
    (
        "engine",
        lambda s: _dependency(s, "engine")["digest"].__setitem__("gitCommit", "b" * 40),
        "provenance.engine",
        f"provenance engine is {'b' * 40}, the image pins {VLLM_COMMIT}",
    ),
    (
        "engine missing",
        lambda s: _dependency(s, "engine").__setitem__("digest", {}),
        "provenance.engine",
        "provenance engine is unrecorded",
    ),
    (
        "engine record where the pins name none",
        lambda s: _dependency(s, "engine-record").__setitem__("digest", {"sha256": "e" * 64}),
        "provenance.engine-record",
        f"provenance engine-record is {'e' * 64}, the image pins nothing",
    ),
    (
        "model",
        lambda s: _dependency(s, "model")["digest"].__setitem__("gitCommit", "c" * 40),
        "provenance.model",
        "provenance model is " + "c" * 40,
    ),
    (
        "base",
        lambda s: _dependency(s, "base").__setitem__("digest", {"sha256": "d" * 64}),
        "provenance.base",
        "provenance base is " + "d" * 64 + ", the image pins ",
    ),
    (
        "base missing",
        lambda s: _dependency(s, "base").pop("digest"),
        "provenance.base",
        "provenance base is unrecorded, the image pins ",
    ),
]


@pytest.mark.parametrize("name, change, field, message", STATEMENT_CASES, ids=[c[0] for c in STATEMENT_CASES])
def test_a_provenance_that_disagrees_with_the_image_is_refused(genuine, keys, name, change, field, message) -> None:
    registry = _world(genuine, keys, statement=_statement(genuine, change))
    with pytest.raises(OciError, match=message) as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == field


def test_signatures_by_another_key_or_of_another_digest_are_refused(genuine, keys) -> None:
    with pytest.raises(OciError, match="the image signature does not verify") as refused:
        verify_image(_reference(genuine), keys["public"], client=_world(genuine, keys, signer=keys["other"]))
    assert refused.value.field == "signature"
    other = "sha256:" + "e" * 64
    with pytest.raises(OciError, match=f"the signature is for {other}, not") as refused:
        verify_image(_reference(genuine), keys["public"], client=_world(genuine, keys, signed_digest=other))
    assert refused.value.field == "signature"
    # Image signed by the right key, provenance by another.
    registry = _world(genuine, keys)
    push_attestation(registry, REPO, genuine["digest"], dsse_envelope(keys["other"], genuine["statement"]))
    with pytest.raises(OciError, match="the provenance: the signature does not verify") as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == "provenance"


def _envelope(genuine, keys, change: Callable[[dict[str, Any]], None]) -> MemoryRegistry:
    registry = _world(genuine, keys)
    envelope = json.loads(dsse_envelope(keys["key"], genuine["statement"]))
    change(envelope)
    push_attestation(registry, REPO, genuine["digest"], json.dumps(envelope).encode())
    return registry


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda e: e.__setitem__("payload", "not base64!"), "the provenance: the DSSE envelope is malformed"),
        (lambda e: e.__setitem__("signatures", 7), "the provenance: the DSSE envelope is malformed"),
        (lambda e: e.__setitem__("signatures", ["sig"]), "the provenance: the DSSE envelope is malformed"),
        (lambda e: e.__setitem__("signatures", []), "the provenance: the signature does not verify"),
        (lambda e: e.__setitem__("payloadType", "text/plain"), "carries 'text/plain', not an in-toto statement"),
        (
            lambda e: e.__setitem__("payload", base64.b64encode(b"{}").decode()),
            "the provenance: the signature does not",
        ),
    ],
)
def test_a_malformed_or_tampered_envelope_is_refused(genuine, keys, change, message: str) -> None:
    with pytest.raises(OciError, match=message) as refused:
        verify_image(_reference(genuine), keys["public"], client=_envelope(genuine, keys, change))
    assert refused.value.field == "provenance"


def _attestation_image(registry: MemoryRegistry, digest: str, layers: list[tuple[bytes, str]]) -> None:
    """A legacy `.att` image of DSSE layers, each (envelope, its predicateType annotation)."""
    config = canonical({"architecture": "", "os": "", "rootfs": {"type": "layers", "diff_ids": []}})
    for blob in (config, *(envelope for envelope, _ in layers)):
        registry.upload(REPO, sha256_digest(blob), blob, len(blob))
    annotated = [
        descriptor(DSSE_TYPE, envelope, annotations={SIGNATURE_ANNOTATION: "", LEGACY_PREDICATE: predicate})
        for envelope, predicate in layers
    ]
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor(OCI_CONFIG, config)}
    registry.put_manifest(REPO, tag_for(digest, "att"), canonical({**manifest, "layers": annotated}), OCI_MANIFEST)


def _legacy_sbom(genuine, keys, *, signer="key", about=None, predicate=SPDX_PREDICATE) -> tuple[bytes, str]:
    sbom = statement(about or genuine["digest"], predicate, {"spdxVersion": "SPDX-2.3"})
    return dsse_envelope(keys[signer], sbom), SPDX_PREDICATE


def test_the_legacy_attestations_carry_the_sbom_and_say_so(genuine, keys) -> None:
    registry = _world(genuine, keys)
    assert verify_image(_reference(genuine), keys["public"], client=registry)["sbom_signed"] is False
    provenance = (dsse_envelope(keys["key"], genuine["statement"]), SLSA_PROVENANCE)
    _attestation_image(registry, genuine["digest"], [provenance, _legacy_sbom(genuine, keys)])
    summary = verify_image(_reference(genuine), keys["public"], client=registry)
    assert (summary["signatures"], summary["sbom_signed"]) == ("legacy tags", True)


@pytest.mark.parametrize(
    "layers, field, message",
    [
        (lambda g, k, p: [p, _legacy_sbom(g, k, signer="other")], "sbom", "the SBOM: the signature does not verify"),
        (lambda g, k, p: [p, _legacy_sbom(g, k, about="sha256:" + "0" * 64)], "sbom.subject", "the SBOM is about"),
        (
            lambda g, k, p: [p, _legacy_sbom(g, k, predicate=SLSA_PROVENANCE)],
            "sbom",
            f"not an in-toto v1 statement of {SPDX_PREDICATE}",
        ),
        (lambda g, k, p: [_legacy_sbom(g, k)], "att", "must hold exactly one"),
        (lambda g, k, p: [p, p], "att", "must hold exactly one"),
        (lambda g, k, p: [p, _legacy_sbom(g, k), _legacy_sbom(g, k)], "att", "one per predicate type"),
        (
            lambda g, k, p: [p, *((dsse_envelope(k["key"], g["statement"]), f"https://x.test/{n}") for n in range(8))],
            "att",
            "at most 8",
        ),
        (lambda g, k, p: [(p[0], "")], "att", "annotated predicateType=https://slsa.dev/provenance/v1"),
    ],
    ids=[
        "sbom by another key",
        "sbom of another digest",
        "sbom signs another type",
        "no provenance",
        "two provenances",
        "two sboms",
        "nine layers",
        "unannotated provenance",
    ],  # fmt: skip
)
def test_a_bad_legacy_attestation_layer_refuses_the_image(genuine, keys, layers, field, message) -> None:
    registry = _world(genuine, keys)
    provenance = (dsse_envelope(keys["key"], genuine["statement"]), SLSA_PROVENANCE)
    _attestation_image(registry, genuine["digest"], layers(genuine, keys, provenance))
    with pytest.raises(OciError, match=re.escape(message)) as refused:
        verify_image(_reference(genuine), keys["public"], client=registry, layout="legacy")
    expected = tag_for(genuine["digest"], "att") if field == "att" else field
    assert refused.value.field == expected


def test_a_signature_image_of_two_layers_is_refused(genuine, keys) -> None:
    registry = _world(genuine, keys)
    payload = simple_signing_payload(f"{REGISTRY}/{REPO}", genuine["digest"])
    _single_layer_image(
        registry,
        tag_for(genuine["digest"], "sig"),
        payload,
        SIMPLESIGNING_TYPE,
        {SIGNATURE_ANNOTATION: sign(keys["key"], payload)},
        layers=2,
    )
    with pytest.raises(OciError, match=re.escape(f"must hold exactly one {SIMPLESIGNING_TYPE} layer")):
        verify_image(_reference(genuine), keys["public"], client=registry)
    registry = _world(genuine, keys)
    _single_layer_image(registry, tag_for(genuine["digest"], "att"), b"{}", "application/json", {})
    with pytest.raises(OciError, match=re.escape(f"must hold exactly one {DSSE_TYPE} layer")):
        verify_image(_reference(genuine), keys["public"], client=registry)


def _repush_image(
    registry: MemoryRegistry, genuine, keys, *, manifest_change=None, config_change=None, baked_change=None
) -> str:
    """The genuine image altered, re-signed (as a careless signer would) with a matching statement."""
    layout = genuine["layout"]
    _, manifest, _ = read_layout(layout)
    manifest = copy.deepcopy(manifest)
    if config_change:
        config = json.loads(read_blob(layout, manifest["config"]["digest"]))
        config_change(config)
        data = canonical(config)
        registry.upload(REPO, sha256_digest(data), data, len(data))
        manifest["config"] = descriptor(OCI_CONFIG, data)
    if baked_change:
        baked = json.loads(_baked_bytes(layout, manifest))
        baked_change(baked)
        blob = _pins_layer(json.dumps(baked).encode())
        registry.upload(REPO, sha256_digest(blob), blob, len(blob))
        manifest["layers"][-1] = descriptor(
            manifest["layers"][-1]["mediaType"], blob, annotations=manifest["layers"][-1].get("annotations")
        )
    if manifest_change:
        manifest_change(manifest)
    data = canonical(manifest)
    digest = registry.put_manifest(REPO, sha256_digest(data), data, OCI_MANIFEST)
    push_image_signature(registry, REPO, digest, keys["key"])
    statement = copy.deepcopy(genuine["statement"])
    statement["subject"][0]["digest"]["sha256"] = digest.split(":", 1)[1]
    push_attestation(registry, REPO, digest, dsse_envelope(keys["key"], statement))
    return f"{REGISTRY}/{REPO}@{digest}"


def _baked_bytes(layout: Path, manifest: dict[str, Any]) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(read_blob(layout, manifest["layers"][-1]["digest"]))) as tar:
        return tar.extractfile(BAKED_PATH.lstrip("/")).read()


def _pins_layer(data: bytes, name: str = BAKED_PATH.lstrip("/")) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _label(config: dict[str, Any], name: str, value: str) -> None:
    config["config"]["Labels"][name] = value


IMAGE_CASES = [
    (
        "label",
        dict(config_change=lambda c: _label(c, "omni.model.revision", "f" * 40)),
        "omni.model.revision",
        "label omni.model.revision is",
    ),
    (
        "label missing",
        dict(config_change=lambda c: c["config"]["Labels"].pop("omni.engine")),
        "omni.engine",
        "label omni.engine is None",
    ),
    (
        "layer list",
        dict(baked_change=lambda b: b.__setitem__("layers", ["sha256:" + "0" * 64])),
        BAKED_PATH,
        "the baked layer list differs",
    ),
    (
        "baked pins malformed",
        dict(baked_change=lambda b: b["pins"]["hardware"].__setitem__("profile", "h100")),
        f"{BAKED_PATH} pins.hardware.profile",
        "Input should be",
    ),
    (
        "baked pins differ",
        dict(baked_change=lambda b: b["pins"]["model"].__setitem__("id", "Qwen/Other")),
        "provenance.pins",
        "the provenance's pins differ",
    ),
    (
        "no title",
        dict(manifest_change=lambda m: m["layers"][-1].pop("annotations")),
        BAKED_PATH,
        "has no final layer annotated",
    ),
    (
        "two titles",
        dict(manifest_change=lambda m: m["layers"][0].__setitem__("annotations", {TITLE: BAKED_PATH})),
        BAKED_PATH,
        "has no final layer annotated",
    ),
    (
        "config descriptor",
        dict(manifest_change=lambda m: m["config"].__setitem__("size", -1)),
        "manifest config",
        "is not a descriptor with a digest and a size",
    ),
    (
        "layer size bool",
        dict(manifest_change=lambda m: m["layers"][0].__setitem__("size", True)),
        "manifest layer 0",
        "is not a descriptor",
    ),
    (
        "layer digest",
        dict(manifest_change=lambda m: m["layers"][0].__setitem__("digest", 7)),
        "manifest layer 0",
        "is not a descriptor",
    ),
    (
        "config not an object",
        dict(manifest_change=lambda m: m.__setitem__("config", "sha256:" + "0" * 64)),
        "manifest config",
        "is not a descriptor",
    ),
    (
        "config size text",
        dict(manifest_change=lambda m: m["config"].__setitem__("size", "12")),
        "manifest config",
        "is not a descriptor",
    ),
    (
        "layers not a list",
        dict(manifest_change=lambda m: m.__setitem__("layers", {"0": {}})),
        "manifest",
        "manifest has no layers",
    ),
    ("layers empty", dict(manifest_change=lambda m: m.__setitem__("layers", [])), "manifest", "manifest has no layers"),
    (
        "title on another layer only",
        dict(manifest_change=lambda m: m["layers"][0].__setitem__("annotations", m["layers"][-1].pop("annotations"))),
        BAKED_PATH,
        "has no final layer annotated",
    ),
    ("config without config", dict(config_change=lambda c: c.pop("config")), "omni.image", "label omni.image is None"),
    (
        "config without labels",
        dict(config_change=lambda c: c["config"].pop("Labels")),
        "omni.image",
        "label omni.image is None",
    ),
    (
        "huge pins layer",
        dict(manifest_change=lambda m: m["layers"][-1].__setitem__("size", verify_module.MAX_PINS_LAYER_BYTES + 1)),
        None,
        "declares",
    ),
]


@pytest.mark.parametrize("name, changes, field, message", IMAGE_CASES, ids=[c[0] for c in IMAGE_CASES])
def test_an_image_that_disagrees_with_its_pins_is_refused_even_when_signed(
    genuine, keys, name, changes, field, message
) -> None:
    registry = _world(genuine, keys)
    reference = _repush_image(registry, genuine, keys, **changes)
    with pytest.raises(
        AttestError,  # OciError, or the pins' own refusal
        match=message,
    ) as refused:
        verify_image(reference, keys["public"], client=registry)
    if field is not None:
        assert refused.value.field == field


def test_the_pins_layer_bound_is_exact(genuine, keys, monkeypatch) -> None:
    """A pins layer that decompresses to exactly the bound is read; one byte more is refused."""
    registry = _world(genuine, keys)
    _, manifest, _ = read_layout(genuine["layout"])
    size = len(gzip.decompress(read_blob(genuine["layout"], manifest["layers"][-1]["digest"])))
    monkeypatch.setattr(verify_module, "MAX_PINS_UNCOMPRESSED", size)
    assert verify_image(_reference(genuine), keys["public"], client=registry)["ok"] is True
    monkeypatch.setattr(verify_module, "MAX_PINS_UNCOMPRESSED", size - 1)
    with pytest.raises(OciError, match=f"decompresses to more than {size - 1} bytes"):
        verify_image(_reference(genuine), keys["public"], client=registry)


def test_a_truncated_pins_layer_and_one_without_the_file_are_refused(genuine, keys) -> None:
    registry = _world(genuine, keys)
    whole = _pins_layer(b'{"pins": {}}')
    reference = _repush_image(registry, genuine, keys, manifest_change=lambda m: _swap_last(registry, m, whole[:-12]))
    with pytest.raises(OciError, match="is a truncated gzip stream"):
        verify_image(reference, keys["public"], client=registry)
    other = _pins_layer(b"{}", name="etc/other.json")
    reference = _repush_image(registry, genuine, keys, manifest_change=lambda m: _swap_last(registry, m, other))
    with pytest.raises(OciError, match=f"the pins layer does not hold {BAKED_PATH}") as refused:
        verify_image(reference, keys["public"], client=registry)
    assert refused.value.field == BAKED_PATH


def _swap_last(registry: MemoryRegistry, manifest: dict[str, Any], blob: bytes) -> None:
    registry.upload(REPO, sha256_digest(blob), blob, len(blob))
    manifest["layers"][-1] = descriptor(
        manifest["layers"][-1]["mediaType"], blob, annotations=manifest["layers"][-1]["annotations"]
    )


def test_an_unpinned_image_verifies_and_says_what_is_unpinned(tmp_path: Path, keys) -> None:
    pins = qwen_pins(base__digest="", engine__commit="", model__revision="")
    layer = make_layer(tmp_path, "app", {"/opt/omni/app/x.py": "x = 1\n"})
    result = make_image(tmp_path / "layout", [layer], pins=pins, entrypoint=["/bin/true"])
    statement = build_statement("qwen_mi300x", result["digest"], pins, "a" * 40, {}, "", "")
    image = {"layout": tmp_path / "layout", "digest": result["digest"], "pins": pins, "statement": statement}
    summary = verify_image(_reference(image), keys["public"], client=_world(image, keys))
    assert summary["pinned"] is False
    assert summary["unpinned"] == ["base.digest", "engine.commit or engine.record_sha256", "model.revision"]
    # A provenance that records a commit the image leaves unpinned is refused, saying so.
    recorded = copy.deepcopy(statement)
    _dependency(recorded, "engine")["digest"] = {"gitCommit": "b" * 40}
    with pytest.raises(OciError, match=f"provenance engine is {'b' * 40}, the image pins nothing"):
        verify_image(_reference(image), keys["public"], client=_world(image, keys, statement=recorded))


def test_the_cli_reports_a_refusal_as_one_json_line(tmp_path: Path, capsys) -> None:
    assert verify_command.main([f"{REGISTRY}/{REPO}:latest", "--key", str(tmp_path / "absent.pem")]) == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["ok"] is False and refusal["field"] == "reference"


@pytest.mark.parametrize(
    "cap, blob",
    [
        ("MAX_CONFIG_BYTES", lambda manifest, registry, digest: manifest["config"]["digest"]),
        ("MAX_PINS_LAYER_BYTES", lambda manifest, registry, digest: manifest["layers"][-1]["digest"]),
        # One cap for both signed payloads: the provenance envelope is the larger.
        (
            "MAX_SIGNED_BYTES",
            lambda manifest, registry, digest: json.loads(registry.manifests[tag_for(digest, "att")])["layers"][0][
                "digest"
            ],
        ),
    ],
)
def test_each_read_bound_is_exact(genuine, keys, monkeypatch, cap: str, blob) -> None:
    """Every blob verify reads is bounded by its cap: at the cap it is read, one byte under refused."""
    registry = _world(genuine, keys)
    _, manifest, _ = read_layout(genuine["layout"])
    size = len(registry.blobs[blob(manifest, registry, genuine["digest"])])
    for name in ("MAX_CONFIG_BYTES", "MAX_PINS_LAYER_BYTES", "MAX_SIGNED_BYTES"):
        monkeypatch.setattr(verify_module, name, 1 << 30)  # only the cap under test binds
    monkeypatch.setattr(verify_module, cap, size)
    assert verify_image(_reference(genuine), keys["public"], client=registry)["ok"] is True
    monkeypatch.setattr(verify_module, cap, size - 1)
    with pytest.raises(OciError, match=f"declares {size} bytes; at most {size - 1}"):
        verify_image(_reference(genuine), keys["public"], client=registry)


def test_extra_annotations_and_a_size_zero_descriptor_are_no_reason_to_refuse(genuine, keys) -> None:
    registry = _world(genuine, keys)
    reference = _repush_image(
        registry,
        genuine,
        keys,
        manifest_change=lambda m: (
            m["layers"][0].__setitem__("annotations", {"org.example.note": "x"}),
            m["layers"][0].__setitem__("size", 0),
        ),
    )
    assert verify_image(reference, keys["public"], client=registry)["ok"] is True


def _raw_pins_layer(genuine, compress) -> bytes:
    layout = genuine["layout"]
    _, manifest, _ = read_layout(layout)
    return compress(gzip.decompress(read_blob(layout, manifest["layers"][-1]["digest"])))


def test_the_pins_layer_must_be_gzip_with_the_full_window(genuine, keys) -> None:
    """Not zlib, not raw bytes; and a stream that refers back 20 kB (gzip's 32 kB window) is read."""
    import random
    import zlib

    registry = _world(genuine, keys)
    for blob, message in (
        (_raw_pins_layer(genuine, zlib.compress), "is not a gzip stream"),
        (b"plain bytes, not gzip", "is not a gzip stream"),
    ):
        reference = _repush_image(registry, genuine, keys, manifest_change=lambda m: _swap_last(registry, m, blob))
        with pytest.raises(OciError, match=message):
            verify_image(reference, keys["public"], client=registry)
    noise = random.Random(7).randbytes(20_000)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in (
            ("etc/omni/pad", noise + noise),
            (BAKED_PATH.lstrip("/"), _baked_bytes(genuine["layout"], read_layout(genuine["layout"])[1])),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    far = gzip.compress(raw.getvalue(), mtime=0)
    reference = _repush_image(registry, genuine, keys, manifest_change=lambda m: _swap_last(registry, m, far))
    assert verify_image(reference, keys["public"], client=registry)["ok"] is True


def test_an_envelope_without_signatures_is_refused(genuine, keys) -> None:
    registry = _envelope(genuine, keys, lambda e: e.pop("signatures"))
    with pytest.raises(OciError, match="the provenance: the DSSE envelope is malformed") as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == "provenance"


def test_a_config_that_is_not_json_is_refused(genuine, keys) -> None:
    registry = _world(genuine, keys)
    junk = b"not json at all"

    def swap_config(manifest: dict[str, Any]) -> None:
        registry.upload(REPO, sha256_digest(junk), junk, len(junk))
        manifest["config"] = descriptor(OCI_CONFIG, junk)

    reference = _repush_image(registry, genuine, keys, manifest_change=swap_config)
    with pytest.raises(OciError) as refused:
        verify_image(reference, keys["public"], client=registry)
    assert refused.value.field == "config"


# --- Sigstore bundles as referrers (omni_oci/signing/bundles.py) ---------------------------------


def _subject(genuine: dict[str, Any]) -> dict[str, Any]:
    return descriptor(OCI_MANIFEST, read_layout(genuine["layout"])[2])


def _bundled(genuine, keys, *, legacy: bool = False, sbom: bool = True, **bundles) -> MemoryRegistry:
    """The genuine image with its bundles (and the legacy tags with `legacy`); `bundles` maps a
    predicate type to replacement (payload bytes, announced predicate type) or None to leave it out."""
    registry = _world(genuine, keys) if legacy else MemoryRegistry()
    registry.requested = []
    if not legacy:
        for path in (genuine["layout"] / "blobs" / "sha256").iterdir():
            registry.blobs["sha256:" + path.name] = path.read_bytes()
        registry.put_manifest(REPO, genuine["digest"], read_layout(genuine["layout"])[2], OCI_MANIFEST)
    subject = _subject(genuine)
    made = {
        SIGN_PREDICATE: (bundle(keys["key"], statement(genuine["digest"], SIGN_PREDICATE, {})), SIGN_PREDICATE),
        SLSA_PROVENANCE: (bundle(keys["key"], genuine["statement"]), SLSA_PROVENANCE),
    }
    if sbom:
        spdx = statement(genuine["digest"], SPDX_PREDICATE, {"spdxVersion": "SPDX-2.3"})
        made[SPDX_PREDICATE] = (bundle(keys["key"], spdx), SPDX_PREDICATE)
    made.update(bundles)
    for payload, announced in filter(None, made.values()):
        annotations = {CONTENT_ANNOTATION: "dsse-envelope", PREDICATE_ANNOTATION: announced}
        push_referrer(registry, REPO, subject, BUNDLE_TYPE, payload, BUNDLE_TYPE, annotations)
    return registry


def test_bundles_verify_and_are_preferred_to_the_legacy_tags(genuine, keys) -> None:
    summary = verify_image(_reference(genuine), keys["public"], client=_bundled(genuine, keys))
    assert (summary["signatures"], summary["sbom_signed"]) == ("sigstore bundles", True)
    both = _bundled(genuine, keys, legacy=True)
    assert verify_image(_reference(genuine), keys["public"], client=both)["signatures"] == "sigstore bundles"
    assert verify_image(_reference(genuine), keys["public"], client=both, layout="legacy")["signatures"] == (
        "legacy tags"
    )
    legacy_only = _world(genuine, keys)
    assert verify_image(_reference(genuine), keys["public"], client=legacy_only)["signatures"] == "legacy tags"
    with pytest.raises(OciError) as refused:
        verify_image(_reference(genuine), keys["public"], client=legacy_only, layout="bundles")
    assert refused.value.field == "bundle" and "no Sigstore bundle refers to" in str(refused.value)
    bundle_only = _bundled(genuine, keys, sbom=False)
    assert verify_image(_reference(genuine), keys["public"], client=bundle_only)["sbom_signed"] is False


def _tampered_payload(genuine, keys) -> bytes:
    document = json.loads(bundle(keys["key"], statement(genuine["digest"], SIGN_PREDICATE, {})))
    body = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    body["predicate"] = {"added": "after signing"}
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    return json.dumps(document).encode()


def _without_hint(data: bytes) -> bytes:
    document = json.loads(data)
    del document["verificationMaterial"]["publicKey"]["hint"]
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    "replace, field, message",
    [
        (
            lambda g, k: {
                SIGN_PREDICATE: (bundle(k["key"], statement("sha256:" + "0" * 64, SIGN_PREDICATE, {})), SIGN_PREDICATE)
            },
            "bundle.subject",
            "is about",
        ),
        (
            lambda g, k: {
                SLSA_PROVENANCE: (bundle(k["key"], statement(g["digest"], SIGN_PREDICATE, {})), SLSA_PROVENANCE)
            },
            "bundle.predicateType",
            "announces 'https://slsa.dev/provenance/v1' but signs 'https://sigstore.dev/cosign/sign/v1'",
        ),
        (
            lambda g, k: {SIGN_PREDICATE: (_tampered_payload(g, k), SIGN_PREDICATE)},
            "bundle.signature",
            "does not verify",
        ),
        (
            lambda g, k: {
                SIGN_PREDICATE: (bundle(k["other"], statement(g["digest"], SIGN_PREDICATE, {})), SIGN_PREDICATE)
            },
            "bundle.verificationMaterial",
            "not the given public key",
        ),
        (
            lambda g, k: {
                SIGN_PREDICATE: (
                    _without_hint(bundle(k["other"], statement(g["digest"], SIGN_PREDICATE, {}))),
                    SIGN_PREDICATE,
                )
            },
            "bundle.signature",
            "does not verify",
        ),
        (lambda g, k: {SIGN_PREDICATE: (b'{"mediaType": "x"}', SIGN_PREDICATE)}, "bundle.mediaType", "is not a"),
        (lambda g, k: {SIGN_PREDICATE: (b"[]", SIGN_PREDICATE)}, "bundle", "object"),
        (lambda g, k: {SIGN_PREDICATE: None}, "bundle.predicateType", "no bundle signs"),
        (lambda g, k: {SLSA_PROVENANCE: None}, "provenance", "no bundle attests the provenance"),
    ],
)
def test_a_bad_bundle_is_refused_naming_what_does_not_match(genuine, keys, replace, field, message) -> None:
    registry = _bundled(genuine, keys, **{k: v for k, v in replace(genuine, keys).items()})
    with pytest.raises(OciError) as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == field and message in str(refused.value), refused.value


def _referrer_manifests(registry: MemoryRegistry, genuine) -> list[dict[str, Any]]:
    index = json.loads(registry.manifests[genuine["digest"].replace(":", "-")])
    return [json.loads(registry.manifests[item["digest"]]) for item in index["manifests"]]


def test_a_referrer_with_a_missing_blob_or_another_subject_is_refused(genuine, keys) -> None:
    registry = _bundled(genuine, keys)
    (provenance,) = [
        m for m in _referrer_manifests(registry, genuine) if m["annotations"][PREDICATE_ANNOTATION] == SLSA_PROVENANCE
    ]
    del registry.blobs[provenance["layers"][0]["digest"]]
    with pytest.raises(OciError) as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == "bundle" and "its bundle blob cannot be read" in str(refused.value)
    registry = _bundled(genuine, keys)
    index_tag = genuine["digest"].replace(":", "-")
    index = json.loads(registry.manifests[index_tag])
    moved = json.loads(registry.manifests[index["manifests"][0]["digest"]])
    moved["subject"]["digest"] = "sha256:" + "1" * 64
    data = canonical(moved)
    registry.put_manifest(REPO, sha256_digest(data), data, OCI_MANIFEST)
    index["manifests"][0] = descriptor(OCI_MANIFEST, data, artifactType=BUNDLE_TYPE)
    registry.put_manifest(REPO, index_tag, canonical(index), "application/vnd.oci.image.index.v1+json")
    with pytest.raises(OciError) as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == "bundle.subject" and "names the subject sha256:111" in str(refused.value)


def test_bundles_fit_the_pinned_sigstore_schema(genuine, keys) -> None:
    schema = sigstore_bundle_schema()
    for payload, _ in (
        (bundle(keys["key"], statement(genuine["digest"], SIGN_PREDICATE, {})), None),
        (bundle(keys["key"], genuine["statement"]), None),
    ):
        jsonschema.Draft4Validator(schema).validate(json.loads(payload))
    with pytest.raises(jsonschema.ValidationError):  # the check can fail
        jsonschema.Draft4Validator(schema).validate({"mediaType": BUNDLE_TYPE, "verificationMaterial": {}})


def sigstore_bundle_schema() -> dict[str, Any]:
    """The pinned Bundle schema (tests/data/sigstore/SOURCE.md). Its generator wrote the names in
    `required` as proto field names (public_key) while the properties are proto3 JSON names
    (publicKey), so no JSON bundle could pass a oneOf; they are mapped as proto3's JSON mapping
    maps them, and nothing else is changed."""
    data = SIGSTORE_SCHEMA.read_bytes()
    assert sha256_digest(data) == "sha256:" + SIGSTORE_SCHEMA_SHA256, "the bundle schema is not the pinned one"

    def json_name(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part[:1].upper() + part[1:] for part in rest)

    def mapped(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                key: [json_name(n) for n in value] if key == "required" else mapped(value)
                for key, value in node.items()
            }
        return [mapped(item) for item in node] if isinstance(node, list) else node

    return mapped(json.loads(data))


class _ReferrersApiRegistry(MemoryRegistry):
    """A registry with the referrers API: the index comes from /v2/.../referrers/<digest>, and no
    fallback tag exists."""

    def __init__(self, source: MemoryRegistry, subject_digest: str) -> None:
        super().__init__()
        self.blobs, self.manifests = dict(source.blobs), dict(source.manifests)
        self.index = self.manifests.pop(subject_digest.replace(":", "-"))
        self.asked: list[str] = []

    def request(self, method: str, path: str, *, repository: str, headers: dict | None = None) -> _Answer:
        self.asked.append(path)
        if "/referrers/" in path:
            answer = _Answer(200, self.index)
            answer.headers = {"Content-Type": "application/vnd.oci.image.index.v1+json"}
            return answer
        return super().request(method, path, repository=repository, headers=headers)


def test_bundles_are_found_through_the_referrers_api_too(genuine, keys) -> None:
    registry = _ReferrersApiRegistry(_bundled(genuine, keys), genuine["digest"])
    registry.requested = []
    summary = verify_image(_reference(genuine), keys["public"], client=registry)
    assert summary["signatures"] == "sigstore bundles"
    assert registry.asked == [f"/v2/{REPO}/referrers/{genuine['digest']}"]  # no fallback tag asked for


@pytest.mark.parametrize(
    "index, says",
    [
        (b"[1]", "object"),
        (b'{"manifests": 5}', "manifests must be a list of descriptors"),
        (b'{"manifests": [1]}', "manifests must be a list of descriptors"),
        (b'{"manifests": [{"size": 3}]}', "manifests must be a list of descriptors"),
        (b'{"manifests": [], "manifests": []}', "duplicate"),
        (b'{"manifests": [', "JSON"),
        (b'{"manifests": [], "x": NaN}', "NaN"),
    ],
    ids=["a list", "a number", "a number inside", "no digest", "duplicate keys", "cut short", "NaN"],
)
def test_a_malformed_referrers_index_is_refused_naming_it(genuine, keys, index: bytes, says: str) -> None:
    registry = _world(genuine, keys)
    tag = genuine["digest"].replace(":", "-")
    registry.manifests[tag] = index
    with pytest.raises(OciError) as refused:
        verify_image(_reference(genuine), keys["public"], client=registry)
    assert refused.value.field == f"the referrers of {genuine['digest']} (tag {tag})"
    assert says.lower() in str(refused.value).lower(), str(refused.value)


def test_an_oversized_referrers_index_is_refused(genuine, keys, monkeypatch) -> None:
    from omni_oci.remote import referrers as referrers_module

    registry = _world(genuine, keys)
    registry.manifests[genuine["digest"].replace(":", "-")] = b'{"manifests": []}'
    monkeypatch.setattr(referrers_module, "MAX_REFERRERS_BYTES", 16)
    with pytest.raises(OciError, match="is over 16 bytes"):
        verify_image(_reference(genuine), keys["public"], client=registry)


JSON_SCALARS = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8)
OBJECTS = st.recursive(
    st.dictionaries(st.text(max_size=6), JSON_SCALARS, max_size=4),
    lambda inner: st.dictionaries(st.text(max_size=6), inner | st.lists(inner, max_size=3), max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(OBJECTS, st.text(max_size=6), JSON_SCALARS, st.integers(0, 10**6))
def test_a_registry_document_with_a_duplicate_key_anywhere_is_refused(document, key, value, where) -> None:
    """Any object, with one of its objects (nested ones too) given a key twice: refused by the one
    strict reader every registry document goes through, naming the document."""
    objects = []

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            objects.append(node)
            for child in node.values():
                collect(child)
        elif isinstance(node, list):
            for child in node:
                collect(child)

    collect(document)
    target = objects[where % len(objects)]
    target[key] = value
    text = json.dumps(document)
    encoded = json.dumps({key: value})[1:-1]  # `"key": value`, as the object holds it
    marker = json.dumps(target)
    doubled = marker[:-1] + (", " if len(target) > 0 else "") + encoded + "}"
    assert text.count(marker) >= 1
    with pytest.raises(OciError, match="duplicate key") as refused:
        refusing_object(text.replace(marker, doubled, 1).encode(), "a manifest")
    assert refused.value.field == "a manifest"
    assert refusing_object(text.encode(), "a manifest") == document
