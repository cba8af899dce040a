"""Every host builds this commit's images to the digests recorded in images/digests.json,
and the deps layer installs wheels with nothing of the build host in it."""

from __future__ import annotations

import copy
import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from attest.record import parse_record, verify_installed
from omni_oci.format.layout import blob_path
from omni_oci.format.tar_members import extract_all
from omni_oci.format.tar_reader import TarStream
from tests.fixtures.oci import make_image, make_layer
from tools.oci.build_diff import check, diff, manifest_of

RECORDED = Path("images/digests.json")
IMAGES = {name: Path("images") / f"{name}.layout" for name in ("qwen_mi300x", "deepseek_spark")}
SITE = "opt/omni/site-packages"


def _recorded() -> dict:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


def test_builds_match_the_recorded_digests() -> None:
    recorded = _recorded()
    assert set(recorded["images"]) == set(IMAGES)
    problems = check(recorded, IMAGES)
    assert not problems, (
        "this build differs from images/digests.json; if the change is intended, run "
        "`bazel run //images:update_digests` and commit the file:\n" + "\n".join(problems)
    )


def test_a_difference_names_the_layer_and_the_first_file() -> None:
    recorded = _recorded()
    image = recorded["images"]["qwen_mi300x"]
    deps = image["layers"][1]
    table = copy.deepcopy(recorded["layers"][deps["digest"]])
    victim = sorted(
        path
        for path in table
        if path.endswith("httpx-0.29.0.dist-info/RECORD")
        or (path.startswith(SITE + "/httpx/") and path.endswith(".py"))
    )[0]
    table[victim] = table[victim][:-4] + "0000"
    table[SITE + "/zz-only-recorded.py"] = "0644 0:0 0000000000000000"
    fake = "sha256:" + "e" * 64
    recorded["layers"][fake] = table
    deps["digest"] = fake
    image["digest"] = "sha256:" + "f" * 64
    problems = check(recorded, {"qwen_mi300x": IMAGES["qwen_mi300x"]})
    assert problems[0].startswith("qwen_mi300x: built sha256:")
    assert (
        f"layer 1: built {manifest_of(IMAGES['qwen_mi300x'])[1]['layers'][1]['digest']}, recorded {fake}" in problems[1]
    )
    assert f"first differing file {victim}" in problems[1]
    assert len(problems) == 2  # the other layers and the config match


def test_an_unrecorded_image_or_format_is_refused() -> None:
    recorded = _recorded()
    del recorded["images"]["deepseek_spark"]
    assert check(recorded, IMAGES) == [
        f"deepseek_spark: not recorded (built {manifest_of(IMAGES['deepseek_spark'])[0]})"
    ]
    assert "format" in check({"format": "other/9"}, IMAGES)[0]


def _deps_layer(tmp_path: Path) -> Path:
    layout = IMAGES["qwen_mi300x"]
    _, manifest = manifest_of(layout)
    for layer in manifest["layers"]:
        with tarfile.open(blob_path(layout, layer["digest"]), "r|gz") as archive:
            names = [member.name for _, member in zip(range(50), archive)]
        if any(name.lstrip("./").startswith(SITE + "/") for name in names):
            root = tmp_path / "rootfs"
            with gzip.open(blob_path(layout, layer["digest"]), "rb") as archive:
                extract_all(TarStream.of_file(archive), root, source=blob_path(layout, layer["digest"]))
            return root / SITE
    raise AssertionError(f"no layer of {layout} holds {SITE}")


def test_deps_layer_records_exactly_its_files(tmp_path: Path) -> None:
    site = _deps_layer(tmp_path)
    files = {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file() or p.is_symlink()}
    recorded: set[str] = set()
    dist_infos = sorted(site.glob("*.dist-info"))
    assert len(dist_infos) >= 15
    for dist_info in dist_infos:
        assert (dist_info / "INSTALLER").read_text() == "omni\n"
        rows, outside = parse_record((dist_info / "RECORD").read_bytes(), f"{dist_info.name}/RECORD")
        assert outside == 0, f"{dist_info.name} records files outside the site (scripts)"
        verify_installed(site, rows, outside, dist_info.name)
        recorded |= {row.path for row in rows} | {f"{dist_info.name}/RECORD", f"{dist_info.name}/INSTALLER"}
    assert files == recorded, (sorted(files - recorded)[:5], sorted(recorded - files)[:5])
    assert not (site / "bin").exists()


def test_deps_layer_holds_no_host_path(tmp_path: Path) -> None:
    site = _deps_layer(tmp_path)
    host_markers = [b"/root/", b"/home/", b".pyenv", b"/tmp/", b"bazel-out", b"_bazel_", b"execroot", b"file://"]
    for path in (p for p in site.rglob("*") if p.is_file()):
        with path.open("rb") as handle:
            head = handle.read(128)
        if head.startswith(b"#!"):  # a script's interpreter must be the image's, never the build host's
            interpreter = head[2:].split(b"\n", 1)[0].strip()
            assert interpreter.startswith((b"/usr/bin/", b"/bin/")), (path, interpreter)
        if path.name in {"RECORD", "INSTALLER", "direct_url.json"}:
            data = path.read_bytes()
            assert not [m for m in host_markers if m in data], path


def _two_layouts(tmp_path: Path, second: str) -> tuple[Path, Path]:
    layouts = []
    for side, text in (("a", "one\ntwo\nthree\n"), ("b", second)):
        work = tmp_path / side
        work.mkdir()
        layer = make_layer(work, "app", {"/app/notes.txt": text, "/app/same.bin": b"\x00\x01"})
        make_image(work / "layout", [layer])
        layouts.append(work / "layout")
    return layouts[0], layouts[1]


def test_diff_prints_differing_paths_and_the_first_text_diff(tmp_path: Path) -> None:
    a, b = _two_layouts(tmp_path, "one\nTWO\nthree\n")
    out = io.StringIO()
    assert diff(a, b, out) == 1
    text = out.getvalue()
    assert "1 differing paths" in text and "app/notes.txt:" in text and "same.bin" not in text
    assert "-two\n+TWO\n" in text and "--- a/app/notes.txt" in text


def test_diff_of_identical_builds_says_identical(tmp_path: Path) -> None:
    a, b = _two_layouts(tmp_path, "one\ntwo\nthree\n")
    out = io.StringIO()
    assert diff(a, b, out) == 0
    assert out.getvalue().startswith("identical: sha256:")


@pytest.mark.parametrize("index", [{"manifests": []}, {"manifests": [{}, {}]}, []])
def test_a_layout_without_one_manifest_is_refused(tmp_path: Path, index) -> None:
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(Exception, match="exactly one manifest"):
        manifest_of(tmp_path)
