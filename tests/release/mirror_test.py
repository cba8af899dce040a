"""tools/release mirror between two real docker-registries on loopback, each with its own
htpasswd user: a signed release (an image whose pins name a signed model artifact, Sigstore
bundles and cosign's legacy tags on both) is mirrored whole and checked on the target by our
verifiers, cosign and skopeo; then each way a source, a target or an offline directory can be
wrong is refused, naming it, with nothing of the target overwritten."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import attest.files
from omni_oci.format.layout import OCI_INDEX, OCI_MANIFEST, canonical, descriptor, read_layout, sha256_digest
from omni_oci.model.verify import verify_artifact
from omni_oci.remote.push import push
from omni_oci.remote.referrers import push_referrer
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.bundles import push_signatures
from omni_oci.signing.keys import load_private_key
from omni_oci.signing.verify import verify_image
from tests.fixtures.cosign import verifiers
from tests.fixtures.fault_proxy import FaultProxy, Step
from tests.fixtures.model import checkpoint_files, write_checkpoint
from tests.fixtures.oci import SKOPEO, make_image, make_layer, run
from tests.fixtures.owners import owned_by_another_user
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry, no_credentials
from tests.fixtures.release import signed_release
from tools.oci.build.index import write_index
from tools.release.cli import main
from tools.release.offline import PARTIAL
from tools.release.record import RECORD

SOURCE_USER, TARGET_USER = ("alice", "source-secret"), ("bob", "target-secret")
FAR_USER = ("carol", "far-secret")  # the registry beyond the air gap
BIG = "model-big.safetensors"
BIG_BYTES = 3 << 20


def _docker_config(home: Path, hosts: dict[str, tuple[str, str]]) -> Path:
    auths = {host: {"auth": base64.b64encode(f"{u}:{p}".encode()).decode()} for host, (u, p) in hosts.items()}
    (home / ".docker" / "config.json").write_text(json.dumps({"auths": auths}))
    return home / ".docker"


def _mirror(*args: str, capsys) -> tuple[int, dict[str, Any], str]:
    code = main(["mirror", *args])
    out, err = capsys.readouterr()
    if code == 2:
        return code, json.loads(err.strip().splitlines()[-1]), err
    return code, json.loads(out), err


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("release")
    with (
        pytest.MonkeyPatch.context() as patch,
        LoopbackRegistry(dict([SOURCE_USER])) as source,
        LoopbackRegistry(dict([TARGET_USER])) as target,
        LoopbackRegistry(dict([FAR_USER])) as far,
    ):
        home = no_credentials(tmp / "home", patch)
        config = _docker_config(home, {source.host: SOURCE_USER, target.host: TARGET_USER, far.host: FAR_USER})
        patch.setenv("DOCKER_CONFIG", str(config))
        private, public = key_pair(tmp, "signer")
        files = {**checkpoint_files(), BIG: hashlib.sha256(b"big").digest() * (BIG_BYTES // 32)}
        write_checkpoint(tmp / "checkpoint", files, tmp / "lock.json")
        release = signed_release(source.host, tmp, tmp / "checkpoint", tmp / "lock.json", private)
        yield {
            "source": source,
            "target": target,
            "far": far,
            "image": release.image,
            "digest": release.digest,
            "model": release.model,
            "pins_path": release.pins_path,
            "public": public,
            "layout": release.layout,
            "lock_sha256": release.lock_sha256,
        }


@pytest.fixture(scope="module")
def mirrored(world):
    """The pinned release mirrored once, with its signatures checked on both sides."""
    target = world["target"].host
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(
            ["mirror", world["image"], f"{target}/omni/qwen:release"]
            + ["--pins", str(world["pins_path"]), "--key", str(world["public"])]
        )
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()


def test_the_pinned_release_arrives_whole_and_verifies_on_the_target(world, mirrored) -> None:
    summary, progress = mirrored
    target, digest, model = world["target"].host, world["digest"], world["model"]
    assert summary["ok"] and summary["verified"]
    image, artifact = summary["mirrored"]
    assert image["reference"] == f"{target}/omni/qwen@{digest}" and image["tags"] == ["release"]
    assert artifact["reference"] == f"{target}/models/tiny@{model.digest}" and artifact["tags"] == ["v1"]
    assert artifact["bytes_copied"] > BIG_BYTES and "copied sha256:" in progress
    # Our verifiers, on the target alone.
    verified = verify_image(f"{target}/omni/qwen@{digest}", world["public"])
    assert verified["signatures"] == "sigstore bundles" and verified["sbom_signed"] is True
    assert verify_image(f"{target}/omni/qwen@{digest}", world["public"], layout="legacy")["sbom_signed"] is True
    for manifest in (model.digest, model.model_digest):
        checked = verify_artifact(f"{target}/models/tiny@{manifest}", world["public"], None)
        assert checked["lock_sha256"] == world["lock_sha256"]
    with RegistryClient(target) as client:
        assert client.manifest_digest("omni/qwen", "release") == digest
        assert client.manifest_digest("models/tiny", "v1") == model.digest


def test_cosign_verifies_the_mirrored_image_and_artifact_on_the_target(world, mirrored) -> None:
    target = world["target"].host
    references = [f"{target}/omni/qwen@{world['digest']}", f"{target}/models/tiny@{world['model'].digest}"]
    for cosign in verifiers():
        for reference in references:
            for legacy in (False, True) if cosign.reads_bundles else (True,):
                where = f"{cosign} {'legacy' if legacy else 'bundles'} {reference}"
                signed = cosign.verify(world["public"], reference, legacy=legacy)
                assert signed.returncode == 0, f"{where}: {signed.stderr}"
                attested = cosign.attestation(world["public"], reference, "slsaprovenance1", legacy=legacy)
                assert attested.returncode == 0, f"{where}: {attested.stderr}"
        sbom = cosign.attestation(world["public"], references[0], "spdxjson", legacy=not cosign.reads_bundles)
        assert sbom.returncode == 0, f"{cosign}: {sbom.stderr}"


def test_skopeo_pulls_the_image_from_the_target(world, mirrored, tmp_path: Path) -> None:
    target = world["target"].host
    copied = run(
        [SKOPEO, "copy", "--quiet", "--src-tls-verify=false", "--src-creds", ":".join(TARGET_USER)]
        + [f"docker://{target}/omni/qwen@{world['digest']}", f"oci:{tmp_path / 'pulled'}:qwen"]
    )
    assert copied.returncode == 0, copied.stderr
    assert read_layout(world["layout"])[0] == world["digest"]
    pulled_index = json.loads((tmp_path / "pulled" / "index.json").read_text())
    assert pulled_index["manifests"][0]["digest"] == world["digest"]


def test_a_second_run_copies_nothing_and_check_passes(world, mirrored, capsys) -> None:
    target = world["target"].host
    args = [world["image"], f"{target}/omni/qwen:release", "--pins", str(world["pins_path"])]
    code, summary, _ = _mirror(*args, capsys=capsys)
    assert code == 0
    for copied in summary["mirrored"]:
        assert copied["blobs"]["copied"] == copied["blobs"]["mounted"] == copied["bytes_copied"] == 0
        assert copied["manifests"]["written"] == 0 and copied["blobs"]["present"] > 0
    code, checked, _ = _mirror(*args, "--check", "--key", str(world["public"]), capsys=capsys)
    assert (code, checked["ok"], checked["missing"]) == (0, True, [])


def test_deploy_names_the_mirrored_image_and_artifact(world, mirrored, tmp_path: Path) -> None:
    """tools/deploy (as `bazel run //deploy:<image>` runs it) takes the mirror's references."""
    target, model = world["target"].host, world["model"]
    output = tmp_path / "qwen.yaml"
    deploy = [os.environ["DEPLOY"]] if "DEPLOY" in os.environ else [sys.executable, "-m", "tools.deploy.cli"]
    done = subprocess.run(
        [*deploy, "--layout", str(world["layout"]), "--repository", f"{target}/omni/qwen"]
        + ["--model-image", f"{target}/models/tiny@{model.digest}", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (deployment,) = [item for item in yaml.safe_load_all(output.read_text()) if item["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    assert [container["image"] for container in spec["containers"]] == [f"{target}/omni/qwen@{world['digest']}"]
    images = [volume["image"]["reference"] for volume in spec["volumes"] if "image" in volume]
    assert images == [f"{target}/models/tiny@{model.digest}"]


# --- refusals --------------------------------------------------------------------------------


def _no_manifest(registry: LoopbackRegistry, repository: str, digest: str) -> bool:
    with RegistryClient(registry.host) as client:
        return client.manifest_digest(repository, digest) is None


def test_a_referrer_naming_another_subject_is_refused_before_anything_is_written(world, capsys) -> None:
    source, target, digest = world["source"], world["target"], world["digest"]
    code, _, _ = _mirror(world["image"], f"{source.host}/graft/qwen", capsys=capsys)  # a mount, same registry
    assert code == 0
    with RegistryClient(source.host) as client:
        config = b"{}"
        client.upload("graft/qwen", sha256_digest(config), config, len(config))
        other = "sha256:" + "e" * 64
        forged = canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                "config": descriptor("application/vnd.oci.empty.v1+json", config),
                "layers": [],
                "subject": {"mediaType": OCI_MANIFEST, "digest": other, "size": 1},
            }
        )
        forged_digest = client.put_manifest("graft/qwen", sha256_digest(forged), forged, OCI_MANIFEST)
        tag = digest.replace(":", "-")
        listed = json.loads(client.manifest("graft/qwen", tag)[0])
        listed["manifests"].append(descriptor(OCI_MANIFEST, forged))
        client.put_manifest("graft/qwen", tag, canonical(listed), OCI_INDEX)
    code, refusal, _ = _mirror(f"{source.host}/graft/qwen@{digest}", f"{target.host}/graft/qwen", capsys=capsys)
    assert code == 2 and refusal["field"] == f"referrer {forged_digest}"
    assert f"listed for {digest} (fallback tag), names the subject {other}" in refusal["error"]
    assert _no_manifest(target, "graft/qwen", digest)


def _blob_data(registry: LoopbackRegistry, digest: str) -> Path:
    hexdigest = digest.split(":", 1)[1]
    return registry.dir / "storage/docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


def test_a_blob_whose_bytes_differ_from_its_digest_never_lands_on_the_target(world, tmp_path: Path, capsys) -> None:
    source, target = world["source"], world["target"]
    layer = make_layer(tmp_path, "lonely", {"/data/lonely.bin": os.urandom(200_000)})
    make_image(tmp_path / "lonely", [layer])
    with RegistryClient(source.host) as client:
        pushed = push(tmp_path / "lonely", f"{source.host}/corrupt/img", client=client)
    blob = layer[0]["digest"]
    data = _blob_data(source, blob)
    data.write_bytes(bytes(byte ^ 0xFF for byte in data.read_bytes()))  # same size, other bytes
    code, refusal, _ = _mirror(
        f"{source.host}/corrupt/img@{pushed.digest}", f"{target.host}/corrupt/img", capsys=capsys
    )
    assert code == 2 and refusal["field"] == blob
    assert "hash to sha256:" in refusal["error"] and f"not {blob}" in refusal["error"]
    with RegistryClient(target.host) as client:
        assert not client.has_blob("corrupt/img", blob)
    assert _no_manifest(target, "corrupt/img", pushed.digest)


def test_a_target_tag_holding_another_manifest_is_refused_and_kept(world, tmp_path: Path, capsys) -> None:
    target = world["target"]
    make_image(tmp_path / "other", [make_layer(tmp_path, "other", {"/other": "other\n"})])
    with RegistryClient(target.host) as client:
        other = push(tmp_path / "other", f"{target.host}/taken/qwen:release", client=client).digest
    code, refusal, _ = _mirror(world["image"], f"{target.host}/taken/qwen:release", capsys=capsys)
    assert code == 2 and refusal["field"] == "taken/qwen:release"
    assert f"holds {other}, not {world['digest']}" in refusal["error"]
    with RegistryClient(target.host) as client:
        assert client.manifest_digest("taken/qwen", "release") == other
    assert _no_manifest(target, "taken/qwen", world["digest"])


def test_a_cut_blob_is_resumed_from_the_byte_it_reached(world, capsys) -> None:
    source, target, model = world["source"], world["target"], world["model"]
    host, port = source.host.split(":")
    with FaultProxy((host, int(port)), [Step("cut", after=BIG_BYTES // 2)]) as proxy:
        config = _docker_config(
            Path(os.environ["DOCKER_CONFIG"]).parent,
            {source.host: SOURCE_USER, target.host: TARGET_USER, world["far"].host: FAR_USER, proxy.host: SOURCE_USER},
        )
        assert config == Path(os.environ["DOCKER_CONFIG"])
        code, summary, progress = _mirror(
            f"{proxy.host}/models/tiny@{model.digest}", f"{target.host}/resumed/tiny", capsys=capsys
        )
    assert code == 0, summary
    (copied,) = summary["mirrored"]
    assert copied["resumed_reads"] == 1 and "resuming at byte" in progress
    assert copied["bytes_copied"] > BIG_BYTES
    # Only what was in flight came twice: the cut blob was not read again from its start.
    assert proxy.to_client < copied["bytes_copied"] + BIG_BYTES // 4
    assert verify_artifact(f"{target.host}/resumed/tiny@{model.digest}", world["public"], None)["ok"]


def test_the_offline_directory_round_trip(world, tmp_path: Path, capsys) -> None:
    target = world["far"].host
    directory = tmp_path / "disk"
    code, written, _ = _mirror(
        world["image"], "--to-dir", str(directory), "--pins", str(world["pins_path"]), capsys=capsys
    )
    assert code == 0 and written["bytes_written"] > BIG_BYTES
    assert (directory / RECORD).is_file() and (directory / "oci-layout").is_file()
    # An OCI layout skopeo reads: the model's root by its pinned tag, a legacy tag by its name.
    layout_index = json.loads((directory / "index.json").read_text())
    assert {item["digest"] for item in layout_index["manifests"]} >= {world["digest"], world["model"].digest}
    for name, digest in (("v1", world["model"].digest), (world["digest"].replace(":", "-") + ".sig", None)):
        inspected = run([SKOPEO, "inspect", "--raw", f"oci:{directory}:{name}"])
        assert inspected.returncode == 0, inspected.stderr
        assert digest is None or "sha256:" + hashlib.sha256(inspected.stdout.encode()).hexdigest() == digest
    # Again into the same directory: nothing fetched.
    code, again, _ = _mirror(
        world["image"], "--to-dir", str(directory), "--pins", str(world["pins_path"]), capsys=capsys
    )
    assert code == 0 and again["complete_already"] is True
    args = ["--from-dir", str(directory), f"{target}/offline/qwen:release", "--model-to", f"{target}/offline/tiny"]
    code, pushed, _ = _mirror(*args, "--key", str(world["public"]), "--pins", str(world["pins_path"]), capsys=capsys)
    assert code == 0, pushed
    # Every blob went up from the directory (the empty config to both repositories).
    assert [item["blobs"]["present"] for item in pushed["mirrored"]] == [0, 0]
    assert sum(item["bytes_copied"] for item in pushed["mirrored"]) >= written["bytes_written"]
    assert verify_image(f"{target}/offline/qwen@{world['digest']}", world["public"])["ok"]
    assert verify_artifact(f"{target}/offline/tiny@{world['model'].digest}", world["public"], None)["ok"]
    code, checked, _ = _mirror(*args, "--check", "--key", str(world["public"]), capsys=capsys)
    assert (code, checked["missing"]) == (0, [])


def test_to_dir_resumes_its_own_unfinished_directory_and_refuses_anyone_elses(world, offline, tmp_path, capsys) -> None:
    args = [world["image"], "--pins", str(world["pins_path"])]
    # Stopped before its end: no record, one blob missing, the marker naming this release.
    unfinished = tmp_path / "unfinished"
    shutil.copytree(offline, unfinished)
    record = (unfinished / RECORD).read_bytes()
    (unfinished / RECORD).unlink()
    (unfinished / PARTIAL).write_text(hashlib.sha256(record).hexdigest() + "\n")
    lost = max((unfinished / "blobs" / "sha256").iterdir(), key=lambda path: path.stat().st_size)
    size = lost.stat().st_size
    lost.unlink()
    code, resumed, _ = _mirror(*args, "--to-dir", str(unfinished), capsys=capsys)
    assert code == 0 and resumed["bytes_written"] == size
    assert (unfinished / RECORD).read_bytes() == record and not (unfinished / PARTIAL).exists()
    # Someone else's layout, or another release's unfinished mirror: refused, untouched.
    for name, files in (("theirs", {"oci-layout": "{}", "index.json": "{}"}), ("other", {PARTIAL: "0" * 64})):
        directory = tmp_path / name
        directory.mkdir()
        for file, text in files.items():
            (directory / file).write_text(text)
        code, refusal, _ = _mirror(*args, "--to-dir", str(directory), capsys=capsys)
        assert code == 2 and refusal["field"] == "--to-dir", refusal
        assert {path.name: path.read_text() for path in directory.iterdir()} == files


def _unfinished_with_a_link(offline: Path, directory: Path, victim: Path) -> Path:
    """`offline` copied, unfinished again (its marker planted), its largest blob gone and a link
    to `victim` under that blob's partial name."""
    shutil.copytree(offline, directory)
    record = (directory / RECORD).read_bytes()
    (directory / RECORD).unlink()
    (directory / PARTIAL).write_text(hashlib.sha256(record).hexdigest() + "\n")
    lost = max((directory / "blobs" / "sha256").iterdir(), key=lambda path: path.stat().st_size)
    lost.unlink()
    (lost.parent / f".{lost.name}.partial").symlink_to(victim)
    return lost


def test_to_dir_never_writes_through_a_planted_link(world, offline, tmp_path, capsys) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"the user's own file")
    lost = _unfinished_with_a_link(offline, tmp_path / "planted", victim)
    code, resumed, _ = _mirror(world["image"], "--pins", str(world["pins_path"]), "--to-dir", str(lost.parents[2]),
                               capsys=capsys)  # fmt: skip
    assert code == 0, resumed
    assert victim.read_bytes() == b"the user's own file" and not victim.is_symlink()
    assert lost.is_file() and not lost.is_symlink()
    assert "sha256:" + hashlib.sha256(lost.read_bytes()).hexdigest() == "sha256:" + lost.name


SHARED_DIRECTORIES = [
    ("writable by others", 0o777, None, "writable by group or others without the sticky bit"),
    ("writable by its group", 0o770, None, "writable by group or others without the sticky bit"),
    ("another user's", 0o700, 65534, "is owned by"),
]


@pytest.mark.parametrize(("case", "mode", "owner", "says"), SHARED_DIRECTORIES, ids=[r[0] for r in SHARED_DIRECTORIES])
def test_to_dir_refuses_a_directory_another_user_could_have_planted_in(
    world, offline, tmp_path, capsys, monkeypatch, case, mode, owner, says
) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"the user's own file")
    lost = _unfinished_with_a_link(offline, tmp_path / "shared", victim)
    directory = lost.parents[2]
    directory.chmod(mode)
    if owner is not None:
        owned_by_another_user(directory, monkeypatch, attest.files)
    before = sorted(path.name for path in directory.rglob("*"))
    code, refusal, _ = _mirror(world["image"], "--pins", str(world["pins_path"]), "--to-dir", str(directory),
                               capsys=capsys)  # fmt: skip
    assert code == 2 and refusal["field"] == "--to-dir" and says in refusal["error"], refusal
    assert str(directory) in refusal["error"]
    assert sorted(path.name for path in directory.rglob("*")) == before
    assert victim.read_bytes() == b"the user's own file"


def test_a_planted_record_is_no_proof_of_a_complete_directory(world, offline, tmp_path, capsys) -> None:
    """A copied omni-mirror.json over a directory holding one blob: every missing blob is
    fetched, and the run does not say it was complete already."""
    hollow = tmp_path / "hollow"
    shutil.copytree(offline, hollow)
    blobs = sorted((hollow / "blobs" / "sha256").iterdir(), key=lambda path: path.stat().st_size)
    for blob in blobs[:-1]:
        blob.unlink()
    (blobs[-1]).write_bytes(b"not the blob")  # the one left is wrong as well
    code, written, _ = _mirror(world["image"], "--pins", str(world["pins_path"]), "--to-dir", str(hollow),
                               capsys=capsys)  # fmt: skip
    assert code == 0 and written["complete_already"] is False and written["bytes_written"] > BIG_BYTES
    for blob in (hollow / "blobs" / "sha256").iterdir():
        assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == "sha256:" + blob.name


def test_an_oversized_record_is_refused_unread(world, tmp_path, capsys) -> None:
    directory = tmp_path / "big-record"
    directory.mkdir(mode=0o700)
    with open(directory / RECORD, "wb") as handle:
        handle.truncate(768 << 20)  # sparse: nothing to read but its size
    code, refusal, _ = _mirror(world["image"], "--pins", str(world["pins_path"]), "--to-dir", str(directory),
                               capsys=capsys)  # fmt: skip
    assert code == 2 and "at most" in refusal["error"] and RECORD in refusal["error"], refusal


def _tampered(directory: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "tampered"
    shutil.copytree(directory, copy)
    change(copy)
    return copy


@pytest.fixture(scope="module")
def offline(world, tmp_path_factory):
    directory = tmp_path_factory.mktemp("offline") / "disk"
    assert main(["mirror", world["image"], "--to-dir", str(directory), "--pins", str(world["pins_path"])]) == 0
    return directory


def _record_edit(edit):
    def change(directory: Path) -> None:
        record = json.loads((directory / RECORD).read_text())
        edit(record)
        (directory / RECORD).write_text(json.dumps(record))

    return change


def _flip_big_blob(directory: Path) -> None:
    biggest = max((directory / "blobs" / "sha256").iterdir(), key=lambda path: path.stat().st_size)
    data = bytearray(biggest.read_bytes())
    data[-1] ^= 1
    biggest.write_bytes(bytes(data))


def _link_a_manifest(directory: Path) -> None:
    record = json.loads((directory / RECORD).read_text())
    path = directory / "blobs" / "sha256" / record["closures"][0]["root"].split(":")[1]
    outside = directory.parent / "outside.json"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)


def _fifo_for_a_blob(directory: Path) -> None:
    biggest = max((directory / "blobs" / "sha256").iterdir(), key=lambda path: path.stat().st_size)
    biggest.unlink()
    os.mkfifo(biggest)


TAMPERED = [
    ("a layer's bytes changed", _flip_big_blob, "hash to sha256:"),
    (
        "a blob listed that no manifest names",
        _record_edit(lambda r: r["closures"][0]["blobs"].append({"digest": "sha256:" + "d" * 64, "size": 1})),
        "is listed but named by no manifest",
    ),
    (
        "a referrer recorded for another subject",
        _record_edit(
            lambda r: next(m for m in r["closures"][0]["manifests"] if m["kind"] == "referrer").update(
                subject=r["closures"][1]["root"]
            )
        ),
        "comes nowhere before it",
    ),
    (
        "a legacy tag that is not its subject's",
        _record_edit(
            lambda r: next(m for m in r["closures"][0]["manifests"] if m["kind"] == "legacy").update(tag="latest")
        ),
        "is not a legacy tag of",
    ),
    ("an unknown field", _record_edit(lambda r: r.update(extra=1)), "unknown field"),
    ("a manifest through a link", _link_a_manifest, "symlink"),
    # Issue #68: the disk chooses no tag, and a FIFO in place of a blob never blocks the run.
    (
        "a model tag computed from a digest",
        _record_edit(lambda r: r["closures"][1].update(tags=["sha256-" + r["closures"][1]["root"][7:]])),
        "computed from a digest",
    ),
    (
        "a model tag that climbs into another repository",
        _record_edit(lambda r: r["closures"][1].update(tags=["../../../x/manifests/evil"])),
        "closures.1.tags.0",
    ),
    (
        "a percent-encoded model tag",
        _record_edit(lambda r: r["closures"][1].update(tags=["%2e%2e"])),
        "closures.1.tags.0",
    ),
    ("a tag on the image's closure", _record_edit(lambda r: r["closures"][0].update(tags=["latest"])), "the target's"),
    ("a FIFO in place of a blob", _fifo_for_a_blob, "not a regular file"),
    ("no record", lambda d: (d / RECORD).unlink(), "holds no omni-mirror.json"),
]


@pytest.mark.parametrize(("case", "change", "says"), TAMPERED, ids=[row[0] for row in TAMPERED])
def test_a_tampered_offline_directory_is_refused_and_leaves_no_manifest(
    world, offline, tmp_path: Path, capsys, case, change, says
) -> None:
    target = world["far"]  # none of the release's blobs in these repositories
    directory = _tampered(offline, tmp_path, change)
    repository = f"tampered/{len(case)}"
    code, refusal, _ = _mirror(
        "--from-dir",
        str(directory),
        f"{target.host}/{repository}",
        "--model-to",
        f"{target.host}/{repository}-model",
        capsys=capsys,
    )
    assert code == 2 and says in refusal["error"], refusal
    assert _no_manifest(target, repository, world["digest"])


def test_with_pins_the_disk_tags_the_model_only_as_the_pin_does(world, offline, tmp_path: Path, capsys) -> None:
    directory = _tampered(offline, tmp_path, _record_edit(lambda r: r["closures"][1].update(tags=["latest"])))
    target = world["far"]
    code, refusal, _ = _mirror("--from-dir", str(directory), f"{target.host}/pinned/qwen", "--model-to",
                               f"{target.host}/pinned/tiny", "--pins", str(world["pins_path"]), capsys=capsys)  # fmt: skip
    assert code == 2 and refusal["field"] == "model.artifact.tag" and "['latest']" in refusal["error"], refusal
    assert _no_manifest(target, "pinned/qwen", world["digest"])


def test_check_names_a_missing_bundle(world, capsys) -> None:
    target = world["target"]
    code, _, _ = _mirror(world["image"], f"{target.host}/checked/qwen", capsys=capsys)
    assert code == 0
    with RegistryClient(target.host) as client:
        listing = json.loads(client.manifest("checked/qwen", world["digest"].replace(":", "-"))[0])
        provenance = next(
            item
            for item in listing["manifests"]
            if item.get("annotations", {}).get("dev.sigstore.bundle.predicateType") == "https://slsa.dev/provenance/v1"
        )
    deleted = httpx.delete(
        f"http://{target.host}/v2/checked/qwen/manifests/{provenance['digest']}", auth=TARGET_USER, timeout=30
    )
    assert deleted.status_code == 202, deleted.text
    code, checked, _ = _mirror(world["image"], f"{target.host}/checked/qwen", "--check", capsys=capsys)
    assert code == 1 and checked["ok"] is False
    assert checked["missing"] == [
        f"{target.host}/checked/qwen: bundle {provenance['digest']} (https://slsa.dev/provenance/v1) of "
        f"{world['digest']} is missing"
    ]
    # Mirrored on from there, the stale listing is left out and said so; with --key the source is
    # refused, naming the bundle its listing promises and it does not hold.
    stale = f"{target.host}/checked/qwen@{world['digest']}"
    code, copied, progress = _mirror(stale, f"{world['far'].host}/stale/qwen", capsys=capsys)
    assert code == 0 and f"referrer {provenance['digest']}" in progress and "a stale listing" in progress
    code, refusal, _ = _mirror(stale, f"{world['far'].host}/stale/qwen", "--key", str(world["public"]), capsys=capsys)
    assert code == 2 and refusal["field"] == "--key" and provenance["digest"] in refusal["error"], refusal
    assert "the source does not verify" in refusal["error"]


def test_pins_of_another_build_are_refused_naming_the_pin(world, tmp_path: Path, capsys) -> None:
    pins = json.loads(world["pins_path"].read_text())
    pins["engine"]["commit"] = "b" * 40
    other = tmp_path / "other.pins.json"
    other.write_text(json.dumps(pins))
    code, refusal, _ = _mirror(
        world["image"], f"{world['target'].host}/other/qwen", "--pins", str(other), capsys=capsys
    )
    assert code == 2 and refusal["field"] == "--pins"
    assert "engine.commit is" in refusal["error"] and "b" * 40 in refusal["error"]
    assert _no_manifest(world["target"], "other/qwen", world["digest"])


def test_another_key_is_refused_on_the_source_before_anything_is_written(world, tmp_path: Path, capsys) -> None:
    _, other = key_pair(tmp_path, "other")
    code, refusal, _ = _mirror(world["image"], f"{world['target'].host}/keyed/qwen", "--key", str(other), capsys=capsys)
    assert code == 2 and refusal["field"] == "--key" and "the source does not verify" in refusal["error"]
    assert _no_manifest(world["target"], "keyed/qwen", world["digest"])


BAD_ARGUMENTS = [
    ((), "references"),
    (("127.0.0.1:1/omni/qwen:tag", "127.0.0.1:2/omni/qwen"), "SOURCE"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/omni/qwen@sha256:" + "a" * 64), "TARGET"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "--to-dir", "d", "--check"), "--check"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/x", "--jobs", "0"), "--jobs"),
    (("--from-dir", "d"), "references"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/x", "--jobs", "65"), "--jobs"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/x", "--key", "/nonexistent.pub"), "--key"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/x", "--model-to", "127.0.0.1:2/m:tag"), "--model-to"),
    (("127.0.0.1:1/omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/x", "--pins", "/nonexistent.json"), "--pins"),
    (("127.0.0.1:1/Omni/qwen@sha256:" + "a" * 64, "127.0.0.1:2/x"), "SOURCE"),
]


@pytest.mark.parametrize(("args", "field"), BAD_ARGUMENTS)
def test_bad_arguments_are_refused_before_any_request(args, field, capsys) -> None:
    code, refusal, _ = _mirror(*args, capsys=capsys)
    assert code == 2 and refusal["field"] == field, refusal


def test_help_names_every_mode() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.release.cli", "mirror", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    for mode in ("--to-dir", "--from-dir", "--check", "--pins", "--model-to", "--key", "--deadline"):
        assert mode in done.stdout


def test_an_index_arrives_with_every_platform_and_each_ones_referrers(world, tmp_path: Path, capsys) -> None:
    source, target = world["source"], world["target"]
    images = []
    for name, platform in (("amd", {"architecture": "amd64"}), ("arm", {"architecture": "arm64"})):
        layer = make_layer(tmp_path, name, {f"/{name}": name})
        make_image(tmp_path / name, [layer], os="linux", entrypoint=["/bin/true"], **platform)
        images.append(tmp_path / name)
    write_index(tmp_path / "index", images)
    arm_digest = read_layout(tmp_path / "arm")[0]
    private, public = key_pair(tmp_path, "index")
    key = load_private_key(private)
    with RegistryClient(source.host) as client:
        pushed = push(tmp_path / "index", f"{source.host}/multi/img", client=client)
        index_bytes = client.manifest("multi/img", pushed.digest)[0]
        push_signatures(client, "multi/img", descriptor(OCI_INDEX, index_bytes), key)
        arm = descriptor(OCI_MANIFEST, client.manifest("multi/img", arm_digest)[0])
        note = push_referrer(client, "multi/img", arm, "application/vnd.example.note", b"arm", "text/plain")
    reference = f"{source.host}/multi/img@{pushed.digest}"
    code, summary, _ = _mirror(reference, f"{target.host}/multi/img:2", capsys=capsys)
    assert code == 0, summary
    with RegistryClient(target.host) as client:
        for digest in (pushed.digest, arm_digest, read_layout(tmp_path / "amd")[0], note):
            assert client.manifest_digest("multi/img", digest) == digest
        assert client.manifest_digest("multi/img", "2") == pushed.digest
        assert client.manifest_digest("multi/img", pushed.digest.replace(":", "-") + ".sig") is not None
    code, checked, _ = _mirror(reference, f"{target.host}/multi/img:2", "--check", capsys=capsys)
    assert (code, checked["missing"]) == (0, [])
    code, checked, _ = _mirror(reference, f"{target.host}/multi/img:2", "--check", "--key", str(public), capsys=capsys)
    assert (code, checked["missing"]) == (0, []), checked  # the index's own signature verifies
    _, other = key_pair(tmp_path, "other")
    code, checked, _ = _mirror(reference, f"{target.host}/multi/img:2", "--check", "--key", str(other), capsys=capsys)
    assert code == 2 and checked["field"] == "--key" and "the source does not verify" in checked["error"]


def test_the_deadline_bounds_the_whole_mirror(world, capsys) -> None:
    code, refusal, _ = _mirror(world["image"], f"{world['target'].host}/late/qwen", "--deadline", "1e-6", capsys=capsys)
    assert code == 2 and refusal["field"] == "deadline" and "passed its deadline" in refusal["error"]
    assert _no_manifest(world["target"], "late/qwen", world["digest"])
