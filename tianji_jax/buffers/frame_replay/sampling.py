"""The frame replay's read side: :class:`FrameSample`, :func:`can_sample`, :func:`sample` (the
``S``-frame stacks rebuilt from the rings, n-step targets) and :func:`update_priorities`, over the
index arithmetic of :mod:`tianji_jax.buffers.frame_replay.state`.
:mod:`tianji_jax.buffers.frame_replay` re-exports them and is the import path to use (its
docstring describes the layout, validity rule and n-step transitions implemented here)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from tianji_jax.buffers import sum_tree
from tianji_jax.buffers.transition import Transition
from tianji_jax.buffers.frame_replay.state import FrameReplayState, _at, _done, _rows, _stack
from tianji_jax.buffers.replay.sampling import check_batch_size, check_number, probs_and_weights

__all__ = ["FrameSample", "can_sample", "sample", "update_priorities"]


@struct.dataclass
class FrameSample:
    """A sampled batch of ``B`` n-step transitions (with replacement).

    Attributes:
        transition: :class:`~tianji_jax.algos.dqn.Transition` with ``obs`` and ``next_obs``
            ``(B, S, *frame_shape)`` (oldest frame first, as envpool stacks), ``action`` int32,
            ``reward`` / ``discount`` float32, all ``(B,)``.
        indices: ``(B,)`` int32 flat slot ``e * F + k`` (for :func:`update_priorities`).
        env_id: ``(B,)`` int32 env of each transition.
        step: ``(B,)`` int32 absolute step of its start frame in that env (its identity).
        policy_version: ``(B,)`` int32 version that chose ``action`` (learner lag = v - this).
        probs: ``(B,)`` float32 probability of drawing that slot (``1 / num_valid`` uniform).
        weights: ``(B,)`` float32 importance weights ``(p_i / p_min)^-beta`` in ``(0, 1]``
            (1 for a uniform buffer). Where nothing is valid, probs and weights are 0 and the
            transition is garbage -- check :func:`can_sample` first.
    """

    transition: Transition
    indices: jax.Array
    env_id: jax.Array
    step: jax.Array
    policy_version: jax.Array
    probs: jax.Array
    weights: jax.Array


# ------------------------------------------------------------------------------------------------
# the read side
# ------------------------------------------------------------------------------------------------
def can_sample(state: FrameReplayState, min_size: int) -> jax.Array:
    """``()`` bool: at least ``min_size`` transitions can be sampled (``min_size >= 1``).

    Raises:
        ValueError: ``min_size < 1`` (when concrete).
    """
    check_number("min_size", min_size, 1, math.inf, "an int >= 1")
    return state.num_valid >= min_size


def sample(state: FrameReplayState, key: jax.Array, batch_size: int, beta: float = 0.0) -> FrameSample:
    """Draw ``B`` valid transitions, stratified over the sum-tree (Schaul et al. 2016, B.2.1).

    Uniform buffer: each valid start with probability ``1 / num_valid``. Prioritised buffer:
    ``P(i) = p_i^alpha / sum_k p_k^alpha`` over the valid starts, importance weights
    ``(p_i / p_min)^-beta`` (as :func:`tianji_jax.buffers.replay.sample_prioritised`). Both stacks are
    rebuilt from the rings. ``O(B (log C + S + n))`` plus copying ``2 B S`` frames.

    Args:
        state: the buffer (check :func:`can_sample` first).
        key: PRNG key.
        batch_size: ``B >= 1``, static Python int.
        beta: importance-sampling exponent in [0, 1] (no effect on a uniform buffer).

    Returns:
        :class:`FrameSample`.

    Raises:
        ValueError: bad ``batch_size``; ``beta`` outside [0, 1] (when concrete).
    """
    b = check_batch_size(batch_size)
    check_number("beta", beta, 0.0, 1.0, "in [0, 1] (importance-sampling exponent)")
    f = state.slots_per_env
    idx = sum_tree.sample_stratified(state.tree, key, b)
    e, k = idx // f, idx % f
    t = state.step_index[e, k]
    # n-step return along the episode (validity guarantees t + 1 .. t + m are held)
    ret = jnp.zeros((b,), jnp.float32)
    disc = jnp.ones((b,), jnp.float32)
    m = jnp.zeros((b,), jnp.int32)
    alive = jnp.ones((b,), bool)
    for j in range(1, state.n_step + 1):
        ret = jnp.where(alive, ret + disc * _at(state.reward, state, e, t + j), ret)
        disc = jnp.where(alive, disc * state.gamma, disc)
        m = jnp.where(alive, j, m)
        alive &= ~_done(state, e, t + j)
    discount = jnp.where(_at(state.terminated, state, e, t + m), 0.0, disc)
    transition = Transition(obs=_stack(state, e, t), action=_at(state.action, state, e, t + 1), reward=ret,
                            discount=discount, next_obs=_stack(state, e, t + m))
    probs, weights = probs_and_weights(state.tree, idx, beta)
    return FrameSample(transition=transition, indices=idx, env_id=e, step=t,
                       policy_version=_at(state.policy_version, state, e, t + 1), probs=probs, weights=weights)


def update_priorities(state: FrameReplayState, indices: jax.Array, step: jax.Array, td_errors: jax.Array,
                      alpha: float = 0.6, eps: float = 1e-6) -> FrameReplayState:
    """Set ``p^alpha = (|td| + eps)^alpha`` of sampled transitions (Schaul et al. 2016).

    Rows whose slot now holds another step (overwritten since sampling) or is no longer valid
    are skipped; duplicated indices: the last one wins (:func:`tianji_jax.buffers.sum_tree.update`).
    Raises ``max_priority`` to the largest value written. ``O(B log C)``. Jit with
    ``donate_argnums=0``.

    Args:
        state: a prioritised buffer.
        indices: ``(B,)`` int ``FrameSample.indices``.
        step: ``(B,)`` int ``FrameSample.step``.
        td_errors: ``(B,)`` float TD errors (sign ignored).
        alpha: priority exponent ``>= 0``; keep it constant over training.
        eps: ``>= 0`` floor.

    Raises:
        ValueError: the buffer is uniform; shapes not ``(B,)``; ``alpha`` / ``eps`` < 0.
    """
    if not state.prioritised:
        raise ValueError("update_priorities needs a buffer made with init(..., prioritised=True)")
    check_number("alpha", alpha, 0.0, math.inf, ">= 0 (priority exponent)")
    check_number("eps", eps, 0.0, math.inf, ">= 0")
    indices = jnp.asarray(indices, jnp.int32)
    b = indices.shape[0] if indices.ndim == 1 else -1
    if b < 0:
        raise ValueError(f"indices must have shape (B,), got {indices.shape}")
    step = _rows("step", step, b, jnp.int32)
    td = _rows("td_errors", td_errors, b, jnp.float32)
    f, n = state.slots_per_env, state.num_envs * state.slots_per_env
    inside = (indices >= 0) & (indices < n)
    safe = jnp.where(inside, indices, 0)
    e, k = safe // f, safe % f
    current = inside & (state.step_index[e, k] == step) & state.valid[e, k]
    written = sum_tree.last_write_mask(indices, current)
    new_p = jnp.power(jnp.abs(td) + eps, alpha)
    return state.replace(
        priority=state.priority.at[jnp.where(written, e, state.num_envs), k].set(new_p, mode="drop"),
        tree=sum_tree.update(state.tree, indices, new_p, written),
        max_priority=jnp.maximum(state.max_priority, jnp.max(jnp.where(written, new_p, 0.0))))
