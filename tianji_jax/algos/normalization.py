"""Running statistics for observation normalisation and reward scaling, as pytrees.

Running mean/variance use the parallel update of Chan et al. (1979), as in OpenAI baselines'
``RunningMeanStd``; reward scaling divides by the running std of the discounted return, as in
gym's ``NormalizeReward`` (Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["RunningMeanStd", "RewardScaler", "CLIP", "normalize_observation"]

CLIP = 10.0
"""Normalised observations and scaled rewards are clipped to ``[-CLIP, CLIP]``."""
_EPS = 1e-8


def normalize_observation(x: Any, mean: Any, var: Any, raw_tail: int = 0) -> Any:
    """The observation normalisation of every path (device rollouts, host actor threads and Ray
    actor processes, replay acting and sampling, evaluation, sweeps), written once:
    ``clip((x - mean) / sqrt(var + 1e-8), -CLIP, CLIP)`` on every entry but the last ``raw_tail``
    of a flat observation, which pass through unchanged: an env's action mask rides there
    (:attr:`~tianji_jax.envs.registry.EnvSpec.action_mask_size`, what every caller passes), and
    the policy reads it back from the observation.

    Args:
        x: observations ``(..., *shape)``.
        mean, var: running statistics ``(*shape)``.
        raw_tail: static int, ``0 <= raw_tail <= x.shape[-1]``.

    Returns:
        ``x``'s shape, in the dtype the arithmetic gives (callers cast ``x`` first): a numpy array
        when ``x``, ``mean`` and ``var`` are all numpy arrays (the host statistics), else a jax array.

    Raises:
        ValueError: ``raw_tail`` not an int in ``[0, x.shape[-1]]``.
    """
    size = x.shape[-1] if x.ndim else 0
    if not isinstance(raw_tail, (int, np.integer)) or isinstance(raw_tail, bool) or not 0 <= raw_tail <= size:
        raise ValueError(f"raw_tail={raw_tail!r}: allowed 0 to {size} (the trailing observation entries kept raw)")
    xp = np if all(isinstance(a, np.ndarray) for a in (x, mean, var)) else jnp
    out = xp.clip((x - mean) / xp.sqrt(var + _EPS), -CLIP, CLIP)
    if raw_tail:
        out = xp.concatenate([out[..., :size - raw_tail], x[..., size - raw_tail:]], axis=-1)
    return out


@struct.dataclass
class RunningMeanStd:
    """Mean ``(*shape)``, variance ``(*shape)`` (float32) and sample count (float32 scalar)."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape: tuple[int, ...]) -> "RunningMeanStd":
        """Mean 0, variance 1, count 1e-4 (a tiny prior so the first update dominates)."""
        return cls(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.asarray(1e-4, jnp.float32))

    def update(self, x: jax.Array) -> "RunningMeanStd":
        """Fold in a batch ``x`` shaped ``(B, *shape)`` (any numeric dtype, cast to float32).

        Parallel mean/variance merge of Chan et al. (1979), as OpenAI baselines' ``RunningMeanStd``;
        the count grows by ``B``.
        """
        x = x.astype(jnp.float32)
        return self._merge(jnp.mean(x, axis=0), jnp.var(x, axis=0), jnp.asarray(x.shape[0], jnp.float32))

    def _merge(self, b_mean: jax.Array, b_var: jax.Array, b_count: jax.Array) -> "RunningMeanStd":
        """Chan et al. (1979)'s parallel merge with a batch of ``b_count`` rows of mean ``b_mean``
        and variance ``b_var`` (float32)."""
        delta = b_mean - self.mean
        tot = self.count + b_count
        mean = self.mean + delta * b_count / tot
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / tot
        return RunningMeanStd(mean, m2 / tot, tot)

    def update_masked(self, x: jax.Array, mask: jax.Array) -> "RunningMeanStd":
        """Fold in the rows of ``x`` ``(B, *shape)`` where ``mask`` ``(B,)`` bool is True (the same
        parallel merge as :meth:`update` over those rows only; no change when none is True).

        The batch mean and variance are computed in float32 over the selected rows; the count
        grows by their number.
        """
        x = x.astype(jnp.float32)
        w = mask.astype(jnp.float32).reshape((-1,) + (1,) * (x.ndim - 1))
        b_count = jnp.sum(mask.astype(jnp.float32))
        safe = jnp.maximum(b_count, 1.0)
        b_mean = jnp.sum(x * w, axis=0) / safe
        b_var = jnp.sum(w * (x - b_mean) ** 2, axis=0) / safe
        return self._merge(b_mean, b_var, b_count)

    def normalize(self, x: jax.Array, raw_tail: int = 0) -> jax.Array:
        """:func:`normalize_observation` of ``x`` ``(..., *shape)`` (any numeric dtype) as float32:
        ``clip((x - mean) / sqrt(var + 1e-8), -CLIP, CLIP)``, the last ``raw_tail`` entries (static
        int >= 0, an env's action mask) passed through unchanged.

        Raises:
            ValueError: ``raw_tail`` out of ``[0, x.shape[-1]]``."""
        return normalize_observation(jnp.asarray(x).astype(jnp.float32), self.mean, self.var, raw_tail)


@struct.dataclass
class RewardScaler:
    """Per-env discounted return ``(N,)`` float32 and the running statistics of it (scalar).

    Rewards are divided by the running std of the discounted return, as gym's ``NormalizeReward``
    (Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients").
    """

    returns: jax.Array
    rms: RunningMeanStd

    @classmethod
    def create(cls, num_envs: int) -> "RewardScaler":
        """Zero discounted returns ``(num_envs,)`` float32 and scalar statistics
        (:meth:`RunningMeanStd.create` of shape ``()``)."""
        return cls(jnp.zeros((num_envs,), jnp.float32), RunningMeanStd.create(()))

    def scale(self, reward: jax.Array, done: jax.Array, gamma: float) -> tuple["RewardScaler", jax.Array]:
        """Scale one step's rewards ``(N,)``; ``done`` ``(N,)`` bool ends the discounted sums.

        Returns ``(new_scaler, clip(reward / sqrt(var_return + 1e-8), -CLIP, CLIP))``.
        """
        returns = self.returns * gamma + reward
        rms = self.rms.update(returns)
        scaled = jnp.clip(reward / jnp.sqrt(rms.var + _EPS), -CLIP, CLIP)
        return RewardScaler(jnp.where(done, 0.0, returns), rms), scaled
