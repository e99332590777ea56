"""Action distributions as pure functions over the actor's output.

Discrete: categorical over logits ``(B, A)``. Continuous: diagonal Gaussian with mean ``(B, A)``
and state-independent ``log_std`` ``(A,)`` (Schulman et al. 2017, section 6.1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["sample", "log_prob", "entropy", "mode"]

_LOG_2PI = math.log(2.0 * math.pi)  # a Python float: importing must not start JAX's backend


def sample(key: jax.Array, actor_out, continuous: bool) -> jax.Array:
    """Sample actions: ``(B,)`` int32 (Discrete) or ``(B, A)`` float32 (continuous)."""
    if continuous:
        mean, log_std = actor_out
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
    return jax.random.categorical(key, actor_out, axis=-1).astype(jnp.int32)


def log_prob(actor_out, actions: jax.Array, continuous: bool) -> jax.Array:
    """Log-probability ``(B,)`` float32 of ``actions`` (shapes as in :func:`sample`)."""
    if continuous:
        mean, log_std = actor_out
        z = (actions - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * _LOG_2PI, axis=-1)
    logp = jax.nn.log_softmax(actor_out, axis=-1)
    return jnp.take_along_axis(logp, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(actor_out, continuous: bool) -> jax.Array:
    """Entropy ``(B,)`` float32 (nats)."""
    if continuous:
        mean, log_std = actor_out
        return jnp.broadcast_to(jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI)), mean.shape[:1])
    logp = jax.nn.log_softmax(actor_out, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def mode(actor_out, continuous: bool) -> jax.Array:
    """Deterministic action: argmax ``(B,)`` int32, or the Gaussian mean ``(B, A)``."""
    if continuous:
        return actor_out[0]
    return jnp.argmax(actor_out, axis=-1).astype(jnp.int32)
