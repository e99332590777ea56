"""Read side of the device replay buffer: the sampled batch, uniform and prioritised draws, priority updates.

:mod:`tianji_jax.buffers.replay` re-exports everything public here (:class:`ReplaySample`,
:func:`can_sample`, :func:`sample`, :func:`sample_prioritised`, :func:`update_priorities`), and
that is the import path to use; its docstring gives the buffer's layout, invariants and the
prioritised-replay formulas (Schaul et al. 2016) these functions implement. Also here: the
argument checks and the ``P(i)`` / importance-weight computation that the frame-deduplicated
buffer (:mod:`tianji_jax.buffers.frame_replay`) shares.

Every function is pure over a :class:`~tianji_jax.buffers.replay.ReplayState`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from tianji_jax.buffers import sum_tree
from tianji_jax.buffers.replay.state import ReplayState, _is_int

__all__ = ["ReplaySample", "can_sample", "sample", "sample_prioritised", "update_priorities"]


@struct.dataclass
class ReplaySample:
    """A sampled batch of ``B`` items (with replacement).

    Attributes:
        item: pytree like the example item, leaves ``(B, *item_shape)``.
        indices: ``(B,)`` int32 slots they came from (for :func:`update_priorities`).
        policy_version: ``(B,)`` int32 version the actor acted with (learner lag = v - this).
        insert_index: ``(B,)`` int32 insert counter of each item (identifies it across overwrites).
        probs: ``(B,)`` float32 probability each slot had of being drawn (``1 / size`` uniform).
        weights: ``(B,)`` float32 importance weights in ``(0, 1]`` (all 1 for uniform).
            Where the buffer was empty, ``probs`` and ``weights`` are 0 and ``item`` is garbage
            from slot 0 (its stamps are -1) -- check :func:`can_sample` first.
    """

    item: Any
    indices: jax.Array
    policy_version: jax.Array
    insert_index: jax.Array
    probs: jax.Array
    weights: jax.Array


# ------------------------------------------------------------------------------------------------
# argument checks (shared with tianji_jax.buffers.replay and tianji_jax.buffers.frame_replay)
# ------------------------------------------------------------------------------------------------
def check_number(name: str, value: Any, lo: float, hi: float, allowed: str) -> None:
    """Validate a concrete Python number argument ``name`` against ``[lo, hi]``; traced values
    pass unchecked (they are only known inside the compiled program).

    Raises:
        ValueError: ``value`` is a number outside ``[lo, hi]``; the message says ``allowed``."""
    if isinstance(value, numbers.Number) and not lo <= value <= hi:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as an int: a Python int >= 1 (static under ``jit``: it sets array shapes).

    Raises:
        ValueError: anything else (a bool, a float, a traced value, a value < 1)."""
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a Python int >= 1 (static under jit), got {batch_size!r}")
    return int(batch_size)


# ------------------------------------------------------------------------------------------------
# sampling and priorities
# ------------------------------------------------------------------------------------------------
def can_sample(state: ReplayState, min_size: int) -> jax.Array:
    """``()`` bool array: the buffer holds at least ``min_size`` items (``min_size >= 1``).

    Raises:
        ValueError: ``min_size < 1`` (when concrete).
    """
    check_number("min_size", min_size, 1, math.inf, "an int >= 1")
    return state.size >= min_size


def _gather(state: ReplayState, idx: jax.Array, probs: jax.Array, weights: jax.Array) -> ReplaySample:
    return ReplaySample(
        item=jax.tree.map(lambda x: jnp.take(x, idx, axis=0), state.data),
        indices=idx,
        policy_version=state.policy_version[idx],
        insert_index=state.insert_index[idx],
        probs=probs.astype(jnp.float32),
        weights=weights.astype(jnp.float32),
    )


def sample(state: ReplayState, key: jax.Array, batch_size: int) -> ReplaySample:
    """Uniform sampling with replacement from the filled slots ``[0, size)`` only. ``O(B)``.

    Args:
        state: the buffer (check :func:`can_sample` first).
        key: PRNG key.
        batch_size: ``B >= 1``, static Python int (``static_argnames="batch_size"`` under jit).

    Returns:
        :class:`ReplaySample` with ``probs = 1 / size`` and ``weights = 1`` (0 if empty).

    Raises:
        ValueError: bad ``batch_size``.
    """
    b = check_batch_size(batch_size)
    size = state.size
    idx = jax.random.randint(key, (b,), 0, jnp.maximum(size, 1), dtype=jnp.int32)
    empty = size == 0
    probs = jnp.where(empty, 0.0, 1.0 / jnp.maximum(size, 1).astype(jnp.float32))
    weights = jnp.where(empty, 0.0, 1.0)
    return _gather(state, idx, jnp.broadcast_to(probs, (b,)), jnp.broadcast_to(weights, (b,)))


def sample_prioritised(state: ReplayState, key: jax.Array, batch_size: int, beta: float) -> ReplaySample:
    """Proportional prioritised sampling with replacement (Schaul et al. 2016, sec. 3.3-3.4).

    Draws slot ``i`` with ``P(i) = p_i^alpha / sum_k p_k^alpha`` (the buffer stores ``p^alpha``)
    from the sum-tree, stratified as in the paper's appendix B.2.1: the total is cut into ``B``
    equal segments and one draw is taken uniformly in each (:func:`tianji_jax.buffers.sum_tree.sample_stratified`),
    so the batch comes in slot order and each slot's count in it is within 2 of ``B P(i)``.
    Unwritten slots have priority 0 and are never drawn, nor are written slots whose priority is
    0. ``O(B log C)`` per call.

    Args:
        state: the buffer (check :func:`can_sample` first).
        key: PRNG key.
        batch_size: ``B >= 1``, static Python int.
        beta: importance-sampling exponent in [0, 1] (Python float or traced scalar), annealed
            towards 1 by the caller; ``0`` gives all weights 1.

    Returns:
        :class:`ReplaySample` with ``probs = P(i)`` and
        ``weights = (N P(i))^-beta / max_k (N P(k))^-beta = (p_i / p_min)^-beta``, ``N = size``
        (``p_min``, the smallest positive priority, is the root of the tree's min-tree).

    Raises:
        ValueError: bad ``batch_size``; ``beta`` outside [0, 1] (when concrete).
    """
    b = check_batch_size(batch_size)
    check_number("beta", beta, 0.0, 1.0, "in [0, 1] (importance-sampling exponent)")
    idx = sum_tree.sample_stratified(state.tree, key, b)
    return _gather(state, idx, *probs_and_weights(state.tree, idx, beta))


def probs_and_weights(tree: sum_tree.SumTree, idx: jax.Array, beta: Any) -> tuple[jax.Array, jax.Array]:
    """``P(i) = p_i / total`` and ``w_i = (p_i / p_min)^-beta`` of the drawn slots ``idx``
    (``(B,)`` int32) of a sum-tree: two ``(B,)`` float32 arrays (both 0 where the tree is empty;
    Schaul et al. 2016, section 3.4)."""
    total = sum_tree.total(tree)
    empty = total <= 0
    p_i = sum_tree.get(tree, idx)
    probs = jnp.where(empty, 0.0, p_i / jnp.where(empty, 1.0, total))
    ratio = jnp.where(empty, 1.0, p_i / jnp.where(empty, 1.0, sum_tree.min_positive(tree)))
    weights = jnp.where(empty, 0.0, jnp.power(ratio, -jnp.asarray(beta, jnp.float32)))
    return probs, weights


def update_priorities(
    state: ReplayState,
    indices: jax.Array,
    td_errors: jax.Array,
    alpha: float = 0.6,
    eps: float = 1e-6,
    insert_index: jax.Array | None = None,
) -> ReplayState:
    """Set ``priority[i] = (|td_i| + eps)^alpha`` for the sampled slots (Schaul et al. 2016).

    Also raises ``max_priority`` (given to new items) to the largest value written. Duplicated
    indices (sampling is with replacement): the last one in batch order wins (deterministic, as
    applying the updates one at a time; with the same params and data the values are equal
    anyway). ``O(B log B + B log C)`` on the sum-tree. Indices outside the filled slots ``[0, size)`` are ignored. With
    ``insert_index`` (from the :class:`ReplaySample`), a slot overwritten by a newer item since it
    was sampled is left alone (asynchronous actors). Jit with ``donate_argnums=0``.

    Args:
        state: the buffer.
        indices: ``(B,)`` int slots (``ReplaySample.indices``).
        td_errors: ``(B,)`` float TD errors (sign ignored).
        alpha: priority exponent ``>= 0`` (0.6 in Schaul et al.'s proportional variant; 0 =
            uniform). Keep it constant over training: stored priorities already include it.
        eps: ``>= 0`` floor so no item gets probability 0.
        insert_index: optional ``(B,)`` int32 insert counters the items had when sampled.

    Returns:
        the new :class:`ReplayState`.

    Raises:
        ValueError: ``alpha < 0`` or ``eps < 0`` (when concrete); shapes not ``(B,)``.
    """
    check_number("alpha", alpha, 0.0, math.inf, ">= 0 (priority exponent)")
    check_number("eps", eps, 0.0, math.inf, ">= 0")
    indices = jnp.asarray(indices, jnp.int32)
    td_errors = jnp.asarray(td_errors, jnp.float32)
    if indices.ndim != 1 or td_errors.shape != indices.shape:
        raise ValueError(f"indices and td_errors must both have shape (B,), got {indices.shape} and "
                         f"{td_errors.shape}")
    new_p = jnp.power(jnp.abs(td_errors) + eps, alpha)
    # only filled slots ([0, size)) may get a priority, so unwritten slots can never be drawn
    current = (indices >= 0) & (indices < state.size)
    if insert_index is not None:
        insert_index = jnp.asarray(insert_index, jnp.int32)
        if insert_index.shape != indices.shape:
            raise ValueError(f"insert_index must have shape {indices.shape}, got {insert_index.shape}")
        current = current & (state.insert_index[jnp.clip(indices, 0, state.capacity - 1)] == insert_index)
    written = sum_tree.last_write_mask(indices, current)
    new_max = jnp.max(jnp.where(written, new_p, 0.0))
    return state.replace(
        tree=sum_tree.update(state.tree, indices, new_p, written),
        max_priority=jnp.maximum(state.max_priority, new_max),
    )
