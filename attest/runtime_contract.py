"""The variables of an image's runtime contract that name places a program writes: one list for
the start-up checks (attest.primitives) and the image build that records them."""

from __future__ import annotations

# Variables that point the engine at places it writes (caches, temporary files): each must name a
# writable place at start-up (attest.primitives).
CACHE_VARIABLES = (
    "HOME",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TMPDIR",
)
# Every variable that points a program at a place it writes: the image build records them with
# the image's runtime contract.
WRITABLE_VARIABLES = (*CACHE_VARIABLES, "MODEL_PATH", "STATE_PATH")
