"""tools/deploy --admission (issue 70): the Kyverno ClusterPolicy and the policy-controller
ClusterImagePolicy it writes, checked with the engines the controllers use, since neither
controller runs here:
- both documents validate against the controllers' own CRD schemas (pinned in tests/data),
  unknown fields refused as a structural schema would drop them;
- the policy-controller CUE is evaluated by `cosign verify-attestation --policy` (cosign 2 and 3)
  against releases signed and pushed to a loopback registry here: the release is admitted; one
  signed by the same key whose provenance names another base, engine commit or model lock is
  refused, and so is one without the SBOM attestation;
- Kyverno's conditions are JMESPath: evaluated with the `jmespath` package over the same
  statements' predicates (Kyverno merges the predicate into its context), same rows. Where
  Kyverno's dialect differs: it substitutes `{{ }}` first and resolves a missing path to an
  error, not null (here null fails the Equals all the same), and adds functions of its own
  (none used); it never sees the subject, so only policy-controller binds the digest.
- refusals: an unpinned engine, a key that is not P-256 PEM, an image named by tag only, the
  key flag without --admission; each names its flag or pin and writes nothing."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import jmespath
import jsonschema
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from attest.pins import ImagePins
from omni_oci.format.layout import OCI_MANIFEST, descriptor, read_layout
from omni_oci.format.statement import SLSA_PROVENANCE, SPDX_PREDICATE
from omni_oci.remote.push import push
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.bundles import push_signatures
from tests.fixtures.cosign import verifiers
from tests.fixtures.crds import closed_resource, crd_schema
from tests.fixtures.oci import make_image, make_layer
from tests.fixtures.pins import key_pair, qwen_pins
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.release import SERVING_SPEC
from tools.deploy import (
    KYVERNO,
    POLICY_CONTROLLER,
    admission_policies,
    cue_policies,
    dump,
    public_key_pem,
    requirements,
)
from tools.oci.build.provenance import build_statement

KYVERNO_CRD = Path("tests/data/kyverno/kyverno.io_clusterpolicies.yaml")
KYVERNO_CRD_SHA256 = "fb041ee35f8e89b5bca566bb6e00cd67fccc30be8859998757333f2a40d79655"
POLICY_CONTROLLER_CRD = Path("tests/data/policy-controller/300-clusterimagepolicy.yaml")
POLICY_CONTROLLER_CRD_SHA256 = "e23467593124763d9937b1180d48cefe89dc72cf04e9bcf84cbf29822d51b20c"
REPOSITORY = "omni/qwen"
RECORD = "ab" * 32
LOCK = b'{"files": []}\n'
SBOM = {"spdxVersion": "SPDX-2.3", "name": "qwen"}


def _pins(base_digest: str) -> dict[str, Any]:
    return qwen_pins(
        base__digest=base_digest, engine__record_sha256=RECORD, model__lock_sha256=hashlib.sha256(LOCK).hexdigest()
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    """A registry, the release key, a base and the pins of a release built on it."""
    work = tmp_path_factory.mktemp("admission")
    private, public = key_pair(work, "release")
    make_image(work / "base", [make_layer(work, "base", {"/usr/bin/tool": "#!/bin/true\n"})])
    base_digest = read_layout(work / "base")[0]
    with LoopbackRegistry() as registry:
        yield {
            "work": work,
            "registry": registry,
            "private": private,
            "public": public,
            "base": base_digest,
            "pins": _pins(base_digest),
        }


def _release(world: dict[str, Any], name: str, edit=None, sbom: bool = True) -> tuple[str, dict[str, Any]]:
    """An image of `world`'s pins pushed signed (bundles and legacy tags); `edit` changes its
    provenance statement before it is signed. (REGISTRY/REPO@digest, the statement)."""
    from omni_oci.signing.keys import load_private_key

    work = world["work"] / name
    layer = make_layer(work.parent, name, {"/opt/omni/app/x.py": f"x = {name!r}\n"})
    image = make_image(
        work, [layer], base=world["work"] / "base", pins=world["pins"], checkpoint_lock=LOCK, **SERVING_SPEC
    )
    statement = build_statement(
        "qwen_mi300x", image["digest"], world["pins"], "a" * 40, {}, "docker.io/rocm/vllm", world["base"]
    )
    if edit is not None:
        edit(statement)
    host = world["registry"].host
    with RegistryClient(host) as client:
        pushed = push(work, f"{host}/{REPOSITORY}", client=client)
        subject = descriptor(OCI_MANIFEST, read_layout(work)[2])
        key = load_private_key(world["private"])
        push_signatures(client, REPOSITORY, subject, key, provenance=statement, sbom=SBOM if sbom else None)
    return f"{host}/{REPOSITORY}@{pushed.digest}", statement


def _dependency(statement: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"] if d["name"] == name)


def _key_pem(world) -> str:
    return public_key_pem(Path(world["public"]).read_bytes(), "release.pub.pem")


BAD = [
    ("another base", lambda s: _dependency(s, "base").__setitem__("digest", {"sha256": "d" * 64})),
    ("another engine commit", lambda s: _dependency(s, "engine")["digest"].__setitem__("gitCommit", "b" * 40)),
    ("another model lock", lambda s: _dependency(s, "checkpoint-lock")["digest"].__setitem__("sha256", "e" * 64)),
    (
        "a second base named after the pinned one",
        lambda s: s["predicate"]["buildDefinition"]["resolvedDependencies"].append(
            {"name": "base", "uri": "oci://elsewhere", "digest": {"sha256": "f" * 64}}
        ),
    ),
]


@pytest.fixture(scope="module")
def generated(world) -> dict[str, Any]:
    """The genuine release, and what `deploy --admission kyverno --admission policy-controller`
    writes for it: {reference, statement, documents, kyverno, policy-controller}."""
    reference, statement = _release(world, "genuine")
    output = world["work"] / "qwen.yaml"
    flags = ["--image", reference, "--model-pvc", "models", "--output", str(output)]
    flags += ["--admission", KYVERNO, "--admission", POLICY_CONTROLLER, "--signing-key-pub", str(world["public"])]
    assert _deploy(world, "genuine", *flags) == 0
    documents = [d for d in yaml.safe_load_all(output.read_text()) if d]
    by_kind = {d["kind"]: d for d in documents}
    return {
        "reference": reference,
        "statement": statement,
        "documents": documents,
        KYVERNO: by_kind["ClusterPolicy"],
        POLICY_CONTROLLER: by_kind["ClusterImagePolicy"],
    }


def _deploy(world: dict[str, Any], name: str, *flags: str) -> int:
    from tools.deploy.cli import main

    return main(["--layout", str(world["work"] / name), *flags])


# --- the documents ---------------------------------------------------------------------------


def test_both_policies_fit_their_controllers_crds(generated) -> None:
    kyverno = closed_resource(crd_schema(KYVERNO_CRD, KYVERNO_CRD_SHA256, "v1"))
    jsonschema.Draft7Validator(kyverno).validate(generated[KYVERNO])
    controller = closed_resource(crd_schema(POLICY_CONTROLLER_CRD, POLICY_CONTROLLER_CRD_SHA256, "v1beta1"))
    jsonschema.Draft7Validator(controller).validate(generated[POLICY_CONTROLLER])
    typo = copy.deepcopy(generated[POLICY_CONTROLLER])
    typo["spec"]["authorities"][0]["key"]["ignoreTlog"] = True  # no such field: refused, never dropped
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(controller).validate(typo)


def test_the_policies_name_the_repository_the_key_and_every_pin(world, generated) -> None:
    repository = generated["reference"].split("@")[0]
    policy = generated[KYVERNO]["spec"]["rules"][0]["verifyImages"][0]
    assert policy["imageReferences"] == [f"{repository}@*", f"{repository}:*"]
    keys = policy["attestors"][0]["entries"][0]["keys"]
    assert keys["publicKeys"] == Path(world["public"]).read_text()
    assert keys["rekor"] == {"ignoreTlog": True} and keys["ctlog"] == {"ignoreSCT": True}
    controller = generated[POLICY_CONTROLLER]["spec"]
    assert controller["images"] == [{"glob": f"{repository}@**"}, {"glob": f"{repository}:**"}]
    assert "ctlog" not in controller["authorities"][0]  # a key authority without a log: no tlog
    assert "no transparency-log entry" in generated[KYVERNO]["metadata"]["annotations"]["omni.admission/offline"]
    pins = ImagePins.model_validate(world["pins"])
    wanted = {(r.dependency, r.value) for r in requirements(pins)}
    conditions = policy["attestations"][0]["conditions"][0]["all"]
    assert {(c["key"].split("'")[1], c["value"]) for c in conditions if c["value"] != "1"} == wanted
    cue = cue_policies(generated[POLICY_CONTROLLER])[SLSA_PROVENANCE]
    assert all(value in cue for _, value in wanted) and generated["reference"].split(":")[-1] in cue
    assert {p for _, p in [(r.value, r.pin) for r in requirements(pins)]} == {
        "base.digest",
        "engine.commit",
        "engine.record_sha256",
        "model.revision",
        "model.lock_sha256",
        "speculator.revision",
    }


def test_the_kustomize_base_holds_both_policies_with_their_own_notes(world, generated) -> None:
    base = world["work"] / "base-dir"
    flags = ["--image", generated["reference"], "--model-pvc", "models", "--output-dir", str(base)]
    flags += ["--admission", KYVERNO, "--admission", POLICY_CONTROLLER, "--signing-key-pub", str(world["public"])]
    assert _deploy(world, "genuine", *flags) == 0
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text().split("\n# sha256", 1)[0])
    name = generated[KYVERNO]["metadata"]["name"]
    assert {f"clusterpolicy-{name}.yaml", f"clusterimagepolicy-{name}.yaml"} <= set(kustomization["resources"])
    written = yaml.safe_load((base / f"clusterpolicy-{name}.yaml").read_text().split("\n# sha256", 1)[0])
    # The policy's own annotation stays in its file; the shared ones come from commonAnnotations.
    assert set(written["metadata"]["annotations"]) == {"omni.admission/offline"}
    assert written["spec"] == generated[KYVERNO]["spec"]


# --- evaluated: policy-controller's CUE by cosign, Kyverno's JMESPath by jmespath -------------


def _rows(world) -> dict[str, tuple[str, dict[str, Any], bool]]:
    """name -> (reference, provenance statement, whether an SBOM is attested)."""
    rows = {}
    for name, edit in BAD:
        reference, statement = _release(world, name.replace(" ", "-"), edit)
        rows[name] = (reference, statement, True)
    reference, statement = _release(world, "no-sbom", sbom=False)
    rows["no SBOM"] = (reference, statement, False)
    return rows


def _cosign_admits(world, cue: dict[str, str], reference: str) -> list[str]:
    """Every (cosign, layout, predicate) that refuses `reference` under the CUE policies."""
    refused = []
    for predicate, text in cue.items():
        path = world["work"] / (predicate.rsplit("/", 2)[-2] + ".cue")
        path.write_text(text)
        for cosign in verifiers():
            for legacy in (True, False) if cosign.reads_bundles else (True,):
                args = ("verify-attestation", "--key", str(world["public"]), "--type", predicate)
                run = cosign.run(*args, "--policy", str(path), reference, legacy=legacy)
                if run.returncode != 0:
                    refused.append(f"{cosign} {'legacy' if legacy else 'bundles'} {predicate}: {run.stderr[-300:]}")
    return refused


def _kyverno_admits(document: dict[str, Any], statements: dict[str, dict[str, Any]]) -> list[str]:
    """Kyverno's attestation checks over `statements` (predicate type -> statement): a type with
    no statement is refused (Kyverno: "attestions not found"), else each condition's key, its
    {{ }} stripped, is evaluated over the predicate and compared as Equals compares."""
    refused = []
    for attestation in document["spec"]["rules"][0]["verifyImages"][0]["attestations"]:
        found = statements.get(attestation["type"])
        if found is None:
            refused.append(f"{attestation['type']}: not found")
            continue
        for condition in attestation["conditions"][0]["all"]:
            assert condition["operator"] == "Equals"
            value = jmespath.search(condition["key"].strip("{} "), found["predicate"])
            if value != condition["value"]:
                refused.append(condition["message"])
    return refused


def _statements(statement: dict[str, Any], sbom: bool, digest: str) -> dict[str, dict[str, Any]]:
    from omni_oci.signing.bundles import statement as bundle_statement

    made = {SLSA_PROVENANCE: statement}
    if sbom:
        made[SPDX_PREDICATE] = bundle_statement(digest, SPDX_PREDICATE, SBOM)
    return made


def test_the_release_is_admitted_by_both_engines(world, generated) -> None:
    reference, statement = generated["reference"], generated["statement"]
    assert _cosign_admits(world, cue_policies(generated[POLICY_CONTROLLER]), reference) == []
    digest = reference.split("@")[1]
    assert _kyverno_admits(generated[KYVERNO], _statements(statement, True, digest)) == []


def test_a_release_naming_other_pins_or_without_its_sbom_is_refused_by_both(world, generated) -> None:
    pins = ImagePins.model_validate(world["pins"])
    key = _key_pem(world)
    for name, (reference, statement, sbom) in _rows(world).items():
        # The policies for that image's digest (the same pins): only the evidence differs.
        kyverno, controller = admission_policies([KYVERNO, POLICY_CONTROLLER], reference, pins, key, {})
        refused = _cosign_admits(world, cue_policies(controller), reference)
        layouts = sum(2 if cosign.reads_bundles else 1 for cosign in verifiers())
        assert len(refused) == layouts, (name, refused)  # every cosign and layout, one predicate each
        expected = SPDX_PREDICATE if name == "no SBOM" else SLSA_PROVENANCE
        assert all(f" {expected}: " in line for line in refused), (name, refused)
        by_kyverno = _kyverno_admits(kyverno, _statements(statement, sbom, reference.split("@")[1]))
        assert len(by_kyverno) == 1, (name, by_kyverno)


def test_the_cue_binds_the_digest(world, generated) -> None:
    """The genuine release's policy, applied to another image of the same repository and pins."""
    other, _ = _release(world, "rebuilt")
    refused = _cosign_admits(
        world, {SLSA_PROVENANCE: cue_policies(generated[POLICY_CONTROLLER])[SLSA_PROVENANCE]}, other
    )
    assert refused and all("subject" in line or "conflicting values" in line for line in refused), refused


# --- refusals --------------------------------------------------------------------------------


def _pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


KEYS = [
    ("an RSA key", lambda: _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)), "RSAPublicKey"),
    ("a P-384 key", lambda: _pem(ec.generate_private_key(ec.SECP384R1())), "secp384r1"),
    ("not PEM", lambda: b"MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n", "not a PEM public key"),
    (
        "a private key",
        lambda: ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        "not a PEM public key",
    ),
]


@pytest.mark.parametrize(("what", "make", "message"), KEYS, ids=[k[0] for k in KEYS])
def test_a_key_that_is_not_p256_pem_is_refused(world, generated, capsys, what, make, message) -> None:
    key = world["work"] / "bad.pem"
    key.write_bytes(make())
    output = world["work"] / "refused.yaml"
    flags = ["--image", generated["reference"], "--model-pvc", "m", "--output", str(output)]
    assert _deploy(world, "genuine", *flags, "--admission", KYVERNO, "--signing-key-pub", str(key)) == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "--signing-key-pub" and message in refusal["error"], refusal
    assert not output.exists()


def test_unpinned_images_tags_and_lone_flags_are_refused(world, generated, capsys) -> None:
    unpinned = copy.deepcopy(world["pins"])
    unpinned["engine"]["commit"] = unpinned["engine"]["record_sha256"] = ""
    layer = make_layer(world["work"], "unpinned", {"/opt/omni/app/x.py": "x = 0\n"})
    make_image(
        world["work"] / "unpinned",
        [layer],
        base=world["work"] / "base",
        pins=unpinned,
        checkpoint_lock=LOCK,
        **SERVING_SPEC,
    )
    output = world["work"] / "refused.yaml"
    key = ("--signing-key-pub", str(world["public"]))
    repository = generated["reference"].split("@")[0]
    rows = [
        (
            "unpinned",
            ["--repository", repository, "--admission", KYVERNO, *key],
            "engine.commit or engine.record_sha256",
        ),
        ("genuine", ["--image", f"{repository}:v1", "--admission", KYVERNO, *key], "--image"),
        ("genuine", ["--image", generated["reference"], *key], "--signing-key-pub"),
        ("genuine", ["--image", generated["reference"], "--admission", POLICY_CONTROLLER], "--admission"),
    ]
    for layout, flags, field in rows:
        assert _deploy(world, layout, *flags, "--model-pvc", "m", "--output", str(output)) == 2, flags
        refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert refusal["field"] == field, (flags, refusal)
        assert not output.exists()


# --- the docs ---------------------------------------------------------------------------------

DOCS = Path("docs/release.md")
DOCS_PINS = Path("tests/deploy/qwen_mi300x.pins.json")  # the deploy tests' stand-in pins
DOCS_IMAGE = "registry.example/omni/qwen@sha256:" + hashlib.sha256(b"omni docs example image").hexdigest()


def documented_policies() -> str:
    """docs/release.md's admission example: both policies for the stand-in pins, an example image
    and an example key (a fixed P-256 key), as deploy writes them."""
    example = ec.derive_private_key(0x0DD5, ec.SECP256R1()).public_key()
    key = public_key_pem(
        example.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), "example"
    )
    pins = ImagePins.model_validate(json.loads(DOCS_PINS.read_text()))
    return dump(
        admission_policies(
            [KYVERNO, POLICY_CONTROLLER], DOCS_IMAGE, pins, key, {"app.kubernetes.io/name": "qwen-mi300x"}
        )
    )


def test_the_docs_show_what_deploy_writes(tmp_path: Path) -> None:
    text = DOCS.read_text()
    block = text.split("<!-- admission:begin -->\n```yaml\n", 1)[1].split("```\n<!-- admission:end -->", 1)[0]
    expected = documented_policies()
    (tmp_path / "admission.yaml").write_text(expected)
    assert block == expected, f"docs/release.md's admission example is stale: paste {tmp_path / 'admission.yaml'}"
