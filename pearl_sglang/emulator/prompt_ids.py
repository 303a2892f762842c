"""A prompt's token ids as a uint64 array, for callers that have already checked them.

An agentic turn carries its whole context (tens of thousands of ids). Over HTTP the
emulator decodes the JSON into Python ints, checks each one's type and converts them
to uint64 for its page hashes. A caller in the same process that holds ids it has
already validated (the replay harness's in-process transport: the router checked the
text as canonical non-negative JSON integers) hands them over as ``PromptIds`` instead:
the engine hashes the array as it is, and whatever reads single ids or slices (a
prefix-cache tail, ``prompt_token_ids``) gets Python ints, as from a tuple.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence, overload

import numpy as np


class PromptIds(Sequence[int]):
    """Non-negative token ids in a read-only uint64 array; equal to any sequence of the
    same ids."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        if array.dtype != np.uint64 or array.ndim != 1:
            raise TypeError(f"PromptIds needs a 1-d uint64 array, not {array.dtype} {array.shape}")
        array.flags.writeable = False
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self.array[index].tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.array.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptIds):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and list(other) == self.array.tolist()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"PromptIds({len(self)} ids)"
