"""tools/dev/engine_patches/torchvision_cpu.py on files made here: it patches only the file it was
made for, changes exactly the two decorators, and refuses anything else writing nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tools.dev.engine_patches import torchvision_cpu
from tools.dev.engine_patches.torchvision_cpu import PatchError, patch, patched_source

SOURCE = (
    "import torch\n"
    "import torchvision.extension  # noqa: F401\n\n\n"
    '@register_meta("roi_align")\ndef meta_roi_align():\n    pass\n\n\n'
    '@torch.library.register_fake("torchvision::nms")\ndef meta_nms():\n    pass\n\n\n'
    '@torch.library.register_fake("torchvision::qnms")\ndef meta_qnms():\n    pass\n'
)


def test_the_two_unguarded_registrations_are_guarded_and_nothing_else_changes() -> None:
    text = patched_source(SOURCE)
    assert "@torch.library.register_fake(" not in text
    assert text.count("@_register_fake_if_ops(") == 2 and "if torchvision.extension._has_ops():" in text
    assert (
        text.replace(torchvision_cpu.GUARD, "").replace("@_register_fake_if_ops(", "@torch.library.register_fake(")
        == SOURCE
    )


@pytest.mark.parametrize(
    "source, message",
    [
        (SOURCE.replace('@torch.library.register_fake("torchvision::qnms")\n', ""), "expected 2 register_fake"),
        (SOURCE + '@torch.library.register_fake("torchvision::x")\ndef x():\n    pass\n', "expected 2 register_fake"),
        (SOURCE.replace("import torchvision.extension  # noqa: F401\n", ""), "not there exactly once"),
    ],
)
def test_a_file_of_another_shape_is_refused(source: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        patched_source(source)


def test_only_the_pinned_file_is_patched_and_a_refusal_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    (site / "torchvision" / "io").mkdir(parents=True)
    (site / "torchvision" / "_meta_registrations.py").write_text(SOURCE)
    (site / "torchvision" / "io" / "__init__.py").write_text("x = 1\n")
    with pytest.raises(PatchError, match="not torchvision 0.28.0's"):
        patch(site, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert torchvision_cpu.main([str(site), str(tmp_path / "out")]) == 2
    monkeypatch.setattr(torchvision_cpu, "EXPECTED_SHA256", hashlib.sha256(SOURCE.encode()).hexdigest())
    note = patch(site, tmp_path / "out")
    assert (tmp_path / "out" / "torchvision" / "io" / "__init__.py").read_text() == "x = 1\n"
    patched = (tmp_path / "out" / "torchvision" / "_meta_registrations.py").read_text()
    assert patched == patched_source(SOURCE) and (site / "torchvision" / "_meta_registrations.py").read_text() == SOURCE
    assert json.loads((tmp_path / "out" / "PATCHED.json").read_text()) == note
    assert note["patched_sha256"] == hashlib.sha256(patched.encode()).hexdigest()
    with pytest.raises(PatchError, match="is missing"):
        patch(tmp_path / "empty", tmp_path / "out2")


def _site_tar(path: Path, members: dict[str, str]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def test_the_image_layer_mode_writes_only_the_patched_file_and_its_note(tmp_path: Path, monkeypatch) -> None:
    """`--layer SITE.tar FILE NOTE`: the inputs of //images:qwen_cpu_tiny's patch layer."""
    site = _site_tar(
        tmp_path / "site.tar", {"torchvision/_meta_registrations.py": SOURCE, "torchvision/io/__init__.py": "x = 1\n"}
    )
    out, note_path = tmp_path / "patched.py", tmp_path / "note.json"
    assert torchvision_cpu.main(["--layer", str(site), str(out), str(note_path)]) == 2  # not the pinned file
    assert not out.exists() and not note_path.exists()
    monkeypatch.setattr(torchvision_cpu, "EXPECTED_SHA256", hashlib.sha256(SOURCE.encode()).hexdigest())
    assert torchvision_cpu.main(["--layer", str(site), str(out), str(note_path)]) == 0
    assert out.read_text() == patched_source(SOURCE)
    note = json.loads(note_path.read_text())
    assert note["file"] == "torchvision/_meta_registrations.py"
    assert note["patched_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["note.json", "patched.py", "site.tar"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: _site_tar(p, {"other/file.py": "x\n"}), "holds no torchvision/_meta_registrations.py"),
        (lambda p: p.write_bytes(b"not a tar" * 100) and p, "is not a readable tar"),
    ],
)
def test_the_layer_mode_refuses_a_site_without_the_file(tmp_path: Path, make, message: str) -> None:
    site = tmp_path / "site.tar"
    make(site)
    with pytest.raises(torchvision_cpu.PatchError, match=message):
        torchvision_cpu.patch_layer(site, tmp_path / "patched.py", tmp_path / "note.json")
    assert not (tmp_path / "patched.py").exists()
