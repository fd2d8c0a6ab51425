"""Explicit weight-name maps: every source tensor is taken once, with its shape checked."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from specedge.errors import ExportError


class WeightTable:
    """Wraps a source state dict; `take` hands out float32 numpy arrays and records what was used."""

    def __init__(self, names: Iterable[str], load: Callable[[str], np.ndarray], ignore: Iterable[str] = ()):
        self._load = load
        self._left = {n for n in names if not any(n.endswith(suffix) for suffix in ignore)}

    def take(self, name: str, shape: tuple) -> np.ndarray:
        if name not in self._left:
            raise ExportError(f"source weights lack '{name}' (or it was used twice)")
        self._left.discard(name)
        return self.again(name, shape)

    def again(self, name: str, shape: tuple) -> np.ndarray:
        """A tensor already taken, read once more (a tied head: read at the end, not held through the layers)."""
        array = np.asarray(self._load(name), dtype=np.float32)
        if tuple(array.shape) != tuple(shape):
            raise ExportError(f"weight '{name}' has shape {tuple(array.shape)}, expected {tuple(shape)}")
        return array

    def drop(self, name: str) -> None:
        """Marks a tensor as deliberately unused (for example a tied lm_head that repeats the embedding)."""
        self._left.discard(name)

    def finish(self) -> None:
        if self._left:
            shown = ", ".join(sorted(self._left)[:5])
            raise ExportError(f"{len(self._left)} source weights were not mapped into the graph: {shown}")
