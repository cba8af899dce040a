"""The py_test suites of `bazel test //...`, with fixtures they build themselves (tiny checkpoints,
loopback servers, fake distributions). Engine checks run the engines as processes."""
