"""The py_test suites of `bazel test //...`, with fixtures they build themselves (tiny checkpoints,
loopback servers, fake distributions). They must not import `vllm`, `sglang` or `torch`: engine checks run the engines as processes."""
