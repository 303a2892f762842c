"""Fixtures: a tiny model folder (config + trained BPE tokenizer) and in-process servers."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from tests.support.emulated import emulator

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n",
    "Agentic reinforcement learning alternates between tool calls and generation.",
] * 20


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    d = tmp_path_factory.mktemp("tiny-model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": None}))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 1024,
        "eos_token_id": 2, "max_position_embeddings": 4096, "hidden_size": 64}))
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


@pytest.fixture
def emu():
    """Factory: ``async with emu(*flags) as (url, worker)`` runs an emulated worker."""
    return emulator


@pytest.fixture
def port_factory():
    """Returns a function giving a currently free loopback port."""
    return free_port
