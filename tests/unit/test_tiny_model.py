import json

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from benchmarks.harness.tiny_model import (
    TinyModelSpec, weight_shapes, write_tiny_model, write_weight_variant,
)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_writes_loadable_model(tmp_path, arch):
    out = write_tiny_model(tmp_path / arch, TinyModelSpec(arch=arch))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == arch and cfg["vocab_size"] == 1024
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == 1024
    assert tok.decode(tok.encode("the agent reads the issue").ids) == "the agent reads the issue"
    tensors = load_file(str(out / "model.safetensors"))
    assert {k: v.shape for k, v in tensors.items()} == weight_shapes(TinyModelSpec(arch=arch))
    assert all(v.dtype == np.float32 for v in tensors.values())
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())


def test_deterministic_and_variant_differs(tmp_path):
    a = load_file(str(write_tiny_model(tmp_path / "a") / "model.safetensors"))
    b = load_file(str(write_tiny_model(tmp_path / "b") / "model.safetensors"))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    v = load_file(str(write_weight_variant(tmp_path / "a", tmp_path / "v", seed=7) / "model.safetensors"))
    assert set(v) == set(a)
    assert not np.array_equal(v["lm_head.weight"], a["lm_head.weight"])


def test_rejects_bad_spec(tmp_path):
    with pytest.raises(ValueError, match="arch"):
        write_tiny_model(tmp_path, TinyModelSpec(arch="gpt2"))
