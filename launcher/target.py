"""The exact target and drafter this launcher serves: one source for every constant."""
from __future__ import annotations

TARGET_MODEL_ID = "Qwen/Qwen3.8-27B"
TARGET_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"
TARGET_MODEL_TYPE = "qwen3_5"
TARGET_TEXT_SHAPE = {
    "model_type": "qwen3_5_text",
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "vocab_size": 248320,
}
MTP_WEIGHT_GROUPS = ("mtp.layers.0.", "mtp.fc.", "mtp.norm.")

DFLASH2_MODEL_ID = "incoai/Qwen3.8-27B-DFlash2"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
DFLASH2_SHAPE = {"hidden_size": 5120, "num_target_layers": 64, "num_hidden_layers": 5, "vocab_size": 248320}
DFLASH2_DRAFTER_CONFIG = {
    "block_size": 8,
    "conv_group_size": 16,
    "conv_kernel_size": 2,
    "selector_rank": 256,
    "selector_top_k": 16,
    "target_layer_ids": [5, 19, 33, 47, 61],
}
DFLASH2_WEIGHT_FILE = "model.safetensors"
DFLASH2_SPECULATIVE_TOKENS = 7

HARDWARE_PROFILE = "mi300x_single"
GPU_ARCH = "gfx942"
