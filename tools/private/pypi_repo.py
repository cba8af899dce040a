"""Fetch-time helper of the `pypi` module extension (run by the repository rule).

    pypi_repo.py plan LOCK [NAME...]       -> JSON: interpreter path and chosen wheels (of NAMEs)
    pypi_repo.py site WHEELS SITE PYVER PLATFORM -> unpacks them into SITE for that target, as
                                              image-install does, without a BUILD file
    pypi_repo.py install WHEELS SITE PYTHON -> installs wheels into SITE, writes BUILD.bazel
    pypi_repo.py image-plan LOCK PYVER PLATFORM [ROOT...] -> JSON: wheels of ROOT's closure (all: none)
                                              for an image's Python (e.g. 3.11, linux/arm64)
    pypi_repo.py image-install WHEELS SITE PYVER PLATFORM -> unpacks them for that target
                                              (wheel_unpack.py: no pip, nothing of this host)
    pypi_repo.py image-tar WHEELS TAR PYVER PLATFORM -> the same, as one tar (for sites too
                                              big for a glob: tens of thousands of files)
    pypi_repo.py image-facts WHEELS        -> JSON: each wheel's license, maker and copyright
                                              facts, by file name (wheel_facts.py), for the SBOM

Only the standard library and pip's vendored `packaging` are used: this runs before any
locked package exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename

REQUIREMENT_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
WHEEL_RE = re.compile(r"^\s*# wheel sha256=([0-9a-f]{64}) url=(\S+)$")
# Characters Bazel accepts in a label's target name; anything else stays out of the BUILD.
LABEL_SAFE = re.compile(r"^[A-Za-z0-9!%\-@^_`\"#$&'()*+,;<=>?\[\]{|}~/.]+$")
SCRIPTS_FROM_PURELIB = "../../bin/"
NOT_DATA = (".pyc", "/RECORD", "/INSTALLER", "/REQUESTED", "/direct_url.json")


def plan(lock: Path, tags=None, only: set[str] | None = None) -> dict:
    tag_rank = {tag: rank for rank, tag in enumerate(tags if tags is not None else sys_tags())}
    wheels, current = [], None
    candidates: list[tuple[str, str]] = []

    def choose() -> None:
        if current is None:
            return
        name, version = current
        if only is not None and canonicalize_name(name) not in only:
            return
        ranked = []
        for sha256, url in candidates:
            filename = unquote(url.rsplit("/", 1)[-1])  # torch-2.13.0%2Bcpu-... names torch-2.13.0+cpu-...
            ranks = [tag_rank[t] for t in parse_wheel_filename(filename)[3] if t in tag_rank]
            if ranks:
                ranked.append((min(ranks), filename, sha256, url))
        if not ranked:
            sys.exit(
                f"{lock}: no wheel of {name}=={version} fits this interpreter "
                f"({sys.implementation.name} {sys.version.split()[0]}); re-run tools/lock_python"
            )
        _, filename, sha256, url = min(ranked)
        wheels.append({"name": name, "version": version, "filename": filename, "sha256": sha256, "url": url})

    for line in lock.read_text(encoding="utf-8").splitlines():
        requirement = REQUIREMENT_RE.match(line)
        if requirement:
            choose()
            current, candidates = requirement.groups(), []
            continue
        wheel = WHEEL_RE.match(line)
        if wheel:
            candidates.append(wheel.groups())
    choose()
    return {"python": os.path.realpath(sys.executable), "wheels": wheels}


GLIBC_MINOR = 36  # Debian bookworm's glibc 2.36: the oldest runtime our image bases have
ARCHES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def image_tags(python_version: str, platform: str) -> list:
    """Wheel tags a CPython `python_version` on `platform` (glibc 2.36) accepts, best first."""
    from pip._vendor.packaging import tags

    if platform not in ARCHES:
        sys.exit(f"unsupported image platform {platform!r}; expected one of {sorted(ARCHES)}")
    arch = ARCHES[platform]
    major, minor = (int(part) for part in python_version.split("."))
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(GLIBC_MINOR, 16, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    interpreter = f"cp{major}{minor}"
    return [
        *tags.cpython_tags((major, minor), [interpreter], platforms),
        *tags.compatible_tags((major, minor), interpreter, platforms),
    ]


def closure(lock: Path, roots: list[str]) -> set[str]:
    """The locked distributions `roots` need, from pip-compile's `# via` annotations."""
    via: dict[str, set[str]] = {}
    current = None
    in_via = False
    for line in lock.read_text(encoding="utf-8").splitlines():
        requirement = REQUIREMENT_RE.match(line)
        if requirement:
            current, in_via = canonicalize_name(requirement.group(1)), False
            via[current] = set()
            continue
        stripped = line.strip()
        if current is None or not stripped.startswith("#"):
            continue
        text = stripped.lstrip("#").strip()
        if text.startswith("via"):
            in_via = True
            text = text[3:].strip()
        elif text.startswith("wheel "):
            continue
        if in_via and text:
            via[current].add(canonicalize_name(text) if not text.startswith("-r") else "-r")
    needed = {canonicalize_name(root) for root in roots}
    unknown = needed - set(via)
    if unknown:
        sys.exit(f"{lock}: image packages {sorted(unknown)} are not in the lock")
    changed = True
    while changed:
        changed = False
        for name, parents in via.items():
            if name not in needed and parents & needed:
                needed.add(name)
                changed = True
    return needed


def site_install(wheels: Path, site: Path, python_version: str, platform: str) -> None:
    """Unpack a test site's wheels for the target Python, not this host's: the sites are read
    in place and run by the target's interpreter, whatever Python the host has."""
    from wheel_unpack import WheelError, unpack_all  # beside this file: sys.path[0]

    try:
        unpack_all(wheels, site)
    except WheelError as error:
        sys.exit(f"site wheels for CPython {python_version} on {platform}: {error}")


def image_install(wheels: Path, site: Path, python_version: str, platform: str) -> None:
    """Unpack the image's wheels with fixed behaviour (see wheel_unpack.py): pip is the
    build host's and would write that host's interpreter into scripts and RECORD."""
    from wheel_unpack import WheelError, unpack_all  # beside this file: sys.path[0]

    try:
        unpack_all(wheels, site)
    except WheelError as error:
        sys.exit(f"image wheels for CPython {python_version} on {platform}: {error}")
    unsafe = sorted(str(p.relative_to(site)) for p in site.rglob("*") if not LABEL_SAFE.match(p.name))
    if unsafe:
        # Bazel cannot name them, so the layer would lack files RECORD lists.
        sys.exit(f"image wheels install files Bazel cannot name: {unsafe[:5]}")
    (site.parent / "BUILD.bazel").write_text(
        f"""# Generated by //tools/private:pypi_repo.py. Do not edit.
# The locked runtime packages for CPython {python_version} on {platform}, for image layers.
package(default_visibility = ["//visibility:public"])

exports_files(["wheels.json"])

filegroup(
    name = "site",
    srcs = glob(["site/**"]),
)
""",
        encoding="utf-8",
    )


def image_tar(wheels: Path, tar_path: Path, python_version: str, platform: str) -> None:
    """The unpacked site as one tar: sorted, owner 0, time 0, so the same wheels give the same
    bytes on every host (the layer that reads it normalises again)."""
    import shutil
    import tarfile

    from wheel_unpack import WheelError, unpack_all  # beside this file: sys.path[0]

    site = tar_path.with_suffix(".unpacking")
    shutil.rmtree(site, ignore_errors=True)
    try:
        unpack_all(wheels, site)
    except WheelError as error:
        sys.exit(f"image wheels for CPython {python_version} on {platform}: {error}")

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = info.mtime = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for child in sorted(site.iterdir()):
            tar.add(child, arcname=child.name, filter=fixed)  # recurses in sorted order
    shutil.rmtree(site)


def _target(name: str) -> str:
    return canonicalize_name(name).replace("-", "_")


def _dist_info(site: Path) -> list[Path]:
    return sorted(site.glob("*.dist-info"))


def _files(site: Path, dist_info: Path) -> list[str]:
    record = (dist_info / "RECORD").read_text(encoding="utf-8").splitlines()
    paths = []
    for row in record:
        path = row.split(",", 1)[0]
        # pip --target puts a wheel's scripts and binaries (ruff's) in site/bin, which RECORD
        # names from the scheme's purelib: they become data, so `python -m ruff` finds its binary.
        if path.startswith(SCRIPTS_FROM_PURELIB):
            path = "bin/" + path.removeprefix(SCRIPTS_FROM_PURELIB)
        if not path or path.startswith("..") or path.endswith(NOT_DATA) or " " in path:
            continue
        if LABEL_SAFE.match(path) and (site / path).is_file():
            paths.append("site/" + path)
    return sorted(set(paths))


def _requires(dist_info: Path) -> list[str]:
    names = []
    for line in (dist_info / "METADATA").read_text(encoding="utf-8").splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.append(requirement.name)
    return names


def _pip_install(python: str, wheels: Path, site: Path, target_args: list[str]) -> None:
    """Install the downloaded wheels into `site`, isolated from the machine's pip settings,
    then remove what must not reach a Bazel repository or an image layer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHONNOUSERSITE="1")
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            *target_args,
            "--target",
            str(site),
            *sorted(map(str, wheels.glob("*.whl"))),
        ],
        check=True,
        env=env,
    )
    # BUILD files shipped inside wheels would cut this repository into packages.
    for build in [*site.rglob("BUILD"), *site.rglob("BUILD.bazel")]:
        build.unlink()
    # pip records where each wheel came from as an absolute file:// URL: a path of this
    # machine's Bazel output base, which would make outputs differ per machine.
    for direct_url in site.glob("*.dist-info/direct_url.json"):
        direct_url.unlink()
        record = direct_url.parent / "RECORD"
        entry = f"{direct_url.parent.name}/direct_url.json,"
        record.write_text(
            "".join(line for line in record.read_text().splitlines(keepends=True) if not line.startswith(entry))
        )


def install(wheels: Path, site: Path, python: str) -> None:
    _pip_install(python, wheels, site, [])
    infos = _dist_info(site)
    present = {}
    for info in infos:
        name = info.name.split("-", 1)[0]
        present[canonicalize_name(name)] = info
    rules = []
    for key, info in sorted(present.items()):
        files = _files(site, info)
        srcs = [f for f in files if f.endswith(".py")]
        data = [f for f in files if not f.endswith(".py")]
        deps = sorted({_target(r) for r in _requires(info) if canonicalize_name(r) in present} - {_target(key)})
        rules.append(
            "py_library(\n"
            f"    name = {json.dumps(_target(key))},\n"
            f"    srcs = {json.dumps(srcs, indent=8)},\n"
            f"    data = {json.dumps(data, indent=8)},\n"
            '    imports = ["site"],\n'
            f"    deps = {json.dumps([':' + d for d in deps])},\n"
            ")\n"
        )
    header = f"""# Generated by //tools/private:pypi_repo.py from the hashed lock. Do not edit.
load("@rules_python//python:defs.bzl", "py_library", "py_runtime", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

exports_files(["python.txt"] + glob(["wheels/*.whl"]))

filegroup(name = "wheels", srcs = glob(["wheels/*.whl"]))

# The interpreter these wheels were installed for; tests and tools run with it.
py_runtime(
    name = "python_runtime",
    interpreter_path = {json.dumps(python)},
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(name = "python_runtime_pair", py3_runtime = ":python_runtime")

toolchain(
    name = "python_toolchain",
    toolchain = ":python_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

"""
    (site.parent / "BUILD.bazel").write_text(header + "\n".join(rules), encoding="utf-8")
    (site.parent / "python.txt").write_text(python + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv[:1] == ["plan"] and len(argv) >= 2:
        only = {canonicalize_name(name) for name in argv[2:]} or None
        print(json.dumps(plan(Path(argv[1]), only=only)))
        return 0
    if argv[:1] == ["site"] and len(argv) == 5:
        site_install(Path(argv[1]), Path(argv[2]), argv[3], argv[4])
        return 0
    if argv[:1] == ["install"] and len(argv) == 4:
        install(Path(argv[1]), Path(argv[2]), argv[3])
        return 0
    if argv[:1] == ["image-plan"] and len(argv) >= 4:
        lock = Path(argv[1])
        # No roots: the whole lock (a `--exact` lock is the complete set, with no `# via` lines).
        only = closure(lock, argv[4:]) if argv[4:] else None
        print(json.dumps(plan(lock, image_tags(argv[2], argv[3]), only)))
        return 0
    if argv[:1] == ["image-tar"] and len(argv) == 5:
        image_tar(Path(argv[1]), Path(argv[2]), argv[3], argv[4])
        return 0
    if argv[:1] == ["image-facts"] and len(argv) == 2:
        from wheel_facts import WheelFactsError, wheel_facts  # beside this file: sys.path[0]

        try:
            print(json.dumps({wheel.name: wheel_facts(wheel) for wheel in sorted(Path(argv[1]).glob("*.whl"))}))
        except WheelFactsError as error:
            sys.exit(f"image wheels: {error}")
        return 0
    if argv[:1] == ["image-install"] and len(argv) == 5:
        image_install(Path(argv[1]), Path(argv[2]), argv[3], argv[4])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
