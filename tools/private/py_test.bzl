"""omni_py_test: a py_test whose main is the shared pytest runner."""

load("@rules_python//python:defs.bzl", "py_test")

_RUNNER = Label("//tools/private:pytest_runner.py")

def omni_py_test(name, srcs, deps = [], args = [], **kwargs):
    """A py_test that runs pytest over `srcs`.

    Args:
      name: target name.
      srcs: the test files (test functions collected by pytest).
      deps: libraries the tests import; pytest is always added.
      args: extra pytest arguments, after the test files.
      **kwargs: passed to py_test (data, tags, size, env, ...).
    """
    py_test(
        name = name,
        srcs = srcs + [_RUNNER],
        main = _RUNNER,
        args = ["$(rootpath {})".format(src) for src in srcs] + args,
        deps = deps + ["@pypi//:pytest"],
        python_version = "PY3",
        **kwargs
    )
