"""`bazel run //images:<image> -- ...` never deletes what it did not write, resolves paths
where the user typed them, says what was built, and refuses a shallow archive unless asked."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from unittest import mock

import pytest

from omni_oci.format.layout import BASE_SIDECAR
from tests.fixtures.oci import make_image, make_layer
from tools.oci import run_image


@pytest.fixture()
def layout(tmp_path: Path) -> Path:
    make_image(tmp_path / "built", [make_layer(tmp_path, "app", {"/opt/app": "app"})])
    return tmp_path / "built"


def _run(cwd: Path, layout: Path, *args: str, capsys) -> tuple[int, str, str]:
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": str(cwd)}):
        code = run_image.main(["--layout", str(layout), "--name", "//images:qwen_mi300x", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _refusal(err: str) -> dict:
    return json.loads(err.strip().splitlines()[-1])


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_output_into_a_non_empty_foreign_directory_is_refused_and_nothing_is_deleted(tmp_path, layout, capsys):
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "main.py").write_text("print('mine')\n")
    (work / "notes.txt").write_text("my notes\n")
    before = _snapshot(work)
    for extra in ((), ("--force",)):
        code, _, err = _run(work.parent, layout, "--output", "work", *extra, capsys=capsys)
        assert code == 2
        refusal = _refusal(err)
        assert refusal["field"] == "--output" and "not an OCI layout" in refusal["error"]
        assert _snapshot(work) == before


def test_output_to_a_new_or_empty_directory_then_replacing_a_layout_needs_force(tmp_path, layout, capsys):
    cwd = tmp_path / "cwd"
    (cwd / "empty").mkdir(parents=True)
    assert _run(cwd, layout, "--output", "empty", capsys=capsys)[0] == 0
    assert _run(cwd, layout, "--output", "new/dir", capsys=capsys)[0] == 0
    assert _snapshot(cwd / "new" / "dir") == _snapshot(layout)
    code, _, err = _run(cwd, layout, "--output", "new/dir", capsys=capsys)
    assert code == 2 and "pass --force" in _refusal(err)["error"]
    assert _run(cwd, layout, "--output", "new/dir", "--force", capsys=capsys)[0] == 0
    assert _snapshot(cwd / "new" / "dir") == _snapshot(layout)
    assert not [p for p in (cwd / "new").iterdir() if p.name.startswith(".")]  # no staging left behind


def test_output_onto_a_file_or_symlink_is_refused(tmp_path, layout, capsys):
    (tmp_path / "file").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    for name in ("file", "link"):
        code, _, err = _run(tmp_path, layout, "--output", name, "--force", capsys=capsys)
        assert code == 2 and _refusal(err)["field"] == "--output"
    assert (tmp_path / "file").read_text() == "keep"


def test_archive_never_overwrites_without_force(tmp_path, layout, capsys):
    (tmp_path / "image.tar").write_text("an older archive the user keeps")
    code, _, err = _run(tmp_path, layout, "--archive", "image.tar", capsys=capsys)
    assert code == 2 and _refusal(err)["field"] == "--archive"
    assert (tmp_path / "image.tar").read_text() == "an older archive the user keeps"
    assert _run(tmp_path, layout, "--archive", "image.tar", "--force", capsys=capsys)[0] == 0
    with tarfile.open(tmp_path / "image.tar") as tar:
        assert "index.json" in tar.getnames()


def test_a_shallow_archive_is_refused_unless_asked_for(tmp_path, layout, capsys):
    (layout / BASE_SIDECAR).write_text(
        json.dumps({"image": "docker.io/rocm/vllm", "digest": "sha256:" + "a" * 64, "shallow_layers": []})
    )
    code, out, err = _run(tmp_path, layout, "--archive", "shallow.tar", capsys=capsys)
    assert code == 2 and "cannot load it" in _refusal(err)["error"] and not (tmp_path / "shallow.tar").exists()
    code, out, _ = _run(tmp_path, layout, "--archive", "shallow.tar", "--allow-shallow", capsys=capsys)
    assert code == 0 and "(base layers not included: shallow)" in out
    assert "engine: from the vendor base docker.io/rocm/vllm@sha256:" in out


def test_the_summary_says_the_local_image_has_no_engine(tmp_path, layout, capsys):
    code, out, _ = _run(tmp_path, layout, capsys=capsys)
    assert code == 0
    assert "engine: none (local Debian base" in out
    assert "the deployable image: bazel run --config=release //images:qwen_mi300x\n" in out


@pytest.mark.parametrize(
    "key,message",
    [
        ("missing.pem", "cannot be read (No such file or directory)"),
        ("cosign.key", "cosign's own encrypted format"),
        ("garbage.pem", "is not a PEM private key"),
    ],
)
def test_signing_keys_are_found_where_the_user_ran_bazel_and_refused_cleanly(tmp_path, layout, capsys, key, message):
    cwd = tmp_path / "somewhere"
    cwd.mkdir()
    (cwd / "cosign.key").write_text(
        "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nabc\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
    )
    (cwd / "garbage.pem").write_text("not a key")
    code, _, err = _run(cwd, layout, "--push", "127.0.0.1:9/repo", "--signing-key", key, capsys=capsys)
    refusal = _refusal(err)
    assert code == 2 and message in refusal["error"], refusal
    assert refusal["field"] in ("--signing-key", str(cwd / key)) and str(cwd / key) in refusal["error"]
    assert "Traceback" not in err


def test_a_relative_signing_key_is_read_from_the_directory_bazel_run_started_in(tmp_path, layout, capsys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cwd = tmp_path / "keys-here"
    cwd.mkdir()
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (cwd / "omni.key").write_bytes(pem)
    # The key loads (the push then fails on the closed port, after the key was accepted).
    code, _, err = _run(cwd, layout, "--push", "127.0.0.1:9/repo", "--signing-key", "omni.key", capsys=capsys)
    assert code == 2 and "signing key" not in _refusal(err)["error"]
