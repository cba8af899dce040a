"""The local runtime base from pinned Debian packages: reproducible, refusing tampered
packages, runnable (the image entrypoints run for real in a chroot of the unpacked
rootfs), and described by an SPDX SBOM that spdx-tools accepts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from omni_oci.format.errors import OciError
from omni_oci.format.layout import read_blob, read_layout
from omni_oci.remote.referrers import referrers
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.oci import UMOCI, blobs_of, run, writable_copy
from tests.fixtures.qwen import TARGET_REVISION, attest_checkpoint, make_checkpoint, make_fake_vllm
from tests.fixtures.registry import LoopbackRegistry
from tools.debian.rootfs import build

LOCK = json.loads(Path("images/debian.lock.json").read_text())
DEBS = {arch: Path(os.environ[f"DEBS_{arch.upper()}"].split()[0]).parent for arch in ("amd64", "arm64")}
WHEELS = {arch: json.loads(Path(os.environ[f"WHEELS_{arch.upper()}"]).read_text()) for arch in ("amd64", "arm64")}


def _unpack(name: str, tmp_path: Path) -> tuple[Path, list[str]]:
    if os.geteuid() != 0:
        pytest.skip(
            f"running an image's rootfs needs root (umoci unpack and chroot); this test runs as uid {os.geteuid()}"
        )
    layout = writable_copy(Path("images") / f"{name}.layout", tmp_path / "layout")
    bundle = tmp_path / "bundle"
    # --rootless: inside Bazel's sandbox uid 1000 (/state's owner) is not mapped; ownership does not
    # matter for running the entrypoint.
    unpacked = run([UMOCI, "unpack", "--rootless", "--image", f"{layout}:latest", str(bundle)])
    assert unpacked.returncode == 0, unpacked.stderr
    _, manifest, _ = read_layout(layout)
    config = json.loads(read_blob(layout, manifest["config"]["digest"]))["config"]
    return bundle / "rootfs", config["Entrypoint"]


def _chroot(rootfs: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/usr/sbin/chroot", str(rootfs), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_launcher_entrypoint_fails_closed_without_a_model(tmp_path: Path) -> None:
    rootfs, entrypoint = _unpack("qwen_mi300x", tmp_path)
    completed = _chroot(rootfs, [*entrypoint, "--inspect-only"], {})
    assert completed.returncode == 2, completed.stderr
    assert json.loads(completed.stderr) == {
        "ok": False,
        "field": "MODEL_PATH",
        "error": "MODEL_PATH does not exist: /models/qwen (MODEL_PATH is unset; its default /models/qwen was used)",
    }


def test_launcher_entrypoint_decides_with_a_checkpoint_and_an_installed_vllm(tmp_path: Path) -> None:
    rootfs, entrypoint = _unpack("qwen_mi300x", tmp_path)
    make_checkpoint(rootfs / "models" / "qwen")
    digest = attest_checkpoint(rootfs / "models" / "qwen")
    make_fake_vllm(rootfs / "usr" / "local" / "lib" / "python3.11" / "dist-packages")
    completed = _chroot(
        rootfs,
        [*entrypoint, "--inspect-only"],
        {
            "MODEL_ID": "Qwen/Qwen3.8-27B",
            "MODEL_REVISION": TARGET_REVISION,
            "QWEN_CHECKPOINT_MANIFEST_SHA256": digest,
            "QWEN_API_KEY": "k-chroot",
        },
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["decision"]["mode"] == "native_mtp"
    assert report["vllm"]["package_root"] == "/usr/local/lib/python3.11/dist-packages/vllm"
    assert report["server_argv"][:4] == ["/usr/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve"]


def test_boot_entrypoint_prints_its_usage(tmp_path: Path) -> None:
    rootfs, entrypoint = _unpack("deepseek_spark_amd64_test", tmp_path)
    completed = _chroot(rootfs, [*entrypoint, "--help"], {})
    assert completed.returncode == 0, completed.stderr
    assert "Commands:" in completed.stdout and "prepare" in completed.stdout


def test_rootfs_has_packages_records_certificates_and_users(tmp_path: Path) -> None:
    descriptor, packages = build(
        LOCK,
        "amd64",
        DEBS["amd64"],
        Path("images/local_base/passwd"),
        Path("images/local_base/group"),
        tmp_path / "base.tar.gz",
    )
    assert [p["name"] for p in packages] == [p["name"] for p in LOCK["packages"]["amd64"]]
    import tarfile

    with tarfile.open(tmp_path / "base.tar.gz") as tar:
        names = set(tar.getnames())
        for package in packages:
            assert f"var/lib/dpkg/status.d/{package['name']}" in names
        status = tar.extractfile("var/lib/dpkg/status.d/python3-minimal").read().decode()
        assert status.startswith("Package: python3-minimal\nStatus: install ok installed\n")
        assert tar.extractfile("etc/ssl/certs/ca-certificates.crt").read().count(b"BEGIN CERTIFICATE") > 100
        assert b"omni:x:1000:1000" in tar.extractfile("etc/passwd").read()
        state = tar.getmember("state")
        assert (state.uid, state.gid, oct(state.mode)) == (1000, 1000, "0o755")
        assert "usr/bin/python3" in names and "usr/share/zoneinfo/UTC" in names


def test_two_builds_give_the_bazel_built_base_digest(tmp_path: Path) -> None:
    [descriptor] = [p for p in os.environ["BASE_LAYER_AMD64"].split() if p.endswith(".layer.json")]
    bazel_built = json.loads(Path(descriptor).read_text())
    first, _ = build(
        LOCK,
        "amd64",
        DEBS["amd64"],
        Path("images/local_base/passwd"),
        Path("images/local_base/group"),
        tmp_path / "one.tar.gz",
    )
    second, _ = build(
        LOCK,
        "amd64",
        DEBS["amd64"],
        Path("images/local_base/passwd"),
        Path("images/local_base/group"),
        tmp_path / "two.tar.gz",
    )
    assert first == second == bazel_built


def test_a_package_that_does_not_match_the_lock_is_refused(tmp_path: Path) -> None:
    debs = tmp_path / "debs"
    shutil.copytree(DEBS["amd64"], debs)
    victim = debs / "zlib1g_amd64.deb"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))
    with pytest.raises(OciError, match="zlib1g_amd64.deb: downloaded bytes do not match the lock"):
        build(
            LOCK,
            "amd64",
            debs,
            Path("images/local_base/passwd"),
            Path("images/local_base/group"),
            tmp_path / "base.tar.gz",
        )


@pytest.mark.parametrize("name,arch", [("qwen_mi300x", "amd64"), ("deepseek_spark", "arm64")])
def test_sbom_lists_every_package_and_wheel_and_validates(name: str, arch: str) -> None:
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    path = Path("images") / f"{name}.spdx.json"
    sbom = json.loads(path.read_text())
    debs = [p for p in sbom["packages"] if p["SPDXID"].startswith("SPDXRef-deb-")]
    wheels = [p for p in sbom["packages"] if p["SPDXID"].startswith("SPDXRef-pypi-")]
    assert len(debs) == len(LOCK["packages"][arch]) == 31
    assert len(wheels) == len(WHEELS[arch]) and len(wheels) >= 15
    names = {p["name"] for p in sbom["packages"]}
    assert {"python3-minimal", "libc6", "ca-certificates", "tzdata", "pydantic", "httpx", "pillow"} <= names
    assert sbom["packages"][0]["versionInfo"] == blobs_of(Path("images") / f"{name}.layout")["digest"]
    errors = validate_full_spdx_document(parse_file(str(path)))
    assert errors == [], [e.validation_message for e in errors][:5]


def test_push_sends_the_sbom_as_an_artifact_referring_to_the_image(tmp_path: Path) -> None:
    runner = Path("images/qwen_mi300x.run.sh").resolve()
    with LoopbackRegistry() as registry:
        completed = subprocess.run(
            [str(runner), "--unsigned", "--push", f"{registry.host}/omni/qwen"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path)},
        )
        assert completed.returncode == 0, completed.stderr
        digest = blobs_of(Path("images/qwen_mi300x.layout"))["digest"]
        with RegistryClient(registry.host) as client:
            listed, how = referrers(client, "omni/qwen", digest)
            [sbom_entry] = [item for item in listed if item.get("artifactType") == "application/spdx+json"]
            artifact = json.loads(client.manifest("omni/qwen", sbom_entry["digest"])[0])
            assert artifact["subject"]["digest"] == digest
            payload = client.blob("omni/qwen", artifact["layers"][0]["digest"])
    assert payload == Path("images/qwen_mi300x.spdx.json").read_bytes()
    assert how in ("api", "tag")


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, data in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    return out


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _one_package_lock(debs: Path, compression: str) -> dict:
    """A lock of one .deb (written into `debs`) whose data archive is compressed `compression`."""
    import hashlib
    import lzma

    import zstandard

    copyright_file = (
        b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
        b"Files: *\nCopyright: 2024 Omni\nLicense: Expat\n"
    )
    data_tar = _tar(
        {"./usr/share/doc/omni-test/hello.txt": b"hello\n", "./usr/share/doc/omni-test/copyright": copyright_file}
    )
    data = lzma.compress(data_tar) if compression == "xz" else zstandard.ZstdCompressor().compress(data_tar)
    control = _tar({"./control": b"Package: omni-test\nVersion: 1.0-1\nArchitecture: amd64\n"})
    deb = _ar({"debian-binary": b"2.0\n", "control.tar.xz": lzma.compress(control), f"data.tar.{compression}": data})
    debs.mkdir()
    (debs / "omni-test_amd64.deb").write_bytes(deb)
    entry = {"name": "omni-test", "version": "1.0-1", "architecture": "amd64"}
    entry |= {"sha256": hashlib.sha256(deb).hexdigest(), "size": len(deb), "urls": []}
    return {"release": "trixie", "packages": {"amd64": [entry]}}


@pytest.mark.parametrize("compression", ["xz", "zst"])
def test_data_archives_in_xz_and_zstd_are_unpacked(tmp_path: Path, compression: str) -> None:
    lock = _one_package_lock(tmp_path / "debs", compression)
    _, packages = build(
        lock,
        "amd64",
        tmp_path / "debs",
        Path("images/local_base/passwd"),
        Path("images/local_base/group"),
        tmp_path / "layer.tar.gz",
    )
    import tarfile

    with tarfile.open(tmp_path / "layer.tar.gz") as tar:
        assert tar.extractfile("usr/share/doc/omni-test/hello.txt").read() == b"hello\n"
        assert "var/lib/dpkg/status.d/omni-test" in tar.getnames()
        # Scanners identify the distribution by /etc/os-release (base-files' file, written here).
        assert tar.getmember("etc/os-release").linkname == "../usr/lib/os-release"
        os_release = tar.extractfile("usr/lib/os-release").read().decode()
        assert 'VERSION_ID="13"' in os_release and "ID=debian\n" in os_release
    assert packages == [
        {
            "name": "omni-test",
            "version": "1.0-1",
            "architecture": "amd64",
            "sha256": lock["packages"]["amd64"][0]["sha256"],
            "licenses": ["Expat"],  # the SBOM's facts (tools/debian/copyright.py)
            "copyright": ["Copyright 2024 Omni"],
            "license_texts": {},
            "vendor": "debian",
            "distro": "debian-13",  # the purl's, from the lock's release
        }
    ]


def test_a_lock_of_an_unknown_release_is_refused_before_any_package(tmp_path: Path) -> None:
    from omni_oci.format.errors import OciError

    lock = {"release": "sid", "packages": {"amd64": [{"name": "x", "version": "1", "architecture": "amd64"}]}}
    with pytest.raises(OciError, match=r"release 'sid' is none of \['bookworm', 'trixie'\]") as caught:
        build(
            lock, "amd64", tmp_path, Path("images/local_base/passwd"), Path("images/local_base/group"), tmp_path / "l"
        )
    assert caught.value.field == "release" and not (tmp_path / "l").exists()
