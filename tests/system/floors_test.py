"""The floors: docs/development.md's table is the one allow-list of who imports what, and every
module of the tree keeps to its row; Bazel's visibility on the floors few others use says the same.

Like the style test, it reads the checkout itself (through its own file's link), so a module no
target names yet is checked too; tagged `external`, it is never served from Bazel's cache.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("attest", "boot", "images", "launcher", "omni_oci", "tests", "tools")
ENGINES = ("vllm", "sglang", "torch")
STANDARD = set(sys.stdlib_module_names) | {"__future__"}
_ROW = re.compile(r"^\| `([\w.*]+)` \| ([^|]*) \| ([^|]*) \|", flags=re.M)


@dataclass(frozen=True)
class Floor:
    folder: str  # dotted: omni_oci.remote, or tests.* for a folder and everything below it
    ours: frozenset[str]  # entries: a package (its own modules), a module, or PACKAGE.*; "any"
    pypi: frozenset[str]  # top-level import names; "any"


def _entries(cell: str) -> frozenset[str]:
    cell = cell.strip()
    return frozenset({"any"} if cell == "any" else re.findall(r"`([\w.*]+)`", cell))


def floors_of(page: str) -> dict[str, Floor]:
    block = page.split("<!-- floors:begin -->", 1)[1].split("<!-- floors:end -->", 1)[0]
    return {folder: Floor(folder, _entries(ours), _entries(pypi)) for folder, ours, pypi in _ROW.findall(block)}


@functools.cache
def python_folders(root: Path) -> dict[str, Path]:
    """Every folder holding a Python file, by its dotted name."""
    return {
        ".".join(path.parent.relative_to(root).parts): path.parent
        for path in root.rglob("*.py")
        if not any(part.startswith((".", "bazel-")) or part == "__pycache__" for part in path.relative_to(root).parts)
    }


def floor_for(folder: str, floors: dict[str, Floor]) -> Floor | None:
    if folder in floors:
        return floors[folder]
    for name, floor in floors.items():
        if name.endswith(".*") and (folder == name[:-2] or folder.startswith(name[:-1])):
            return floor
    return None


def _imports(source: Path, root: Path, folders: set[str]) -> list[tuple[int, str]]:
    """(line, dotted target) of every absolute import; `from a import b` is `a.b` where that is
    a module or a package of ours."""
    found = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                named = dotted in folders or (root / Path(*dotted.split("."))).with_suffix(".py").is_file()
                found.append((node.lineno, dotted if named else node.module))
    return found


def _package(target: str, folders: set[str]) -> str:
    """The folder a dotted import target lives in (a module's folder, or the package itself)."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in folders:
            return ".".join(parts[:end])
    return parts[0]


def allowed(floor: Floor, target: str, folders: set[str]) -> bool:
    if "any" in floor.ours:
        return True
    package = _package(target, folders)
    for entry in floor.ours:
        if entry.endswith(".*") and (package == entry[:-2] or package.startswith(entry[:-1])):
            return True
        if entry == package or target == entry or target.startswith(entry + "."):
            if entry == package or entry not in folders:  # a module entry, or the package's own modules
                return True
    return False


def violations(root: Path, floors: dict[str, Floor], ours: tuple[str, ...] = OURS) -> list[str]:
    folders = python_folders(root)
    names = set(folders)
    found = [f"{folder}: no row in the floors table" for folder in sorted(names) if floor_for(folder, floors) is None]
    found += [
        f"{folder}: a row for a folder that does not exist" for folder in floors if folder.rstrip(".*") not in names
    ]
    for folder, path in sorted(folders.items()):
        floor = floor_for(folder, floors)
        for source in sorted(path.glob("*.py")) if floor else ():
            for line, target in sorted(set(_imports(source, root, names))):
                top = target.split(".")[0]
                where = f"{source.relative_to(root)}:{line} imports {target}"
                if (path / f"{top}.py").is_file():  # a script's sibling, on its path as a top-level name
                    continue
                if top in ENGINES and top not in floor.pypi:
                    found.append(f"{where}: an engine runs as a process, never imported")
                elif top in ours:
                    if _package(target, names) != folder and not allowed(floor, target, names):
                        found.append(f"{where}, not in the {floor.folder} row")
                elif top not in STANDARD and "any" not in floor.pypi and top not in floor.pypi:
                    found.append(f"{where} (PyPI), not in the {floor.folder} row")
    return found


def test_every_import_of_the_tree_is_in_its_floors_row() -> None:
    floors = floors_of((ROOT / "docs" / "development.md").read_text())
    assert {"attest", "attest.edge", "boot.checkpoint", "tools.oci.build", "tests.*"} <= set(floors)
    assert violations(ROOT, floors) == []


TINY_FLOORS = {  # `low` may import nothing, `high` may import `low` and `low.sub.*` and httpx
    "low": Floor("low", frozenset(), frozenset()),
    "low.sub": Floor("low.sub", frozenset({"low"}), frozenset()),
    "high": Floor("high", frozenset({"low", "low.sub.*"}), frozenset({"httpx"})),
}


def _tiny_tree(root: Path, extra: dict[str, str]) -> list[str]:
    files = {"low/__init__.py": "", "low/sub/__init__.py": "import low\n", "low/sub/c.py": "", "high/__init__.py": ""}
    files["high/b.py"] = "import low\nimport httpx\nfrom low.sub import c\n"
    for name, text in {**files, **extra}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return violations(root, TINY_FLOORS, ours=("low", "high", "stray"))


def test_a_tree_keeping_to_its_floors_passes(tmp_path: Path) -> None:
    assert _tiny_tree(tmp_path, {}) == []


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        ("low/a.py", "import high.b\n", "low/a.py:1 imports high.b, not in the low row"),
        ("low/a.py", "from high import b\n", "low/a.py:1 imports high.b, not in the low row"),
        ("low/a.py", "import low.sub.c\n", "low/a.py:1 imports low.sub.c, not in the low row"),
        ("low/a.py", "import httpx\n", "low/a.py:1 imports httpx (PyPI), not in the low row"),
        ("high/b.py", "import torch\n", "high/b.py:1 imports torch: an engine runs as a process"),
        ("stray/d.py", "", "stray: no row in the floors table"),
    ],
)
def test_the_check_sees_each_kind_of_forbidden_import(tmp_path: Path, module: str, source: str, complaint: str) -> None:
    found = _tiny_tree(tmp_path, {module: source})
    assert any(line.startswith(complaint) for line in found), found


def _visibility(build: Path) -> dict[str, list[str]]:
    """py_library name -> its visibility labels, from a buildifier-formatted BUILD file."""
    text = build.read_text()
    found = {}
    for block in re.findall(r"^py_library\((.*?)^\)", text, flags=re.M | re.S):
        name = re.search(r'name = "([^"]+)"', block)
        labels = re.search(r"visibility = \[(.*?)\]", block, flags=re.S)
        if name and labels:
            found[name.group(1)] = re.findall(r'"([^"]+)"', labels.group(1))
    return found


def _visible_folders(labels: list[str]) -> set[str]:
    folders = set()
    for label in labels:
        package, _, target = label.removeprefix("//").partition(":")
        dotted = package.replace("/", ".")
        folders.add(dotted + ".*" if target == "__subpackages__" else dotted)
    return folders


@pytest.mark.parametrize(
    ("build", "library", "floor"),
    [
        ("boot/checkpoint/BUILD.bazel", "checkpoint", "boot.checkpoint"),
        ("boot/serving/BUILD.bazel", "serving", "boot.serving"),
        ("boot/BUILD.bazel", "settings", "boot.settings"),
        ("tools/oci/build/BUILD.bazel", "build", "tools.oci.build"),
        ("omni_oci/remote/BUILD.bazel", "remote", "omni_oci.remote"),
        ("omni_oci/signing/BUILD.bazel", "signing", "omni_oci.signing"),
    ],
)
def test_bazel_visibility_mirrors_the_floors(build: str, library: str, floor: str) -> None:
    """Exactly the folders whose row may import the floor see its library (tests see every floor)."""
    floors = floors_of((ROOT / "docs" / "development.md").read_text())
    names = set(python_folders(ROOT))
    own = ".".join(Path(build).parent.parts)  # within its own Bazel package visibility does not apply
    importers = {
        name for name, row in floors.items() if "any" not in row.ours and name != own and allowed(row, floor, names)
    }
    visible = _visible_folders(_visibility(ROOT / build)[library])
    assert visible - {"tests.*"} == importers, f"{build}:{library} visibility vs the floors table"
    assert "tests.*" in visible
