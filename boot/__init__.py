"""Pinned checkpoint download and verification, SGLang serving and API acceptance for
DeepSeek-V4.1-Flash on 3x DGX Spark (GB10), TP3/EP3 over NCCL. It runs in the image beside the
engine and must not import `launcher`, `tools`, `tests`, `sglang` or `torch` (it starts SGLang as a process).

Spark remap of the 4x RTX PRO 6000 TP4/EP4 recipe. Engram tables stay on NVMe via the
row-store adapter; RAM mode is refused by default because on Spark host RAM is the GPU's
unified memory.
"""
