"""Entry point of every omni_py_test: runs pytest on the test's own source files.

Bazel passes the test files as arguments; this adds what Bazel's test protocol expects
(JUnit XML in XML_OUTPUT_FILE, --test_filter as `-k`) and keeps pytest from writing into
the read-only runfiles tree.

With OMNI_TEST_PYTHON set (the `*_oldest_python` twins of omni_py_test), the same tests run
under that interpreter instead: Debian 12's own python3 (3.11.2) is the oldest Python the
README supports, and an API that arrived in a later 3.11 release (extraction filters came in
3.11.4) fails there while the suite passes under a newer 3.11. The locked packages are built
for one minor version's ABI, so the twin runs only when that interpreter is an older release
of the toolchain's own minor version; otherwise it says why it has nothing to check.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

OLDEST_PYTHON_VARIABLE = "OMNI_TEST_PYTHON"


def _version_of(interpreter: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [interpreter, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        major, minor, micro = (int(part) for part in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return major, minor, micro


def _own_library_paths() -> list[str]:
    """sys.path without this interpreter's standard library: the runfiles and the locked site."""
    own = {os.path.realpath(prefix) for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return [
        path
        for path in sys.path
        if path
        and not any(
            os.path.realpath(path) == prefix or os.path.realpath(path).startswith(prefix + os.sep) for prefix in own
        )
    ]


def _rerun_under(interpreter: str) -> int | None:
    """Runs this test under `interpreter` when it is an older release of this minor version;
    None (after saying why) when there is nothing to check on this host."""
    theirs, ours = _version_of(interpreter), tuple(sys.version_info[:3])
    if theirs is None:
        print(
            f"{OLDEST_PYTHON_VARIABLE}={interpreter}: not a runnable Python on this host; nothing older to check here"
        )
        return None
    if theirs[:2] != ours[:2] or theirs >= ours:
        print(
            f"{OLDEST_PYTHON_VARIABLE}={interpreter} is Python {'.'.join(map(str, theirs))}, the toolchain "
            f"{'.'.join(map(str, ours))}: only an older {ours[0]}.{ours[1]} release can run the locked "
            "packages and find an API newer than itself; the toolchain run covers this host"
        )
        return None
    print(
        f"running under {interpreter} (Python {'.'.join(map(str, theirs))}), "
        f"not the toolchain's {'.'.join(map(str, ours))}",
        flush=True,
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(_own_library_paths()))
    env.pop(OLDEST_PYTHON_VARIABLE)
    return subprocess.run([interpreter, "-s", "-B", os.path.abspath(__file__), *sys.argv[1:]], env=env).returncode


def main() -> int:
    interpreter = os.environ.get(OLDEST_PYTHON_VARIABLE)
    if interpreter:
        code = _rerun_under(interpreter)
        if code is not None:
            return code
        # Nothing older to run under: the files must still import and collect.
        collected = pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", *sys.argv[1:]])
        return 0 if collected == pytest.ExitCode.OK else 1
    args = ["-p", "no:cacheprovider", "-q", "-ra", "--strict-markers"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    if os.environ.get("TESTBRIDGE_TEST_ONLY"):
        args += ["-k", os.environ["TESTBRIDGE_TEST_ONLY"]]
    sys.dont_write_bytecode = True
    return pytest.main(args + sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
