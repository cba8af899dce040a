"""Pinned checkpoint download and verification, SGLang serving and API acceptance for
DeepSeek-V4.1-Flash on 3x DGX Spark (GB10), TP3/EP3 over NCCL. It runs in the image beside the
engine, which it starts as a process.

By phase, bottom to top: `boot.errors` and `boot.settings`; `boot.checkpoint` (the pinned
checkpoint on disk, however it arrives, and the group's verdict on it) and `boot.serving`
(SGLang and its acceptance), neither importing the other; `boot.cli`.

Spark remap of the 4x RTX PRO 6000 TP4/EP4 recipe. Engram tables stay on NVMe via the
row-store adapter; RAM mode is refused by default because on Spark host RAM is the GPU's
unified memory.
"""
