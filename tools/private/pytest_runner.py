"""Entry point of every omni_py_test: runs pytest on the test's own source files.

Bazel passes the test files as arguments; this adds what Bazel's test protocol expects
(JUnit XML in XML_OUTPUT_FILE, --test_filter as `-k`) and keeps pytest from writing into
the read-only runfiles tree.
"""
from __future__ import annotations

import os
import sys

import pytest


def main() -> int:
    args = ["-p", "no:cacheprovider", "-q", "-ra", "--strict-markers"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    if os.environ.get("TESTBRIDGE_TEST_ONLY"):
        args += ["-k", os.environ["TESTBRIDGE_TEST_ONLY"]]
    sys.dont_write_bytecode = True
    return pytest.main(args + sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
