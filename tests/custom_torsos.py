"""User torsos for the tests (importable as ``custom_torsos:<name>`` with ``tests/`` on the path)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class TwoConv(nn.Module):
    """Two 3x3 stride-1 convolutions over channels-last images, flattened: ``(B, H, W, C)`` ->
    ``(B, (H-4) * (W-4) * 8)``."""

    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32)
        x = nn.relu(nn.Conv(8, (3, 3), padding="VALID")(x))
        x = nn.relu(nn.Conv(8, (3, 3), padding="VALID")(x))
        return x.reshape((x.shape[0], -1))


def two_conv() -> nn.Module:
    """The factory of :class:`TwoConv`."""
    return TwoConv()


class Wide(nn.Module):
    """An MLP torso ``(B, ...)`` -> ``(B, 32)``."""

    @nn.compact
    def __call__(self, obs):
        return nn.relu(nn.Dense(32)(obs.reshape((obs.shape[0], -1)).astype(jnp.float32)))


def wide() -> nn.Module:
    """The factory of :class:`Wide`."""
    return Wide()


class Unflattened(nn.Module):
    """A torso whose output is still an image: unusable by the heads."""

    @nn.compact
    def __call__(self, obs):
        return nn.Conv(4, (3, 3))(obs.astype(jnp.float32))


def unflattened() -> nn.Module:
    """The factory of :class:`Unflattened`."""
    return Unflattened()


class BatchDrop(nn.Module):
    """A torso that returns one row whatever the batch: unusable by the heads."""

    @nn.compact
    def __call__(self, obs):
        x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
        return nn.Dense(32)(jnp.mean(x, axis=0, keepdims=True))


def batch_drop() -> nn.Module:
    """The factory of :class:`BatchDrop`."""
    return BatchDrop()


NOT_A_FACTORY = 3
