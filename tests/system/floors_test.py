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
    return {name: labels for name, (_, labels) in _py_libraries(build).items()}


def _py_libraries(build: Path) -> dict[str, tuple[list[str], list[str]]]:
    """py_library name -> (its source files, its visibility labels), from a buildifier-formatted
    BUILD file; `glob([...])` sources are listed from the folder."""
    found = {}
    for block in re.findall(r"^py_library\((.*?)^\)", build.read_text(), flags=re.M | re.S):
        name = re.search(r'name = "([^"]+)"', block)
        labels = re.search(r"visibility = \[(.*?)\]", block, flags=re.S)
        srcs = re.search(r"srcs = (glob\(\[.*?\]\)|\[.*?\])", block, flags=re.S)
        if not (name and srcs):
            continue
        patterns = re.findall(r'"([^"]+)"', srcs.group(1))
        files = (
            sorted({str(f.relative_to(build.parent)) for pattern in patterns for f in build.parent.glob(pattern)})
            if srcs.group(1).startswith("glob(")
            else patterns
        )
        found[name.group(1)] = (files, re.findall(r'"([^"]+)"', labels.group(1)) if labels else [])
    return found


def _visible_folders(labels: list[str]) -> set[str]:
    folders = set()
    for label in labels:
        package, _, target = label.removeprefix("//").partition(":")
        dotted = package.replace("/", ".")
        folders.add(dotted + ".*" if target == "__subpackages__" else dotted)
    return folders


# Who uses a library without importing it: the images pack boot's and the launcher's programs into
# their layers and run build_diff's `update` as //images:update_digests; the mutation driver runs
# the policy modules' tests in its own process and the pin and mirror benchmarks run tools/pin and tools/release as processes;
# the library's face (omni_oci/__init__.py) is a dependency of its floors.
USED_WITHOUT_IMPORT = {
    "//boot:lib": {"images", "tools.dev.mutation"},
    "//launcher:lib": {"images", "tools.dev.mutation"},
    "//tools/oci:oci": {"images", "tools.dev.mutation"},
    "//tools/gate:gate_lib": {"tools.dev.mutation"},
    "//tools:settings": {"tools.dev.mutation"},
    "//tools/pin:pin_lib": {"tools.dev.bench"},
    "//tools/release:release_lib": {"tools.dev.bench"},
    "//omni_oci:omni_oci": {"omni_oci.*"},
}


def _library_labels() -> list[str]:
    builds = [b for b in ROOT.rglob("BUILD.bazel") if b.parent.parts[len(ROOT.parts) :][:1] != ("tests",)]
    builds = [b for b in builds if not any(part.startswith(("bazel-", ".")) for part in b.relative_to(ROOT).parts)]
    return sorted(f"//{b.parent.relative_to(ROOT).as_posix()}:{name}" for b in builds for name in _py_libraries(b))


def bazel_package(folder: str, root: Path = ROOT) -> str:
    """The Bazel package a Python folder's files belong to (dotted): the folder itself, or the
    nearest one above it with a BUILD.bazel (omni_oci.remote.auth is in //omni_oci/remote)."""
    if folder.endswith(".*"):
        return folder
    parts = folder.split(".")
    while len(parts) > 1 and not (root / Path(*parts) / "BUILD.bazel").is_file():
        parts.pop()
    return ".".join(parts)


def importers_of(package: str, files: list[str], floors: dict[str, Floor], names: set[str]) -> set[str]:
    """The Bazel packages of the rows (other than the library's own and the tests') that may
    import any module the library holds."""
    own = package.replace("/", ".")
    modules = {
        ".".join([own, *Path(f).parent.parts])
        if Path(f).stem == "__init__"
        else ".".join([own, *Path(f).with_suffix("").parts])
        for f in files
    }
    rows = {
        bazel_package(name)
        for name, row in floors.items()
        if "any" not in row.ours and any(allowed(row, module, names) for module in modules)
    }
    return rows - {own}


@pytest.mark.parametrize("label", _library_labels())
def test_bazel_visibility_mirrors_the_floors(label: str) -> None:
    """Exactly the folders whose row may import a library see it (tests see every library; a
    library used without an import says so in USED_WITHOUT_IMPORT): never public."""
    floors = floors_of((ROOT / "docs" / "development.md").read_text())
    names = set(python_folders(ROOT))
    package, _, name = label.removeprefix("//").partition(":")
    files, labels = _py_libraries(ROOT / package / "BUILD.bazel")[name]
    expected = importers_of(package, files, floors, names) | USED_WITHOUT_IMPORT.get(label, set())
    visible = _visible_folders(labels)
    assert "//visibility:public" not in labels, f"{label} is public; the floors table says {sorted(expected)}"
    assert visible - {"tests.*"} == expected, f"{label} visibility vs the floors table"
    assert "tests.*" in visible, f"{label}: the tests see every library"


def test_the_visibility_check_reads_every_library() -> None:
    labels = _library_labels()
    assert {"//attest:attest", "//boot:lib", "//omni_oci/model:pull", "//tools:settings"} <= set(labels)
    assert not any(label.startswith("//tests") for label in labels)


# The library (omni_oci/) has no program edge: no main(), no argparse, no environment reads;
# the one exception is the registry keychain, which finds credential files and helpers where
# docker, podman and crane look (go-containerregistry's authn keychain reads the same variables).
ENVIRONMENT_READERS = {"omni_oci/remote/auth/credentials.py"}
# Bazel's build actions (tools/oci/build) are programs whose functions are their floor's API,
# imported per its row; every other module under tools/ with a main() is a command.
ACTION_FLOORS = ("tools/oci/build/",)


def program_edges(root: Path, library: str = "omni_oci") -> list[str]:
    found = []
    for source in sorted((root / library).rglob("*.py")):
        where = source.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "main" and node.col_offset == 0:
                found.append(f"{where}:{node.lineno} defines main()")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                named = [alias.name for alias in node.names]
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if "argparse" in named or module == "argparse":
                    found.append(f"{where}:{node.lineno} imports argparse")
                if module == "os" and {"environ", "getenv"} & set(named) and where not in ENVIRONMENT_READERS:
                    found.append(f"{where}:{node.lineno} reads the environment")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in ("environ", "getenv")
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and where not in ENVIRONMENT_READERS
            ):
                found.append(f"{where}:{node.lineno} reads the environment")
    return found


def library_faces(root: Path, library: str = "omni_oci") -> list[str]:
    """Every package of the library opens with a purpose line and lists its modules in __all__."""
    found = []
    for init in sorted((root / library).rglob("__init__.py")):
        tree = ast.parse(init.read_text())
        where = init.relative_to(root).as_posix()
        if not (ast.get_docstring(tree) or "").strip():
            found.append(f"{where}: no purpose line")
        listed = [
            ast.literal_eval(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        ]
        members = sorted(
            {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
            | {p.parent.name for p in init.parent.glob("*/__init__.py")}
        )
        if not listed:
            found.append(f"{where}: no __all__")
        elif sorted(listed[0]) != members:
            found.append(f"{where}: __all__ lists {sorted(listed[0])}, the package holds {members}")
    return found


def command_imports(root: Path) -> list[str]:
    """Imports of a command module (a module under tools/ with a main(), the build actions
    aside) from outside its folder; the tests may import anything."""
    commands = {}
    for source in root.glob("tools/**/*.py"):
        where = source.relative_to(root).as_posix()
        if where.startswith(ACTION_FLOORS) or "bazel-" in where:
            continue
        tree = ast.parse(source.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            commands[".".join(source.relative_to(root).with_suffix("").parts)] = where
    found = []
    for source in sorted(root.rglob("*.py")):
        parts = source.relative_to(root).parts
        if parts[0] == "tests" or any(part.startswith(("bazel-", ".")) for part in parts):
            continue
        folder = ".".join(parts[:-1])
        for node in ast.walk(ast.parse(source.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in commands and target.rsplit(".", 1)[0] != folder:
                    found.append(f"{'/'.join(parts)}:{node.lineno} imports the command {commands[target]}")
    return found


def test_the_library_has_no_program_edge() -> None:
    assert program_edges(ROOT) == []


def test_every_library_package_has_a_purpose_line_and_a_face() -> None:
    assert library_faces(ROOT) == []


def test_no_command_module_is_imported_outside_its_folder() -> None:
    assert command_imports(ROOT) == []


@pytest.mark.parametrize(
    ("files", "complaint"),
    [
        ({"omni_oci/a.py": "def main():\n    pass\n"}, "omni_oci/a.py:1 defines main()"),
        ({"omni_oci/a.py": "import argparse\n"}, "omni_oci/a.py:1 imports argparse"),
        ({"omni_oci/a.py": "import os\nx = os.environ.get('A')\n"}, "omni_oci/a.py:2 reads the environment"),
        ({"omni_oci/a.py": "from os import getenv\n"}, "omni_oci/a.py:1 reads the environment"),
        ({"omni_oci/__init__.py": "__all__ = []\n"}, "omni_oci/__init__.py: no purpose line"),
        ({"omni_oci/__init__.py": '"""Purpose."""\n'}, "omni_oci/__init__.py: no __all__"),
        (
            {"omni_oci/__init__.py": '"""Purpose."""\n__all__ = ["b"]\n', "omni_oci/a.py": ""},
            "omni_oci/__init__.py: __all__ lists ['b'], the package holds ['a']",
        ),
        (
            {"tools/x/cli.py": "def main():\n    pass\n", "tools/y/use.py": "from tools.x.cli import main\n"},
            "tools/y/use.py:1 imports the command tools/x/cli.py",
        ),
        (
            {"tools/x/cli.py": "def main():\n    pass\n", "boot/use.py": "import tools.x.cli\n"},
            "boot/use.py:1 imports the command tools/x/cli.py",
        ),
    ],
)
def test_the_library_and_command_checks_see_each_kind(tmp_path: Path, files: dict[str, str], complaint: str) -> None:
    for name, text in {"omni_oci/__init__.py": '"""Purpose."""\n__all__ = ["a"]\n', **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = program_edges(tmp_path) + library_faces(tmp_path) + command_imports(tmp_path)
    assert complaint in found, found


def test_a_command_may_be_imported_within_its_folder_and_by_the_tests(tmp_path: Path) -> None:
    files = {
        "tools/x/cli.py": "def main():\n    pass\n",
        "tools/x/other.py": "from tools.x.cli import main\n",
        "tests/x_test.py": "from tools.x.cli import main\n",
        "tools/oci/build/image.py": "def main():\n    pass\n",
        "tools/debian/rootfs.py": "from tools.oci.build.image import main\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert command_imports(tmp_path) == []
