"""One switch for every compiled-function cache: tianji's per-config caches and JAX's own.

tianji_jax keeps compiled trainers, learners and evaluators per config so that a second
``train`` with the same config compiles nothing. Every XLA CPU executable also holds a few
memory mappings, and Linux caps mappings per process (``vm.max_map_count``, 65530 by default):
a long-lived process that compiles thousands of different configs (a sweep in one Jupyter
kernel, a test session) can reach the cap, after which the next compilation crashes the process
with a segmentation fault inside LLVM. :func:`clear_caches` frees them.
"""

from __future__ import annotations

import gc
from typing import Any, MutableMapping

__all__ = ["clear_caches", "register"]

_REGISTERED: list[MutableMapping[Any, Any]] = []


def register(cache: MutableMapping[Any, Any]) -> MutableMapping[Any, Any]:
    """Register a module-level compiled-function cache (a dict) so :func:`clear_caches` empties
    it; returns ``cache``."""
    _REGISTERED.append(cache)
    return cache


def clear_caches() -> None:
    """Drop every compiled function tianji_jax and JAX hold (``jax.clear_caches()``), so their
    executables and memory mappings are freed. The next ``train``/``make_train`` recompiles.
    Do not call it while a run is in progress in another thread."""
    import jax

    for cache in _REGISTERED:
        cache.clear()
    jax.clear_caches()
    gc.collect()
