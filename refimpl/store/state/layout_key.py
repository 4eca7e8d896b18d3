"""Layout keys: what makes entries share a flat layout (see [Note: store vocabulary] in
:mod:`refimpl.store.state.layout`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

import torch

from refimpl.store.config import CATEGORY_ORDER, FIRST_USE_ORDER, Category


@dataclass(frozen=True)
class LayoutKey:
    """What makes entries share a flat buffer: category, dtype and the backend's placement key."""

    category: Category
    dtype: torch.dtype
    placement: Hashable | None = None

    def __post_init__(self) -> None:
        # hashed once: a key is looked up per layout in every stage, and the generated __hash__ costs
        # three Python calls (the Enum's __hash__ among them) per lookup
        object.__setattr__(self, "_hash", hash((self.category.value, self.dtype, self.placement)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return LayoutKey, (self.category, self.dtype, self.placement)  # the hash is made afresh

    def sort_key(self) -> tuple[int, str, str]:
        """A total order identical on every rank (layouts are processed in it)."""
        return CATEGORY_ORDER[self.category], str(self.dtype), repr(self.placement)

    def reload_key(self) -> tuple[int, int, str, str]:
        """The order a reload issues layouts in: a training step's first use of the category, then
        :meth:`sort_key` (identical on every rank)."""
        return (FIRST_USE_ORDER[self.category], *self.sort_key())

    def label(self) -> str:
        """Short human-readable name, e.g. ``params/bfloat16`` or ``params/bfloat16@<placement>``."""
        base = f"{self.category.value}/{str(self.dtype).replace('torch.', '')}"
        return base if self.placement is None else f"{base}@{self.placement}"


_CATEGORY_BY_VALUE = {c.value: c for c in Category}


class LayoutKeys(dict):
    """Layout keys interned by ``(category value, dtype, placement key)``: ``keys[raw]`` makes the key once.

    A plain dict lookup per storage on a hit (Enum hashing is slow in the per-storage loops, hence the
    category's value in the raw tuple); :meth:`__missing__` builds the :class:`LayoutKey` on a miss.
    """

    def __missing__(self, raw: tuple[str, torch.dtype, Hashable | None]) -> "LayoutKey":
        key = self[raw] = LayoutKey(_CATEGORY_BY_VALUE[raw[0]], raw[1], raw[2])
        return key


__all__ = ["LayoutKey", "LayoutKeys"]
