"""omni_py_test: a py_test whose main is the shared pytest runner."""

load("@rules_python//python:defs.bzl", "py_test")

_RUNNER = Label("//tools/private:pytest_runner.py")

# The oldest interpreter the README supports: Debian 12's own python3 (3.11.2).
OLDEST_PYTHON = "/usr/bin/python3"

def _package_init():
    """A test package's own __init__.py and the tests umbrella's: pytest then names each test
    module by its package (tests.oci.verify_test), so equal file names in two folders never meet."""
    if not native.package_name().startswith("tests/"):
        return [], []
    return native.glob(["__init__.py"]), ["//tests:init"]

def _pytest(name, srcs, deps, args, **kwargs):
    init_srcs, init_deps = _package_init()
    py_test(
        name = name,
        srcs = srcs + init_srcs + [_RUNNER],
        main = _RUNNER,
        args = ["$(rootpath {})".format(src) for src in srcs] + args,
        deps = deps + init_deps + ["@pypi//:pytest"],
        python_version = "PY3",
        **kwargs
    )

def omni_py_test(name, srcs, deps = [], args = [], also_on_oldest_python = False, **kwargs):
    """A py_test that runs pytest over `srcs`.

    Args:
      name: target name.
      srcs: the test files (test functions collected by pytest).
      deps: libraries the tests import; pytest is always added.
      args: extra pytest arguments, after the test files.
      also_on_oldest_python: adds `<name>_oldest_python`, the same tests run under Debian's
        own python3 where that is an older release of the toolchain's minor version (see
        pytest_runner.py); elsewhere it only checks that the tests collect.
      **kwargs: passed to py_test (data, tags, size, env, ...).

    Example:

        omni_py_test(
            name = "verify_test",
            size = "small",
            srcs = ["verify_test.py"],
            also_on_oldest_python = True,
            deps = ["//tests/fixtures:oci", "//tools/oci"],
        )
    """
    _pytest(name, srcs, deps, args, **kwargs)
    if also_on_oldest_python:
        twin = dict(kwargs)
        twin["env"] = dict(kwargs.get("env", {}), OMNI_TEST_PYTHON = OLDEST_PYTHON)
        _pytest(name + "_oldest_python", srcs, deps, args, **twin)
