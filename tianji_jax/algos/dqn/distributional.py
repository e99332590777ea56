"""Distributional value heads for the DQN family, as pure functions over arrays: C51's categorical
projection and cross-entropy loss (Bellemare, Dabney and Munos 2017, "A Distributional
Perspective on Reinforcement Learning", section 4, Algorithm 1) and QR-DQN's quantile Huber loss
(Dabney, Rowland, Bellemare and Munos 2018, "Distributional Reinforcement Learning with Quantile
Regression", section 3, eq. 9-10 and Algorithm 1).

Both combine with n-step targets (``discount = gamma^n * (1 - terminated)`` from the replay),
double Q (the online network picks the next action by its expected value), dueling heads and
prioritised replay (each item's loss is its priority, as Rainbow does for C51).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["c51_support", "categorical_projection", "c51_loss", "quantile_midpoints", "quantile_huber_loss",
           "expected_q", "distributional_loss"]


def c51_support(num_atoms: int, v_min: float, v_max: float) -> jax.Array:
    """The fixed support ``z_i = v_min + i * (v_max - v_min) / (K - 1)``, ``i = 0..K-1`` (float32 ``(K,)``).

    Raises:
        ValueError: ``num_atoms < 2`` or ``v_min >= v_max``.
    """
    if num_atoms < 2 or not v_min < v_max:
        raise ValueError(f"need num_atoms >= 2 and v_min < v_max, got {num_atoms}, {v_min}, {v_max}")
    return jnp.linspace(v_min, v_max, num_atoms, dtype=jnp.float32)


def categorical_projection(rewards: jax.Array, discounts: jax.Array, next_probs: jax.Array,
                           support: jax.Array) -> jax.Array:
    """Project the distribution of ``r + discount * Z(s')`` onto the fixed support (Bellemare et
    al. 2017, Algorithm 1): each atom ``Tz_j = clip(r + discount * z_j, v_min, v_max)`` splits its
    mass ``p_j`` between its two neighbouring atoms in proportion to closeness,
    ``m_i = sum_j p_j * max(0, 1 - |Tz_j - z_i| / dz)``, which conserves mass and puts all of an
    atom's mass on ``z_i`` when ``Tz_j`` falls exactly on it (including the clipped edges).

    Args:
        rewards: ``(B,)`` float32 (n-step discounted reward sums).
        discounts: ``(B,)`` float32 ``gamma^n * (1 - terminated)`` (0: no bootstrap).
        next_probs: ``(B, K)`` probabilities of the bootstrap action's distribution at ``s'``.
        support: ``(K,)`` evenly spaced atoms (:func:`c51_support`).

    Returns:
        ``(B, K)`` float32 target probabilities (rows sum to the rows of ``next_probs``), no gradient.
    """
    support = jnp.asarray(support, jnp.float32)
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (support.shape[0] - 1)
    tz = jnp.clip(rewards[:, None] + discounts[:, None] * support[None, :], v_min, v_max)  # (B, K_j)
    weights = jnp.clip(1.0 - jnp.abs(tz[:, :, None] - support[None, None, :]) / dz, 0.0, 1.0)  # (B, K_j, K_i)
    return jax.lax.stop_gradient(jnp.einsum("bj,bji->bi", next_probs.astype(jnp.float32), weights))


def c51_loss(logits_a: jax.Array, target_probs: jax.Array) -> jax.Array:
    """Per-item cross-entropy ``-sum_i m_i log softmax(logits)_i`` of the taken action's
    distribution against the projected target (Bellemare et al. 2017, Algorithm 1's loss).

    Args:
        logits_a: ``(B, K)`` online logits of the taken actions.
        target_probs: ``(B, K)`` projected targets (:func:`categorical_projection`).

    Returns:
        ``(B,)`` float32 losses.
    """
    return -jnp.sum(jax.lax.stop_gradient(target_probs) * jax.nn.log_softmax(logits_a.astype(jnp.float32)), axis=-1)


def quantile_midpoints(num_quantiles: int) -> jax.Array:
    """``tau_hat_i = (2 i + 1) / (2 N)``, ``i = 0..N-1`` (float32 ``(N,)``; Dabney et al. 2018, Lemma 2)."""
    return (2 * jnp.arange(num_quantiles, dtype=jnp.float32) + 1) / (2 * num_quantiles)


def quantile_huber_loss(quantiles_a: jax.Array, targets: jax.Array, kappa: float = 1.0) -> jax.Array:
    """Per-item quantile Huber loss (Dabney et al. 2018, eq. 9-10):
    ``sum_i mean_j |tau_hat_i - 1{u_ij < 0}| * L_kappa(u_ij) / kappa`` with
    ``u_ij = T theta_j - theta_i`` and ``L_kappa`` the Huber loss (``u^2 / 2`` within ``kappa``).

    Args:
        quantiles_a: ``(B, N)`` online quantiles of the taken actions.
        targets: ``(B, N')`` target samples ``r + discount * theta_j(s', a*)`` (no gradient).
        kappa: Huber threshold ``> 0``.

    Returns:
        ``(B,)`` float32 losses.
    """
    n = quantiles_a.shape[-1]
    u = jax.lax.stop_gradient(targets)[:, None, :] - quantiles_a.astype(jnp.float32)[:, :, None]  # (B, N, N')
    abs_u = jnp.abs(u)
    huber = jnp.where(abs_u <= kappa, 0.5 * u * u, kappa * (abs_u - 0.5 * kappa))
    tau = quantile_midpoints(n)[None, :, None]
    rho = jnp.abs(tau - (u < 0).astype(jnp.float32)) * huber / kappa
    return jnp.sum(jnp.mean(rho, axis=-1), axis=-1)


def expected_q(out: jax.Array, kind: str, support: jax.Array | None = None) -> jax.Array:
    """Q-values ``(B, A)`` from a distributional head's output ``(B, A, K)``: the mean of C51's
    categorical distribution (``sum_i softmax_i z_i``) or of QR-DQN's quantiles."""
    if kind == "c51":
        return jnp.sum(jax.nn.softmax(out.astype(jnp.float32), axis=-1) * support, axis=-1)
    return jnp.mean(out.astype(jnp.float32), axis=-1)


def distributional_loss(kind: str, out: jax.Array, next_out_target: jax.Array, next_q_select: jax.Array,
                        actions: jax.Array, rewards: jax.Array, discounts: jax.Array,
                        support: jax.Array | None, kappa: float = 1.0) -> jax.Array:
    """The per-item loss of a distributional DQN update.

    The bootstrap action is ``argmax_a next_q_select`` (the online network's expected Q at ``s'``
    for double Q, else the target's); its target-network distribution at ``s'`` gives the target
    (C51: projected probabilities; QR: ``r + discount * theta_j``).

    Args:
        kind: ``"c51"`` or ``"qr"``.
        out: ``(B, A, K)`` online head output at ``s`` (C51 logits or QR quantiles).
        next_out_target: ``(B, A, K)`` target-network output at ``s'``.
        next_q_select: ``(B, A)`` expected Q-values at ``s'`` that choose the bootstrap action.
        actions: ``(B,)`` int actions taken; ``rewards`` / ``discounts``: ``(B,)`` float32.
        support: C51's ``(K,)`` atoms (unused for QR).
        kappa: QR's Huber threshold.

    Returns:
        ``(B,)`` float32 per-item losses (their mean, importance-weighted, is the loss; their
        values are the items' new priorities).
    """
    a_next = jnp.argmax(next_q_select, axis=-1)
    take = lambda x, a: jnp.take_along_axis(x, a[:, None, None], axis=1)[:, 0]  # noqa: E731 - (B, A, K) -> (B, K)
    out_a = take(out, actions.astype(jnp.int32))
    next_a = jax.lax.stop_gradient(take(next_out_target, a_next))
    if kind == "c51":
        target = categorical_projection(rewards, discounts, jax.nn.softmax(next_a.astype(jnp.float32), axis=-1),
                                        support)
        return c51_loss(out_a, target)
    targets = rewards[:, None] + discounts[:, None] * next_a.astype(jnp.float32)
    return quantile_huber_loss(out_a, targets, kappa)
