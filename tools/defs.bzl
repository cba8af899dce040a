"""Public Starlark API of Omni's build tooling."""

load("//tools/private:py_test.bzl", _omni_py_test = "omni_py_test")

omni_py_test = _omni_py_test
