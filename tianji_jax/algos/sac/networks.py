"""Flax (linen) networks of SAC: the squashed-Gaussian actor and the twin soft Q critics.

Haarnoja et al. 2018 ("Soft Actor-Critic: Off-Policy Maximum Entropy Deep RL with a Stochastic
Actor", section 4.2 and appendix C; "Soft Actor-Critic Algorithms and Applications", section 6):
a Gaussian policy whose sample is squashed by ``tanh`` (the squashing and its log-density are in
:mod:`tianji_jax.algos.sac.math`), and two independent Q-functions ``Q(s, a)`` whose minimum is
used (clipped double Q, Fujimoto et al. 2018). The actor's ``log_std`` is squashed into
``[LOG_STD_MIN, LOG_STD_MAX]`` by ``tanh`` as CleanRL's ``sac_continuous_action.py``.

Torsos follow :mod:`tianji_jax.nets.networks` (``torso`` names one of
:data:`~tianji_jax.nets.networks.TORSOS` or is a user torso factory; :func:`make_sac_networks` also
takes ``"auto"`` and import paths, through :func:`~tianji_jax.nets.networks.resolve_torso`):

* ``mlp``: observations flattened (any rank) and cast to float32;
* ``nature_cnn`` / ``small_cnn``: the image torsos of :mod:`tianji_jax.nets.networks`;
* a user factory: ``factory()`` maps ``(B, *obs_shape)`` to features ``(B, F)``.

Unlike ``QNetwork``, the MLP of ``hidden_sizes`` always follows the torso's features, for every
torso (the critics must mix the action into the features, and the actor mirrors them, as
pixel-based SAC variants do). Initialisation as :mod:`tianji_jax.nets.networks`: orthogonal, hidden
layers gain ``sqrt(2)``, biases 0; the actor's heads gain 0.01 (a near-zero mean and a mid-range
``log_std`` at init), the critics' heads gain 1.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.nets.networks import ACTIVATIONS, TORSOS, user_torso_features, orthogonal_dense, image_torso, resolve_torso

__all__ = ["SACActor", "TwinQ", "make_sac_networks", "LOG_STD_MIN", "LOG_STD_MAX"]

LOG_STD_MIN = -5.0
"""Lower bound of the actor's ``log_std`` (CleanRL's ``sac_continuous_action.py``)."""
LOG_STD_MAX = 2.0
"""Upper bound of the actor's ``log_std``."""


def _features(torso: Any, obs_shape: tuple[int, ...], obs: jax.Array) -> jax.Array:
    """Features ``(B, F)`` float32 of ``obs (B, *obs_shape)`` from ``torso`` (submodules of the
    calling compact module)."""
    if callable(torso):
        return user_torso_features(torso, obs)
    if torso in ("nature_cnn", "small_cnn"):
        return image_torso(torso, tuple(obs_shape))(obs)
    if torso == "mlp":
        return obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
    raise ValueError(f"torso={torso!r}: the SAC networks take {', '.join(repr(t) for t in TORSOS)} or a user "
                     "torso factory (resolve 'auto' and import paths with tianji_jax.nets.networks.resolve_torso, or "
                     "build the networks with make_sac_networks)")


def _mlp(x: jax.Array, hidden_sizes: Sequence[int], activation: str) -> jax.Array:
    """The hidden layers: ``Dense(h)`` (orthogonal, gain sqrt(2)) then ``activation``, for each ``h``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: allowed: {', '.join(repr(a) for a in ACTIVATIONS)}")
    act = ACTIVATIONS[activation]
    for h in hidden_sizes:
        x = act(orthogonal_dense(int(h), np.sqrt(2))(x))
    return x


def _head(features: int, scale: float, name: str) -> nn.Dense:
    """A named output layer, initialised as :func:`tianji_jax.nets.networks.orthogonal_dense` (orthogonal with
    gain ``scale``, bias 0)."""
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.constant(0.0),
                    name=name)


class SACActor(nn.Module):
    """The SAC policy network: a diagonal Gaussian over pre-squash actions ``u``, state-dependent
    mean and standard deviation (Haarnoja et al. 2018, "Soft Actor-Critic", section 4.2; the
    squashing is :func:`tianji_jax.algos.sac.math.squashed_gaussian_sample`).

    Attributes:
        action_dim: number of action dimensions ``A`` of the Box.
        hidden_sizes: widths of the hidden layers after the torso.
        activation: ``"relu"`` or ``"tanh"``.
        torso: ``"mlp"``, ``"nature_cnn"``, ``"small_cnn"`` or a user torso factory (see the
            module docstring; ``"auto"`` and import paths go through :func:`make_sac_networks`).
        obs_shape: one observation's shape (tells ``small_cnn`` the channel layout).

    ``__call__(obs)``: ``obs (B, *obs_shape)`` of any numeric dtype (cast to float32 by the torso;
    ``nature_cnn`` also divides by 255) -> ``(mean, log_std)``, both ``(B, A)`` float32, with
    ``log_std = LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) (tanh(x) + 1) / 2`` in
    ``[LOG_STD_MIN, LOG_STD_MAX] = [-5, 2]`` (CleanRL's bounding of a linear head ``x``).
    Parameters: the torso's, ``Dense_i`` hidden layers, and the ``mean`` and ``log_std`` heads.
    """

    action_dim: int
    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    torso: Any = "mlp"
    obs_shape: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = _mlp(_features(self.torso, self.obs_shape, obs), self.hidden_sizes, self.activation)
        mean = _head(self.action_dim, 0.01, "mean")(x)
        raw = _head(self.action_dim, 0.01, "log_std")(x)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw) + 1.0)
        return mean.astype(jnp.float32), log_std.astype(jnp.float32)


class _Critic(nn.Module):
    """One soft Q-function: torso features of ``obs`` concatenated with the action, the MLP, a
    linear ``Dense(1)``: ``(B, *obs_shape), (B, A) -> (B,)`` float32."""

    hidden_sizes: Sequence[int]
    activation: str
    torso: Any
    obs_shape: tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = _features(self.torso, self.obs_shape, obs)
        x = jnp.concatenate([x, action.reshape((action.shape[0], -1)).astype(jnp.float32)], axis=-1)
        x = _mlp(x, self.hidden_sizes, self.activation)
        return _head(1, 1.0, "q")(x)[:, 0]


class TwinQ(nn.Module):
    """The two soft Q-functions of SAC (Haarnoja et al. 2018, "Soft Actor-Critic", section 4.2;
    "Soft Actor-Critic Algorithms and Applications", section 6; clipped double Q of Fujimoto et
    al. 2018), with independent parameters.

    Each critic: the torso's features of ``obs`` (its own image or user torso; flattened for
    ``mlp``), concatenated with the action, the MLP of ``hidden_sizes``, then ``Dense(1)``. The two
    critics are one ``nn.vmap`` over a stacked parameter axis: every leaf of
    ``params["critics"]`` (``Dense_i`` hidden layers, the ``q`` head, the torso's own
    parameters) has a leading axis of size 2 (index 0 -> ``q1``, 1 -> ``q2``), each
    slice initialised from its own key (so target-network updates are one tree operation, and
    the two critics run as one batched computation).

    Attributes:
        hidden_sizes: widths of the hidden layers after the concatenation.
        activation: ``"relu"`` or ``"tanh"``.
        torso: ``"mlp"``, ``"nature_cnn"``, ``"small_cnn"`` or a user torso factory (as
            :class:`SACActor`).
        obs_shape: one observation's shape.

    ``__call__(obs, action)``: ``obs (B, *obs_shape)`` of any numeric dtype, ``action (B, A)``
    (cast to float32; the environment's scale, i.e. the squashed action in ``[low, high]``) ->
    ``(q1, q2)``, each ``(B,)`` float32.
    """

    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    torso: Any = "mlp"
    obs_shape: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        critics = nn.vmap(_Critic, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                          out_axes=0, axis_size=2)
        q = critics(tuple(self.hidden_sizes), self.activation, self.torso, tuple(self.obs_shape),
                    name="critics")(obs, action)
        return q[0], q[1]


def make_sac_networks(action_dim: int, hidden_sizes: Sequence[int] = (256, 256), activation: str = "relu",
                      torso: Any = "auto", obs_shape: tuple[int, ...] = ()) -> tuple[SACActor, TwinQ]:
    """The actor and twin critics of SAC for one observation shape, sharing the torso choice.

    Args:
        action_dim: number of action dimensions ``A >= 1``.
        hidden_sizes: hidden widths of the actor's and each critic's MLP.
        activation: ``"relu"`` or ``"tanh"``.
        torso: ``"auto"`` (:func:`~tianji_jax.nets.networks.choose_torso` of ``obs_shape``), one of
            :data:`~tianji_jax.nets.networks.TORSOS`, a user torso factory or its import path
            ``"package.module:factory"`` (:func:`~tianji_jax.nets.networks.resolve_torso`).
        obs_shape: one observation's shape, without the batch axis.

    Returns:
        ``(SACActor, TwinQ)``, unbound modules (``.init`` them with ``obs (B, *obs_shape)``, and
        ``TwinQ`` also with ``action (B, A)``).

    Raises:
        ValueError: ``action_dim < 1``, an unknown activation, or a torso that does not fit
        ``obs_shape`` / cannot be imported.
    """
    if int(action_dim) < 1:
        raise ValueError(f"action_dim must be >= 1, got {action_dim!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: allowed: {', '.join(repr(a) for a in ACTIVATIONS)}")
    obs_shape = tuple(int(d) for d in obs_shape)
    resolved = resolve_torso(torso, obs_shape)
    hidden = tuple(int(h) for h in hidden_sizes)
    actor = SACActor(action_dim=int(action_dim), hidden_sizes=hidden, activation=activation, torso=resolved,
                     obs_shape=obs_shape)
    critic = TwinQ(hidden_sizes=hidden, activation=activation, torso=resolved, obs_shape=obs_shape)
    return actor, critic
