"""PQN math as pure functions over pytrees: Q(lambda) returns, the TD loss, one update, and
epsilon-greedy exploration.

Source: Gallici et al. 2024 ("Simplifying Deep Temporal Difference Learning", arXiv 2407.04811,
section 4 and Algorithm 1): a Q-network with LayerNorm (:class:`tianji_jax.nets.networks.QNetwork`
with ``layer_norm=True``) trained on-policy from short rollouts of many vectorised envs, with
Q(lambda) targets, several epochs of shuffled minibatches per rollout, and no target network and
no replay buffer. Q(lambda) is Peng's (Peng & Williams 1996, "Incremental Multi-Step
Q-Learning"), computed backwards over the rollout as PQN does.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from tianji_jax.algos import guard

__all__ = ["q_lambda_returns", "PQNBatch", "pqn_loss", "pqn_update", "epsilon_at", "epsilon_greedy"]


def q_lambda_returns(
    rewards: jax.Array,
    next_q_max: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float,
    q_lambda: float,
) -> jax.Array:
    """Peng's Q(lambda) returns over a rollout (PQN's targets), as a reverse ``lax.scan``.

    Gallici et al. 2024, section 4 (Q(lambda) targets of Algorithm 1); Peng & Williams 1996.
    Time runs along axis 0. With ``done[t] = terminated[t] | truncated[t]``::

        boot[t] = next_q_max[t]                      if done[t] or t == T - 1
                  G[t+1]                             otherwise
        G[t]    = r[t] + gamma * (1 - terminated[t]) * ((1 - lambda) * next_q_max[t] + lambda * boot[t])

    so a termination bootstraps nothing, a time-limit truncation bootstraps from the max-Q of the
    true final observation and cuts the trace (the next step belongs to a new episode), and the
    last step of the rollout bootstraps from ``next_q_max``. ``lambda = 0`` gives the one-step
    Q-learning target ``r + gamma * (1 - terminated) * next_q_max``.

    Args:
        rewards: ``(T, N)`` float rewards.
        next_q_max: ``(T, N)`` float ``max_a Q(s'_t, a)``, ``s'_t`` the true observation after
            step t (the final observation, before the auto-reset, where the episode ended at t).
        terminated: ``(T, N)`` bool, the episode ended at t by reaching a terminal state.
        truncated: ``(T, N)`` bool, the episode was cut at t (time limit); where both are set,
            termination wins.
        gamma: discount in [0, 1].
        q_lambda: lambda in [0, 1].

    Returns:
        ``(T, N)`` float32 returns (the regression targets of :func:`pqn_loss`).
    """
    rewards, next_q_max = (jnp.asarray(x, jnp.float32) for x in (rewards, next_q_max))
    terminated = jnp.asarray(terminated, bool)
    truncated = jnp.asarray(truncated, bool)
    cut = (terminated | truncated).at[-1].set(True)  # the trace stops at an episode end and at T-1
    not_term = 1.0 - terminated.astype(jnp.float32)

    def backward(g_next, xs):
        r, nq, nt, c = xs
        boot = jnp.where(c, nq, g_next)
        g = r + gamma * nt * ((1.0 - q_lambda) * nq + q_lambda * boot)
        return g, g

    _, returns = jax.lax.scan(backward, jnp.zeros_like(next_q_max[-1]),
                              (rewards, next_q_max, not_term, cut), reverse=True)
    return returns


@struct.dataclass
class PQNBatch:
    """A flat batch of ``B`` transitions for the PQN loss.

    Attributes:
        obs: ``(B, *obs_shape)`` observations as the network saw them when acting.
        actions: ``(B,)`` int32 actions taken.
        targets: ``(B,)`` float32 Q(lambda) returns (:func:`q_lambda_returns`, flattened).
    """

    obs: jax.Array
    actions: jax.Array
    targets: jax.Array


def pqn_loss(params: Any, apply_fn: Callable, batch: PQNBatch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PQN's TD loss (Gallici et al. 2024, Algorithm 1): ``0.5 * mean((Q(s, a) - G)^2)``.

    The targets ``G`` are held fixed (``stop_gradient``): they were computed from the network
    before the update, and no target network is used.

    Args:
        params: network params for ``apply_fn``.
        apply_fn: ``apply_fn(params, obs (B, *obs_shape)) -> q_values (B, A)`` float32.
        batch: a :class:`PQNBatch` of ``B`` transitions (or of ``B`` env columns of ``T``
            transitions each for a recurrent network: ``actions``/``targets`` ``(B, T)``, ``obs`` what
            ``apply_fn`` takes, ``q_values (B, T, A)``; the mean is then over all ``B * T``).

    Returns:
        ``(loss, metrics)``: scalar float32 loss and a dict of float32 scalars ``td_loss`` (the
        loss) and ``q_mean`` (mean of ``Q(s, a)`` over the batch).
    """
    q = apply_fn(params, batch.obs)
    actions = jnp.asarray(batch.actions, jnp.int32)
    q_sa = jnp.take_along_axis(q, actions[..., None], axis=-1)[..., 0]
    targets = jax.lax.stop_gradient(jnp.asarray(batch.targets, jnp.float32))
    loss = 0.5 * jnp.mean((q_sa - targets) ** 2)
    return loss, {"td_loss": loss, "q_mean": jnp.mean(q_sa)}


def pqn_update(
    key: jax.Array,
    params: Any,
    opt_state: Any,
    batch: PQNBatch,
    *,
    apply_fn: Callable,
    tx: optax.GradientTransformation,
    update_epochs: int,
    num_minibatches: int,
    axis_name: str | None = None,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """``update_epochs`` passes of shuffled minibatch SGD on :func:`pqn_loss` over a flat batch.

    Gallici et al. 2024, Algorithm 1: the rollout's ``B = T * N`` transitions and their
    Q(lambda) targets are reused for several epochs of minibatches, no target network.

    Args:
        key: PRNG key for the per-epoch permutations.
        params, opt_state: network params and optimizer state.
        batch: :class:`PQNBatch` with leading axis ``B``, divisible by ``num_minibatches`` (``B`` env
            columns for a recurrent network, see :func:`pqn_loss`).
        apply_fn: ``apply_fn(params, obs) -> q_values (B, A)``.
        tx: the optax optimizer (e.g. :func:`tianji_jax.algos.ppo.math.make_optimizer`).
        update_epochs: passes over the batch, each with a fresh permutation (static int).
        num_minibatches: minibatches per pass, ``B // num_minibatches`` transitions each (static int).
        axis_name: when set (data-parallel learners under ``shard_map``, each holding an equal
            shard of the batch and permuting it locally), gradients, loss and metrics are averaged
            over this mapped axis, so every replica applies the same update and skips the same steps.

    Returns:
        ``(params, opt_state, metrics)``: metrics are float32 scalars ``td_loss``, ``q_mean`` and
        ``grad_norm`` (global norm before clipping) averaged over all ``update_epochs *
        num_minibatches`` gradient steps, and int32 ``nonfinite_skips``: the gradient steps
        skipped because their loss or gradient was not finite (:mod:`tianji_jax.algos.guard`;
        params and optimizer state are then left as they were).
    """
    def loss_fn(p, mb):
        return pqn_loss(p, apply_fn, mb)

    return guard.minibatch_epochs(loss_fn, tx, params, opt_state, batch, key, update_epochs=update_epochs,
                                  num_minibatches=num_minibatches, axis_name=axis_name)


def epsilon_at(env_steps: jax.Array, start: float, finish: float, anneal_steps: int) -> jax.Array:
    """Exploration rate after ``env_steps`` env steps: linear from ``start`` to ``finish``.

    ``eps = start + (finish - start) * clip(env_steps / anneal_steps, 0, 1)``, so ``finish`` from
    ``anneal_steps`` on (PQN's exploration schedule, as DQN's of Mnih et al. 2015).
    ``anneal_steps <= 0`` gives ``finish`` at every step.

    Args:
        env_steps: int or float scalar (or array) of env steps taken (all envs counted); Python
            or traced (e.g. int32).
        start: epsilon at step 0, in [0, 1].
        finish: epsilon once annealed, in [0, 1].
        anneal_steps: env steps over which epsilon goes from ``start`` to ``finish``.

    Returns:
        float32 array shaped like ``env_steps``.
    """
    steps = jnp.asarray(env_steps, jnp.float32)
    span = jnp.asarray(anneal_steps, jnp.float32)
    frac = jnp.where(span > 0, jnp.clip(steps / jnp.maximum(span, 1.0), 0.0, 1.0), 1.0)
    return (start + (finish - start) * frac).astype(jnp.float32)


def epsilon_greedy(key: jax.Array, q_values: jax.Array, epsilon: jax.Array, mask: jax.Array | None = None
                   ) -> tuple[jax.Array, jax.Array]:
    """Epsilon-greedy actions and their behaviour log-probabilities.

    Each row independently: with probability ``epsilon`` a uniformly random action among the
    ``A``, else ``argmax_a q`` (the first maximum on ties). The behaviour probability of the
    chosen action ``a`` is ``epsilon / A + (1 - epsilon) * [a == argmax]``.

    Args:
        key: PRNG key.
        q_values: ``(B, A)`` float Q-values.
        epsilon: scalar or ``(B,)`` float exploration rate in [0, 1].
        mask: optional ``(B, A)`` bool allowed actions (an env's action mask; each row allows at
            least one): the random action is uniform among the allowed ones, ``A`` above becomes
            their number, and ``q_values`` must already be masked for the argmax.

    Returns:
        ``(actions, log_prob)``: ``(B,)`` int32 actions and ``(B,)`` float32 log of their
        behaviour probability (0 for a greedy action at ``epsilon = 0``, ``log(1 / A)`` for any
        action at ``epsilon = 1``).
    """
    b, num_actions = q_values.shape
    explore_key, action_key = jax.random.split(key)
    eps = jnp.broadcast_to(jnp.asarray(epsilon, jnp.float32), (b,))
    greedy = jnp.argmax(q_values, axis=-1).astype(jnp.int32)
    if mask is None:
        random = jax.random.randint(action_key, (b,), 0, num_actions, dtype=jnp.int32)
        allowed = num_actions
    else:
        random = jax.random.categorical(action_key, jnp.where(mask, 0.0, -1e9), axis=-1).astype(jnp.int32)
        allowed = jnp.sum(mask, axis=-1)
    actions = jnp.where(jax.random.uniform(explore_key, (b,)) < eps, random, greedy)
    prob = eps / allowed + jnp.where(actions == greedy, 1.0 - eps, 0.0)
    return actions, jnp.log(prob).astype(jnp.float32)
