"""tools/pin --model-signature FILE --model-signer-key PEM: a publisher's OpenSSF Model Signing
signature checked against the lock pin resolves from a loopback hub. A signature the reference
tool made (model_signing 1.1.1, tests/data/oms) and one Omni made are taken: the lock's trust is
publisher-signed and the pins record the signer and the file's sha256. Signatures of another key,
with a file missing or more, of other bytes (an LFS file's or a small file's, fetched from the
hub), leaving out a file the engine loads, and a hub serving other bytes are refused by name,
nothing written; and `model_signing sign` of the files (the reference tool, live) is taken,
of another revision's refused. The certificate method: a chain to the given root is taken with
its identity; another root, a certificate that allows no signing, and the methods swapped are
refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from attest.lock import ARTIFACT_SIGNATURE, PUBLISHER_SIGNED, REVIEWED
from attest.pins import load_pins
from omni_oci.model import oms
from omni_oci.signing.keys import load_private_key, load_public_key
from tests.fixtures.hub import HubRepo, LoopbackHub
from tests.fixtures.oms import certificate_chain, model_signing
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry
from tests.pin.deepseek import MODEL_COMMIT, MODEL_ID, REPO_ROOT
from tests.pin.deepseek import pin as _pin
from tests.pin.deepseek import workspace as _workspace
from tools.pin.cli import main

REFERENCE = REPO_ROOT / "tests/data/oms/model_signing-1.1.1"
FILES = {"config.json": b'{"a": 1}', "model-00001.safetensors": b"d" * 500, "README.md": b"# d\n"}
LFS = {"model-00001.safetensors"}


def _sha256s(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry() as served:
        yield served


@pytest.fixture
def world(tmp_path: Path, registry, monkeypatch):
    hub_repo = HubRepo(MODEL_ID, MODEL_COMMIT, dict(FILES), lfs=set(LFS), refs={"main": MODEL_COMMIT})
    with LoopbackHub(hub_repo) as hub:
        private, public = key_pair(tmp_path, "publisher")
        yield {
            "workspace": _workspace(tmp_path, registry, hub, monkeypatch),
            "key": load_private_key(private),
            "public": public,
            "tmp": tmp_path,
            "hub": hub_repo,
        }


def _signature(world, resources: dict[str, str], ignore: tuple[str, ...] = (), key=None) -> Path:
    path = world["tmp"] / "model.sig"
    path.write_bytes(oms.sign(key or world["key"], oms.statement(MODEL_ID, resources, ignore)))
    return path


def _signed_pin(world, signature: Path, public: Path, *more: str) -> int:
    return _pin(world["workspace"], "--model-signature", str(signature), "--model-signer-key", str(public), *more)


def _lock(workspace: Path) -> dict:
    return json.loads((workspace / "images/deepseek_spark.checkpoint.lock.json").read_text())


def test_a_publisher_signature_of_the_locks_files_is_pinned_and_checked_again(world, capsys) -> None:
    signature = _signature(world, _sha256s(FILES))
    assert _signed_pin(world, signature, world["public"], "--write") == 0
    workspace = world["workspace"]
    pins = load_pins(workspace / "images/deepseek_spark.pins.json")
    hint = oms.key_hint(load_public_key(world["public"]))
    assert pins.model.signature.signer == f"key:{hint}"
    assert pins.model.signature.sha256 == hashlib.sha256(signature.read_bytes()).hexdigest()
    lock = workspace / "images/deepseek_spark.checkpoint.lock.json"
    assert (_lock(workspace)["trust"], _lock(workspace)["signed_by"]) == (PUBLISHER_SIGNED, f"key:{hint}")
    assert pins.model.lock_sha256 == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert f"publisher-signed by key:{hint}, 3 files" in capsys.readouterr().out
    assert _signed_pin(world, signature, world["public"], "--check") == 0
    # Without the signature the lock would silently become a reviewed one: refused, naming the pin.
    assert _pin(workspace, "--check") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.signature" and hint in refusal["error"], refusal


def test_a_signature_of_the_reference_tool_is_taken(tmp_path: Path, registry, monkeypatch, capsys) -> None:
    """model_signing 1.1.1 signed config.json and sub/weights.safetensors (tests/data/oms)."""
    model = REFERENCE / "model"
    files = {name: (model / name).read_bytes() for name in ("config.json", "sub/weights.safetensors")}
    served = HubRepo(MODEL_ID, MODEL_COMMIT, files, lfs={"sub/weights.safetensors"}, refs={"main": MODEL_COMMIT})
    with LoopbackHub(served) as hub:
        workspace = _workspace(tmp_path, registry, hub, monkeypatch)
        argv = ["--model-signature", str(REFERENCE / ARTIFACT_SIGNATURE), "--model-signer-key"]
        assert _pin(workspace, *argv, str(REFERENCE / "signer.pub.pem"), "--write") == 0
    assert _lock(workspace)["trust"] == PUBLISHER_SIGNED
    assert "2 files" in capsys.readouterr().out


def _signed_by_the_reference_tool(world, files: dict[str, bytes]) -> Path:
    model = world["tmp"] / "publisher-model"
    for name, data in files.items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes(data)
    private = world["tmp"] / "publisher.key.pem"
    private.write_bytes(world["key"].private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    signature = world["tmp"] / "reference.sig"
    argv = ["sign", "key", str(model), "--private_key", str(private), "--signature", str(signature)]
    done = model_signing(*argv, home=world["tmp"])
    assert done.returncode == 0, done.stdout + done.stderr
    return signature


def test_the_reference_tools_signature_of_these_files_is_taken_and_of_others_refused(world, capsys) -> None:
    other_revision = _signed_by_the_reference_tool(world, {**FILES, "config.json": b'{"a": 2}'})
    assert _signed_pin(world, other_revision, world["public"], "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.signature" and "config.json: the signature says" in refusal["error"], refusal
    assert _signed_pin(world, _signed_by_the_reference_tool(world, FILES), world["public"], "--write") == 0
    assert _lock(world["workspace"])["trust"] == PUBLISHER_SIGNED


def _other_key(world) -> tuple[dict[str, str], tuple[str, ...], object]:
    private, _ = key_pair(world["tmp"], "someone-else")
    return _sha256s(FILES), (), load_private_key(private)


def _missing(world):
    return {k: v for k, v in _sha256s(FILES).items() if k != "README.md"}, (), None


def _more(world):
    return {**_sha256s(FILES), "extra.safetensors": "0" * 64}, (), None


def _other_lfs_bytes(world):
    return {**_sha256s(FILES), "model-00001.safetensors": "1" * 64}, (), None


def _other_small_bytes(world):
    return {**_sha256s(FILES), "config.json": hashlib.sha256(b'{"a": 2}').hexdigest()}, (), None


def _config_left_out(world):
    return {k: v for k, v in _sha256s(FILES).items() if k != "config.json"}, ("config.json",), None


@pytest.mark.parametrize(
    "make, field, says",
    [
        (_other_key, "hint", "names the key"),
        (_missing, "model.signature", "README.md: expected, not in the signature"),
        (_more, "model.signature", "extra.safetensors: in the signature, not expected"),
        (_other_lfs_bytes, "model.signature", "model-00001.safetensors: the signature says sha256:1111"),
        (_other_small_bytes, "model.signature", "config.json: the signature says sha256:"),
        (_config_left_out, "config.json", "which the engine would load"),
    ],
    ids=["another key", "a file missing", "a file more", "another revision", "a small file's bytes", "ignored"],
)
def test_a_signature_that_is_not_of_these_files_is_refused_and_nothing_written(
    world, capsys, make, field: str, says: str
) -> None:
    resources, ignore, key = make(world)
    signature = _signature(world, resources, ignore, key)
    pins_path = world["workspace"] / "images/deepseek_spark.pins.json"
    before = pins_path.read_bytes()
    assert _signed_pin(world, signature, world["public"], "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] in (field, "model.signature") and says in refusal["error"], refusal
    assert pins_path.read_bytes() == before
    assert not (world["workspace"] / "images/deepseek_spark.checkpoint.lock.json").exists()


def test_a_hub_serving_other_bytes_for_a_small_file_is_refused(world, capsys) -> None:
    world["hub"].served_instead["README.md"] = b"# e\n"
    assert _signed_pin(world, _signature(world, _sha256s(FILES)), world["public"], "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "README.md", refusal


@pytest.mark.parametrize("given", ["--model-signature", "--model-signer-key"])
def test_the_signature_and_its_key_go_together(world, capsys, given: str) -> None:
    assert _pin(world["workspace"], given, str(world["public"])) == 2
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["field"] == "--model-signer-key"


def test_without_a_signature_the_lock_stays_reviewed(world) -> None:
    assert _pin(world["workspace"], "--write") == 0
    assert _lock(world["workspace"])["trust"] == REVIEWED
    assert load_pins(world["workspace"] / "images/deepseek_spark.pins.json").model.signature is None


def _signed_with_a_certificate(world, name: str, *, usage: str = "codeSigning") -> tuple[Path, dict[str, Path]]:
    model = world["tmp"] / f"model-{name}"
    for path, data in FILES.items():
        (model / path).parent.mkdir(parents=True, exist_ok=True)
        (model / path).write_bytes(data)
    certificates = certificate_chain(world["tmp"], name, usage=usage)
    signature = world["tmp"] / f"{name}.sig"
    argv = ["sign", "certificate", str(model), "--private_key", str(certificates["signing.key"])]
    argv += ["--signing_certificate", str(certificates["signing.pem"])]
    argv += ["--certificate_chain", str(certificates["chain.pem"]), "--signature", str(signature)]
    done = model_signing(*argv, home=world["tmp"])
    assert done.returncode == 0, done.stdout + done.stderr
    return signature, certificates


def _chain_pin(world, signature: Path, roots: Path, *more: str) -> int:
    return _pin(world["workspace"], "--model-signature", str(signature), "--model-signer-chain", str(roots), *more)


def test_a_certificate_signature_leading_to_the_given_root_is_pinned_with_its_identity(world, capsys) -> None:
    signature, certificates = _signed_with_a_certificate(world, "Publisher")
    assert _chain_pin(world, signature, certificates["root.pem"], "--write") == 0
    pins = load_pins(world["workspace"] / "images/deepseek_spark.pins.json")
    leaf = x509.load_pem_x509_certificate(certificates["signing.pem"].read_bytes())
    signer = "cert:" + hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()
    assert (pins.model.signature.signer, pins.model.signature.identity) == (signer, "CN=Publisher Models")
    assert _lock(world["workspace"])["signed_by"] == signer
    assert f"publisher-signed by {signer} (CN=Publisher Models), 3 files" in capsys.readouterr().out


def _another_root(world, signature: Path, certificates: dict[str, Path]) -> tuple[Path, Path]:
    return signature, certificate_chain(world["tmp"], "Someone")["root.pem"]


def _a_key_signature(world, signature: Path, certificates: dict[str, Path]) -> tuple[Path, Path]:
    return _signature(world, _sha256s(FILES)), certificates["root.pem"]


@pytest.mark.parametrize(
    "make, says",
    [(_another_root, "does not lead to a given root"), (_a_key_signature, "not with a certificate chain")],
    ids=["another root", "a key signature"],
)
def test_a_certificate_signature_not_leading_to_the_root_is_refused(world, capsys, make, says: str) -> None:
    signature, roots = make(world, *_signed_with_a_certificate(world, "Publisher"))
    assert _chain_pin(world, signature, roots, "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.signature" and says in refusal["error"], refusal


# RFC 5280 4.2.1.3 and 4.2.1.12: a usage extension that is present limits the key to what it
# lists (issue #68: a TLS server's certificate signed models).
SIGNING_USAGES = [
    ("serverAuth", "extended key usage (serverAuth) does not include codeSigning"),
    ("serverAndClientAuth", "extended key usage (serverAuth, clientAuth) does not include codeSigning"),
    ("noDigitalSignature", "key usage does not include digitalSignature"),
    ("codeSigningNoDigitalSignature", "key usage does not include digitalSignature"),
    ("noUsageAtAll", "allows no signing"),
    ("keyUsageOnly", None),
    ("codeSigning", None),
]


@pytest.mark.parametrize(("usage", "says"), SIGNING_USAGES, ids=[row[0] for row in SIGNING_USAGES])
def test_a_signing_certificate_signs_models_only_where_its_usages_allow(world, capsys, usage, says) -> None:
    signature, certificates = _signed_with_a_certificate(world, f"Usage-{usage}", usage=usage)
    code = _chain_pin(world, signature, certificates["root.pem"], "--write")
    if says is None:
        assert code == 0, capsys.readouterr().err
        return
    assert code == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.signature" and says in refusal["error"], refusal


def test_a_certificate_signature_is_not_taken_for_a_key(world, capsys) -> None:
    signature, _ = _signed_with_a_certificate(world, "Publisher")
    assert _signed_pin(world, signature, world["public"], "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert "certificate method" in refusal["error"], refusal


def test_a_root_file_holding_no_certificate_is_refused(world, capsys) -> None:
    signature, _ = _signed_with_a_certificate(world, "Publisher")
    roots = world["tmp"] / "roots.pem"
    roots.write_text("not a certificate\n")
    assert _chain_pin(world, signature, roots, "--write") == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "model.signature" and "no PEM certificates" in refusal["error"], refusal


def test_pins_that_lock_no_checkpoint_are_refused_before_any_request(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("OMNI_BASE_MIRROR", "127.0.0.1:9")  # were anything asked, it would stay on loopback
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    images = tmp_path / "ws" / "images"
    images.mkdir(parents=True)
    (images / "qwen_mi300x.pins.json").write_bytes((REPO_ROOT / "images/qwen_mi300x.pins.json").read_bytes())
    argv = ["--workspace", str(tmp_path / "ws"), "qwen_mi300x", "--model-signature", str(tmp_path / "model.sig")]
    assert main([*argv, "--model-signer-key", str(tmp_path / "publisher.pub")]) == 2  # no hub, no registry: none asked
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "--model-signature" and "locks no checkpoint" in refusal["error"], refusal
