"""Observation/action spaces shared by every env backend (gymnax now, envpool/gymnasium later)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Discrete", "Box", "from_gymnax_space"]


@dataclass(frozen=True)
class Discrete:
    """``n`` actions ``0 .. n-1``; an action batch is int32 shaped ``(N,)``."""

    n: int

    @property
    def shape(self) -> tuple[int, ...]:
        """``()``: one env's action is a scalar."""
        return ()

    def __repr__(self) -> str:
        return f"Discrete({self.n})"


@dataclass(frozen=True)
class Box:
    """A real (or integer) array space of ``shape`` with elementwise bounds ``low``/``high``.

    ``low``/``high`` are numpy arrays broadcast to ``shape`` (possibly infinite).
    """

    shape: tuple[int, ...]
    dtype: Any
    low: np.ndarray
    high: np.ndarray

    def __repr__(self) -> str:
        lo, hi = np.unique(self.low), np.unique(self.high)
        bounds = f"[{lo[0]:g}, {hi[0]:g}]" if lo.size == 1 and hi.size == 1 else "[per-dim bounds]"
        return f"Box({self.shape}, {np.dtype(self.dtype).name}, {bounds})"

    # eq/hash by shape/dtype/bounds values (numpy arrays are not hashable)
    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Box) and self.shape == other.shape
                and np.dtype(self.dtype) == np.dtype(other.dtype)
                and np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high))

    def __hash__(self) -> int:
        return hash((self.shape, np.dtype(self.dtype).str))


def from_gymnax_space(space: Any) -> Discrete | Box:
    """Convert a gymnax space into :class:`Discrete` or :class:`Box`.

    Raises:
        TypeError: for other space types (Tuple, Dict, ...), naming the type found.
    """
    import gymnax.environments.spaces as gs

    if isinstance(space, gs.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, gs.Box):
        shape = tuple(int(s) for s in space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float64), shape).copy()
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float64), shape).copy()
        return Box(shape, np.dtype(space.dtype), low, high)
    raise TypeError(f"unsupported space {type(space).__name__}; allowed: Discrete, Box")
