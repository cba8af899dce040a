"""Pins bound into images and verified at start; provenance and cosign signatures through
a real loopback registry, checked by our verify and by Debian's cosign 2 and 3."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from attest.documents import parse_document
from attest.errors import AttestError
from attest.pins import ImagePins
from boot.cli import main as boot_main
from boot.settings import REVISION
from omni_oci.format.errors import OciError
from omni_oci.format.statement import resolved
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.bundles import BUNDLE_TYPE
from omni_oci.signing.keys import load_private_key
from omni_oci.signing.legacy import dsse_envelope, push_attestation, tag_for
from omni_oci.signing.verify import model_trust, verify_image
from tests.fixtures.cosign import Cosign, verifiers
from tests.fixtures.deepseek import boot_env, tiny_repo, write_lock
from tests.fixtures.oci import blobs_of, make_image, make_layer
from tests.fixtures.pins import key_pair, qwen_pins, write_baked
from tests.fixtures.qwen import SPECULATOR_REVISION, TARGET_REVISION, VLLM_COMMIT, LauncherWorld, make_fake_vllm
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.wheels import write_record
from tools.oci.build.image import checked_lock, load_pins_checked
from tools.oci.build.provenance import build_statement

OTHER = "fe" * 20


def _world(tmp_path: Path, **pin_overrides) -> LauncherWorld:
    world = LauncherWorld(tmp_path / "world")
    world.env["OMNI_IMAGE_JSON"] = str(write_baked(tmp_path / "image.json", qwen_pins(**pin_overrides)))
    world.env["INFERENCE_MODE"] = "dflash2_canary"
    return world


def test_matching_pins_pass_and_are_reported(tmp_path: Path) -> None:
    world = _world(tmp_path)
    # What the fixture installed, counted here: every file of the package and its dist-info.
    installed = [
        p
        for p in [*world.site.joinpath("vllm").rglob("*"), *world.site.glob("vllm-*.dist-info/*")]
        if p.is_file() and p.name not in ("RECORD", "direct_url.json", "INSTALLER", "REQUESTED")
    ]
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    assert result.report["decision"]["mode"] == "dflash2_canary"
    assert result.report["image_pins"] == [
        f"engine.commit {VLLM_COMMIT} matches the installed vllm (full commit from direct_url.json)",
        f"{len(installed)} installed vllm files ({sum(p.stat().st_size for p in installed)} bytes) match its RECORD",
        f"model.revision {TARGET_REVISION} matches MODEL_REVISION",
        "the DFlash2 gate is bound to the pinned engine, model and speculator",
    ]


@pytest.mark.parametrize(
    "pins,setup,field,pinned,found",
    [
        ({"engine__commit": OTHER}, lambda w: None, "engine.commit", OTHER, VLLM_COMMIT),
        ({"model__revision": OTHER}, lambda w: None, "model.revision", OTHER, TARGET_REVISION),
        ({}, lambda w: w.edit_gate(vllm_commit=OTHER), "engine.commit", VLLM_COMMIT, OTHER),
        ({}, lambda w: w.edit_gate(target_revision=OTHER), "model.revision", TARGET_REVISION, OTHER),
        ({}, lambda w: w.edit_gate(speculator_revision=OTHER), "speculator.revision", SPECULATOR_REVISION, OTHER),
    ],
    ids=["engine commit", "model revision", "gate vllm_commit", "gate target_revision", "gate speculator_revision"],
)
def test_each_mismatch_refuses_the_start_naming_both_values(tmp_path: Path, pins, setup, field, pinned, found) -> None:
    world = _world(tmp_path, **pins)
    setup(world)
    result = world.run()
    assert result.code == 2 and result.exec_calls == []
    refusal = result.refusal
    assert refusal["field"] == field
    assert f"pinned {pinned}, found {found}" in refusal["error"]


def test_a_launcher_in_an_sglang_image_is_refused(tmp_path: Path) -> None:
    result = _world(tmp_path, engine__name="sglang").run("--inspect-only")
    assert result.code == 2 and result.refusal["field"] == "engine.name"


def _spark_baked(tmp_path: Path, **overrides) -> Path:
    pins = json.loads(Path("images/deepseek_spark.pins.json").read_text())
    pins["engine"]["commit"] = VLLM_COMMIT
    for key, value in overrides.items():
        section, field = key.split("__")
        pins[section][field] = value
    return write_baked(tmp_path / "image.json", pins)


def test_boot_refuses_a_model_revision_other_than_the_pin(tmp_path: Path, capsys) -> None:
    env = boot_env(tmp_path, OMNI_IMAGE_JSON=str(_spark_baked(tmp_path, model__revision=OTHER)), SKIP_PREPARE="1")
    with mock.patch.dict(os.environ, env, clear=True):
        assert boot_main(["prepare"]) == 2
    refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert refusal["field"] == "model.revision" and f"pinned {OTHER}, found {REVISION}" in refusal["error"]
    env["OMNI_IMAGE_JSON"] = str(_spark_baked(tmp_path))
    env["MODEL_REVISION"] = OTHER
    with mock.patch.dict(os.environ, env, clear=True):
        assert boot_main(["prepare"]) == 2
    assert f"pinned {REVISION}, found {OTHER}" in capsys.readouterr().err


def test_boot_refuses_an_sglang_commit_other_than_the_pin(tmp_path: Path, capsys) -> None:
    site = tmp_path / "engine-site"
    make_fake_vllm(site)  # a dist-info with a commit, renamed to sglang below
    (site / "vllm-0.18.1.dist-info").rename(site / "sglang-0.5.0.dist-info")
    (site / "sglang-0.5.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.0\n")
    write_record(site, site / "sglang-0.5.0.dist-info", ("vllm",))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for commit, code, expected in ((OTHER, 2, f"pinned {OTHER}, found {VLLM_COMMIT}"), (VLLM_COMMIT, 2, '"API_KEY"')):
        env = boot_env(tmp_path, OMNI_IMAGE_JSON=str(_spark_baked(tmp_path, engine__commit=commit)), SKIP_PREPARE="1")
        with mock.patch.dict(os.environ, env, clear=True), mock.patch("sys.path", [str(site), *os.sys.path]):
            assert boot_main(["run"]) == code
        err = capsys.readouterr().err
        assert expected in err  # the matching commit passes the pins and stops later, at the key check


def test_pins_edited_in_one_place_change_labels_baked_file_and_provenance(tmp_path: Path) -> None:
    path = tmp_path / "qwen_mi300x.pins.json"
    path.write_text(json.dumps(qwen_pins(model__revision=OTHER, engine__commit="ab" * 20)))
    pins = load_pins_checked(path, release=True)
    result = make_image(tmp_path / "layout", [make_layer(tmp_path, "app", {"/opt/x": "x"})], pins=pins)
    labels = result["config"]["config"]["Labels"]
    assert labels["omni.model.revision"] == OTHER and labels["omni.engine.commit"] == "ab" * 20
    import gzip
    import io
    import tarfile

    baked_blob = tmp_path / "layout" / "blobs/sha256" / result["manifest"]["layers"][-1]["digest"].split(":")[1]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(baked_blob.read_bytes()))) as tar:
        baked = json.loads(tar.extractfile("etc/omni/image.json").read())
    assert baked["pins"] == pins and baked["layers"] == [result["manifest"]["layers"][0]["digest"]]
    statement = build_statement("qwen_mi300x", result["digest"], pins, "cd" * 20, {}, "", "")
    assert resolved(statement, "model") == {"gitCommit": OTHER}
    assert resolved(statement, "engine") == {"gitCommit": "ab" * 20}


@pytest.mark.parametrize(
    "signature, field",
    [
        ({"signer": "key:" + "a" * 64, "sha256": "b" * 64}, ""),
        ({"signer": "cert:" + "c" * 64, "sha256": "b" * 64, "identity": "CN=Publisher Models"}, ""),
        ({"signer": "a" * 64, "sha256": "b" * 64}, "model.signature.signer"),
        ({"signer": "key:" + "a" * 64, "sha256": "B" * 64}, "model.signature.sha256"),
        ({"signer": "key:" + "a" * 64}, "model.signature.sha256"),
    ],
    ids=["a key", "a certificate", "a signer without its method", "upper-case hex", "no sha256"],
)
def test_a_publisher_signature_pin_is_labelled_baked_and_reported(tmp_path: Path, signature, field: str) -> None:
    path = tmp_path / "qwen_mi300x.pins.json"
    path.write_text(json.dumps(qwen_pins(model__signature=signature)))
    if field:
        with pytest.raises(AttestError) as refused:
            load_pins_checked(path, release=False)
        assert field in str(refused.value), refused.value
        return
    pins = load_pins_checked(path, release=False)
    result = make_image(tmp_path / "layout", [make_layer(tmp_path, "app", {"/opt/x": "x"})], pins=pins)
    assert result["config"]["config"]["Labels"]["omni.model.signer"] == signature["signer"]
    trust = model_trust(parse_document(ImagePins, pins, label="pins"))
    who = signature["signer"] + (f" ({signature['identity']})" if "identity" in signature else "")
    assert trust == f"publisher-signed by {who} (model.sig sha256 {signature['sha256']})"


def test_release_builds_refuse_empty_pins(tmp_path: Path) -> None:
    with pytest.raises(
        AttestError,
        match=r"release build refused: base.digest, base.contents_sha256, engine.commit or engine.record_sha256, "
        r"model.revision, speculator.revision are empty in qwen_mi300x.pins.json",
    ):
        load_pins_checked(Path("images/qwen_mi300x.pins.json"), release=True)
    assert load_pins_checked(Path("images/qwen_mi300x.pins.json"), release=False)["engine"]["commit"] == ""
    bad = tmp_path / "bad.pins.json"
    bad.write_text(json.dumps(qwen_pins(engine__commit="v0.18")))
    with pytest.raises(AttestError, match="engine.commit: Value error, must be empty"):
        load_pins_checked(bad, release=False)
    # An engine named by its RECORD alone is pinned (PyPI wheels record no full commit).
    by_record = tmp_path / "record.pins.json"
    by_record.write_text(json.dumps(qwen_pins(engine__commit="", engine__record_sha256="ab" * 32)))
    assert load_pins_checked(by_record, release=True)["engine"]["record_sha256"] == "ab" * 32
    # A base pinned without its contents (the release's SBOM would leave the base out) is refused.
    no_contents = tmp_path / "contents.pins.json"
    no_contents.write_text(json.dumps(qwen_pins(base__contents_sha256="")))
    with pytest.raises(AttestError, match="release build refused: base.contents_sha256 is empty") as caught:
        load_pins_checked(no_contents, release=True)
    assert caught.value.field == "base.contents_sha256"
    by_record.write_text(json.dumps(qwen_pins(engine__record_sha256="xyz")))
    with pytest.raises(AttestError, match="engine.record_sha256: Value error"):
        load_pins_checked(by_record, release=False)


def test_the_deepseek_release_needs_a_reviewed_checkpoint_lock(tmp_path: Path) -> None:
    with pytest.raises(
        AttestError,
        match=r"release build refused: base.digest, base.contents_sha256, engine.commit or engine.record_sha256, "
        r"model.lock_sha256 are empty in deepseek_spark.pins.json",
    ) as caught:
        load_pins_checked(Path("images/deepseek_spark.pins.json"), release=True)
    assert caught.value.field == "base.digest"
    pins = load_pins_checked(Path("images/deepseek_spark.pins.json"), release=False)
    assert pins["model"]["lock_sha256"] == ""
    assert checked_lock(None, pins) is None  # development: no lock, nothing baked
    lock = tmp_path / "deepseek_spark.checkpoint.lock.json"
    sha = write_lock(lock, tiny_repo())
    with pytest.raises(OciError, match=f"has sha256 {sha}; model.lock_sha256 pins nothing"):
        checked_lock(lock, pins)
    pins["model"]["lock_sha256"] = sha
    with pytest.raises(OciError, match="model.lock_sha256 is pinned .* but no checkpoint lock is given"):
        checked_lock(None, pins)
    pins["model"]["lock_sha256"] = "ab" * 32
    with pytest.raises(OciError, match=f"has sha256 {sha}; model.lock_sha256 pins {'ab' * 32}"):
        checked_lock(lock, pins)
    pins["model"]["lock_sha256"] = sha
    result = make_image(
        tmp_path / "layout",
        [make_layer(tmp_path, "app", {"/opt/x": "x"})],
        pins=pins,
        checkpoint_lock=checked_lock(lock, pins),
    )
    assert result["config"]["config"]["Labels"]["omni.model.lock_sha256"] == sha
    import gzip
    import io
    import tarfile

    baked_blob = tmp_path / "layout" / "blobs/sha256" / result["manifest"]["layers"][-1]["digest"].split(":")[1]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(baked_blob.read_bytes()))) as tar:
        assert tar.extractfile("etc/omni/checkpoint.lock.json").read() == lock.read_bytes()
    statement = build_statement("deepseek_spark", result["digest"], pins, "cd" * 20, {}, "", "")
    assert resolved(statement, "checkpoint-lock") == {"sha256": sha}


def test_boot_takes_the_lock_sha256_from_the_image_pin(tmp_path: Path, capsys) -> None:
    from boot.checkpoint.sources import prepare
    from boot.settings import BootSettings
    from tests.fixtures.hub import LoopbackHub

    lock = tmp_path / "locks" / "checkpoint.lock.json"
    sha = write_lock(lock, tiny_repo())
    for pinned, expected in ((sha, None), ("ab" * 32, "model.lock_sha256 pins " + "ab" * 32)):
        env = boot_env(
            tmp_path, OMNI_IMAGE_JSON=str(_spark_baked(tmp_path, model__lock_sha256=pinned)), CHECKPOINT_LOCK=str(lock)
        )
        with LoopbackHub(tiny_repo()) as hub, mock.patch.dict(os.environ, {**env, "HF_ENDPOINT": hub.url}, clear=True):
            if expected is None:
                assert prepare(BootSettings.from_env()).trust == "reviewed"
                assert "WARNING" not in capsys.readouterr().err
            else:
                with pytest.raises(AttestError, match=expected):
                    prepare(BootSettings.from_env())


def test_the_deepseek_pin_is_the_revision_boot_downloads() -> None:
    assert json.loads(Path("images/deepseek_spark.pins.json").read_text())["model"]["revision"] == REVISION


# --- signed push, our verify, cosign ----------------------------------------------------
@pytest.fixture(scope="module")
def cosigns() -> list[Cosign]:
    """The host's cosign and the other major set-up keeps (2.5 and 3.1 here)."""
    return verifiers()


def _payload(completed: subprocess.CompletedProcess) -> dict:
    return json.loads(base64.b64decode(json.loads(completed.stdout.splitlines()[0])["payload"]))


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signed")
    key, public = key_pair(tmp, "signer")
    other_key, other_public = key_pair(tmp, "other")
    runner = Path("images/qwen_mi300x.run.sh").resolve()
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [str(runner), "--push", f"{registry.host}/omni/qwen", "--signing-key", str(key)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp)},
        )
        assert completed.returncode == 0, completed.stderr
        assert "BEGIN" not in completed.stdout + completed.stderr  # the key is never printed
        yield {
            "registry": registry,
            "reference": completed.stdout.splitlines()[-1],
            "key": key,
            "public": public,
            "other_key": other_key,
            "other_public": other_public,
            "tmp": tmp,
        }


def test_signed_push_verifies_with_ours_and_cosign(pushed) -> None:
    summary = verify_image(pushed["reference"], pushed["public"])
    assert summary["ok"] and summary["image"] == "qwen_mi300x"
    assert summary["bytes_fetched_from_layers"] < 4096  # only the pins layer, never the big ones
    # A development image says it is unpinned, and what it runs as.
    assert summary["pinned"] is False and "base.digest" in summary["unpinned"]
    assert summary["runtime"]["user"] == "1000:1000"
    assert summary["runtime"]["groups"] == ["video:44", "render:110"]
    assert summary["runtime"]["volumes"] == ["/cache", "/models", "/tmp"]
    assert (summary["signatures"], summary["sbom_signed"], summary["cyclonedx_signed"]) == (
        "sigstore bundles",
        True,
        True,
    )
    legacy = verify_image(pushed["reference"], pushed["public"], layout="legacy")
    assert (legacy["signatures"], legacy["sbom_signed"], legacy["cyclonedx_signed"]) == ("legacy tags", True, True)


# What each cosign must accept on a default signed push (bundles and legacy tags): every
# attestation, from every layout it reads (docs/release.md#what-each-cosign-verifies).
ATTESTATIONS = [
    ("slsaprovenance1", "https://slsa.dev/provenance/v1"),
    ("spdxjson", "https://spdx.dev/Document"),
    ("cyclonedx", "https://cyclonedx.org/bom"),
]


def test_a_default_signed_push_verifies_with_cosign_2_and_3(pushed, cosigns) -> None:
    reference, public = pushed["reference"], pushed["public"]
    for cosign in cosigns:
        for legacy in (False, True) if cosign.reads_bundles else (True,):
            where = f"{cosign}, {'legacy tags' if legacy else 'bundles'}"
            signature = cosign.verify(public, reference, legacy=legacy)
            assert signature.returncode == 0, f"{where}: {signature.stderr}"
            for kind, predicate in ATTESTATIONS:
                attestation = cosign.attestation(public, reference, kind, legacy=legacy)
                assert attestation.returncode == 0, f"{where} --type {kind}: {attestation.stderr}"
                payload = _payload(attestation)
                assert payload["subject"][0]["digest"]["sha256"] == reference.split("sha256:")[1], where
                assert payload["predicateType"] == predicate, where
            assert _payload(cosign.attestation(public, reference, "spdxjson", legacy=legacy))["predicate"][
                "spdxVersion"
            ], where


def test_without_legacy_signatures_only_the_bundles_are_pushed(pushed, cosigns) -> None:
    """docker-registry 2.8 has no referrers API: the bundles are listed in the fallback tag index.
    cosign 3 verifies them; cosign 2 finds nothing, as the push warns."""
    registry = pushed["registry"]
    completed = subprocess.run(
        [
            str(Path("images/qwen_mi300x.run.sh").resolve()),
            "--push",
            f"{registry.host}/omni/bundled",
            "--signing-key",
            str(pushed["key"]),
            "--no-legacy-signatures",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BUILD_WORKING_DIRECTORY": str(pushed["tmp"])},
    )
    assert completed.returncode == 0, completed.stderr
    assert "warning: --no-legacy-signatures: cosign < 3" in completed.stderr
    reference = completed.stdout.splitlines()[-1]
    digest = reference.split("@")[1]
    with RegistryClient(registry.host) as client:
        tags = client.request("GET", "/v2/omni/bundled/tags/list", repository="omni/bundled").json()["tags"]
        assert tag_for(digest, "sig") not in tags and tag_for(digest, "att") not in tags
        index, _ = client.manifest("omni/bundled", digest.replace(":", "-"))
    listed = [item for item in json.loads(index)["manifests"] if item.get("artifactType") == BUNDLE_TYPE]
    assert len(listed) == 4  # signature, provenance, SBOM (SPDX, CycloneDX)
    assert verify_image(reference, pushed["public"])["signatures"] == "sigstore bundles"
    with pytest.raises(OciError) as refused:
        verify_image(reference, pushed["public"], layout="legacy")
    assert refused.value.field == tag_for(digest, "sig")
    for cosign in cosigns:
        bundles, tags = (cosign.verify(pushed["public"], reference, legacy=legacy) for legacy in (False, True))
        assert tags.returncode != 0 and "no signatures found" in tags.stderr, f"{cosign}: {tags.stderr}"
        if cosign.reads_bundles:
            assert bundles.returncode == 0, f"{cosign}: {bundles.stderr}"
        else:
            assert bundles.returncode != 0 and "no signatures found" in bundles.stderr, f"{cosign}: {bundles.stderr}"


def test_the_wrong_key_is_refused_by_ours_and_every_cosign(pushed, cosigns) -> None:
    with pytest.raises(OciError, match="not the given public key"):
        verify_image(pushed["reference"], pushed["other_public"])
    with pytest.raises(OciError, match="image signature does not verify"):
        verify_image(pushed["reference"], pushed["other_public"], layout="legacy")
    for cosign in cosigns:
        for legacy in (False, True):
            assert cosign.verify(pushed["other_public"], pushed["reference"], legacy=legacy).returncode, str(cosign)
            for kind, _ in ATTESTATIONS:
                refused = cosign.attestation(pushed["other_public"], pushed["reference"], kind, legacy=legacy)
                assert refused.returncode, f"{cosign} --type {kind}"


@contextlib.contextmanager
def _attestation_replaced(pushed, statement_change, keep_signature: bool = False):
    """The legacy `.att` replaced by one provenance layer, its statement changed (under the
    original signature with `keep_signature`); the pushed `.att` put back afterwards."""
    repository, digest = pushed["reference"].split("/", 1)[1].split("@")
    statement = json.loads(Path("images/qwen_mi300x.provenance.json").read_text())
    original = dsse_envelope(load_private_key(pushed["key"]), statement)
    statement_change(statement)
    envelope = dsse_envelope(load_private_key(pushed["key"]), statement)
    if keep_signature:  # tampered payload under the original signature
        tampered = json.loads(envelope)
        tampered["signatures"] = json.loads(original)["signatures"]
        envelope = json.dumps(tampered, separators=(",", ":")).encode()
    with RegistryClient(pushed["registry"].host) as client:
        pushed_att, media_type = client.manifest(repository, tag_for(digest, "att"))
        push_attestation(client, repository, digest, envelope)
        try:
            yield
        finally:
            client.put_manifest(repository, tag_for(digest, "att"), pushed_att, media_type)


def _refused_by_every_cosign(pushed, cosigns) -> None:
    for cosign in cosigns:
        refused = cosign.attestation(pushed["public"], pushed["reference"], "slsaprovenance1", legacy=True)
        assert refused.returncode, f"{cosign} accepted it"


def test_tampered_provenance_is_refused_by_ours_and_every_cosign(pushed, cosigns) -> None:
    def tamper(statement):
        statement["predicate"]["buildDefinition"]["externalParameters"]["pins"]["model"]["revision"] = OTHER

    with _attestation_replaced(pushed, tamper, keep_signature=True):
        with pytest.raises(OciError, match="the provenance: the signature does not verify"):
            verify_image(pushed["reference"], pushed["public"], layout="legacy")
        _refused_by_every_cosign(pushed, cosigns)


def test_provenance_about_another_digest_is_refused_by_ours_and_every_cosign(pushed, cosigns) -> None:
    def retarget(statement):
        statement["subject"][0]["digest"]["sha256"] = "0" * 64

    with _attestation_replaced(pushed, retarget):
        with pytest.raises(OciError, match="the provenance is about"):
            verify_image(pushed["reference"], pushed["public"], layout="legacy")
        _refused_by_every_cosign(pushed, cosigns)
    assert verify_image(pushed["reference"], pushed["public"], layout="legacy")["sbom_signed"] is True


def test_verify_cli_refuses_a_tag_and_prints_json(pushed, capsys) -> None:
    from tools.oci import verify

    assert verify.main([pushed["reference"].split("@")[0] + ":latest", "--key", str(pushed["public"])]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == "reference"
    assert verify.main([pushed["reference"], "--key", str(pushed["public"])]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert blobs_of(Path("images/qwen_mi300x.layout"))["digest"] in pushed["reference"]


@pytest.mark.parametrize(
    "override, field, message",
    [
        ({"image": ""}, "image", "at least 1 character"),
        ({"base__image": ""}, "base.image", "at least 1 character"),
        ({"engine__repository": ""}, "engine.repository", "at least 1 character"),
        ({"model__id": ""}, "model.id", "at least 1 character"),
        ({"hardware__gpu_arch": ""}, "hardware.gpu_arch", "at least 1 character for a GPU profile"),
        ({"hardware__profile": "cpu_x86_64"}, "hardware.gpu_arch", "must be empty for the CPU profile"),
        ({"base__digest": "sha256:" + "1" * 63}, "base.digest", "must be empty (not pinned yet) or"),
        ({"base__digest": "sha512:" + "1" * 64}, "base.digest", "must be empty (not pinned yet) or"),
        ({"engine__commit": VLLM_COMMIT[:-1]}, "engine.commit", "must be empty (not pinned yet) or"),
        ({"engine__record_sha256": "ab" * 31}, "engine.record_sha256", "must be empty (not pinned yet) or"),
        ({"model__revision": TARGET_REVISION + "0"}, "model.revision", "must be empty (not pinned yet) or"),
        ({"model__lock_sha256": "cd" * 33}, "model.lock_sha256", "must be empty (not pinned yet) or"),
        ({"hardware__profile": "h100"}, "hardware.profile", "Input should be"),
        ({"base__platform": "linux/riscv64"}, "base.platform", "Input should be"),
        ({"engine__name": "tgi"}, "engine.name", "Input should be"),
        ({"engine__needs_root": "yes"}, "engine.needs_root", "valid boolean"),
        ({"schema_version": "2"}, "schema_version", "Input should be '1'"),
    ],
)
def test_every_pin_field_refuses_a_malformed_value_by_name(tmp_path: Path, override, field: str, message: str) -> None:
    path = tmp_path / "bad.pins.json"
    path.write_text(json.dumps(qwen_pins(**override)))
    with pytest.raises(AttestError) as caught:
        load_pins_checked(path, release=False)
    assert caught.value.field.endswith(field) and message in str(caught.value), (caught.value.field, str(caught.value))


def test_a_mismatch_names_both_values_and_says_when_nothing_was_found() -> None:
    from attest.pins import mismatch

    error = mismatch("engine.commit", "a" * 40, "", "the installed vllm commit")
    assert (error.field, str(error)) == (
        "engine.commit",
        f"the installed vllm commit differs from the image pin engine.commit: pinned {'a' * 40}, found nothing",
    )
    assert str(mismatch("model.revision", "b" * 40, "main", "MODEL_REVISION")).endswith(
        f"pinned {'b' * 40}, found main"
    )


def test_a_stale_gate_is_not_checked_against_the_pins_unless_the_canary_is_requested(tmp_path: Path) -> None:
    world = _world(tmp_path)
    world.env["INFERENCE_MODE"] = "auto"
    world.edit_gate(speculator_revision=OTHER)  # would be refused in dflash2_canary mode
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    assert result.report["decision"]["mode"] == "native_mtp"
    assert not [note for note in result.report["image_pins"] if "DFlash2 gate" in note]


def test_the_canary_without_a_gate_path_falls_to_the_gate_check_not_to_a_crash(tmp_path: Path) -> None:
    world = _world(tmp_path)
    del world.env["QWEN_DFLASH2_GATE_PATH"]
    result = world.run("--inspect-only")
    without_pins = LauncherWorld(tmp_path / "plain")
    without_pins.env["INFERENCE_MODE"] = "dflash2_canary"
    del without_pins.env["QWEN_DFLASH2_GATE_PATH"]
    expected = without_pins.run("--inspect-only")
    assert result.code == expected.code == 0, result.stderr
    assert result.report["decision"] == expected.report["decision"]
    assert result.report["decision"]["mode"] == "native_mtp"
    assert any("QWEN_DFLASH2_GATE_PATH" in reason for reason in result.report["decision"]["reasons"])


def test_a_gate_is_only_bound_to_the_pins_that_are_set(tmp_path: Path) -> None:
    world = _world(tmp_path, speculator=None)
    world.edit_gate(speculator_revision=OTHER)
    world.env["DFLASH2_SPECULATOR_REVISION"] = OTHER
    result = world.run("--inspect-only")
    assert result.code != 2 or result.refusal["field"] != "speculator.revision", result.refusal
    assert "the DFlash2 gate is bound to the pinned engine, model and speculator" in result.report["image_pins"]
