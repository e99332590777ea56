"""Action distributions as pure functions over the actor's output.

Discrete: categorical over logits ``(B, A)``. Continuous: diagonal Gaussian with mean ``(B, A)``
and state-independent ``log_std`` ``(A,)`` (Schulman et al. 2017, section 6.1). MultiDiscrete
(``nvec`` given): a factored categorical over logits ``(B, sum(nvec))``, split into ``len(nvec)``
consecutive heads (factor ``k`` owns entries ``sum(nvec[:k]) .. sum(nvec[:k+1])-1``), independent
given the state: the log-probability of an action ``(B, len(nvec))`` is the sum of its factors'
log-probabilities, the entropy the sum of theirs, the mode the per-factor argmax (as CleanRL's
``ppo_multidiscrete`` and Stoix's multi-discrete heads).

The leading axes ``B`` may be any batch shape (``(T, N)`` included).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["sample", "log_prob", "entropy", "mode", "split_logits", "factored_sample", "factored_log_prob",
           "factored_entropy", "factored_mode"]

_LOG_2PI = math.log(2.0 * math.pi)  # a Python float: importing must not start JAX's backend


# ---- factored categorical (MultiDiscrete) -------------------------------------------------------------
def split_logits(logits: jax.Array, nvec: tuple[int, ...]) -> list[jax.Array]:
    """The per-factor logits ``[(..., nvec[0]), (..., nvec[1]), ...]`` of ``logits (..., sum(nvec))``.

    Raises:
        ValueError: the last axis is not ``sum(nvec)`` long.
    """
    if logits.shape[-1] != sum(nvec):
        raise ValueError(f"logits: last axis {logits.shape[-1]} != sum(nvec) = {sum(nvec)} for nvec={list(nvec)}")
    return jnp.split(logits, np.cumsum(nvec)[:-1].tolist(), axis=-1)


def factored_sample(key: jax.Array, logits: jax.Array, nvec: tuple[int, ...]) -> jax.Array:
    """Actions ``(..., len(nvec))`` int32, factor ``k`` drawn from the categorical over its own logits
    (each factor with its own key split from ``key``)."""
    keys = jax.random.split(key, len(nvec))
    return jnp.stack([jax.random.categorical(k, part, axis=-1)
                      for k, part in zip(keys, split_logits(logits, nvec))], axis=-1).astype(jnp.int32)


def factored_log_prob(logits: jax.Array, actions: jax.Array, nvec: tuple[int, ...]) -> jax.Array:
    """``log pi(a|s) = sum_k log softmax(logits_k)[a_k]``: ``(...)`` float32 for ``logits (...,
    sum(nvec))`` and ``actions (..., len(nvec))`` int."""
    actions = actions.astype(jnp.int32)
    terms = [jnp.take_along_axis(jax.nn.log_softmax(part, axis=-1), actions[..., k, None], axis=-1)[..., 0]
             for k, part in enumerate(split_logits(logits, nvec))]
    return sum(terms[1:], terms[0])


def factored_entropy(logits: jax.Array, nvec: tuple[int, ...]) -> jax.Array:
    """``H = sum_k H(softmax(logits_k))`` (nats): ``(...)`` float32 for ``logits (..., sum(nvec))``
    (the factors are independent given the state, so their entropies add)."""
    terms = []
    for part in split_logits(logits, nvec):
        logp = jax.nn.log_softmax(part, axis=-1)
        terms.append(-jnp.sum(jnp.exp(logp) * logp, axis=-1))
    return sum(terms[1:], terms[0])


def factored_mode(logits: jax.Array, nvec: tuple[int, ...]) -> jax.Array:
    """The greedy action ``(..., len(nvec))`` int32: each factor's argmax (the joint argmax, as the
    factors are independent)."""
    return jnp.stack([jnp.argmax(part, axis=-1) for part in split_logits(logits, nvec)], axis=-1).astype(jnp.int32)


# ---- dispatch over the three kinds ----------------------------------------------------------------------
def sample(key: jax.Array, actor_out, continuous: bool, nvec: tuple[int, ...] | None = None) -> jax.Array:
    """Sample actions: ``(B,)`` int32 (Discrete), ``(B, len(nvec))`` int32 (MultiDiscrete, ``nvec``
    given) or ``(B, A)`` float32 (continuous)."""
    if continuous:
        mean, log_std = actor_out
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
    if nvec is not None:
        return factored_sample(key, actor_out, nvec)
    return jax.random.categorical(key, actor_out, axis=-1).astype(jnp.int32)


def log_prob(actor_out, actions: jax.Array, continuous: bool, nvec: tuple[int, ...] | None = None) -> jax.Array:
    """Log-probability ``(B,)`` float32 of ``actions`` (shapes as in :func:`sample`)."""
    if continuous:
        mean, log_std = actor_out
        z = (actions - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * _LOG_2PI, axis=-1)
    if nvec is not None:
        return factored_log_prob(actor_out, actions, nvec)
    logp = jax.nn.log_softmax(actor_out, axis=-1)
    return jnp.take_along_axis(logp, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(actor_out, continuous: bool, nvec: tuple[int, ...] | None = None) -> jax.Array:
    """Entropy ``(B,)`` float32 (nats)."""
    if continuous:
        mean, log_std = actor_out
        return jnp.broadcast_to(jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI)), mean.shape[:1])
    if nvec is not None:
        return factored_entropy(actor_out, nvec)
    logp = jax.nn.log_softmax(actor_out, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def mode(actor_out, continuous: bool, nvec: tuple[int, ...] | None = None) -> jax.Array:
    """Deterministic action: argmax ``(B,)`` int32, the per-factor argmax ``(B, len(nvec))`` int32
    (``nvec`` given), or the Gaussian mean ``(B, A)``."""
    if continuous:
        return actor_out[0]
    if nvec is not None:
        return factored_mode(actor_out, nvec)
    return jnp.argmax(actor_out, axis=-1).astype(jnp.int32)
