"""Mutation testing of the fail-closed policy: does a test fail when a check is broken?

    bazel run //tools/dev/mutation -- [MODULE ...] [--jobs N] [--report FILE] [--list]

Each MODULE (default: every policy module in TARGETS) is parsed, and one mutant is made per
site: comparisons flipped or loosened (< to <=, == to !=, in to not in), `and`/`or` swapped
and operands dropped, `not` removed, `if` conditions negated, `raise` replaced by `pass`,
integer constants moved by one, `return True/False` inverted. Each mutant is written into a
private copy of the checkout and the module's covering tests run against it (pytest -x, in
parallel, one copy per job); a failing run kills the mutant. Tests that killed earlier mutants
of the module run first, then the rest fastest first (tools/dev/mutation/fastfirst.py). Mutants listed in
tools/dev/mutation/equivalent.txt (with a reason each) are not scored. The report gives, per
module: generated, killed, survived, equivalent and the score killed / (generated -
equivalent), and every survivor with its line.

Why a driver of our own rather than mutmut or cosmic-ray: the covering tests start the
launcher and boot as subprocesses (`python -m launcher`), which mutmut's in-process
trampolines do not reach, and cosmic-ray needs a session database and a config per module;
here a mutant is a plain source file in a copy of the tree, which every kind of test sees.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
EQUIVALENT = "tools/dev/mutation/equivalent.txt"
TIMEOUT_FACTOR = 3  # a mutant's run may take this many times the unmutated run (a hang is a kill)

# Policy module -> the tests that cover it (they must pass unmutated outside Bazel).
LAUNCHER_TESTS = [
    "tests/launcher/refusals_test.py",
    "tests/launcher/launcher_test.py",
    "tests/launcher/hostile_test.py",
]
BOOT_TESTS = ["tests/boot/verify_test.py", "tests/boot/prepare_test.py"]
GATE_TESTS = [
    "tests/gate/judge_test.py",
    "tests/gate/parity_test.py",
    "tests/gate/openai_client_test.py",
    "tests/gate/benchmark_test.py",
    "tests/gate/cli_test.py",
    "tests/system/contract_fuzz_test.py",
]
TARGETS: dict[str, list[str]] = {
    "launcher/selection.py": LAUNCHER_TESTS,
    "launcher/checkpoint.py": [*LAUNCHER_TESTS, "tests/attest/target_profile_test.py"],
    "launcher/settings.py": ["tests/system/settings_bounds_test.py", *LAUNCHER_TESTS],
    "launcher/dflash2.py": LAUNCHER_TESTS,
    "launcher/engine_probe.py": [
        "tests/launcher/engine_probe_test.py",
        *LAUNCHER_TESTS,
        "tests/attest/engine_identity_test.py",
    ],
    "launcher/cli.py": [*LAUNCHER_TESTS, "tests/system/pins_test.py"],
    "launcher/server.py": [
        *LAUNCHER_TESTS,
        "tests/attest/target_profile_test.py",
        "tests/launcher/engine_probe_test.py",
    ],
    "launcher/hardware.py": LAUNCHER_TESTS,
    "launcher/target.py": ["tests/attest/target_profile_test.py", *LAUNCHER_TESTS],
    "launcher/image_pins.py": [*LAUNCHER_TESTS, "tests/system/pins_test.py"],
    "launcher/build_attestation.py": LAUNCHER_TESTS,
    "attest/hashing.py": ["tests/attest/hashing_test.py", "tests/attest/attest_test.py", "tests/boot/prepare_test.py"],
    "attest/pins.py": ["tests/system/pins_test.py", "tests/attest/engine_identity_test.py"],
    "attest/reader.py": [
        "tests/attest/reader_test.py",
        "tests/attest/attest_test.py",
        "tests/launcher/hostile_test.py",
    ],
    "attest/record.py": ["tests/attest/record_test.py", "tests/attest/engine_identity_test.py"],
    "attest/edge/settings.py": ["tests/system/settings_bounds_test.py", "tests/launcher/refusals_test.py"],
    "attest/engine.py": ["tests/attest/engine_identity_test.py", "tests/system/pins_test.py"],
    "attest/primitives.py": [
        "tests/attest/attest_test.py",
        "tests/system/contract_fuzz_test.py",
        "tests/system/pins_test.py",
        *LAUNCHER_TESTS,
    ],
    "attest/documents.py": [
        "tests/attest/attest_test.py",
        "tests/system/contract_fuzz_test.py",
        *LAUNCHER_TESTS,
        "tests/boot/verify_test.py",
    ],
    "attest/speculation.py": ["tests/attest/attest_test.py", *LAUNCHER_TESTS],
    "attest/profile.py": ["tests/attest/target_profile_test.py", *LAUNCHER_TESTS],
    "attest/lock.py": ["tests/attest/lock_test.py", *BOOT_TESTS],
    "attest/tree.py": ["tests/attest/tree_test.py", *BOOT_TESTS, "tests/attest/record_test.py"],
    "attest/files.py": ["tests/attest/attest_test.py", "tests/system/no_data_loss_test.py", *BOOT_TESTS],
    "attest/edge/redact.py": [
        "tests/attest/attest_test.py",
        "tests/boot/serve_test.py",
        "tests/launcher/launcher_test.py",
    ],
    "attest/errors.py": ["tests/attest/attest_test.py", "tests/launcher/hostile_test.py"],
    "attest/baked.py": ["tests/launcher/launcher_test.py", "tests/system/pins_test.py", "tests/boot/verify_test.py"],
    "boot/checkpoint/verify.py": BOOT_TESTS,
    "boot/checkpoint/receipt.py": ["tests/boot/receipt_test.py", "tests/boot/prepare_test.py"],
    "boot/serving/serve.py": ["tests/boot/serve_test.py", "tests/boot/api_test.py"],
    "tools/gate/stats.py": GATE_TESTS,
    "tools/gate/corpus.py": GATE_TESTS,
    "tools/gate/openai_client.py": GATE_TESTS,
    "tools/gate/parity.py": GATE_TESTS,
    "tools/gate/benchmark.py": GATE_TESTS,
    "tools/gate/cli.py": GATE_TESTS,
    "tools/oci/verify.py": [
        "tests/oci/verify_test.py",
        "tests/oci/hostile_test.py",
        "tests/system/contract_fuzz_test.py",
        "tests/system/pins_test.py",
    ],
}
# Tests that read Bazel-built images (runfiles under Bazel). The driver runs outside Bazel's
# test runner: when `bazel build //images:qwen_mi300x` has made them, each job copy links
# bazel-bin's outputs in (and a `tools/oci/run` that runs the copy's own run_image.py);
# otherwise these tests are deselected and the report says so.
BUILT_IMAGE = [
    "images/qwen_mi300x.layout",
    "images/qwen_mi300x.provenance.json",
    "images/qwen_mi300x.spdx.json",
    "images/qwen_mi300x.run.sh",
]
NEEDS_BUILT_IMAGE = [
    "tests/system/pins_test.py::test_signed_push_verifies_with_ours_and_cosign",
    "tests/system/pins_test.py::test_the_wrong_key_is_refused_by_both",
    "tests/system/pins_test.py::test_tampered_provenance_is_refused_by_both",
    "tests/system/pins_test.py::test_provenance_about_another_digest_is_refused_by_both",
    "tests/system/pins_test.py::test_verify_cli_refuses_a_tag_and_prints_json",
]
# The schema export test runs a Bazel target's output against the models.
DESELECT = ["tests/attest/attest_test.py::test_schema_export_target_matches_the_models"]


@dataclass(frozen=True)
class Mutant:
    module: str
    line: int
    column: int
    kind: str
    index: int  # which of the mutations at this node
    description: str

    @property
    def ident(self) -> str:
        return f"{self.module}:{self.line}:{self.column}:{self.kind}:{self.index}"


FLIPS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str, int, str]]:
    """(node, kind, index, description) for every mutation of `tree`, in a stable order."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for position, operator in enumerate(node.ops):
                if type(operator) in FLIPS:
                    sites.append(
                        (node, "compare", position, f"{type(operator).__name__} -> {FLIPS[type(operator)].__name__}")
                    )
        elif isinstance(node, ast.BoolOp):
            sites.append((node, "boolop", -1, "and <-> or"))
            for position in range(len(node.values)):
                sites.append((node, "drop", position, f"drop operand {position + 1} of {len(node.values)}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            sites.append((node, "not", 0, "remove not"))
        elif isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.Constant):
            sites.append((node, "negate", 0, "negate condition"))
        elif isinstance(node, ast.Raise):
            sites.append((node, "raise", 0, "raise -> pass"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append((node, "number", 0, f"{node.value} -> {node.value + 1}"))
            sites.append((node, "number", 1, f"{node.value} -> {node.value - 1}"))
        elif (
            isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool)
        ):
            sites.append((node, "return", 0, f"return {node.value.value} -> {not node.value.value}"))
    return sites


def _is_docstring_or_annotation(tree: ast.AST) -> set[int]:
    """ids of nodes not worth mutating: docstrings and type annotations."""
    skip = set()
    for node in ast.walk(tree):
        for field in ("annotation", "returns"):
            value = getattr(node, field, None)
            if value is not None:
                skip.update(id(inner) for inner in ast.walk(value))
    return skip


def mutants(module: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _is_docstring_or_annotation(tree)
    return sorted(
        {
            Mutant(module, node.lineno, node.col_offset, kind, index, description)
            for node, kind, index, description in _sites(tree)
            if id(node) not in skip
        },
        key=lambda m: (m.line, m.column, m.kind, m.index),
    )


def apply(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    for node, kind, index, description in _sites(tree):
        if (node.lineno, node.col_offset, kind, index) != (mutant.line, mutant.column, mutant.kind, mutant.index):
            continue
        if kind == "compare":
            node.ops[index] = FLIPS[type(node.ops[index])]()
        elif kind == "boolop":
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif kind == "drop":
            rest = node.values[:index] + node.values[index + 1 :]
            if len(rest) == 1:
                return _replace(tree, node, rest[0])
            node.values = rest
        elif kind == "not":
            return _replace(tree, node, node.operand)
        elif kind == "negate":
            node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
        elif kind == "raise":
            return _replace(tree, node, ast.Pass())
        elif kind == "number":
            node.value = node.value + (1 if index == 0 else -1)
        elif kind == "return":
            node.value = ast.Constant(not node.value.value)
        return ast.unparse(ast.fix_missing_locations(tree))
    raise KeyError(mutant.ident)


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> str:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
            elif isinstance(value, list) and any(item is old for item in value):
                setattr(parent, field, [new if item is old else item for item in value])
    return ast.unparse(ast.fix_missing_locations(tree))


def _load_equivalents(root: Path) -> dict[str, str]:
    found = {}
    for number, line in enumerate((root / EQUIVALENT).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        ident, sep, reason = line.partition("  # ")
        if not sep or not reason.strip():
            raise SystemExit(f"{EQUIVALENT} line {number}: expected `MUTANT_ID  # reason`")
        found[ident.strip()] = reason.strip()
    return found


def _pytest(
    copy_root: Path,
    tests: list[str],
    python_path: str,
    timeout: float,
    durations: Path,
    record: bool = False,
    killers: Path | None = None,
    failed: Path | None = None,
    log: Path | None = None,
) -> int:
    deselect = DESELECT if (copy_root / BUILT_IMAGE[0]).exists() else [*DESELECT, *NEEDS_BUILT_IMAGE]
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tools.dev.mutation.fastfirst",
        "--no-header",
        *[f"--deselect={item}" for item in deselect],
        *tests,
    ]
    # No plugin autoloading: the environment's plugins (hypothesis's, anyio's) are not used by
    # the covering tests (hypothesis tests run without its plugin), and importing them was most
    # of each run's start-up, paid once per mutant.
    env = {
        **os.environ,
        "PYTHONPATH": python_path,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "OMNI_MUTATION_DURATIONS": str(durations),
        "OMNI_MUTATION_RECORD": "1" if record else "0",
        "OMNI_MUTATION_KILLERS": str(killers or ""),
        "OMNI_MUTATION_FAILED": str(failed or ""),
    }
    try:
        with open(log or os.devnull, "wb") as output:
            return subprocess.run(
                argv,
                cwd=copy_root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
    except subprocess.TimeoutExpired:
        return -1  # a mutant that hangs the tests is caught
    finally:
        _kill_leftovers(copy_root)


def _kill_leftovers(copy_root: Path) -> None:
    """A mutant that breaks a shutdown path (a server's stop()) leaves processes in their own
    sessions, out of reach of pytest's cleanup: anything still running in this copy goes."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == copy_root or copy_root in cwd.parents:
            try:
                os.kill(int(entry.name), 9)
            except OSError:
                pass


def _has_built_image(root: Path) -> bool:
    return all((root / "bazel-bin" / name).exists() for name in BUILT_IMAGE)


def _copy_tree(root: Path, target: Path, with_image: bool) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for name in files:
        source = root / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    if with_image:
        for name in BUILT_IMAGE:
            (target / name).symlink_to((root / "bazel-bin" / name).resolve())
        shim = target / "tools/oci/run"  # what the run.sh scripts exec, as runfiles would hold it
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m tools.oci.run_image "$@"\n', encoding="utf-8")
        shim.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mutation",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("modules", nargs="*", help=f"default: {' '.join(TARGETS)}")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--report", type=Path, help="also write the report as JSON here")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument(
        "--tests",
        nargs="+",
        metavar="TEST",
        help="run only these of the declared covering tests (a quick look while writing tests: "
        "a score with fewer tests is a lower bound of the declared one)",
    )
    args = parser.parse_args(argv)
    root = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY") or Path.cwd())
    modules = args.modules or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        print(f"mutation: no covering tests declared for {unknown}; known: {sorted(TARGETS)}", file=sys.stderr)
        return 2
    equivalents = _load_equivalents(root)
    work = Path(tempfile.mkdtemp(prefix="omni-mutation-"))
    # The job's copy first, then this interpreter's packages (under `bazel run`: the locked ones).
    python_path = os.pathsep.join([str(work / "job{}"), *dict.fromkeys(p for p in sys.path if p)])
    results: dict[str, dict] = {}
    try:
        with_image = _has_built_image(root)
        if not with_image:
            print(
                "mutation: bazel-bin has no built qwen_mi300x image (bazel build //images:qwen_mi300x); "
                f"deselecting {len(NEEDS_BUILT_IMAGE)} tests that read it",
                file=sys.stderr,
            )
        for job in range(args.jobs):
            _copy_tree(root, work / f"job{job}", with_image)
        for module in modules:
            source = (root / module).read_text(encoding="utf-8")
            found = mutants(module, source)
            # An entry is a line and column: after an edit it may name no mutant any more, and
            # the mutant it meant is scored again (a survivor until the entry is moved).
            stale = sorted({i for i in equivalents if i.startswith(module + ":")} - {m.ident for m in found})
            for ident in stale:
                print(
                    f"mutation: {EQUIVALENT}: {ident} names no mutant of {module} (moved by an edit?)",
                    file=sys.stderr,
                    flush=True,
                )
            if args.list:
                for mutant in found:
                    print(f"{mutant.ident}  {mutant.description}")
                continue
            tests = TARGETS[module]
            if args.tests:
                undeclared = sorted(set(args.tests) - set(tests))
                if undeclared:
                    print(f"mutation: {module}: {undeclared} are not among its declared tests {tests}", file=sys.stderr)
                    return 2
                tests = [test for test in tests if test in args.tests]
            started = time.monotonic()
            slug = module.replace("/", "_")
            durations, baseline_log = work / f"durations-{slug}.json", work / f"baseline-{slug}.log"
            if (
                _pytest(work / "job0", tests, python_path.format(0), 1800, durations, record=True, log=baseline_log)
                != 0
            ):
                tail = baseline_log.read_text(encoding="utf-8", errors="replace")[-4000:]
                print(
                    f"mutation: {module}: its tests fail without any mutant; fix them first. The end of their "
                    f"output:\n{tail}",
                    file=sys.stderr,
                )
                return 2
            timeout = TIMEOUT_FACTOR * (time.monotonic() - started) + 10
            scored = [m for m in found if m.ident not in equivalents]
            print(
                f"mutation: {module}: {len(found)} mutants ({len(found) - len(scored)} equivalent), "
                f"{args.jobs} jobs ...",
                file=sys.stderr,
                flush=True,
            )
            free = list(range(args.jobs))
            survivors: list[Mutant] = []
            kills: dict[str, int] = {}  # test id -> mutants of this module it killed: those tests run first
            kills_lock = threading.Lock()

            def run_one(mutant: Mutant) -> bool:
                job = free.pop()
                try:
                    target = work / f"job{job}" / module
                    killers, failed = work / f"killers{job}.json", work / f"failed{job}"
                    with kills_lock:
                        killers.write_text(json.dumps(kills), encoding="utf-8")
                    failed.unlink(missing_ok=True)
                    target.write_text(apply(source, mutant), encoding="utf-8")
                    killed = (
                        _pytest(
                            work / f"job{job}",
                            tests,
                            python_path.format(job),
                            timeout,
                            durations,
                            killers=killers,
                            failed=failed,
                        )
                        != 0
                    )
                    target.write_text(source, encoding="utf-8")
                    if failed.is_file():
                        killer = failed.read_text(encoding="utf-8")
                        with kills_lock:
                            kills[killer] = kills.get(killer, 0) + 1
                    return killed
                finally:
                    free.append(job)

            with ThreadPoolExecutor(args.jobs) as pool:
                for done, (mutant, killed) in enumerate(zip(scored, pool.map(run_one, scored)), 1):
                    if not killed:
                        survivors.append(mutant)
                    if done % 25 == 0:
                        print(f"  {done}/{len(scored)}, {len(survivors)} survived", file=sys.stderr, flush=True)
            killed = len(scored) - len(survivors)
            results[module] = {
                "generated": len(found),
                "equivalent": len(found) - len(scored),
                "killed": killed,
                "survived": len(survivors),
                "score": round(killed / len(scored), 4) if scored else 1.0,
                "seconds": round(time.monotonic() - started, 1),
                "tests": tests,
                "survivors": [f"{m.ident}  {m.description}" for m in survivors],
                "stale_equivalents": stale,
            }
            print(
                f"mutation: {module}: {killed}/{len(scored)} killed ({results[module]['score']:.1%}), "
                f"{results[module]['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            for survivor in results[module]["survivors"]:
                print(f"    survived: {survivor}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.list:
        return 0
    print(f"{'module':<28} {'generated':>9} {'equivalent':>10} {'killed':>7} {'survived':>8} {'score':>7}")
    for module, row in results.items():
        print(
            f"{module:<28} {row['generated']:>9} {row['equivalent']:>10} {row['killed']:>7} {row['survived']:>8} "
            f"{row['score']:>7.1%}"
        )
        for survivor in row["survivors"]:
            print(f"    survived: {survivor}")
    if args.report:
        args.report.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
