"""DQN-family math as pure functions over pytrees: n-step transitions and targets, max / double-Q
bootstrap values, the Huber TD loss with importance weights, target-network updates and the
epsilon schedules.

Every function here is free of Python side effects on traced values, so it can be ``jax.jit``-ed
and ``jax.vmap``-ed; arguments that fix a shape (``n``, ``num_actors``) must be static Python ints.
Argument checks that need concrete values (``gamma`` in [0, 1], ``period >= 1``...) run only when
the value is a Python number, so they cost nothing under ``jit``.

Sources:
    Mnih et al. 2015, "Human-level control through deep reinforcement learning" (Nature 518;
    Methods: target network, error clipping = Huber loss with delta 1, linear epsilon annealing).
    van Hasselt, Guez & Silver 2016, "Deep Reinforcement Learning with Double Q-learning"
    (AAAI; eq. 4: the online net picks the argmax, the target net evaluates it).
    Sutton & Barto 2018, "Reinforcement Learning: An Introduction" 2nd ed., section 7.1
    (n-step returns); Hessel et al. 2018, "Rainbow" (n-step targets in replay-based DQN).
    Schaul et al. 2016, "Prioritized Experience Replay" (ICLR; importance weights, section 3.4).
    Lillicrap et al. 2016, "Continuous control with deep RL" (DDPG; soft / Polyak target update).
    Horgan et al. 2018, "Distributed Prioritized Experience Replay" (Ape-X; section 4.1 and
    appendix: per-actor epsilons ``eps_i = eps^(1 + i / (N - 1) * alpha)``, eps = 0.4, alpha = 7).

Episode boundaries (docs/runtime.md, "Episode boundaries"): ``terminated`` and ``truncated`` stay separate.
A termination ends the n-step sum with no bootstrap (discount 0). A truncation (time limit) ends
the sum too, but the target bootstraps from the value of the *true final observation* of that
step, which the env layer delivers as ``Timestep.final_obs`` (:mod:`tianji_jax.envs.core`):
``final_obs[t]`` is the real successor of step ``t`` for every step (equal to the next ``obs``
unless the episode ended there), so the bootstrap observation of any n-step transition is simply
``final_obs`` at its last step.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from tianji_jax.buffers.transition import Transition

__all__ = [
    "NStepReturns",
    "Transition",
    "n_step_returns",
    "gather_time",
    "n_step_transitions",
    "n_step_targets",
    "max_q_target",
    "double_q_target",
    "td_loss",
    "polyak_update",
    "periodic_hard_update",
    "linear_epsilon",
    "apex_epsilons",
]


def _is_number(x: Any) -> bool:
    """True for concrete Python / numpy scalars (checked eagerly); False for arrays and tracers."""
    return isinstance(x, numbers.Number)


def _check_range(name: str, value: Any, lo: float, hi: float) -> None:
    if _is_number(value) and not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")


def _check_time_major(name: str, x: jax.Array, ref_shape: tuple[int, ...], leading: bool = False) -> None:
    if (x.shape[:len(ref_shape)] if leading else x.shape) != ref_shape:
        raise ValueError(f"{name} must have shape {ref_shape} (same as rewards, time-major (T, N)), "
                         f"got {x.shape}")


# ------------------------------------------------------------------------------------------------
# n-step returns
# ------------------------------------------------------------------------------------------------
@struct.dataclass
class NStepReturns:
    """Truncated n-step returns for every start step of a time-major rollout.

    For start step ``t`` the sum runs over ``k`` steps ``t, ..., t + k - 1`` where
    ``k = min(n, T - t, steps up to and including the first terminated/truncated step)``.

    Attributes:
        returns: ``(T, ...)`` float32, ``sum_{j<k} gamma^j r[t + j]``.
        discounts: ``(T, ...)`` float32, ``gamma^k``, or ``0`` where step ``t + k - 1`` terminated
            (termination wins over truncation on the same step).
        bootstrap_index: ``(T, ...)`` int32, ``t + k - 1``: the step whose successor observation
            (``final_obs[t + k - 1]``) the target bootstraps from.
        num_steps: ``(T, ...)`` int32, ``k`` in ``[1, n]``. ``k < n`` happens at an episode end
            or at the end of the rollout (see :func:`n_step_returns`).
    """

    returns: jax.Array
    discounts: jax.Array
    bootstrap_index: jax.Array
    num_steps: jax.Array


def _shift(x: jax.Array, j: int) -> jax.Array:
    """``y[t] = x[t + j]`` along axis 0, zero (False) past the end. ``j`` is static."""
    if j == 0:
        return x
    t = x.shape[0]
    pad = [(0, min(j, t))] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x[j:], pad)


def n_step_returns(
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float,
    n: int,
) -> NStepReturns:
    """n-step discounted reward sums, cut at episode boundaries (Sutton & Barto 2018, sec. 7.1).

    Actor-side, value-free part of the n-step target: the learner's target for the transition
    starting at ``t`` is ``returns[t] + discounts[t] * V(final_obs[bootstrap_index[t]])`` with
    ``V`` the max-Q or double-Q value (:func:`max_q_target`, :func:`double_q_target`). Because
    ``final_obs`` is the true successor of each step, a truncated episode bootstraps from its true
    final observation and a terminated one gets discount 0 -- no special casing downstream.

    The last ``n - 1`` start steps of a rollout see fewer than ``n`` future steps; they get a
    ``k``-step target (``k = T - t``) with ``discounts = gamma^k``, which is an equally valid
    (shorter-horizon) bootstrapped target, so every step of every rollout can be inserted once.
    Callers that want exactly ``n`` steps everywhere can keep the last ``n - 1`` steps of each
    rollout, prepend them to the next one and insert only starts with ``num_steps == n`` or an
    episode end inside the window.

    Cost: ``O(n * T * N)`` with a static unrolled loop over ``j < n`` (no scan); ``n`` is small.

    Args:
        rewards: ``(T, ...)`` float rewards (time-major; any trailing batch axes, e.g. ``(T, N)``).
        terminated: ``(T, ...)`` bool, episode reached a terminal state at step ``t``.
        truncated: ``(T, ...)`` bool, episode was cut (time limit) at step ``t``.
        gamma: discount in [0, 1] (Python float or traced scalar).
        n: number of steps, static Python int ``>= 1``. ``n = 1`` gives the one-step TD target.

    Returns:
        :class:`NStepReturns` with ``(T, ...)`` fields.

    Raises:
        ValueError: ``n < 1`` or not an int; ``gamma`` outside [0, 1] (when concrete); shapes of
            ``terminated`` / ``truncated`` differ from ``rewards``; ``rewards`` has no time axis.
    """
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a Python int >= 1 (number of steps, static), got {n!r}")
    _check_range("gamma", gamma, 0.0, 1.0)
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim < 1:
        raise ValueError(f"rewards must be time-major with shape (T, ...), got shape {rewards.shape}")
    terminated = jnp.asarray(terminated, bool)
    truncated = jnp.asarray(truncated, bool)
    _check_time_major("terminated", terminated, rewards.shape)
    _check_time_major("truncated", truncated, rewards.shape)
    T = rewards.shape[0]
    done = terminated | truncated
    t_idx = jnp.arange(T, dtype=jnp.int32).reshape((T,) + (1,) * (rewards.ndim - 1))

    returns = jnp.zeros_like(rewards)
    num_steps = jnp.zeros(rewards.shape, jnp.int32)
    alive = jnp.ones(rewards.shape, bool)  # step t + j is part of the sum started at t
    for j in range(n):
        alive = alive & (t_idx + j < T)
        returns = returns + jnp.where(alive, (gamma ** j) * _shift(rewards, j), 0.0)
        num_steps = num_steps + alive.astype(jnp.int32)
        alive = alive & ~_shift(done, j)  # the sum stops after the first finished step

    bootstrap_index = t_idx + num_steps - 1
    last_terminated = jnp.take_along_axis(terminated, bootstrap_index, axis=0)
    discounts = jnp.where(last_terminated, 0.0, jnp.power(jnp.asarray(gamma, jnp.float32),
                                                          num_steps.astype(jnp.float32)))
    return NStepReturns(returns=returns, discounts=discounts.astype(jnp.float32),
                        bootstrap_index=bootstrap_index, num_steps=num_steps)


def gather_time(x: Any, index: jax.Array) -> Any:
    """Per-env gather along time: ``y[t, i] = x[index[t, i], i]`` for every leaf of a pytree.

    Args:
        x: pytree of arrays shaped ``(T, N, ...)``.
        index: ``(T, N)`` int time indices in ``[0, T)`` (e.g. ``NStepReturns.bootstrap_index``).

    Returns:
        pytree like ``x``, leaves ``(T, N, ...)``.

    Raises:
        ValueError: ``index`` is not 2-D, or a leaf's leading axes differ from ``index.shape``.
    """
    index = jnp.asarray(index, jnp.int32)
    if index.ndim != 2:
        raise ValueError(f"index must have shape (T, N), got {index.shape}")

    def take(leaf):
        leaf = jnp.asarray(leaf)
        if leaf.shape[:2] != index.shape:
            raise ValueError(f"leaf with shape {leaf.shape} does not start with index shape {index.shape}")
        return leaf[index, jnp.arange(index.shape[1])[None, :]]

    return jax.tree.map(take, x)


def n_step_transitions(
    obs: Any,
    actions: jax.Array,
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    final_obs: Any,
    gamma: float,
    n: int,
) -> Transition:
    """Build n-step replay transitions on the actor side, before insertion (Hessel et al. 2018).

    For each start ``(t, i)``: ``Transition(obs[t, i], actions[t, i], R, discount,
    final_obs[t + k - 1, i])`` with ``R``, ``discount`` and ``k`` from :func:`n_step_returns`.
    The learner's target is then ``reward + discount * V(next_obs)`` whatever ``k`` was.

    Args:
        obs: pytree, leaves ``(T, N, ...)``: the observation each step acted on.
        actions: ``(T, N)`` int actions (cast to int32), or ``(T, N, A)`` float continuous
            actions (cast to float32).
        rewards, terminated, truncated: ``(T, N)`` as in :func:`n_step_returns`.
        final_obs: pytree like ``obs``: true successor of each step (``Timestep.final_obs``).
        gamma: discount in [0, 1].
        n: static int ``>= 1``.

    Returns:
        :class:`Transition` with leaves ``(T, N, ...)``; flatten to ``(T * N, ...)`` before
        :func:`tianji_jax.buffers.replay.add`.

    Raises:
        ValueError: as :func:`n_step_returns` and :func:`gather_time`; ``rewards`` not 2-D.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must have shape (T, N), got {rewards.shape}")
    ns = n_step_returns(rewards, terminated, truncated, gamma, n)
    actions = jnp.asarray(actions)
    actions = actions.astype(jnp.float32 if jnp.issubdtype(actions.dtype, jnp.floating) else jnp.int32)
    _check_time_major("actions", actions, rewards.shape, leading=True)
    return Transition(obs=obs, action=actions, reward=ns.returns, discount=ns.discounts,
                      next_obs=gather_time(final_obs, ns.bootstrap_index))


def n_step_targets(
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    bootstrap_values: jax.Array,
    gamma: float,
    n: int,
) -> tuple[jax.Array, jax.Array]:
    """Bootstrapped n-step targets over a whole trajectory (learner side, e.g. sequence replay).

    ``target[t] = returns[t] + discounts[t] * bootstrap_values[bootstrap_index[t]]`` with the
    fields of :func:`n_step_returns`.

    Args:
        rewards, terminated, truncated: ``(T, ...)`` as in :func:`n_step_returns`.
        bootstrap_values: ``(T, ...)`` float, value of the true successor of step ``t``, i.e. of
            ``final_obs[t]`` (max-Q or double-Q, computed by the caller with the target net). At a
            truncation this is the value of the true final observation, not of the reset one.
        gamma: discount in [0, 1].
        n: static int ``>= 1``.

    Returns:
        ``(targets, discounts)``, both ``(T, ...)`` float32; the targets carry no gradient
        (``stop_gradient``).

    Raises:
        ValueError: as :func:`n_step_returns`; ``bootstrap_values`` shape differs from ``rewards``.
    """
    ns = n_step_returns(rewards, terminated, truncated, gamma, n)
    bootstrap_values = jnp.asarray(bootstrap_values, jnp.float32)
    _check_time_major("bootstrap_values", bootstrap_values, ns.returns.shape)
    boot = jnp.take_along_axis(bootstrap_values, ns.bootstrap_index, axis=0)
    targets = ns.returns + ns.discounts * boot
    return jax.lax.stop_gradient(targets), ns.discounts


# ------------------------------------------------------------------------------------------------
# bootstrap values and loss
# ------------------------------------------------------------------------------------------------
def max_q_target(q_next_target: jax.Array) -> jax.Array:
    """Plain DQN bootstrap value ``max_a Q_target(s', a)`` (Mnih et al. 2015).

    Args:
        q_next_target: ``(B, A)`` (any leading axes) target-network Q-values at the next obs.

    Returns:
        ``(B,)`` float32, no gradient.
    """
    return jax.lax.stop_gradient(jnp.max(jnp.asarray(q_next_target, jnp.float32), axis=-1))


def double_q_target(q_next_online: jax.Array, q_next_target: jax.Array) -> jax.Array:
    """Double-DQN bootstrap value ``Q_target(s', argmax_a Q_online(s', a))`` (van Hasselt et al.
    2016, eq. 4): the online network selects the action, the target network evaluates it, which
    removes the max operator's overestimation bias. Ties pick the lowest action index.

    Args:
        q_next_online: ``(B, A)`` (any leading axes) online-network Q-values at the next obs.
        q_next_target: same shape, target-network Q-values at the next obs.

    Returns:
        ``(B,)`` float32, no gradient.

    Raises:
        ValueError: the two shapes differ.
    """
    q_next_online = jnp.asarray(q_next_online)
    q_next_target = jnp.asarray(q_next_target, jnp.float32)
    if q_next_online.shape != q_next_target.shape:
        raise ValueError(f"q_next_online {q_next_online.shape} and q_next_target {q_next_target.shape} "
                         "must have the same shape (B, A)")
    a_star = jnp.argmax(q_next_online, axis=-1)
    value = jnp.take_along_axis(q_next_target, a_star[..., None], axis=-1)[..., 0]
    return jax.lax.stop_gradient(value)


def td_loss(
    q: jax.Array,
    actions: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    huber_delta: float | None = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Importance-weighted Huber TD loss (Mnih et al. 2015; Schaul et al. 2016, sec. 3.4).

    ``td = targets - Q(s, a)`` (targets get ``stop_gradient``) and
    ``loss = mean_b(w_b * huber(td_b))`` with ``huber(x) = x^2 / 2`` for ``|x| <= delta`` and
    ``delta * (|x| - delta / 2)`` beyond, so the gradient w.r.t. ``Q(s, a)`` is
    ``-w * clip(td, -delta, delta) / B`` -- Mnih et al.'s "error clipping" for ``delta = 1``.
    ``huber_delta=None`` gives the squared loss ``x^2 / 2``. The mean divides by ``B``, not by
    ``sum(w)``; prioritised-replay weights are already normalised to ``max w = 1``.

    Args:
        q: ``(B, A)`` online Q-values at the start observations.
        actions: ``(B,)`` int actions taken.
        targets: ``(B,)`` float TD targets (e.g. ``reward + discount * double_q_target(...)``).
        weights: ``(B,)`` float importance weights, or None (all ones).
        huber_delta: Huber threshold ``> 0``, or None for the squared loss.

    Returns:
        ``(loss, td_errors)``: scalar float32 loss and ``(B,)`` float32 ``targets - Q(s, a)``
        (feed ``td_errors`` to :func:`tianji_jax.buffers.replay.update_priorities`).

    Raises:
        ValueError: ``q`` not 2-D; ``actions`` / ``targets`` / ``weights`` not ``(B,)``;
            ``huber_delta <= 0``.
    """
    q = jnp.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"q must have shape (B, A), got {q.shape}")
    b = q.shape[0]
    actions = jnp.asarray(actions)
    targets = jnp.asarray(targets, jnp.float32)
    for name, arr in (("actions", actions), ("targets", targets)):
        if arr.shape != (b,):
            raise ValueError(f"{name} must have shape ({b},) to match q {q.shape}, got {arr.shape}")
    if huber_delta is not None and _is_number(huber_delta) and not huber_delta > 0:
        raise ValueError(f"huber_delta must be > 0 or None (squared loss), got {huber_delta!r}")
    q_a = jnp.take_along_axis(q, actions.astype(jnp.int32)[:, None], axis=-1)[:, 0].astype(jnp.float32)
    td = jax.lax.stop_gradient(targets) - q_a
    if huber_delta is None:
        per_item = 0.5 * jnp.square(td)
    else:
        per_item = optax.huber_loss(td, delta=huber_delta)
    if weights is not None:
        weights = jnp.asarray(weights, jnp.float32)
        if weights.shape != (b,):
            raise ValueError(f"weights must have shape ({b},) or be None, got {weights.shape}")
        per_item = jax.lax.stop_gradient(weights) * per_item
    return jnp.mean(per_item), td


# ------------------------------------------------------------------------------------------------
# target networks
# ------------------------------------------------------------------------------------------------
def polyak_update(target: Any, online: Any, tau: float) -> Any:
    """Soft target update ``target <- tau * online + (1 - tau) * target`` (Lillicrap et al. 2016).

    Args:
        target: pytree of target params.
        online: pytree of online params, same structure.
        tau: step size in [0, 1]; ``tau = 1`` copies ``online``, ``tau = 0`` keeps ``target``.

    Returns:
        pytree like ``target`` (``optax.incremental_update``).

    Raises:
        ValueError: ``tau`` outside [0, 1] (when concrete).
    """
    _check_range("tau", tau, 0.0, 1.0)
    return optax.incremental_update(online, target, tau)


def periodic_hard_update(target: Any, online: Any, step: jax.Array, period: int) -> Any:
    """Hard target update every ``period`` gradient steps (Mnih et al. 2015, "C" in Algorithm 1).

    Returns ``online`` where ``step % period == 0`` and ``target`` otherwise, as a ``jnp.where``
    per leaf (no ``lax.cond``, so it is branch-free under ``vmap``). Call it with the optimizer
    step count *after* the update (1, 2, ...), so the copy happens after steps ``period``,
    ``2 * period``, ...; ``step = 0`` copies too (a fresh target equals the online net).

    Args:
        target, online: pytrees of params, same structure.
        step: int scalar (Python or traced), number of gradient steps taken.
        period: int ``>= 1`` (Python or traced).

    Returns:
        pytree like ``target``.

    Raises:
        ValueError: ``period < 1`` (when concrete).
    """
    if _is_number(period) and not period >= 1:
        raise ValueError(f"period must be an int >= 1 (gradient steps between copies), got {period!r}")
    copy = jnp.mod(jnp.asarray(step), period) == 0
    return jax.tree.map(lambda t, o: jnp.where(copy, o, t).astype(jnp.result_type(t)), target, online)


# ------------------------------------------------------------------------------------------------
# exploration
# ------------------------------------------------------------------------------------------------
def linear_epsilon(step: jax.Array, start: float, end: float, decay_steps: int) -> jax.Array:
    """Linearly annealed epsilon (Mnih et al. 2015: 1.0 -> 0.1 over the first 1M frames).

    ``eps = start + (end - start) * clip(step / decay_steps, 0, 1)``; constant ``end`` afterwards.

    Args:
        step: int or float scalar (or array) of env steps (Python or traced).
        start: epsilon at step 0, in [0, 1].
        end: final epsilon, in [0, 1].
        decay_steps: steps to go from ``start`` to ``end``, ``>= 1``.

    Returns:
        float32 array shaped like ``step``.

    Raises:
        ValueError: ``start`` / ``end`` outside [0, 1] or ``decay_steps < 1`` (when concrete).
    """
    _check_range("start", start, 0.0, 1.0)
    _check_range("end", end, 0.0, 1.0)
    if _is_number(decay_steps) and not decay_steps >= 1:
        raise ValueError(f"decay_steps must be >= 1, got {decay_steps!r}")
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / decay_steps, 0.0, 1.0)
    return (start + (end - start) * frac).astype(jnp.float32)


def apex_epsilons(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> jax.Array:
    """Fixed per-actor (or per-env) epsilons of Ape-X (Horgan et al. 2018, sec. 4.1):
    ``eps_i = base^(1 + i / (N - 1) * alpha)`` for ``i = 0, ..., N - 1``; ``N = 1`` gives ``[base]``.

    Args:
        num_actors: ``N >= 1``, static Python int (it fixes the output shape).
        base: ``epsilon`` of the paper, in [0, 1] (0.4).
        alpha: exponent spread ``>= 0`` (7).

    Returns:
        ``(N,)`` float32, decreasing from ``base`` to ``base^(1 + alpha)``.

    Raises:
        ValueError: ``num_actors < 1`` or not an int; ``base`` outside [0, 1]; ``alpha < 0``.
    """
    if not isinstance(num_actors, numbers.Integral) or isinstance(num_actors, bool) or num_actors < 1:
        raise ValueError(f"num_actors must be a Python int >= 1, got {num_actors!r}")
    _check_range("base", base, 0.0, 1.0)
    if _is_number(alpha) and not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    i = jnp.arange(num_actors, dtype=jnp.float32)
    frac = i / max(num_actors - 1, 1)
    return jnp.power(jnp.asarray(base, jnp.float32), 1.0 + frac * alpha)
