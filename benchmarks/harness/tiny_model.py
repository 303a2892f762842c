"""A tiny random-weight causal LM written locally (no model hub).

Real SGLang loads it on CPU in seconds, so tests can exercise real servers: weight
updates from disk need real safetensors weights, and token-exact resumption needs
weights with enough variance that greedy decoding does not fall into a short loop
(dummy weights do). The tokenizer is a byte-level BPE trained on a built-in corpus.

    python -m benchmarks.harness.tiny_model OUT_DIR [--arch qwen2|qwen3|llama] [--seed N]
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ARCHITECTURES = {
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "llama": ("LlamaForCausalLM", "llama"),
}
_CORPUS_WORDS = (
    "the agent reads the issue and opens the file then edits the function and runs "
    "the tests until they pass a patch is a diff over lines of code the environment "
    "returns an observation with stdout stderr and an exit code reward is one when "
    "the hidden tests pass zero otherwise prefill computes the prompt decode emits "
    "tokens one by one the router sends each turn to a worker that holds its prefix "
    "paris is the capital of france rome of italy berlin of germany madrid of spain "
    "def main return import class for while if else try except with as yield lambda "
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } : ; , . ' \" # @ ! ? < > _"
).split()


@dataclass(frozen=True)
class TinyModelSpec:
    arch: str = "qwen2"
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    weight_std: float = 0.3
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def validate(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {self.arch!r}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must divide by num_heads, num_heads by num_kv_heads")


def _corpus(seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    words = list(_CORPUS_WORDS) + [
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)
    ]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) for _ in range(6000)]


def write_tokenizer(out: Path, spec: TinyModelSpec) -> dict[str, int]:
    """Train a byte-level BPE tokenizer; returns the ids of the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    if tok.get_vocab_size() != spec.vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {spec.vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False}
            for t, i in ids.items()
        },
    }, indent=1))
    return ids


def config_dict(spec: TinyModelSpec, eos_id: int, pad_id: int) -> dict:
    arch, model_type = ARCHITECTURES[spec.arch]
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "use_cache": True,
    }
    if spec.arch == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=spec.num_layers)
    if spec.arch == "qwen3":
        cfg.update(attention_bias=False, use_sliding_window=False, sliding_window=None)
    return cfg


def weight_shapes(spec: TinyModelSpec) -> dict[str, tuple[int, ...]]:
    h, i, v, d = spec.hidden_size, spec.intermediate_size, spec.vocab_size, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for n in range(spec.num_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
        if spec.arch == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if spec.arch == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return shapes


def write_weights(path: Path, spec: TinyModelSpec, seed: int) -> None:
    """Random float32 weights; norms are ones so activations stay bounded."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in weight_shapes(spec).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape) * spec.weight_std).astype(np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_tiny_model(out: Path | str, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write config, tokenizer and weights into ``out``; returns it. Deterministic in ``spec``."""
    spec.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out, spec)
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    (out / "config.json").write_text(json.dumps(config_dict(spec, eos, pad), indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad}, indent=1))
    write_weights(out / "model.safetensors", spec, spec.seed)
    return out


def write_weight_variant(model_dir: Path | str, out: Path | str, seed: int) -> Path:
    """A second checkpoint of the same model with different weights (for weight updates)."""
    model_dir, out = Path(model_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((model_dir / "config.json").read_text())
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((model_dir / name).read_bytes())
    arch = next(k for k, (a, _) in ARCHITECTURES.items() if a == cfg["architectures"][0])
    spec = TinyModelSpec(
        arch=arch, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], num_kv_heads=cfg["num_key_value_heads"],
        max_position_embeddings=cfg["max_position_embeddings"])
    write_weights(out / "model.safetensors", spec, seed)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--arch", default="qwen2", choices=sorted(ARCHITECTURES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_tiny_model(args.out, TinyModelSpec(arch=args.arch, seed=args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
