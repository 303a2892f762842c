"""Text <-> token ids and model metadata for the HTTP shell.

With ``tokenizer.json`` in the model folder we use the HuggingFace ``tokenizers``
library, as SGLang would.  Without one, a built-in byte-level codec: ids 0-255 are
UTF-8 bytes, 256-258 are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, and any
higher id decodes to `` t<id>`` so generated text stays readable.

Chat prompts are rendered with the folder's ``chat_template`` through jinja2 when both
exist, otherwise with a fixed ChatML layout (``<|im_start|>role\\ncontent<|im_end|>\\n``
... ``<|im_start|>assistant\\n``), which is what Qwen-family templates produce for plain
text messages.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import fastjson

BYTE_SPECIALS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}
_SPECIAL = re.compile("|".join(map(re.escape, BYTE_SPECIALS)))


@dataclass(frozen=True)
class ModelMeta:
    """What the emulator reads from ``config.json`` (all optional)."""

    vocab_size: Optional[int] = None
    eos_token_id: Optional[int] = None
    context_length: Optional[int] = None
    architectures: tuple[str, ...] = ()
    model_type: Optional[str] = None
    raw: dict = field(default_factory=dict, compare=False)

    @staticmethod
    def load(model_path: str) -> "ModelMeta":
        path = Path(model_path) / "config.json"
        if not path.is_file():
            return ModelMeta()
        cfg = json.loads(path.read_text(encoding="utf-8"))
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return ModelMeta(vocab_size=cfg.get("vocab_size"), eos_token_id=eos,
                         context_length=cfg.get("max_position_embeddings"),
                         architectures=tuple(cfg.get("architectures") or ()),
                         model_type=cfg.get("model_type"), raw=cfg)


# Generated ids (259 and up) below this render as `` t<id>`` on the fast path.
_GENERATED_IDS = 1 << 18


class TextCodec:
    def __init__(self, model_path: Optional[str]) -> None:
        self._tok = None
        self.chat_template: Optional[str] = None
        root = Path(model_path) if model_path else None
        if root is not None and (root / "tokenizer.json").is_file():
            from tokenizers import Tokenizer
            self._tok = Tokenizer.from_file(str(root / "tokenizer.json"))
        if root is not None and (root / "tokenizer_config.json").is_file():
            tc = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
            tpl = tc.get("chat_template")
            self.chat_template = tpl if isinstance(tpl, str) else None
        if self._tok is not None:
            added = self._tok.get_added_tokens_decoder()
            self.special_ids = frozenset(i for i, t in added.items() if t.special)
            self._specials = {t.content: i for i, t in added.items()}
            self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        else:
            self.special_ids = frozenset(BYTE_SPECIALS.values())
            self._specials = dict(BYTE_SPECIALS)
            self.vocab_size = 512

    @property
    def uses_tokenizer(self) -> bool:
        return self._tok is not None

    def token_id(self, text: str) -> Optional[int]:
        return self._specials.get(text)

    def encode(self, text: str) -> list[int]:
        if self._tok is not None:
            return self._tok.encode(text, add_special_tokens=False).ids
        # The text between specials is encoded in one call: a prompt of thousands of
        # characters costs microseconds, not a Python step per character (the workers of
        # a benchmark share one process with the router and the clients).
        out: list[int] = []
        start = 0
        for m in _SPECIAL.finditer(text):
            out.extend(text[start:m.start()].encode("utf-8"))
            out.append(BYTE_SPECIALS[m.group()])
            start = m.end()
        out.extend(text[start:].encode("utf-8"))
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._tok is not None:
            return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        text = self.generated_text(ids)
        if text is not None:
            return text
        buf, parts = bytearray(), []
        names = {v: k for k, v in BYTE_SPECIALS.items()}
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            parts.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if i in names:
                parts.append("" if skip_special_tokens else names[i])
            else:
                parts.append(f" t{i}")
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def generated_text(self, ids: list[int]) -> Optional[str]:
        """The byte codec's text of generated ids (all >= 259: `` t<id>`` each, so a
        prefix's text is a prefix of the text); None when ``ids`` hold other ids. Written
        by orjson as ``a,b,c`` and the commas replaced, five times faster than formatting
        each id (a table of 2**18 strings was slower still: in a replay's large heap each
        lookup missed the cache)."""
        if self._tok is None and ids and min(ids) >= 259 and max(ids) < _GENERATED_IDS:
            return " t" + fastjson.dumps(ids)[1:-1].decode().replace(",", " t")
        return None

    def render_chat(self, messages: list[dict]) -> str:
        if self.chat_template:
            try:
                import jinja2.sandbox
            except ImportError:
                pass
            else:
                env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                return env.from_string(self.chat_template).render(
                    messages=messages, add_generation_prompt=True)
        parts = []
        for m in messages:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content}<|im_end|>\n")
        parts.append("<|im_start|>assistant\n")
        return "".join(parts)


class GrowingText:
    """Text of a growing output (one stream's chunks): with the byte codec, ids already
    decoded are not decoded again while every id maps to one table entry."""

    __slots__ = ("codec", "skip_special_tokens", "_n", "_text")

    def __init__(self, codec: TextCodec, skip_special_tokens: bool = True) -> None:
        self.codec, self.skip_special_tokens = codec, skip_special_tokens
        self._n, self._text = (0, "") if not codec.uses_tokenizer else (-1, "")

    def decode(self, ids: list[int]) -> str:
        n = self._n
        if 0 <= n <= len(ids):
            tail = self.codec.generated_text(ids[n:]) if len(ids) > n else ""
            if tail is not None:
                self._n, self._text = len(ids), self._text + tail
                return self._text
            self._n = -1  # an id outside the table: decode whole from now on
        return self.codec.decode(ids, skip_special_tokens=self.skip_special_tokens)
