"""Recurrent actor-critic networks (Flax linen): a torso, a recurrent core (an LSTM or a GRU), then
the policy and value heads of :class:`~tianji_jax.nets.networks.ActorCritic` (PureJaxRL ``ppo_rnn``'s
layout: an embedding, the core, separate actor and critic MLPs).

Sources: the LSTM of Hochreiter & Schmidhuber 1997 ("Long Short-Term Memory", with the forget gate
of Gers et al. 2000; flax ``nn.OptimizedLSTMCell``) and the GRU of Cho et al. 2014 ("Learning Phrase
Representations using RNN Encoder-Decoder for Statistical Machine Translation"; flax ``nn.GRUCell``).
Recurrent PPO follows CleanRL's ``ppo_atari_lstm.py`` and PureJaxRL's ``ppo_rnn.py``: the core's
state (its *carry*) is zeroed before the step that follows an episode's end, the carry at the start
of each rollout is stored with the trajectory, and the learner re-runs whole env columns through
the core from that carry (:meth:`RecurrentActorCritic.sequence`).

The carry of ``B`` envs is a pytree of float32 ``(B, H)`` arrays (``H = rnn_hidden_size``): the pair
``(c, h)`` for the LSTM, ``h`` alone for the GRU (:func:`initial_carry`).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.nets.networks import ACTIVATIONS, NatureCNN, user_torso_features, orthogonal_dense, image_torso, _norm

__all__ = ["CELLS", "RecurrentActorCritic", "RecurrentQNetwork", "initial_carry", "reset_carry"]

CELLS = ("lstm", "gru")
"""Recurrent cores: ``"lstm"`` (:class:`flax.linen.OptimizedLSTMCell`) and ``"gru"`` (:class:`flax.linen.GRUCell`)."""


def initial_carry(cell: str, batch: int, hidden_size: int) -> Any:
    """The zero carry of ``batch`` envs: ``(c, h)`` for ``cell='lstm'``, ``h`` for ``'gru'``, each
    float32 ``(batch, hidden_size)`` (the flax cells' own ``carry_init`` is zeros too).

    Raises:
        ValueError: ``cell`` not in :data:`CELLS`.
    """
    if cell not in CELLS:
        raise ValueError(f"recurrent must be one of {CELLS} for a recurrent network, got {cell!r}")
    zeros = jnp.zeros((batch, hidden_size), jnp.float32)
    return (zeros, zeros) if cell == "lstm" else zeros


def reset_carry(carry: Any, reset: jax.Array) -> Any:
    """``carry`` (leaves ``(B, H)``) with the rows where ``reset`` (``(B,)`` bool) is True set to zero;
    the other rows untouched (bit for bit)."""
    return jax.tree.map(lambda c: jnp.where(reset[:, None], jnp.zeros_like(c), c), carry)


class _Features(nn.Module):
    """The torso before the core: observations ``(B, *obs_shape)`` -> features ``(B, F)`` float32: one
    dense layer of ``hidden_sizes[0]`` units and the activation (``torso='mlp'``, observations
    flattened: an embedding), :class:`~tianji_jax.nets.networks.SmallCNN` (``'small_cnn'``),
    :class:`~tianji_jax.nets.networks.NatureCNN` (``'nature_cnn'``) or a user torso factory's module."""

    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: Any = "mlp"
    obs_shape: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.torso == "nature_cnn":
            return NatureCNN()(obs)
        if callable(self.torso):
            return user_torso_features(self.torso, obs)
        if self.torso == "small_cnn":
            return image_torso(self.torso, self.obs_shape)(obs)
        x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
        return ACTIVATIONS[self.activation](orthogonal_dense(self.hidden_sizes[0], np.sqrt(2))(x))


class _Heads(nn.Module):
    """Policy and value heads on the core's output ``(..., H)``: for the ``mlp`` / ``small_cnn``
    torsos separate actor and critic MLPs of ``hidden_sizes`` first (as :class:`~tianji_jax.nets.networks.ActorCritic`),
    else linear heads directly."""

    action_dim: int
    continuous: bool = False
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: Any = "mlp"
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, y: jax.Array) -> tuple[Any, jax.Array]:
        a = c = y
        if self.torso in ("mlp", "small_cnn"):
            act = ACTIVATIONS[self.activation]
            for h in self.hidden_sizes:
                a = act(orthogonal_dense(h, np.sqrt(2))(a))
            for h in self.hidden_sizes:
                c = act(orthogonal_dense(h, np.sqrt(2))(c))
        head = orthogonal_dense(self.action_dim, 0.01)(a)
        if self.continuous:
            actor_out = (head, self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_dim,)))
        else:
            actor_out = head
        return actor_out, orthogonal_dense(1, 1.0)(c)[..., 0]


def _core_step(core: nn.Module, carry: Any, inputs: tuple[jax.Array, jax.Array]) -> tuple[Any, tuple[Any, jax.Array]]:
    """One core step inside ``nn.scan``: reset, then the cell; emits ``(carry, output)``."""
    x, reset = inputs
    carry, y = core(reset_carry(carry, reset), x)
    return carry, (carry, y)


class RecurrentActorCritic(nn.Module):
    """Recurrent actor-critic: torso -> core -> heads, the torso and core shared by policy and value.

    * torso: ``mlp``: a dense embedding of ``hidden_sizes[0]`` units (the MLP itself follows the
      core); ``small_cnn`` / ``nature_cnn`` / a user torso: as in :class:`~tianji_jax.nets.networks.ActorCritic`;
    * core: an ``nn.OptimizedLSTMCell`` / ``nn.GRUCell`` of ``rnn_hidden_size`` units (flax's
      initialisation: LeCun-normal input kernels, orthogonal recurrent kernels, zero biases);
    * heads: for ``mlp`` and ``small_cnn``, separate actor and critic MLPs of ``hidden_sizes``
      (orthogonal gain sqrt(2)) on the core's output, then the linear heads (policy gain 0.01, value
      gain 1, biases 0), as :class:`~tianji_jax.nets.networks.ActorCritic`; linear heads directly otherwise.

    Attributes:
        action_dim: number of actions (Discrete) or action dimensions (Box).
        continuous: ``False`` -> logits ``(..., action_dim)``; ``True`` -> ``(mean (..., action_dim),
            log_std (action_dim,))`` with a state-independent ``log_std`` parameter (initialised to
            ``log_std_init``).
        hidden_sizes: widths of the torso's MLP (``mlp`` and ``small_cnn`` torsos).
        activation: ``"tanh"`` or ``"relu"`` (the MLP's).
        torso: one of :data:`~tianji_jax.nets.networks.TORSOS` or a user torso factory.
        obs_shape: one observation's shape (tells the small CNN the channel layout).
        cell: ``"lstm"`` or ``"gru"`` (:data:`CELLS`).
        rnn_hidden_size: ``H``, the core's units.
        log_std_init: the Gaussian policy's initial log standard deviation (Box actions).

    ``__call__(carry, obs, reset)`` is one step for ``B`` envs: ``carry`` (leaves float32 ``(B, H)``),
    ``obs (B, *obs_shape)`` (any numeric dtype), ``reset (B,)`` bool (the env's previous step ended an
    episode: its carry is zeroed before this step) -> ``(carry, actor_out, value (B,) float32)``.
    :meth:`sequence` runs ``T`` such steps.
    """

    action_dim: int
    continuous: bool = False
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: Any = "mlp"
    obs_shape: tuple[int, ...] = ()
    cell: str = "lstm"
    rnn_hidden_size: int = 128
    log_std_init: float = 0.0

    def setup(self) -> None:
        """The submodules: torso, core, heads (and ``log_std`` for Box actions)."""
        self.features = _Features(self.hidden_sizes, self.activation, self.torso, self.obs_shape)
        self.core = (nn.OptimizedLSTMCell(self.rnn_hidden_size) if self.cell == "lstm"
                     else nn.GRUCell(self.rnn_hidden_size))
        self.heads = _Heads(self.action_dim, self.continuous, self.hidden_sizes, self.activation, self.torso,
                            self.log_std_init)

    def _heads(self, y: jax.Array) -> tuple[Any, jax.Array]:
        return self.heads(y)

    def __call__(self, carry: Any, obs: jax.Array, reset: jax.Array) -> tuple[Any, Any, jax.Array]:
        """One step (see the class docstring)."""
        carry, y = self.core(reset_carry(carry, reset), self.features(obs))
        return (carry, *self._heads(y))

    def sequence(self, carry: Any, obs: jax.Array, reset: jax.Array) -> tuple[Any, Any, jax.Array]:
        """``T`` steps from ``carry``, the torso and heads batched over all ``T * B`` inputs and the
        core scanned over time (equal to ``T`` calls of ``__call__``).

        Args:
            carry: the carry before step 0 (leaves float32 ``(B, H)``).
            obs: ``(T, B, *obs_shape)`` observations.
            reset: ``(T, B)`` bool: zero the carry before step ``t`` where set.

        Returns:
            ``(carries, actor_out, value)``: ``carries`` the carry *after* each step (leaves
            ``(T, B, H)``), ``actor_out`` logits ``(T, B, A)`` or ``(mean (T, B, A), log_std (A,))``,
            ``value (T, B)`` float32.
        """
        t, b = reset.shape
        x = self.features(obs.reshape((t * b, *obs.shape[2:])))
        x = x.reshape((t, b, x.shape[-1]))
        scan = nn.scan(_core_step, variable_broadcast="params", split_rngs={"params": False})
        _, (carries, ys) = scan(self.core, carry, (x, reset))
        return (carries, *self._heads(ys))


class _QHead(nn.Module):
    """Q-values on the core's output ``(..., H)``: for the ``mlp`` / ``small_cnn`` torsos an MLP of
    ``hidden_sizes`` first (a LayerNorm after each hidden Dense with ``layer_norm``, as
    :class:`~tianji_jax.nets.networks.QNetwork`), then a linear head of ``action_dim`` values."""

    action_dim: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "relu"
    torso: Any = "mlp"
    layer_norm: bool = True

    @nn.compact
    def __call__(self, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        if self.torso in ("mlp", "small_cnn"):
            act = ACTIVATIONS[self.activation]
            for h in self.hidden_sizes:
                y = act(_norm(self.layer_norm, orthogonal_dense(h, np.sqrt(2))(y)))
        q = orthogonal_dense(self.action_dim, 1.0)(y)
        return q, jnp.max(q, axis=-1)


class RecurrentQNetwork(RecurrentActorCritic):
    """Recurrent Q-network for PQN: the torso and core of :class:`RecurrentActorCritic`, then
    :class:`_QHead` (PureJaxQL's recurrent PQN layout: an embedding, the core, a normalised MLP
    and the Q head). ``continuous`` is unused (Discrete actions only).

    Attributes:
        layer_norm: a LayerNorm after every hidden Dense of the head's MLP.

    ``__call__(carry, obs, reset) -> (carry, q (B, A), max_a q (B,))`` and :meth:`sequence` (leaves
    ``(T, B, ...)``) as :class:`RecurrentActorCritic`, with the Q-values in place of the policy's
    logits (their argmax is the greedy action) and ``max_a q`` in place of the value.
    """

    layer_norm: bool = True

    def setup(self) -> None:
        """The submodules: torso, core, Q head."""
        self.features = _Features(self.hidden_sizes, self.activation, self.torso, self.obs_shape)
        self.core = (nn.OptimizedLSTMCell(self.rnn_hidden_size) if self.cell == "lstm"
                     else nn.GRUCell(self.rnn_hidden_size))
        self.heads = _QHead(self.action_dim, self.hidden_sizes, self.activation, self.torso, self.layer_norm)
