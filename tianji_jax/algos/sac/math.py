"""SAC math as pure functions over arrays: the tanh-squashed Gaussian policy (reparameterised
sample, log-density, deterministic mode), the soft Q target, and the critic, actor and
temperature losses.

Sources (equation numbers of the arXiv versions):
    Haarnoja, Zhou, Abbeel & Levine 2018, "Soft Actor-Critic: Off-Policy Maximum Entropy Deep
    Reinforcement Learning with a Stochastic Actor" (ICML; arXiv 1801.01290): the soft Bellman
    backup (eq. 2-3), the critic loss (eq. 7-8), the policy loss (eq. 10) and its
    reparameterisation (eq. 11-12), the tanh squashing of a Gaussian and its change-of-variables
    log-density (appendix C, eq. 21).
    Haarnoja, Zhou, Hartikainen et al. 2018, "Soft Actor-Critic Algorithms and Applications"
    (arXiv 1812.05905): the same with the temperature alpha written out (soft value eq. 3, critic
    loss eq. 5, policy loss eq. 7 / reparameterised eq. 9), the automatic temperature (section 5,
    eq. 18) and the tanh correction (appendix C).
    Both papers take the minimum of two Q-functions (section 4.2 of the first, section 6 of the
    second), after Fujimoto et al. 2018 ("Addressing Function Approximation Error in Actor-Critic
    Methods", TD3, clipped double Q-learning).

Conventions followed from the reference implementations: CleanRL's ``sac_continuous_action.py``
(Huang et al. 2022; sum of the two critics' MSEs, ``target_entropy = -|A|``) and Stable-Baselines3's
SAC (the temperature loss on ``log_alpha``).

Every function here is free of Python side effects on traced values, so it can be ``jax.jit``-ed
and ``jax.vmap``-ed. Shapes: ``B`` the batch, ``A`` the action dimensions. Nothing here touches a
runtime, an environment or a replay buffer.
"""

from __future__ import annotations

import math as _math

import jax
import jax.numpy as jnp

__all__ = [
    "squashed_gaussian_sample",
    "squashed_gaussian_mode",
    "soft_q_target",
    "critic_loss",
    "actor_loss",
    "temperature_loss",
    "default_target_entropy",
]

_LOG_2PI = _math.log(2.0 * _math.pi)  # Python floats: importing must not start JAX's backend
_LOG_2 = _math.log(2.0)


def _log_one_minus_tanh_sq(u: jax.Array) -> jax.Array:
    """``log(1 - tanh(u)^2)`` elementwise, finite for every finite ``u``.

    ``1 - tanh(u)^2 = 4 / (e^u + e^-u)^2``, so its log is ``2 (log 2 - u - softplus(-2u))``
    (the form of the TensorFlow Probability tanh bijector and of Haarnoja et al.'s softlearning);
    the naive ``log(1 - tanh(u)^2)`` is ``-inf`` in float32 once ``|u| > ~9``.
    """
    return 2.0 * (_LOG_2 - u - jax.nn.softplus(-2.0 * u))


def _affine(low: jax.Array, high: jax.Array, dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(low, high, half_range)`` as arrays of ``dtype``."""
    low = jnp.asarray(low, dtype)
    high = jnp.asarray(high, dtype)
    return low, high, (high - low) / 2.0


def squashed_gaussian_sample(key: jax.Array, mean: jax.Array, log_std: jax.Array, low: jax.Array,
                             high: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A reparameterised sample of the tanh-squashed Gaussian policy in the Box ``[low, high]``,
    and its log-density.

    With ``eps ~ N(0, I)`` and ``std = exp(log_std)``::

        u        = mean + std * eps                                   (reparameterisation, eq. 11 of 1801.01290)
        action   = low + (tanh(u) + 1) * (high - low) / 2
        log_prob = sum_A [ log N(u; mean, std) - log(1 - tanh(u)^2) - log((high - low) / 2) ]

    the change-of-variables density of Haarnoja et al. 2018 ("Soft Actor-Critic", appendix C,
    eq. 21; "Soft Actor-Critic Algorithms and Applications", appendix C) extended by the affine
    map of ``(-1, 1)`` onto ``[low, high]`` (whose log-Jacobian is ``log((high - low) / 2)`` per
    dimension). ``log(1 - tanh(u)^2)`` is computed as ``2 (log 2 - u - softplus(-2u))``, finite
    for any ``u`` (no ``+ 1e-6`` fudge as in some implementations), and ``log N(u; mean, std)``
    as ``-eps^2 / 2 - log_std - log(2 pi) / 2`` (identical in value and in its pathwise gradient,
    since ``(u - mean) / std = eps``).

    Gradients flow from ``action`` and ``log_prob`` to ``mean`` and ``log_std`` (the
    reparameterisation the policy loss of eq. 12 of 1801.01290 / eq. 9 of 1812.05905 needs).
    The action is clipped to ``[low, high]`` only to absorb float rounding of the affine map
    (``tanh`` saturates at exactly +-1 in float32 for ``|u| > ~9``).

    Args:
        key: a PRNG key.
        mean: ``(B, A)`` float32 mean of the pre-squash Gaussian (the actor's output).
        log_std: ``(B, A)`` float32 log standard deviation (already bounded by the actor).
        low: ``(A,)`` float32 lower bounds of the Box (finite); a scalar broadcasts.
        high: ``(A,)`` float32 upper bounds (finite, ``> low``); a scalar broadcasts.

    Returns:
        ``(action, log_prob)``: ``action (B, A)`` in ``[low, high]`` and ``log_prob (B,)``, the
        log-density of ``action`` w.r.t. Lebesgue measure on the Box, both of ``mean``'s dtype.
    """
    low, high, half = _affine(low, high, mean.dtype)
    eps = jax.random.normal(key, mean.shape, mean.dtype)
    u = mean + jnp.exp(log_std) * eps
    action = jnp.clip(low + (jnp.tanh(u) + 1.0) * half, low, high)
    log_gauss = -0.5 * eps**2 - log_std - 0.5 * _LOG_2PI
    log_det = _log_one_minus_tanh_sq(u) + jnp.log(half)  # log |d action_i / d u_i|
    log_prob = jnp.sum(log_gauss - jnp.broadcast_to(log_det, mean.shape), axis=-1)
    return action, log_prob


def squashed_gaussian_mode(mean: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """The deterministic action of the squashed Gaussian policy, for evaluation:
    ``low + (tanh(mean) + 1) * (high - low) / 2``: the Gaussian's mean pushed through the squashing
    of Haarnoja et al. 2018 ("Soft Actor-Critic", appendix C), the deterministic policy SAC is
    evaluated with (not the mode of the squashed density, which moves towards the bounds when the
    std is large).

    Args:
        mean: ``(B, A)`` float32 mean of the pre-squash Gaussian.
        low: ``(A,)`` float32 lower bounds of the Box; a scalar broadcasts.
        high: ``(A,)`` float32 upper bounds; a scalar broadcasts.

    Returns:
        ``(B, A)`` actions of ``mean``'s dtype in ``[low, high]``.
    """
    low, high, half = _affine(low, high, mean.dtype)
    return jnp.clip(low + (jnp.tanh(mean) + 1.0) * half, low, high)


def soft_q_target(reward: jax.Array, discount: jax.Array, next_q1: jax.Array, next_q2: jax.Array,
                  next_log_prob: jax.Array, alpha: jax.Array | float) -> jax.Array:
    """The soft Q-learning target ``y = r + discount * (min(Q1', Q2') - alpha * log pi(a'|s'))``.

    The soft Bellman backup of Haarnoja et al. 2018 ("Soft Actor-Critic Algorithms and
    Applications", eq. 2 with the soft value of eq. 3, used in the critic loss of eq. 5;
    "Soft Actor-Critic", eq. 2-3 and 8 with alpha folded into the reward scale): the next soft
    value ``V(s') = Q(s', a') - alpha log pi(a'|s')`` is estimated with one action ``a' ~ pi(.|s')``
    and the minimum of the two target critics (clipped double Q, Fujimoto et al. 2018; section 6
    of the second paper). Not stop-gradiented here: :func:`critic_loss` does that.

    Args:
        reward: ``(B,)`` float32 rewards (an n-step sum of discounted rewards for n-step targets).
        discount: ``(B,)`` float32 bootstrap discount: ``gamma^n`` already applied, 0 where the
            episode terminated (1 - terminated, times gamma^n; a truncation still bootstraps).
        next_q1, next_q2: ``(B,)`` float32 target critics' ``Q(s', a')`` for ``a' ~ pi(.|s')``.
        next_log_prob: ``(B,)`` float32 ``log pi(a'|s')`` (from :func:`squashed_gaussian_sample`).
        alpha: scalar temperature ``> 0`` (``exp(log_alpha)``).

    Returns:
        ``(B,)`` float32 targets.
    """
    next_v = jnp.minimum(next_q1, next_q2) - alpha * next_log_prob
    return reward + discount * next_v


def critic_loss(q1: jax.Array, q2: jax.Array, target: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The twin critics' soft Bellman residual: ``mean((q1 - y)^2) + mean((q2 - y)^2)`` with
    ``y = stop_gradient(target)``.

    Haarnoja et al. 2018 ("Soft Actor-Critic Algorithms and Applications", eq. 5; "Soft
    Actor-Critic", eq. 7) for each of the two critics, summed and without the 1/2 factor, as
    CleanRL's ``sac_continuous_action.py`` (the gradient is twice the paper's: a constant factor
    Adam removes).

    Args:
        q1, q2: ``(B,)`` float32 online critics' ``Q(s, a)`` for the replayed actions.
        target: ``(B,)`` float32 :func:`soft_q_target` (gradients into it are stopped here).

    Returns:
        ``(loss, td)``: ``loss`` a float32 scalar; ``td (B,)`` float32 ``(|q1 - y| + |q2 - y|) / 2``,
        the mean absolute TD error of the two critics per item (for metrics or replay priorities).
    """
    y = jax.lax.stop_gradient(target)
    d1, d2 = q1 - y, q2 - y
    loss = jnp.mean(d1**2) + jnp.mean(d2**2)
    td = 0.5 * (jnp.abs(d1) + jnp.abs(d2))
    return loss, td


def actor_loss(log_prob: jax.Array, q1: jax.Array, q2: jax.Array, alpha: jax.Array | float) -> jax.Array:
    """The policy loss ``mean(alpha * log pi(a|s) - min(Q1(s, a), Q2(s, a)))``, ``a`` the
    reparameterised sample of :func:`squashed_gaussian_sample`.

    Haarnoja et al. 2018 ("Soft Actor-Critic Algorithms and Applications", eq. 7, reparameterised
    as eq. 9; "Soft Actor-Critic", eq. 10 and 12 with alpha = 1), with the minimum of the two
    critics (section 6 of the second paper). ``alpha`` is stop-gradiented (it is trained only by
    :func:`temperature_loss`); the critics' parameters should be held fixed by the caller (take
    the gradient w.r.t. the actor's parameters only).

    Args:
        log_prob: ``(B,)`` float32 ``log pi(a|s)`` of the fresh actions.
        q1, q2: ``(B,)`` float32 online critics' ``Q(s, a)`` of those actions.
        alpha: scalar temperature ``> 0``.

    Returns:
        float32 scalar.
    """
    alpha = jax.lax.stop_gradient(alpha)
    return jnp.mean(alpha * log_prob - jnp.minimum(q1, q2))


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """The automatic-temperature loss ``-mean(log_alpha * stop_gradient(log_prob + target_entropy))``.

    Haarnoja et al. 2018 ("Soft Actor-Critic Algorithms and Applications", section 5, eq. 18:
    ``J(alpha) = E[-alpha log pi(a|s) - alpha H_target]``), parameterised by ``log_alpha`` as in
    Stable-Baselines3 (and CleanRL), so alpha stays positive. Its gradient w.r.t. ``log_alpha``
    is ``-mean(log_prob + target_entropy)``: when the policy's entropy estimate ``-log_prob`` is
    below ``target_entropy`` the gradient is negative and a descent step raises alpha (more
    entropy bonus); above it, alpha falls.

    Args:
        log_alpha: float32 scalar, the trained log temperature.
        log_prob: ``(B,)`` float32 ``log pi(a|s)`` of fresh actions (gradients stopped here).
        target_entropy: the entropy target ``H_target`` in nats (:func:`default_target_entropy`).

    Returns:
        float32 scalar.
    """
    return -jnp.mean(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))


def default_target_entropy(action_dim: int) -> float:
    """The heuristic entropy target ``-dim(A)`` (Haarnoja et al. 2018, "Soft Actor-Critic
    Algorithms and Applications", the hyperparameter table of its appendix; CleanRL's default and
    SB3's ``target_entropy="auto"``).

    Args:
        action_dim: number of action dimensions ``A >= 1``.

    Returns:
        ``-float(action_dim)`` (nats).

    Raises:
        ValueError: ``action_dim < 1``.
    """
    if int(action_dim) < 1:
        raise ValueError(f"action_dim must be >= 1, got {action_dim!r}")
    return -float(action_dim)
