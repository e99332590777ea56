"""The device replay buffer's state and write side: :class:`ReplayState`, :func:`init`,
:func:`add`, and the memory checks (:func:`replay_bytes`, :func:`check_fits`). The layout, its
invariants and the prioritised-replay formulas are on the package (:mod:`tianji_jax.buffers.replay`)."""


from __future__ import annotations

import math
import numbers
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.buffers import sum_tree

__all__ = ["ReplayState", "init", "add", "replay_bytes", "check_fits"]

def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


_MAX_CAPACITY = sum_tree.MAX_CAPACITY  # 2^30: the sum-tree's int32 node indices
# per-slot metadata: policy_version (int32) + insert_index (int32); priorities: sum_tree.nbytes
_SLOT_META_BYTES = 8
# scalars: max_priority, write_pos, size, num_inserted
_SCALAR_BYTES = 16


@struct.dataclass
class ReplayState:
    """The buffer's whole state; a pytree, every leaf a ``jax.Array`` on the buffer's device.

    Attributes:
        data: pytree like the example item, every leaf ``(C, *item_shape)`` of the item's dtype.
        policy_version: ``(C,)`` int32 version each stored item was acted with; -1 if unwritten.
        insert_index: ``(C,)`` int32 global insert counter of each stored item; -1 if unwritten.
        tree: :class:`~tianji_jax.buffers.sum_tree.SumTree` over the ``C`` slots' ``p^alpha`` (0 if
            unwritten); :attr:`priority` is its leaf level.
        max_priority: ``()`` float32 largest ``p^alpha`` seen so far (1 initially).
        write_pos: ``()`` int32 next slot to write, in ``[0, C)``.
        size: ``()`` int32 number of filled slots, in ``[0, C]``; filled slots are ``[0, size)``.
        num_inserted: ``()`` int32 items inserted so far (including overwritten ones).
    """

    data: Any
    policy_version: jax.Array
    insert_index: jax.Array
    tree: sum_tree.SumTree
    max_priority: jax.Array
    write_pos: jax.Array
    size: jax.Array
    num_inserted: jax.Array

    @property
    def capacity(self) -> int:
        """``C``, static (from the shapes)."""
        return self.policy_version.shape[0]

    @property
    def priority(self) -> jax.Array:
        """``(C,)`` float32 ``p^alpha`` of each slot; 0 if unwritten (the sum-tree's leaves)."""
        return sum_tree.leaves(self.tree)


# ------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------
def _check_capacity(capacity: Any) -> int:
    if not _is_int(capacity) or not 1 <= capacity <= _MAX_CAPACITY:
        raise ValueError(f"capacity must be a Python int in [1, {_MAX_CAPACITY}] (items), got {capacity!r}")
    return int(capacity)


def _leaf_spec(x: Any) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, canonical dtype) of an example leaf: array, ShapeDtypeStruct or Python scalar."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        shape, dtype = tuple(x.shape), x.dtype
    else:
        arr = np.asarray(x)
        shape, dtype = arr.shape, arr.dtype
    return shape, np.dtype(jax.dtypes.canonicalize_dtype(dtype))


# ------------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------------
def replay_bytes(example_item: Any, capacity: int) -> int:
    """Bytes a buffer of ``capacity`` items like ``example_item`` occupies on its device.

    ``capacity * (sum of item leaf bytes + 8) + sum_tree.nbytes(capacity) + 16``: the 8 are the
    per-slot ``policy_version`` and ``insert_index``, the sum/min trees take ``16 L`` bytes with
    ``L = 2^ceil(log2 capacity)``, the 16 are the scalars. Dtypes are canonicalised as JAX
    stores them (float64 -> float32 unless x64 is enabled).

    Args:
        example_item: pytree of one item (arrays, ``jax.ShapeDtypeStruct`` or scalars), no batch axis.
        capacity: number of items, int ``>= 1``.

    Returns:
        int bytes.

    Raises:
        ValueError: bad ``capacity``; ``example_item`` has no leaves.
    """
    capacity = _check_capacity(capacity)
    leaves = jax.tree.leaves(example_item)
    if not leaves:
        raise ValueError("example_item must be a pytree with at least one array leaf, got no leaves")
    per_item = 0
    for leaf in leaves:
        shape, dtype = _leaf_spec(leaf)
        per_item += math.prod(shape) * dtype.itemsize
    return capacity * (per_item + _SLOT_META_BYTES) + sum_tree.nbytes(capacity) + _SCALAR_BYTES


def _free_host_bytes() -> int:
    try:
        import psutil  # a declared dependency; the fallback covers stripped-down installs
    except ImportError:  # pragma: no cover - fallback when psutil is missing
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.virtual_memory().available)


def _device_stats(device: Any) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without statistics raise various errors
        return None


def check_fits(nbytes: int, device: Any = None, *, max_fraction: float = 1.0) -> int | None:
    """Raise before allocating a buffer that would not fit in ``device``'s free memory.

    Free memory: on CPU, the host's available memory (``psutil.virtual_memory().available``);
    on an accelerator, ``bytes_limit - bytes_in_use`` from ``device.memory_stats()`` (the XLA
    allocator's pool). Where a device reports no statistics the check is skipped with a warning.

    Args:
        nbytes: bytes needed (see :func:`replay_bytes`), int ``>= 0``.
        device: a ``jax.Device`` (anything with ``platform`` and ``memory_stats()``); default
            ``jax.devices()[0]``.
        max_fraction: the buffer may use at most this fraction of the free memory, in (0, 1].

    Returns:
        the free bytes found, or None where the device reports none.

    Raises:
        MemoryError: ``nbytes > max_fraction * free``; the message names both numbers.
        ValueError: ``nbytes < 0`` or ``max_fraction`` outside (0, 1].
    """
    if not _is_int(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
    if not isinstance(max_fraction, numbers.Real) or not 0 < max_fraction <= 1:
        raise ValueError(f"max_fraction must be in (0, 1], got {max_fraction!r}")
    if device is None:
        device = jax.devices()[0]
    if device.platform == "cpu":
        free = _free_host_bytes()
        where = "host memory available (psutil.virtual_memory().available)"
    else:
        stats = _device_stats(device)
        if not stats or "bytes_limit" not in stats:
            warnings.warn(f"{device} reports no memory statistics; cannot check that {nbytes} bytes fit",
                          RuntimeWarning, stacklevel=2)
            return None
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        where = "free on the device (bytes_limit - bytes_in_use)"
    allowed = int(max_fraction * free)
    if nbytes > allowed:
        raise MemoryError(
            f"replay buffer needs {nbytes} bytes ({nbytes / 2**30:.3f} GiB) but only {free} bytes "
            f"({free / 2**30:.3f} GiB) are {where} on {device}"
            + (f", of which max_fraction={max_fraction} may be used ({allowed} bytes)" if max_fraction < 1 else "")
            + "; lower the capacity or the item size")
    return free


# ------------------------------------------------------------------------------------------------
# the buffer
# ------------------------------------------------------------------------------------------------
def init(example_item: Any, capacity: int, *, device: Any = None, check_memory: bool = True) -> ReplayState:
    """Allocate an empty buffer for ``capacity`` items shaped like ``example_item``.

    Eager (call it outside ``jit``): it checks the memory with :func:`check_fits` first, so an
    oversized buffer raises a clear ``MemoryError`` instead of failing inside XLA.

    Args:
        example_item: pytree of one item (arrays, ``jax.ShapeDtypeStruct`` or scalars), no batch axis.
        capacity: int ``>= 1``, any value (not only powers of two).
        device: where the state lives (a ``jax.Device``); default JAX's default device.
        check_memory: run :func:`check_fits` before allocating.

    Returns:
        an empty :class:`ReplayState`.

    Raises:
        ValueError: bad ``capacity`` or an item without leaves.
        MemoryError: the buffer would not fit (see :func:`check_fits`).
    """
    nbytes = replay_bytes(example_item, capacity)
    if check_memory:
        check_fits(nbytes, device)

    def zeros(leaf):
        shape, dtype = _leaf_spec(leaf)
        return jnp.zeros((capacity, *shape), dtype, device=device)

    def full(shape, value, dtype):
        return jnp.full(shape, value, dtype, device=device)

    return ReplayState(
        data=jax.tree.map(zeros, example_item),
        policy_version=full((capacity,), -1, jnp.int32),
        insert_index=full((capacity,), -1, jnp.int32),
        tree=sum_tree.init(capacity, device=device),
        max_priority=full((), 1.0, jnp.float32),
        write_pos=full((), 0, jnp.int32),
        size=full((), 0, jnp.int32),
        num_inserted=full((), 0, jnp.int32),
    )


def add(state: ReplayState, items: Any, version: Any, mask: jax.Array | None = None) -> ReplayState:
    """Insert a batch of ``B`` items, overwriting the oldest ones once the buffer is full.

    Items with ``mask`` False are skipped (e.g. steps that are not real transitions), without
    changing shapes: the kept items go to consecutive slots in their batch order, and the skipped
    ones are scattered out of bounds (dropped). If more than ``C`` items are kept, only the last
    ``C`` are stored (but all are counted in ``num_inserted``). Jit with ``donate_argnums=0``.

    Args:
        state: the buffer.
        items: pytree like the example item, every leaf ``(B, *item_shape)``; dtypes are cast to
            the buffer's within the same kind (float -> float, int -> int).
        version: int policy version the items were acted with, scalar or ``(B,)``.
        mask: optional ``(B,)`` bool, True = insert.

    Returns:
        the new :class:`ReplayState`.

    Raises:
        ValueError: ``items`` has another structure, leaf shape or dtype kind than the buffer, or
            leaves disagree on ``B``; ``version`` / ``mask`` not broadcastable to ``(B,)``.
    """
    cap = state.capacity
    buf_leaves, treedef = jax.tree.flatten(state.data)
    item_leaves, item_def = jax.tree.flatten(items)
    if item_def != treedef:
        raise ValueError(f"items must have the buffer's structure {treedef}, got {item_def}")
    item_leaves = [jnp.asarray(x) for x in item_leaves]
    b = item_leaves[0].shape[0] if item_leaves[0].ndim else None
    for buf, x in zip(buf_leaves, item_leaves):
        if x.ndim == 0 or x.shape[0] != b or x.shape[1:] != buf.shape[1:]:
            raise ValueError(f"every item leaf must have shape (B, *item_shape) with one B; expected "
                             f"(B, {', '.join(map(str, buf.shape[1:]))}) with B={b}, got {x.shape}")
        if not jnp.can_cast(x.dtype, buf.dtype, casting="same_kind"):
            raise ValueError(f"item leaf dtype {x.dtype} cannot be stored in a {buf.dtype} buffer")
    version = jnp.asarray(version)
    if not jnp.issubdtype(version.dtype, jnp.integer) or version.ndim > 1 or version.size not in (1, b):
        raise ValueError(f"version must be an int scalar or shape ({b},), got {version.dtype}{version.shape}")
    version = jnp.broadcast_to(version.astype(jnp.int32).reshape(-1), (b,))
    if mask is None:
        keep = jnp.ones((b,), bool)
    else:
        keep = jnp.asarray(mask)
        if keep.shape != (b,):
            raise ValueError(f"mask must have shape ({b},), got {keep.shape}")
        keep = keep.astype(bool)

    k = keep.astype(jnp.int32)
    offset = jnp.cumsum(k) - k  # position of each kept item among the kept ones
    n_new = jnp.sum(k)
    keep = keep & (offset >= n_new - cap)  # at most C kept items, so target slots are distinct
    slots = jnp.where(keep, (state.write_pos + offset) % cap, cap)  # cap = out of bounds: dropped

    def write(buf, x):
        return buf.at[slots].set(x.astype(buf.dtype), mode="drop")

    return ReplayState(
        data=jax.tree.unflatten(treedef, [write(buf, x) for buf, x in zip(buf_leaves, item_leaves)]),
        policy_version=write(state.policy_version, version),
        insert_index=write(state.insert_index, state.num_inserted + offset),
        tree=sum_tree.update(state.tree, slots, jnp.broadcast_to(state.max_priority, (b,)), keep),
        max_priority=state.max_priority,
        write_pos=((state.write_pos + n_new) % cap).astype(jnp.int32),
        size=jnp.minimum(state.size + n_new, cap).astype(jnp.int32),
        num_inserted=(state.num_inserted + n_new).astype(jnp.int32),
    )
