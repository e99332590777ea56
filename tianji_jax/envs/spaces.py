"""Observation/action spaces shared by every env backend (gymnax, the JAX suites, envpool, gymnasium).

Action batches of ``N`` envs: :class:`Discrete` int32 ``(N,)``; :class:`MultiDiscrete` int32
``(N, len(nvec))`` (factor ``k`` in ``0 .. nvec[k]-1``); :class:`Box` float32 ``(N, *shape)``.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Discrete", "MultiDiscrete", "Box", "from_gymnax_space"]


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
class MultiDiscrete:
    """A factored discrete action: ``len(nvec)`` sub-actions, factor ``k`` in ``0 .. nvec[k]-1``.

    One env's action is int32 shaped ``(len(nvec),)``; a batch of ``N`` is ``(N, len(nvec))``. The
    policy over it is a factored categorical (:func:`~tianji_jax.algos.distributions.factored_log_prob`):
    one logits vector of ``sum(nvec)`` entries split per factor. Only PPO takes it
    (:data:`~tianji_jax.algos.capabilities.MULTI_DISCRETE_REASONS`).

    Raises:
        ValueError: ``nvec`` empty or with an entry below 1.
    """

    nvec: tuple[int, ...]

    def __post_init__(self) -> None:
        nvec = tuple(int(n) for n in np.asarray(self.nvec).reshape(-1))
        if not nvec or min(nvec) < 1:
            raise ValueError(f"MultiDiscrete: nvec={list(nvec)}; allowed: one or more sizes >= 1")
        object.__setattr__(self, "nvec", nvec)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(len(nvec),)``: one env's action is one int per factor."""
        return (len(self.nvec),)

    @property
    def dtype(self) -> Any:
        """``int32``."""
        return np.dtype(np.int32)

    @property
    def num_logits(self) -> int:
        """``sum(nvec)``: the size of the factored categorical's logits vector."""
        return int(sum(self.nvec))

    def __repr__(self) -> str:
        return f"MultiDiscrete({list(self.nvec)})"


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


# Plotting modules gymnax imports at module level for its render helpers only (pong: seaborn,
# which pulls in scipy.stats; catch, rooms, point_robot: matplotlib.pyplot): about 2 s of every
# run's start-up here, never used by training. While gymnax is imported they are stand-ins that
# import the real module on first attribute use; the stand-ins are then taken out of
# sys.modules, so any later `import seaborn` gets the real module, and gymnax's rendering still
# works (through the stand-in it holds).
_PLOTTING = ("matplotlib.pyplot", "seaborn")
# Held while the stand-ins are in sys.modules: a second thread resolving a gymnax env waits for
# the first import to finish, and a stand-in touched meanwhile (another thread that ran
# `import seaborn` in that window) imports the real module instead of finding itself again.
_GYMNAX_LOCK = threading.RLock()


class _Deferred(types.ModuleType):
    """A stand-in for module ``name``: the real module is imported on first attribute access."""

    def __getattr__(self, attr: str) -> Any:
        with _GYMNAX_LOCK:
            if sys.modules.get(self.__name__) is self:  # touched while gymnax is being imported
                del sys.modules[self.__name__]
            module = importlib.import_module(self.__name__)
        return getattr(module, attr)


def import_gymnax() -> Any:
    """``import gymnax`` with the plotting modules it imports for rendering deferred to their first
    use (see ``_PLOTTING``); returns the gymnax module. Modules already imported are left alone.
    Thread-safe: a caller never gets a half-imported gymnax."""
    with _GYMNAX_LOCK:
        if "gymnax" in sys.modules:
            import gymnax  # waits for an import another thread started outside this function

            return gymnax
        placed = [name for name in _PLOTTING if name not in sys.modules]
        for name in placed:
            sys.modules[name] = _Deferred(name)
        try:
            import gymnax
        finally:
            for name in placed:
                if isinstance(sys.modules.get(name), _Deferred):
                    del sys.modules[name]
        return gymnax


def from_gymnax_space(space: Any) -> Discrete | MultiDiscrete | Box:
    """Convert a gymnax space into :class:`Discrete` or :class:`Box`; a :class:`MultiDiscrete`
    (gymnax has none: the JAX suites' envs return this module's) is returned as it is.

    Raises:
        TypeError: for other space types (Tuple, Dict, ...), naming the type found.
    """
    if isinstance(space, MultiDiscrete):
        return space
    gs = import_gymnax().environments.spaces

    if isinstance(space, gs.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, gs.Box):
        shape = tuple(int(s) for s in space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float64), shape).copy()
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float64), shape).copy()
        return Box(shape, np.dtype(space.dtype), low, high)
    raise TypeError(f"unsupported space {type(space).__name__}; allowed: Discrete, Box, MultiDiscrete")
