"""tools/pin --model-signature with Sigstore's keyless method (issue 71, point 3): a real keyless
signature of the public good instance (tests/data/oms/model-transparency-v1.0.1-sigstore, made by
`model_signing sign` and verified by its own test script) is verified offline by sigstore-python
against the committed trusted root, for the pinned identity and issuer, and compared with the
lock from a loopback hub serving the signed files: pinned, publisher-signed. Refused by name,
nothing written: another identity, another issuer, a changed file, a log entry that does not
match, an identity without an issuer (or the reverse), a trusted root that is not its pin, and a
key-method signature offered as keyless."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from attest.lock import PUBLISHER_SIGNED
from attest.pins import load_pins
from omni_oci.model import oms
from tests.fixtures.hub import HubRepo, LoopbackHub
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry
from tests.pin.deepseek import MODEL_COMMIT, MODEL_ID
from tests.pin.deepseek import pin as _pin
from tests.pin.deepseek import workspace as _workspace
from tools.pin.signature import TRUSTED_ROOT

DATA = Path(__file__).resolve().parents[2] / "tests/data/oms/model-transparency-v1.0.1-sigstore"
PINNED = {
    "model.sig": "b950a6755e92a3cce1061921d1449e2e10b085c809bb1737ef583d0cd8a075b9",
    "signme-1": "f6310066c7320497ea554260c32c43660bff648cb2a61194832cc086077085e1",
    "signme-2": "32dcb1f8e1ae52d5963e56a6ba06ab58b424c15ed2a6b70d2feca1d089370028",
}
IDENTITY, ISSUER = "stefanb@us.ibm.com", "https://sigstore.verify.ibm.com/oauth2"


def _files() -> dict[str, bytes]:
    found = {name: (DATA / name).read_bytes() for name in PINNED}
    assert {name: hashlib.sha256(data).hexdigest() for name, data in found.items()} == PINNED, "not the pinned data"
    return found


@pytest.fixture
def world(tmp_path: Path, monkeypatch):
    files = _files()
    repo = HubRepo(MODEL_ID, MODEL_COMMIT, files, refs={"main": MODEL_COMMIT})
    with LoopbackRegistry() as registry, LoopbackHub(repo) as hub:
        yield {"workspace": _workspace(tmp_path, registry, hub, monkeypatch), "tmp": tmp_path, "hub": repo}


def _keyless(world, signature: Path, *more: str) -> int:
    flags = ["--model-signature", str(signature), "--model-signer-identity", IDENTITY]
    return _pin(world["workspace"], *flags, "--model-signer-issuer", ISSUER, *more)


def _pins_bytes(world) -> bytes:
    return (world["workspace"] / "images/deepseek_spark.pins.json").read_bytes()


def test_a_keyless_signature_is_verified_offline_and_pinned(world, capsys) -> None:
    assert _keyless(world, DATA / "model.sig", "--write") == 0
    pins = load_pins(world["workspace"] / "images/deepseek_spark.pins.json")
    assert pins.model.signature.sha256 == PINNED["model.sig"]
    assert pins.model.signature.signer.startswith("cert:")
    assert pins.model.signature.identity == f"{IDENTITY} (issuer {ISSUER}, Sigstore)"
    lock = json.loads((world["workspace"] / "images/deepseek_spark.checkpoint.lock.json").read_text())
    assert (lock["trust"], lock["signed_by"]) == (PUBLISHER_SIGNED, pins.model.signature.signer)
    assert "publisher-signed by cert:" in capsys.readouterr().out
    assert _keyless(world, DATA / "model.sig", "--check") == 0


def _tampered(world, change) -> Path:
    document = json.loads((DATA / "model.sig").read_text())
    change(document)
    path = world["tmp"] / "tampered.sig"
    path.write_text(json.dumps(document))
    return path


def _body(document: dict) -> None:
    """The log entry's canonicalized body names another signature: its inclusion proof no longer fits."""
    entry = document["verificationMaterial"]["tlogEntries"][0]
    body = json.loads(base64.b64decode(entry["canonicalizedBody"]))
    body["spec"]["signatures"] = [{"sig": base64.b64encode(b"another").decode(), "publicKey": {}}]
    entry["canonicalizedBody"] = base64.b64encode(json.dumps(body).encode()).decode()


def _key_signed(world) -> Path:
    private, _ = key_pair(world["tmp"], "publisher")
    from omni_oci.signing.keys import load_private_key

    resources = {name: PINNED[name] for name in ("signme-1", "signme-2")}
    path = world["tmp"] / "key.sig"
    path.write_bytes(oms.sign(load_private_key(private), oms.statement(MODEL_ID, resources)))
    return path


ROWS = [
    ("another identity", ["--model-signer-identity", "someone@example.com"], None, "model.signature", "SANs"),
    ("another issuer", ["--model-signer-issuer", "https://accounts.google.com"], None, "model.signature", "OIDCIssuer"),
    ("a log entry that does not match", [], "body", "model.signature", "Sigstore refuses it"),
    ("a key-method signature", [], "key", "model.signature", "not Sigstore's (keyless)"),
]


@pytest.mark.parametrize(("what", "flags", "signature", "field", "message"), ROWS, ids=[r[0] for r in ROWS])
def test_keyless_refusals_name_the_signature_and_write_nothing(
    world, capsys, what, flags, signature, field, message
) -> None:
    path = {None: DATA / "model.sig", "body": None, "key": None}[signature]
    if signature == "body":
        path = _tampered(world, _body)
    elif signature == "key":
        path = _key_signed(world)
    before = _pins_bytes(world)
    # The later flag wins: each row replaces the identity or the issuer the helper passes.
    assert _keyless(world, path, *flags, "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == field and message in refusal["error"], refusal
    assert _pins_bytes(world) == before
    assert not (world["workspace"] / "images/deepseek_spark.checkpoint.lock.json").exists()


def test_a_changed_file_is_refused(world, capsys) -> None:
    world["hub"].files["signme-1"] = b"other bytes"
    assert _keyless(world, DATA / "model.sig", "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.signature" and "signme-1" in refusal["error"], refusal


def test_an_unpinned_identity_or_trusted_root_is_refused(world, capsys, tmp_path) -> None:
    signature = ["--model-signature", str(DATA / "model.sig")]
    other_root = tmp_path / "root.json"
    other_root.write_bytes(TRUSTED_ROOT.read_bytes().replace(b"fulcio", b"fulcia", 1))
    rows = [
        ([*signature, "--model-signer-identity", IDENTITY], "--model-signer-issuer"),
        ([*signature, "--model-signer-key", "k.pem", "--model-signer-issuer", ISSUER], "--model-signer-identity"),
        (
            [
                *signature,
                "--model-signer-identity",
                IDENTITY,
                "--model-signer-issuer",
                ISSUER,
                "--model-trust-root",
                str(other_root),
            ],
            "--model-trust-root-sha256",
        ),
        (
            [*signature, "--model-signer-identity", IDENTITY, "--model-signer-issuer", ISSUER]
            + ["--model-trust-root", str(other_root), "--model-trust-root-sha256", hashlib.sha256(b"x").hexdigest()],
            "--model-trust-root",
        ),
    ]
    before = _pins_bytes(world)
    for flags, field in rows:
        assert _pin(world["workspace"], *flags, "--write") == 2, flags
        refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert refusal["field"] == field, (flags, refusal)
        assert _pins_bytes(world) == before
