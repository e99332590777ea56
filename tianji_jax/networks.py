"""Flax (linen) networks.

``ActorCritic``: separate actor and critic MLPs with orthogonal initialisation, as in CleanRL's
``ppo.py`` / PureJaxRL (Huang et al. 2022, "The 37 Implementation Details of PPO").
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ActorCritic", "NatureCNN", "QNetwork"]

_ACT = {"tanh": nn.tanh, "relu": nn.relu}


def _dense(features: int, scale: float) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale),
                    bias_init=nn.initializers.constant(0.0))


class NatureCNN(nn.Module):
    """The DQN/Atari torso of Mnih et al. 2015 (Nature, "Methods: model architecture"): conv 32x8x8
    stride 4, conv 64x4x4 stride 2, conv 64x3x3 stride 1, dense 512, ReLU after each; orthogonal
    init with gain sqrt(2) as in CleanRL's ``ppo_atari.py``.

    ``__call__(obs)``: ``(B, C, H, W)`` frames (envpool's channels-first stack, e.g. ``(B, 4, 84,
    84)`` uint8 in [0, 255]) -> ``(B, 512)`` float32 features; inputs are divided by 255.
    """

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = jnp.transpose(obs.astype(jnp.float32) / 255.0, (0, 2, 3, 1))  # NCHW -> NHWC
        init = nn.initializers.orthogonal(np.sqrt(2))
        for feat, k, st in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(nn.Conv(feat, (k, k), (st, st), padding="VALID", kernel_init=init,
                                bias_init=nn.initializers.constant(0.0))(x))
        return nn.relu(_dense(512, np.sqrt(2))(x.reshape((x.shape[0], -1))))


class ActorCritic(nn.Module):
    """Actor-critic: separate MLPs (``torso='mlp'``) or a shared :class:`NatureCNN` torso
    (``torso='nature_cnn'``, image observations) with linear actor and critic heads.

    Attributes:
        action_dim: number of actions (Discrete) or action dimensions (Box).
        continuous: ``False`` -> the actor outputs ``(B, action_dim)`` float32 logits;
            ``True`` -> it outputs the Gaussian mean ``(B, action_dim)`` and a state-independent
            ``log_std`` parameter ``(action_dim,)`` (initialised to 0).
        hidden_sizes: hidden widths of each MLP (unused by the CNN torso).
        activation: ``"tanh"`` or ``"relu"`` (MLP only).
        torso: ``"mlp"`` or ``"nature_cnn"``.

    ``__call__(obs)`` takes ``(B, *obs_shape)`` (any numeric dtype, flattened and cast to float32)
    and returns ``(actor_out, value)``: ``actor_out`` is logits ``(B, A)`` or ``(mean (B, A),
    log_std (A,))``; ``value`` is ``(B,)`` float32.
    """

    action_dim: int
    continuous: bool = False
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: str = "mlp"

    @nn.compact
    def __call__(self, obs: jax.Array):
        if self.torso == "nature_cnn":
            a = c = NatureCNN()(obs)
        else:
            act = _ACT[self.activation]
            x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
            a, c = x, x
            for h in self.hidden_sizes:
                a = act(_dense(h, np.sqrt(2))(a))
            for h in self.hidden_sizes:
                c = act(_dense(h, np.sqrt(2))(c))
        head = _dense(self.action_dim, 0.01)(a)
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            actor_out = (head, log_std)
        else:
            actor_out = head
        value = _dense(1, 1.0)(c)[:, 0]
        return actor_out, value


class QNetwork(nn.Module):
    """Q-network for Discrete actions (Mnih et al. 2015): an MLP torso (``torso='mlp'``) or the
    :class:`NatureCNN` torso of Nature DQN (``torso='nature_cnn'``, stacked uint8 frames), with a
    linear head or a dueling head (Wang et al. 2016, "Dueling Network Architectures for Deep RL", eq. 9).

    Orthogonal initialisation as :class:`ActorCritic`: hidden layers gain ``sqrt(2)``, the output
    heads gain 1, biases 0.

    Attributes:
        action_dim: number of actions ``A``.
        hidden_sizes: hidden widths of the MLP torso (unused by the CNN torso).
        activation: ``"tanh"`` or ``"relu"`` (MLP only).
        torso: ``"mlp"`` or ``"nature_cnn"`` (``(B, C, H, W)`` frames, see :class:`NatureCNN`).
        dueling: ``False`` -> ``Q = Dense(A)(torso)``; ``True`` -> separate value ``V (B, 1)`` and
            advantage ``A (B, A)`` heads on the shared torso, ``Q = V + A - mean_a A``.

    ``__call__(obs)`` takes ``(B, *obs_shape)`` (any numeric dtype; the MLP flattens and casts to
    float32, the CNN divides by 255) and returns ``q``: ``(B, A)`` float32 Q-values.
    """

    action_dim: int
    hidden_sizes: Sequence[int] = (120, 84)
    activation: str = "relu"
    dueling: bool = False
    torso: str = "mlp"

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.torso == "nature_cnn":
            x = NatureCNN()(obs)
        else:
            act = _ACT[self.activation]
            x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
            for h in self.hidden_sizes:
                x = act(_dense(h, np.sqrt(2))(x))
        if not self.dueling:
            return _dense(self.action_dim, 1.0)(x)
        value = _dense(1, 1.0)(x)
        advantage = _dense(self.action_dim, 1.0)(x)
        return value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)
