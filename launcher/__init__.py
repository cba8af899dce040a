"""Fail-closed, local-files-only vLLM launcher for Qwen3.8-27B on one MI300X.
It runs in the image beside vLLM and never imports it (or torch: either can initialise an accelerator).

It never downloads a model and never invokes a shell. It verifies a pinned checkpoint
attestation, probes the installed vLLM by metadata and source files, selects autoregressive,
native one-token MTP or a gated DFlash2 canary, and execs the server.
"""
