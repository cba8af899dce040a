"""The Bazel-built images, checked by independent validators: skopeo inspect, umoci
unpack (files and modes in the rootfs), and crane validate after a push to a loopback
registry; `bazel run`'s summary, archive and push."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from omni_oci.format.layout import read_blob, read_layout
from omni_oci.format.tar_members import extract_all
from omni_oci.format.tar_reader import TarStream
from tests.fixtures.oci import SKOPEO, UMOCI, blobs_of, crane, run, writable_copy
from tests.fixtures.registry import LoopbackRegistry

IMAGES = {
    "qwen_mi300x": {"arch": "amd64", "module": "launcher", "machine": "x86_64"},
    "deepseek_spark": {"arch": "arm64", "module": "boot", "machine": "aarch64"},
}


def _layout(name: str) -> Path:
    # oci_image writes <name>.layout beside its BUILD file; runfiles mirror that.
    return Path("images") / f"{name}.layout"


@pytest.mark.parametrize("name", IMAGES)
def test_skopeo_reads_the_layout(tmp_path: Path, name: str) -> None:
    layout = writable_copy(_layout(name), tmp_path / "layout")
    inspected = run([SKOPEO, "inspect", f"oci:{layout}:latest"])
    assert inspected.returncode == 0, inspected.stderr
    info = json.loads(inspected.stdout)
    assert info["Digest"] == blobs_of(layout)["digest"]
    assert info["Architecture"] == IMAGES[name]["arch"] and info["Os"] == "linux"
    assert info["Labels"]["omni.base"] == "omni-debian-bookworm"
    config = run([SKOPEO, "inspect", "--config", f"oci:{layout}:latest"])
    entrypoint = json.loads(config.stdout)["config"]["Entrypoint"]
    assert entrypoint == ["/usr/bin/python3", "-I", "-S", "/opt/omni/bin/omni-run", IMAGES[name]["module"]]


@pytest.mark.parametrize("name", IMAGES)
def test_umoci_unpacks_the_expected_files_and_modes(tmp_path: Path, name: str) -> None:
    layout = writable_copy(_layout(name), tmp_path / "layout")
    bundle = tmp_path / "bundle"
    unpacked = run([UMOCI, "unpack", "--rootless", "--image", f"{layout}:latest", str(bundle)])
    assert unpacked.returncode == 0, unpacked.stderr
    rootfs = bundle / "rootfs"
    module = IMAGES[name]["module"]
    modes = {
        f"opt/omni/app/{module}/__init__.py": 0o644,
        "opt/omni/app/attest/documents.py": 0o644,
        "opt/omni/bin/omni-run": 0o755,
        "opt/omni/site-packages/pydantic/__init__.py": 0o644,
        "etc/passwd": 0o644,
    }
    for path, mode in modes.items():
        assert stat.S_IMODE((rootfs / path).stat().st_mode) == mode, path
    assert stat.S_IMODE((rootfs / "tmp").stat().st_mode) == 0o1777
    assert "omni:x:1000:1000" in (rootfs / "etc/passwd").read_text()
    native = list((rootfs / "opt/omni/site-packages/pydantic_core").glob("*.so"))
    assert native and IMAGES[name]["machine"] in native[0].name
    assert not list(rootfs.rglob("*.pyc")) and not list(rootfs.rglob("BUILD.bazel"))
    # Nothing of the build machine leaks in (pip's direct_url.json names the output base).
    assert not list((rootfs / "opt/omni/site-packages").glob("*.dist-info/direct_url.json"))
    assert not (rootfs / "opt/omni/app/tests").exists()
    other = "boot" if module == "launcher" else "launcher"
    assert not (rootfs / "opt/omni/app" / other).exists()


def test_bazel_run_summary_archive_and_push(tmp_path: Path) -> None:
    runner = Path("images/qwen_mi300x.run.sh").resolve()
    env = {**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path)}
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [
                str(runner),
                "--archive",
                "qwen.tar",
                "--output",
                "layout-copy",
                "--unsigned",
                "--push",
                f"{registry.host}/omni/qwen_mi300x:dev",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert completed.returncode == 0, completed.stderr
        digest = blobs_of(_layout("qwen_mi300x"))["digest"]
        lines = completed.stdout.splitlines()
        assert lines[0] == f"//images:qwen_mi300x  {digest}"
        assert "base: omni-debian-bookworm (built locally, complete)" in lines
        assert lines[-1] == f"{registry.host}/omni/qwen_mi300x@{digest}"
        assert f"UNSIGNED: {lines[-1]} was pushed without signatures (--unsigned)" in completed.stderr
        assert crane("validate", "--remote", lines[-1]).returncode == 0
        assert crane("digest", f"{registry.host}/omni/qwen_mi300x:dev").stdout.strip() == digest
    assert blobs_of(tmp_path / "layout-copy")["digest"] == digest
    listing = run(["tar", "-tf", str(tmp_path / "qwen.tar")]).stdout.split()
    assert "index.json" in listing and f"blobs/sha256/{digest.split(':')[1]}" in listing


def test_push_target_pushes_by_digest(tmp_path: Path) -> None:
    runner = Path("images/deepseek_spark_push.push.sh").resolve()
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [str(runner), "--unsigned", "--push", f"{registry.host}/omni/spark"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path)},
        )
        assert completed.returncode == 0, completed.stderr
        digest = blobs_of(_layout("deepseek_spark"))["digest"]
        assert completed.stdout.splitlines()[-1] == f"{registry.host}/omni/spark@{digest}"
        manifest = json.loads(crane("manifest", f"{registry.host}/omni/spark@{digest}").stdout)
        config = json.loads(crane("config", f"{registry.host}/omni/spark@{digest}").stdout)
        assert config["architecture"] == "arm64" and len(manifest["layers"]) == 5
        assert manifest["layers"][-1]["annotations"] == {"org.opencontainers.image.title": "/etc/omni/image.json"}


def test_the_push_target_tags_from_its_list_and_the_stamped_commit(tmp_path: Path) -> None:
    runner = Path("images/qwen_mi300x_push.push.sh").resolve()
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [str(runner), "--unsigned", "--push", f"{registry.host}/omni/qwen", "--tag", "extra"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path)},
        )
        assert completed.returncode == 0, completed.stderr
        tags = sorted(crane("ls", f"{registry.host}/omni/qwen").stdout.split())
        stamped = [tag for tag in tags if tag.startswith("git-")]
        assert sorted(set(tags) - set(stamped)) == ["extra", "latest"] and len(stamped) == 1
        assert re.fullmatch(r"git-([0-9a-f]{40}|unknown)", stamped[0]), tags
        digest = blobs_of(_layout("qwen_mi300x"))["digest"]
        assert {crane("digest", f"{registry.host}/omni/qwen:{tag}").stdout.strip() for tag in tags} == {digest}
        assert f"tagged: {registry.host}/omni/qwen:latest" in completed.stderr


def test_push_without_a_key_or_unsigned_flag_is_refused_before_anything_is_pushed(tmp_path: Path) -> None:
    runner = Path("images/qwen_mi300x.run.sh").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_SIGNING_KEY")}
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [str(runner), "--push", f"{registry.host}/omni/nokey"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, "BUILD_WORKING_DIRECTORY": str(tmp_path)},
        )
        assert completed.returncode == 2
        assert "no signing key: set OMNI_SIGNING_KEY_FILE" in completed.stderr
        assert crane("ls", f"{registry.host}/omni/nokey").stdout.strip() == ""


def test_the_load_tarballs_are_read_back_by_skopeo_with_the_same_rootfs(tmp_path: Path) -> None:
    """docker-archive (what `docker load` reads) and OCI archive: skopeo reads both; the
    docker-archive's layers are the image's own blobs and its rootfs unpacks identically."""
    layout = _layout("qwen_mi300x")
    digest, manifest = blobs_of(layout)["digest"], json.loads((layout / "index.json").read_text())
    image_manifest = json.loads((layout / "blobs/sha256" / digest.split(":")[1]).read_text())
    docker = Path("images/qwen_mi300x_load.tar")
    with tarfile.open(docker) as tar:
        names = json.loads(tar.extractfile("manifest.json").read())
    assert names[0]["RepoTags"] == ["omni/qwen_mi300x:latest"]
    # skopeo describes a docker-archive by its uncompressed layers: the image's diff_ids.
    config = json.loads((layout / "blobs/sha256" / image_manifest["config"]["digest"].split(":")[1]).read_text())
    inspected = json.loads(run([SKOPEO, "inspect", f"docker-archive:{docker}"]).stdout)
    assert inspected["Layers"] == config["rootfs"]["diff_ids"] and len(inspected["Layers"]) == 5
    # skopeo unpacks an oci-archive under /var/tmp (read-only in Bazel's sandbox): unpacked here instead.
    with open("images/qwen_mi300x_load_oci.tar", "rb") as tar:
        extract_all(TarStream.of_file(tar), tmp_path / "oci-archive", source="images/qwen_mi300x_load_oci.tar")
    inspected_oci = run([SKOPEO, "inspect", f"oci:{tmp_path / 'oci-archive'}:omni/qwen_mi300x:latest"])
    assert inspected_oci.returncode == 0, inspected_oci.stderr
    oci = json.loads(inspected_oci.stdout)
    assert oci["Digest"] == digest and manifest["manifests"][0]["digest"] == digest
    copied = run([SKOPEO, "copy", f"docker-archive:{docker}", f"oci:{tmp_path / 'from-docker'}:latest"])
    assert copied.returncode == 0, copied.stderr
    listings = []
    for source, name in (
        (writable_copy(layout, tmp_path / "original"), "original"),
        (tmp_path / "from-docker", "from-docker"),
    ):
        unpacked = run(
            [UMOCI, "raw", "unpack", "--rootless", "--image", f"{source}:latest", str(tmp_path / f"{name}-rootfs")]
        )
        assert unpacked.returncode == 0, unpacked.stderr
        root = tmp_path / f"{name}-rootfs"
        listings.append(
            sorted(
                (
                    str(p.relative_to(root)),
                    p.lstat().st_mode,
                    p.read_bytes() if p.is_file() and not p.is_symlink() else None,
                )
                for p in root.rglob("*")
            )
        )
    assert listings[0] == listings[1]


def test_the_local_base_index_is_pushed_signed_and_verified_as_one_digest(tmp_path: Path) -> None:
    from tests.fixtures.pins import key_pair

    key, public = key_pair(tmp_path, "signer")
    runner = Path("images/local_base_push.push.sh").resolve()
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [str(runner), "--push", f"{registry.host}/omni/base", "--signing-key", str(key)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path)},
        )
        assert completed.returncode == 0, completed.stderr
        reference = completed.stdout.splitlines()[-1]
        digest = reference.split("@")[1]
        assert digest == Path("images/local_base.digest").read_text().strip()
        index = json.loads(crane("manifest", reference).stdout)
        assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
        assert [(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]] == [
            ("linux", "amd64"),
            ("linux", "arm64"),
        ]
        raw = json.loads(run([SKOPEO, "inspect", "--tls-verify=false", "--raw", f"docker://{reference}"]).stdout)
        assert raw == index
        for arch in ("amd64", "arm64"):
            config = json.loads(
                crane("config", "--platform", f"linux/{arch}", f"{registry.host}/omni/base:bookworm").stdout
            )
            assert config["architecture"] == arch
        cosign = run(
            [
                "/usr/bin/cosign",
                "verify",
                "--key",
                str(public),
                "--allow-http-registry",
                "--insecure-ignore-tlog=true",
                reference,
            ]
        )
        assert cosign.returncode == 0, cosign.stderr


def test_a_generic_oci_image_takes_tars_other_rules_made() -> None:
    """rules_oci's `tars`: the genrule's tar (owner 1234, a 2023 mtime) becomes one normalised layer."""
    layout = Path("tests/oci/tar_image.layout")
    _, manifest, _ = read_layout(layout)
    with tarfile.open(fileobj=io.BytesIO(read_blob(layout, manifest["layers"][-1]["digest"]))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("etc/hello.txt").read() == b"hello\n"
    assert {(m.uid, m.mtime) for m in members.values()} == {(0, 0)}
    config = json.loads(read_blob(layout, manifest["config"]["digest"]))
    assert config["history"][-1]["created_by"] == "omni: tests/oci/sample.tar"


def test_each_platform_of_an_index_carries_its_own_native_wheels() -> None:
    """The wheels follow the platform: in the amd64 image pydantic_core's extension is an x86-64
    ELF, in the arm64 image an AArch64 one (ELF e_machine 62 and 183)."""
    layout = Path("tests/oci/spark_multiarch.layout")
    index = json.loads(read_blob(layout, json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]))
    machines = {}
    for entry in index["manifests"]:
        manifest = json.loads(read_blob(layout, entry["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(read_blob(layout, layer["digest"]))) as tar:
                for member in tar.getmembers():
                    if member.name.startswith(
                        "opt/omni/site-packages/pydantic_core/_pydantic_core"
                    ) and member.name.endswith(".so"):
                        header = tar.extractfile(member).read(20)
                        machines[entry["platform"]["architecture"]] = (
                            member.name,
                            int.from_bytes(header[18:20], "little"),
                        )
    assert {arch: machine for arch, (_, machine) in machines.items()} == {"amd64": 62, "arm64": 183}, machines
    assert "x86_64" in machines["amd64"][0] and "aarch64" in machines["arm64"][0]
