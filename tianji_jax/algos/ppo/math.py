"""PPO math as pure functions over pytrees: GAE, the clipped-surrogate loss, and one update.

Sources: Schulman et al. 2017 ("Proximal Policy Optimization Algorithms", eq. 7 and 9);
GAE from Schulman et al. 2016 ("High-Dimensional Continuous Control Using Generalized Advantage
Estimation", eq. 16); implementation details (advantage normalisation per minibatch, value
clipping, global-norm clipping, annealing) from Huang et al. 2022 ("The 37 Implementation
Details of PPO"); V-trace from Espeholt et al. 2018 ("IMPALA", section 4.1, eq. 1 and the
policy-gradient advantage of section 4.2).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from tianji_jax.algos import distributions
from tianji_jax.algos import guard

__all__ = ["gae", "vtrace", "PPOBatch", "ppo_loss", "ppo_update", "make_optimizer"]


def gae(
    rewards: jax.Array,
    values: jax.Array,
    last_value: jax.Array,
    final_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over a rollout, with separate termination and truncation.

    Schulman et al. 2016 ("High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", eq. 16), as a reverse ``lax.scan``. Time runs along axis 0. With
    ``next_v[t] = values[t+1]`` (``last_value`` for the last step), replaced by
    ``final_values[t]`` where ``truncated[t]``::

        delta[t] = r[t] + gamma * (1 - terminated[t]) * next_v[t] - values[t]
        A[t]     = delta[t] + gamma * lambda * (1 - done[t]) * A[t+1],   done = terminated | truncated

    so a time-limit cut bootstraps from V of the true final observation, a termination does not
    bootstrap, and where both are set on the same step termination wins.

    Args:
        rewards: ``(T, ...)`` float rewards.
        values: ``(T, ...)`` V(s_t).
        last_value: ``(...)`` V of the observation after the last step.
        final_values: ``(T, ...)`` V of the true final observation of step t (used only where
            ``truncated``).
        terminated: ``(T, ...)`` bool.
        truncated: ``(T, ...)`` bool.
        gamma: discount in [0, 1].
        gae_lambda: lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both ``(T, ...)`` float32, ``returns = advantages + values``.
    """
    rewards, values, final_values, last_value = (jnp.asarray(x, jnp.float32)
                                                 for x in (rewards, values, final_values, last_value))
    terminated = jnp.asarray(terminated, bool)
    truncated = jnp.asarray(truncated, bool)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    next_values = jnp.where(truncated, final_values, next_values)
    not_term = 1.0 - terminated.astype(jnp.float32)
    not_done = 1.0 - (terminated | truncated).astype(jnp.float32)
    deltas = rewards + gamma * not_term * next_values - values

    def backward(adv_next, xs):
        delta, nd = xs
        adv = delta + gamma * gae_lambda * nd * adv_next
        return adv, adv

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(last_value), (deltas, not_done), reverse=True)
    return advantages, advantages + values


def vtrace(
    rewards: jax.Array,
    values: jax.Array,
    last_value: jax.Array,
    final_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    log_rhos: jax.Array,
    gamma: float,
    trace_lambda: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """V-trace targets and policy-gradient advantages for off-policy (stale) trajectories.

    Espeholt et al. 2018, eq. 1: with ``rho[t] = min(rho_bar, pi/mu)``, ``c[t] = lambda *
    min(c_bar, pi/mu)`` and ``next_v`` as in :func:`gae` (``final_values`` where truncated)::

        delta[t] = rho[t] * (r[t] + gamma * (1 - terminated[t]) * next_v[t] - values[t])
        vs[t] - values[t] = delta[t] + gamma * (1 - done[t]) * c[t] * (vs[t+1] - next_v[t])

    (``vs[T]`` = ``last_value``; a truncation or termination cuts the trace, and a truncated
    step bootstraps from V of the true final observation), and the policy-gradient advantage
    ``A[t] = rho[t] * (r[t] + gamma * (1 - terminated[t]) * vs_next[t] - values[t])`` with
    ``vs_next[t] = vs[t+1]`` inside an episode and ``next_v[t]`` where it ended. On-policy
    (``log_rhos = 0``) ``vs`` equals the GAE(lambda) returns of :func:`gae`.

    Args:
        rewards, values, final_values, terminated, truncated: ``(T, ...)`` as in :func:`gae`.
        last_value: ``(...)`` V of the observation after the last step.
        log_rhos: ``(T, ...)`` float ``log pi(a|s) - log mu(a|s)`` (learner minus behaviour).
        gamma: discount in [0, 1].
        trace_lambda: the lambda of the traces ``c`` (1 in the paper; use ``gae_lambda``).
        rho_bar, c_bar: truncation levels (the paper's default 1).

    Returns:
        ``(pg_advantages, vs)``: both ``(T, ...)`` float32; ``vs`` are the value targets.
    """
    rewards, values, last_value, final_values, log_rhos = (jnp.asarray(x, jnp.float32) for x in
                                                           (rewards, values, last_value, final_values, log_rhos))
    terminated = jnp.asarray(terminated, bool)
    truncated = jnp.asarray(truncated, bool)
    ratio = jnp.exp(log_rhos)
    rho = jnp.minimum(rho_bar, ratio)
    c = trace_lambda * jnp.minimum(c_bar, ratio)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    next_values = jnp.where(truncated, final_values, next_values)
    not_term = 1.0 - terminated.astype(jnp.float32)
    not_done = 1.0 - (terminated | truncated).astype(jnp.float32)
    deltas = rho * (rewards + gamma * not_term * next_values - values)

    def backward(acc_next, xs):  # acc = vs - values
        delta, nd, ct = xs
        acc = delta + gamma * nd * ct * acc_next
        return acc, acc

    _, acc = jax.lax.scan(backward, jnp.zeros_like(last_value), (deltas, not_done, c), reverse=True)
    vs = acc + values
    vs_next = jnp.concatenate([vs[1:], last_value[None]], axis=0)
    vs_next = jnp.where(not_done > 0, vs_next, next_values)
    pg_adv = rho * (rewards + gamma * not_term * vs_next - values)
    return pg_adv, vs


@struct.dataclass
class PPOBatch:
    """A flat batch of ``B`` transitions for the PPO loss.

    A recurrent agent's batch is ``B`` env columns instead (leaves ``(B, T, ...)``, ``obs`` a dict of
    the columns' observations, reset flags and initial carries that its ``apply_fn`` re-runs; see
    :meth:`~tianji_jax.algos.ppo.agent.PPOAgent.learn`): every function here only permutes and
    splits the leading axis, so minibatches are then whole env columns.

    Attributes:
        obs: ``(B, *obs_shape)`` observations as the policy saw them (normalised if enabled), or any
            pytree with leading axis ``B`` that ``apply_fn`` takes.
        actions: ``(B,)`` int32 (Discrete), ``(B, len(nvec))`` int32 (MultiDiscrete) or ``(B, A)`` float32
            (unclipped samples).
        log_probs: ``(B,)`` float32 behaviour-policy log-probabilities.
        values: ``(B,)`` float32 value estimates at acting time (for value clipping).
        advantages: ``(B,)`` float32.
        returns: ``(B,)`` float32 value targets.
    """

    obs: jax.Array
    actions: jax.Array
    log_probs: jax.Array
    values: jax.Array
    advantages: jax.Array
    returns: jax.Array


def ppo_loss(
    params: Any,
    apply_fn: Callable,
    batch: PPOBatch,
    *,
    continuous: bool,
    nvec: tuple[int, ...] | None = None,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    clip_value_loss: bool,
    normalize_advantages: bool,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate PPO loss (Schulman et al. 2017, eq. 7 and 9).

    ``loss = -mean(min(r A, clip(r, 1-eps, 1+eps) A)) + vf_coef * 0.5 * mean((V - R)^2)
    - ent_coef * mean(H)`` with ``r = exp(log pi_theta(a|s) - log pi_behaviour(a|s))``; the value
    error is the elementwise max with the clipped version when ``clip_value_loss``.

    Args:
        params: network params for ``apply_fn(params, obs) -> (actor_out, value)``.
        apply_fn: ``apply_fn(params, obs (B, *obs_shape)) -> (actor_out, value (B,))``.
        batch: a :class:`PPOBatch` of ``B`` transitions.
        continuous: Gaussian policy (``actor_out = (mean, log_std)``) if True, else categorical logits.
        nvec: MultiDiscrete sizes: a factored categorical over logits ``(B, sum(nvec))`` and actions
            ``(B, len(nvec))`` int32 (the log-probability and entropy are sums over the factors,
            :func:`~tianji_jax.algos.distributions.factored_log_prob`); None otherwise.
        clip_eps: ratio clip ``eps`` (also the value-clipping range).
        vf_coef, ent_coef: weights of the value loss and the entropy bonus.
        clip_value_loss: clip the value error around ``batch.values`` (Huang et al. 2022).
        normalize_advantages: standardise advantages per minibatch (mean 0, std 1, ``+1e-8``).
        axis_name: data-parallel learners: the mapped axis the minibatch is split over (equal
            shares); advantages are then normalised with the mean and std of the *global*
            minibatch (``pmean`` of the shard moments), as a single learner would.

    Returns:
        ``(loss, metrics)``: scalar float32 loss and a dict of scalars ``policy_loss``,
        ``value_loss``, ``entropy``, ``approx_kl`` ((r - 1) - log r, Schulman 2020), ``clip_fraction``.
    """
    actor_out, value = apply_fn(params, batch.obs)
    logp = distributions.log_prob(actor_out, batch.actions, continuous, nvec)
    log_ratio = logp - batch.log_probs
    ratio = jnp.exp(log_ratio)
    adv = batch.advantages
    if normalize_advantages:
        if axis_name is None:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        else:  # two-pass global moments over the shards
            mean = jax.lax.pmean(adv.mean(), axis_name)
            std = jnp.sqrt(jax.lax.pmean(jnp.mean((adv - mean) ** 2), axis_name))
            adv = (adv - mean) / (std + 1e-8)
    pg_loss = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv))
    v_err = (value - batch.returns) ** 2
    if clip_value_loss:
        v_clipped = batch.values + jnp.clip(value - batch.values, -clip_eps, clip_eps)
        v_err = jnp.maximum(v_err, (v_clipped - batch.returns) ** 2)
    v_loss = 0.5 * jnp.mean(v_err)
    ent = jnp.mean(distributions.entropy(actor_out, continuous, nvec))
    loss = pg_loss + vf_coef * v_loss - ent_coef * ent
    metrics = {
        "policy_loss": pg_loss,
        "value_loss": v_loss,
        "entropy": ent,
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clip_fraction": jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)),
    }
    return loss, metrics


def make_optimizer(learning_rate: float, max_grad_norm: float, anneal_steps: int | None,
                   gradient_steps_per_update: int) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; the learning rate optionally annealed linearly.

    With ``anneal_steps`` (number of updates) set, the rate is
    ``lr * (1 - (count // gradient_steps_per_update) / anneal_steps)``: constant within an update,
    reaching 0 after the last one (PureJaxRL's schedule). The position lives in the optimizer
    state's step count, so it survives checkpoints.

    Args:
        learning_rate: Adam step size (initial value when annealed).
        max_grad_norm: global-norm clipping threshold.
        anneal_steps: PPO updates over which the rate goes to 0, or None for a constant rate.
        gradient_steps_per_update: optimizer steps per PPO update
            (``update_epochs * num_minibatches``).

    Returns:
        The ``optax`` transformation (``clip_by_global_norm`` then ``adam``).
    """
    if anneal_steps is None:
        lr: Any = learning_rate
    else:
        def lr(count):
            frac = 1.0 - (count // gradient_steps_per_update) / anneal_steps
            return learning_rate * frac
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr, eps=1e-5))


def ppo_update(
    key: jax.Array,
    params: Any,
    opt_state: Any,
    batch: PPOBatch,
    *,
    apply_fn: Callable,
    tx: optax.GradientTransformation,
    update_epochs: int,
    num_minibatches: int,
    loss_kwargs: dict[str, Any],
    axis_name: str | None = None,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """``update_epochs`` passes of shuffled minibatch SGD over a flat batch of ``B`` transitions.

    Args:
        key: PRNG key for the per-epoch permutations.
        params, opt_state: network params and optimizer state.
        batch: :class:`PPOBatch` with leading axis ``B``, divisible by ``num_minibatches``.
        apply_fn: ``apply_fn(params, obs) -> (actor_out, value)``.
        tx: the optax optimizer (see :func:`make_optimizer`).
        update_epochs: passes over the batch, each with a fresh permutation (static int).
        num_minibatches: minibatches per pass, ``B // num_minibatches`` transitions each (static int).
        loss_kwargs: keyword arguments of :func:`ppo_loss` besides params/apply_fn/batch.
        axis_name: when set (data-parallel learners, each holding an equal shard of the batch and
            permuting it locally), advantage statistics are global, gradients and metrics are
            averaged over this mapped axis, so every replica applies the same update.

    Returns:
        ``(params, opt_state, metrics)``: metrics are float32 scalars averaged over all
        ``update_epochs * num_minibatches`` gradient steps, plus ``grad_norm`` (global norm
        before clipping) and int32 ``nonfinite_skips``: the gradient steps skipped because their
        loss or gradient was not finite (:mod:`tianji_jax.algos.guard`; params and optimizer
        state are then left as they were).
    """
    def loss_fn(p, mb):
        return ppo_loss(p, apply_fn, mb, axis_name=axis_name, **loss_kwargs)

    return guard.minibatch_epochs(loss_fn, tx, params, opt_state, batch, key, update_epochs=update_epochs,
                                  num_minibatches=num_minibatches, axis_name=axis_name)
