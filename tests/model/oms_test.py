"""omni_oci/model/oms.py: OpenSSF Model Signing (OMS v1.0) signatures. Omni's own validate against
the spec's JSON schemas (tests/data/oms, pinned by sha256); the spec's test vectors give the
outcomes the spec says; a signature the reference tool (model_signing 1.1.1) made is verified
and its files compared; and each way a signature can be forged or malformed is refused,
naming the field."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding

from omni_oci.model.errors import ModelError
from omni_oci.model.oms import (
    certificate_identity,
    differences,
    key_hint,
    read,
    sign,
    signed_facts,
    statement,
    verified,
    verified_by_chain,
)
from omni_oci.signing import dsse
from omni_oci.signing.keys import load_private_key, load_public_key
from tests.fixtures.oms import OMS, certificate_chain, payload, schema_valid
from tests.fixtures.pins import key_pair

# ossf/model-signing-spec at a0c91e2c930298efb8e8445bf475e4fa217d89cd (Apache-2.0): the schemas
# and test vectors, byte for byte.
PINNED = {
    "bundle.schema.json": "c312020be0f380bb3c3215ac0ef61eec8fd945984bf621074d74a3d7590ffd33",
    "envelope.schema.json": "b4fec66cc5d302a256f7e94d65e84f2393f4248ef78b9882216e2a4cb93e61d6",
    "predicate.schema.json": "8f77bdcf81c5e0b2c4558d2cab56ec72eb8f07564c97c4cf82c6eb02db0549cb",
    "statement.schema.json": "6006ce6b033b6c2733d86b5ff4577d9631a047aaefa6969e69b8bb6254dd2f43",
    "valid/key.bundle.json": "a01e761f1eaaf3a96945ec46826df5d1393c466e829fe9f1e43e8118511dbf98",
    "valid/certificate.bundle.json": "06c4dda26ae9e32b8f2ef59475feb20fcd2bca1b411d53379deaf03dd4bbf0ad",
    "valid/sigstore.bundle.json": "d9c15a1ceb077c8860841003d0056d99ec43fd2ca474c26d1213f72dd3cdeaa6",
    "invalid/empty.bundle.json": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "invalid/missing-envelope.bundle.json": "c39a012c6175882130b1e36d405b78a16e6a8947d4e02c346b8ff62593dbd438",
    "invalid/missing-tlog-entries.bundle.json": "02cf8af5dac80d267758ac6e601015de076ec0b88551074ba11014220d0b98bc",
    "invalid/missing-verification-material.bundle.json": (
        "e8d6e3cc62f83bf665a0feb94f6aa91eb1bffeae14595262b59bb5f5694236f7"
    ),
    "invalid-payload/wrong-predicate.bundle.json": "99ea76ef11149659b500c02c4e252bf60f27899213a32b2acbf6cbcc0a0277ea",
}
# A signature model_signing 1.1.1 made here (`model_signing sign key model --private_key ...
# --ignore-paths model/.omni-artifact.lock.json`), with the directory it signed and its key.
REFERENCE = Path("tests/data/oms/model_signing-1.1.1")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_spec_files_are_the_pinned_ones() -> None:
    assert {name: _sha256(OMS / name) for name in PINNED} == PINNED


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("keys")
    private, public = key_pair(work, "signer")
    _, other = key_pair(work, "other")
    return {"key": load_private_key(private), "public": load_public_key(public), "other": load_public_key(other)}


RESOURCES = {"config.json": "1" * 64, "model-00001-of-00002.safetensors": "2" * 64, "sub/tokenizer.json": "3" * 64}


def test_omnis_signature_validates_against_the_spec_schemas_and_reads_back(keys) -> None:
    data = sign(keys["key"], statement("tiny", RESOURCES, (".omni-artifact.lock.json",)))
    assert schema_valid(data)
    signed = verified(data, keys["public"], "model.sig")
    assert (signed.name, signed.resources, signed.method) == ("tiny", RESOURCES, "key")
    assert ".omni-artifact.lock.json" in signed.ignore_paths and ".git" in signed.ignore_paths


@pytest.mark.parametrize("name", sorted(name for name in PINNED if "/" in name))
def test_the_spec_vectors_give_the_spec_outcomes(name: str) -> None:
    """valid/ passes the schemas and Omni's reader (naming its method); invalid/ fails both;
    invalid-payload/ passes the bundle's shape and fails the statement (ours: its predicate)."""
    data = (OMS / name).read_bytes()
    assert schema_valid(data) is name.startswith("valid/")
    if name.startswith("valid/"):
        assert read(data, name)[1] == {"valid/key": "key"}.get(name.split(".")[0], "certificate")
    elif name.startswith("invalid/"):
        with pytest.raises(ModelError):
            read(data, name)
    else:
        document, method = read(data, name)
        with pytest.raises(ModelError, match="predicate|serialization"):
            signed_facts(payload(document), method, name)


def test_a_signature_of_the_reference_tool_verifies_and_its_files_are_named() -> None:
    signed = verified((REFERENCE / "model.sig").read_bytes(), load_public_key(REFERENCE / "signer.pub.pem"), "ref")
    model = REFERENCE / "model"
    files = {
        str(path.relative_to(model)): _sha256(path)
        for path in sorted(model.rglob("*"))
        if path.is_file() and path.name not in signed.ignore_paths
    }
    assert signed.resources == files and signed.name == "model"
    assert differences(signed.resources, files) == []


def test_the_reference_tools_signature_is_refused_with_another_key(keys) -> None:
    data = (REFERENCE / "model.sig").read_bytes()
    with pytest.raises(ModelError, match="names the key") as named:
        verified(data, keys["public"], "ref")
    assert named.value.field == "hint"
    document = json.loads(data)
    del document["verificationMaterial"]["publicKey"]["hint"]  # no hint: the signature itself decides
    with pytest.raises(ModelError, match="does not verify"):
        verified(json.dumps(document).encode(), keys["public"], "ref")


def _resigned(edit: Callable[[dict[str, Any]], None]):
    """A bundle signed by the right key over an edited statement."""

    def make(keys) -> bytes:
        about = statement("tiny", RESOURCES)
        edit(about)
        return sign(keys["key"], about)

    return make


def _tampered(edit: Callable[[dict[str, Any]], None]):
    """A genuine bundle whose document is then edited."""

    def make(keys) -> bytes:
        document = json.loads(sign(keys["key"], statement("tiny", RESOURCES)))
        edit(document)
        return json.dumps(document).encode()

    return make


def _swap_payload(document: dict[str, Any]) -> None:
    about = payload(document)
    about["predicate"]["resources"][0]["digest"] = "f" * 64
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(about).encode()).decode()


def _resources(edit: Callable[[list[dict[str, Any]]], None]):
    return _resigned(lambda about: edit(about["predicate"]["resources"]))


FORGED = [
    ("another payload under the signature", _tampered(_swap_payload), "signature"),
    (
        "the subject not its resources'",
        _resigned(lambda a: a["subject"][0]["digest"].update(sha256="0" * 64)),
        "subject",
    ),
    ("two subjects", _resigned(lambda a: a["subject"].append(a["subject"][0])), "subject"),
    ("another predicate", _resigned(lambda a: a.update(predicateType="https://example/v1")), "predicateType"),
    ("shards", _resigned(lambda a: a["predicate"]["serialization"].update(method="shards")), "predicate.serialization"),
    (
        "symlinks followed",
        _resigned(lambda a: a["predicate"]["serialization"].update(allow_symlinks=True)),
        "predicate.serialization",
    ),
    ("a name climbing out", _resources(lambda r: r[0].update(name="../etc/passwd")), "../etc/passwd"),
    ("an absolute name", _resources(lambda r: r[0].update(name="/etc/passwd")), "/etc/passwd"),
    ("a name not normal", _resources(lambda r: r[0].update(name="a//b")), "a//b"),
    ("a name twice", _resources(lambda r: r.append(copy.deepcopy(r[0]))), "config.json"),
    ("another algorithm", _resources(lambda r: r[0].update(algorithm="blake2b")), "config.json"),
    ("a short digest", _resources(lambda r: r[0].update(digest="abc")), "config.json"),
    ("another media type", _tampered(lambda d: d.update(mediaType="application/json")), "mediaType"),
    (
        "a certificate instead",
        _tampered(lambda d: d["verificationMaterial"].update(certificate={})),
        "verificationMaterial",
    ),
    (
        "no tlogEntries",
        _tampered(lambda d: d["verificationMaterial"].pop("tlogEntries")),
        "verificationMaterial.tlogEntries",
    ),
    ("no envelope", _tampered(lambda d: d.pop("dsseEnvelope")), "dsseEnvelope"),
    ("a duplicate key", lambda keys: b'{"mediaType": "x", "mediaType": "y"}', "sig"),
]


@pytest.mark.parametrize(("case", "make", "field"), FORGED, ids=[row[0] for row in FORGED])
def test_a_forged_or_malformed_signature_is_refused_naming_the_field(keys, case, make, field) -> None:
    with pytest.raises(ModelError) as refused:
        verified(make(keys), keys["public"], "sig")
    assert refused.value.field == field, str(refused.value)


def test_a_certificate_signature_is_not_verified_with_a_key(keys) -> None:
    with pytest.raises(ModelError, match="certificate method") as refused:
        verified((OMS / "valid/certificate.bundle.json").read_bytes(), keys["public"], "cert")
    assert refused.value.field == "certificate"


def test_the_hint_is_the_reference_tools_form() -> None:
    public = load_public_key(REFERENCE / "signer.pub.pem")
    assert (
        key_hint(public)
        == json.loads((REFERENCE / "model.sig").read_text())["verificationMaterial"]["publicKey"]["hint"]
    )


def test_differences_name_each_file() -> None:
    expected = {"a": "1" * 64, "b": "2" * 64, "c": "3" * 64}
    signed = {"a": "1" * 64, "b": "9" * 64, "d": "4" * 64}
    assert differences(signed, expected) == [
        "c: expected, not in the signature",
        "d: in the signature, not expected",
        f"b: the signature says sha256:{'9' * 64}, expected sha256:{'2' * 64}",
    ]
    assert differences(expected, dict(expected)) == []


def _chained(
    work: Path, edit: Callable[[list[dict[str, str]]], None] = lambda chain: None, leaf_key=None
) -> tuple[bytes, Any]:
    """A certificate-method bundle over RESOURCES, signed by a test chain's signing certificate
    (the chain as model_signing carries it: signing certificate, then the intermediate), its
    certificate list edited by `edit`; and the chain's root. With `leaf_key` (not ECDSA) the
    envelope is signed by another key: the certificate's key type is refused before."""
    paths = certificate_chain(work, "Publisher", leaf_key=leaf_key)
    leaf, middle, root = (
        x509.load_pem_x509_certificate(paths[name].read_bytes()) for name in ("signing.pem", "chain.pem", "root.pem")
    )
    key = ec.generate_private_key(ec.SECP256R1()) if leaf_key else load_private_key(paths["signing.key"])
    listed = [{"rawBytes": base64.b64encode(c.public_bytes(Encoding.DER)).decode()} for c in (leaf, middle)]
    edit(listed)
    document = {
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"x509CertificateChain": {"certificates": listed}, "tlogEntries": []},
        "dsseEnvelope": dsse.envelope(key, statement("tiny", RESOURCES), keyid=""),
    }
    return json.dumps(document).encode(), root


def test_a_certificate_signature_verifies_through_its_chain_to_the_root(tmp_path: Path) -> None:
    data, root = _chained(tmp_path)
    facts, certificate = verified_by_chain(data, [root], "model.sig")
    assert facts.resources == RESOURCES and facts.method == "certificate"
    assert certificate_identity(certificate) == "CN=Publisher Models"


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda chain: chain.clear(), "must list 1 to 8 certificates"),
        (lambda chain: chain.extend([chain[-1]] * 8), "must list 1 to 8 certificates"),
        (lambda chain: chain[0].update(rawBytes="not base64!"), "is not base64 DER"),
        (lambda chain: chain[0].update(rawBytes=base64.b64encode(b"not DER").decode()), "is not base64 DER"),
        (lambda chain: chain.pop(), "does not lead to a given root"),
    ],
    ids=["no certificate", "nine", "not base64", "not DER", "no intermediate"],
)
def test_a_malformed_or_broken_chain_is_refused(tmp_path: Path, edit, says: str) -> None:
    data, root = _chained(tmp_path, edit)
    with pytest.raises(ModelError, match=says) as refused:
        verified_by_chain(data, [root], "model.sig")
    assert "x509CertificateChain" in refused.value.field


def test_a_signing_certificate_whose_key_is_not_ecdsa_is_refused(tmp_path: Path) -> None:
    data, root = _chained(tmp_path, leaf_key=rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(ModelError, match="is not ECDSA P-256, P-384 or P-521") as refused:
        verified_by_chain(data, [root], "model.sig")
    assert refused.value.field == "x509CertificateChain"
