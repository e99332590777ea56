"""Flax (linen) networks.

``ActorCritic``: separate actor and critic MLPs with orthogonal initialisation, as in CleanRL's
``ppo.py`` / PureJaxRL (Huang et al. 2022, "The 37 Implementation Details of PPO").

Torsos (the part that turns an observation into features) are chosen from the observation's
layout and size by :func:`choose_torso`:

* ``nature_cnn``: channels-first frame stacks large enough for the Nature DQN convolutions
  (``(C, H, W)`` with ``C <= 16`` and ``H, W >= 36``, e.g. envpool Atari's ``(4, 84, 84)``);
* ``small_cnn``: other images, e.g. MinAtar's channels-last ``(10, 10, C)``: one 3x3 stride-1
  convolution (Young & Tian 2019, "MinAtar", section 4) then the MLP of ``hidden_sizes``;
* ``mlp``: everything else (vectors; any rank is flattened).

A config's ``torso`` field overrides the choice (:func:`resolve_torso`): ``auto`` (the rule
above), one of :data:`TORSOS`, or a user torso given as an import path ``"package.module:factory"``
(or, from Python, the factory itself): ``factory()`` returns an ``nn.Module`` mapping
observations ``(B, *obs_shape)`` to features ``(B, F)``, on which the algorithm's heads sit.

:func:`check_network` refuses, before anything trains, a network whose parameters would hold a
zero-size array (an observation too small for its torso), naming the observation shape and torso.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ActorCritic", "NatureCNN", "SmallCNN", "QNetwork", "TORSOS", "choose_torso", "check_network",
           "resolve_torso", "torso_factory", "torso_path"]

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}
"""The hidden layers' activations by config name (``activation``)."""


def orthogonal_dense(features: int, scale: float) -> nn.Dense:
    """A dense layer of ``features`` outputs, orthogonally initialised with gain ``scale`` and zero
    bias (as PureJaxRL and CleanRL: sqrt(2) hidden, 0.01 policy head, 1.0 value head)."""
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale),
                    bias_init=nn.initializers.constant(0.0))


def _norm(layer_norm: bool, x: jax.Array) -> jax.Array:
    """``nn.LayerNorm()(x)`` (a new ``LayerNorm_i`` submodule of the calling compact module) when
    ``layer_norm``, else ``x`` untouched and no parameters."""
    return nn.LayerNorm()(x) if layer_norm else x


class NatureCNN(nn.Module):
    """The DQN/Atari torso of Mnih et al. 2015 (Nature, "Methods: model architecture"): conv 32x8x8
    stride 4, conv 64x4x4 stride 2, conv 64x3x3 stride 1, dense 512, ReLU after each; orthogonal
    init with gain sqrt(2) as in CleanRL's ``ppo_atari.py``.

    Attributes:
        layer_norm: ``True`` -> an ``nn.LayerNorm`` (over the last axis: channels, then the 512
            features) after each convolution and after the dense layer, before the ReLU (PQN's
            network, Gallici et al. 2024); ``False`` (default) adds no parameters.

    ``__call__(obs)``: ``(B, C, H, W)`` frames (envpool's channels-first stack, e.g. ``(B, 4, 84,
    84)`` uint8 in [0, 255]) -> ``(B, 512)`` float32 features; inputs are divided by 255.
    """

    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = jnp.transpose(obs.astype(jnp.float32) / 255.0, (0, 2, 3, 1))  # NCHW -> NHWC
        init = nn.initializers.orthogonal(np.sqrt(2))
        for feat, k, st in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(_norm(self.layer_norm, nn.Conv(feat, (k, k), (st, st), padding="VALID", kernel_init=init,
                                                       bias_init=nn.initializers.constant(0.0))(x)))
        return nn.relu(_norm(self.layer_norm, orthogonal_dense(512, np.sqrt(2))(x.reshape((x.shape[0], -1)))))


class SmallCNN(nn.Module):
    """The MinAtar torso (Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed", section 4): one
    convolution of 16 3x3 filters, stride 1, VALID padding, ReLU; orthogonal init gain sqrt(2).

    The convolution is computed as a matmul over the nine shifted views of the input (the same
    numbers as ``nn.Conv``, whose ``kernel (3, 3, C, 16)`` / ``bias (16,)`` parameters it keeps):
    XLA:CPU runs a convolution inside ``lax.scan`` (the Anakin loop) about 25x slower than this
    (jax 0.10, batch 1024 of 10x10x4: 3.5 s against 0.13 s for 32 gradient steps).

    Attributes:
        channels_first: ``True`` for ``(B, C, H, W)`` input (transposed to channels-last first),
            ``False`` for ``(B, H, W, C)`` (MinAtar's layout).
        layer_norm: ``True`` -> an ``nn.LayerNorm`` over the 16 output channels after the
            convolution, before the ReLU (PQN's network); ``False`` (default) adds no parameters.

    ``__call__(obs)``: ``(B, H, W, C)`` (or channels-first) images of any numeric dtype, cast to
    float32 without rescaling (MinAtar's planes are 0/1) -> ``(B, 16 (H-2) (W-2))`` float32.
    """

    channels_first: bool = False
    features: int = 16
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32)
        if self.channels_first:
            x = jnp.transpose(x, (0, 2, 3, 1))
        c = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.orthogonal(np.sqrt(2)), (3, 3, c, self.features))
        bias = self.param("bias", nn.initializers.constant(0.0), (self.features,))
        h, w = x.shape[1] - 2, x.shape[2] - 2
        patches = jnp.stack([x[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)], axis=3)
        y = jnp.einsum("bhwkc,kcf->bhwf", patches, kernel.reshape(9, c, self.features)) + bias
        return nn.relu(_norm(self.layer_norm, y)).reshape((y.shape[0], -1))


TORSOS = ("mlp", "nature_cnn", "small_cnn")
"""Built-in torsos (see the module docstring)."""

_NATURE_MIN_HW = 36  # smallest H, W for which the Nature CNN's three VALID convolutions leave >= 1x1


def _channels_first(shape: tuple[int, ...]) -> bool:
    """A rank-3 image shape is channels-first when its first axis is smaller than both others
    (``(4, 84, 84)`` yes; ``(10, 10, 4)`` and ``(10, 10, 16)``, MinAtar's planes with 4 stacked
    frames, no)."""
    return shape[0] < shape[1] and shape[0] < shape[2]


def choose_torso(obs_shape: tuple[int, ...]) -> str:
    """The torso for one env's observation shape (without the batch axis).

    Args:
        obs_shape: e.g. ``(4,)`` (vector), ``(4, 84, 84)`` (channels-first Atari frame stack),
            ``(10, 10, 4)`` (channels-last MinAtar planes).

    Returns:
        ``"nature_cnn"`` for channels-first ``(C, H, W)`` with ``C <= 16`` and ``H, W >= 36``;
        ``"small_cnn"`` for any other rank-3 image whose spatial axes are at least 3x3; else
        ``"mlp"`` (observations are flattened).
    """
    shape = tuple(int(d) for d in obs_shape)
    if len(shape) != 3:
        return "mlp"
    if _channels_first(shape):
        c, h, w = shape
        if c <= 16 and min(h, w) >= _NATURE_MIN_HW:
            return "nature_cnn"
    else:
        h, w = shape[0], shape[1]
    return "small_cnn" if min(h, w) >= 3 else "mlp"


def torso_factory(torso: Any) -> Any:
    """The factory of a user torso: ``torso`` itself when callable, else the object an import
    path ``"package.module:attribute"`` names (imported now).

    Raises:
        ValueError: not an import path of a callable (one line naming the value and what is allowed).
    """
    if callable(torso):
        return torso
    import importlib

    module, sep, attr = str(torso).partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"torso={torso!r}: allowed: 'auto', {', '.join(repr(t) for t in TORSOS)}, or a user torso "
                         "as an import path 'package.module:factory'")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"torso={torso!r}: cannot import it ({type(err).__name__}: {err})") from None
    if not callable(obj):
        raise ValueError(f"torso={torso!r} names a {type(obj).__name__}, not a factory returning an nn.Module")
    return obj


def torso_path(torso: Any) -> str:
    """The text a config stores for ``torso``: a name or import path as given; for a Python
    callable its ``"module:qualname"`` (which ``config.json``, ``tianji eval`` and ``--resume`` can
    import back only when it is defined at the top level of an importable module)."""
    if not callable(torso):
        return str(torso)
    return f"{getattr(torso, '__module__', '?')}:{getattr(torso, '__qualname__', type(torso).__name__)}"


def resolve_torso(torso: Any, obs_shape: tuple[int, ...]) -> Any:
    """The torso a network uses: ``"auto"`` -> :func:`choose_torso`; a name of :data:`TORSOS` as
    is; anything else -> the user factory (:func:`torso_factory`).

    Raises:
        ValueError: an import path that does not name a callable.
    """
    if torso == "auto":
        return choose_torso(obs_shape)
    if isinstance(torso, str) and torso in TORSOS:
        shape = tuple(int(d) for d in obs_shape)
        if torso == "nature_cnn" and not (len(shape) == 3 and _channels_first(shape)
                                          and min(shape[1:]) >= _NATURE_MIN_HW):
            raise ValueError(f"torso='nature_cnn' needs channels-first image observations (C, H, W) with H, W >= "
                             f"{_NATURE_MIN_HW} (Atari frame stacks), got shape {shape}; allowed here: "
                             f"{_fitting(shape)}")
        if torso == "small_cnn" and not (len(shape) == 3 and min(shape[1:] if _channels_first(shape)
                                                                   else shape[:2]) >= 3):
            raise ValueError(f"torso='small_cnn' needs image observations (H, W, C) or (C, H, W) of at least 3x3, "
                             f"got shape {shape}; allowed here: {_fitting(shape)}")
        return torso
    return torso_factory(torso)


def _fitting(shape: tuple[int, ...]) -> str:
    """The built-in torsos that take observations of ``shape`` (for error messages)."""
    return ", ".join(repr(t) for t in ("auto", "mlp") + ((choose_torso(shape),) if choose_torso(shape) != "mlp" else ())
                     ) + " or a user torso"


def user_torso_features(torso: Any, obs: jax.Array) -> jax.Array:
    """Features ``(B, F)`` float32 from a user torso factory's module."""
    x = torso()(obs)
    if x.ndim != 2 or x.shape[0] != obs.shape[0]:
        raise ValueError(f"torso {torso_path(torso)!r} returned features of shape {tuple(x.shape)}; the heads need "
                         "(batch, features): flatten its output (x.reshape((x.shape[0], -1)))")
    return x.astype(jnp.float32)


def image_torso(torso: str, obs_shape: tuple[int, ...], layer_norm: bool = False) -> nn.Module:
    """The CNN torso named ``torso`` for images of ``obs_shape``: :class:`NatureCNN` for
    ``"nature_cnn"``, else :class:`SmallCNN` (channels first when the shape says so)."""
    if torso == "nature_cnn":
        return NatureCNN(layer_norm=layer_norm)
    return SmallCNN(channels_first=len(obs_shape) == 3 and _channels_first(tuple(obs_shape)),
                    layer_norm=layer_norm)


def check_network(network: nn.Module, obs_shape: tuple[int, ...], obs_dtype: Any = jnp.float32) -> None:
    """Refuse a network whose parameters for ``obs_shape`` would contain a zero-size array (the
    policy could not see its observation), before anything is compiled or trained.

    Only shapes are traced (``jax.eval_shape``), nothing is computed.

    Raises:
        ValueError: naming the observation shape, the torso and the first zero-size parameter.
    """
    dummy = jax.ShapeDtypeStruct((2, *obs_shape), obs_dtype)  # batch 2: a torso that drops the batch axis fails
    torso = getattr(network, "torso", None)
    try:
        shapes = jax.eval_shape(network.init, jax.random.PRNGKey(0), dummy)
    except Exception as err:  # noqa: BLE001 - a user torso that cannot take the observation: one line
        if isinstance(torso, str) and torso in TORSOS:
            raise
        raise ValueError(f"torso {torso_path(torso)!r} cannot map observations of shape {tuple(obs_shape)} "
                         f"(dtype {obs_dtype}) to features: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        if int(np.prod(leaf.shape)) == 0:
            raise ValueError(f"observation shape {tuple(obs_shape)} is too small for the "
                             f"{torso_path(torso)!r} torso: parameter {jax.tree_util.keystr(path)} "
                             f"would have shape {tuple(leaf.shape)} (allowed torsos: {list(TORSOS)})")


class ActorCritic(nn.Module):
    """Actor-critic: separate MLPs (``torso='mlp'``), a shared :class:`NatureCNN` torso
    (``torso='nature_cnn'``, Atari frames) or a shared :class:`SmallCNN` followed by separate
    actor and critic MLPs (``torso='small_cnn'``, small images) with linear actor and critic heads.

    Attributes:
        action_dim: number of actions (Discrete) or action dimensions (Box).
        continuous: ``False`` -> the actor outputs ``(B, action_dim)`` float32 logits;
            ``True`` -> it outputs the Gaussian mean ``(B, action_dim)`` and a state-independent
            ``log_std`` parameter ``(action_dim,)`` (initialised to ``log_std_init``).
        hidden_sizes: hidden widths of each MLP (unused by the Nature CNN torso).
        activation: ``"tanh"`` or ``"relu"`` (MLPs only).
        torso: one of :data:`TORSOS`, or a user torso factory (:func:`resolve_torso`), shared by
            the linear actor and critic heads (``hidden_sizes`` unused).
        obs_shape: one observation's shape (tells :class:`SmallCNN` the channel layout).
        log_std_init: the Gaussian policy's initial log standard deviation (Box actions; 0: CleanRL's).

    ``__call__(obs)`` takes ``(B, *obs_shape)`` (any numeric dtype, flattened and cast to float32)
    and returns ``(actor_out, value)``: ``actor_out`` is logits ``(B, A)`` or ``(mean (B, A),
    log_std (A,))``; ``value`` is ``(B,)`` float32.
    """

    action_dim: int
    continuous: bool = False
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: Any = "mlp"
    obs_shape: tuple[int, ...] = ()
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, obs: jax.Array):
        if self.torso == "nature_cnn":
            a = c = NatureCNN()(obs)
        elif callable(self.torso):  # a user torso, shared by the actor and critic heads
            a = c = user_torso_features(self.torso, obs)
        else:
            act = ACTIVATIONS[self.activation]
            if self.torso == "small_cnn":
                x = image_torso(self.torso, self.obs_shape)(obs)
            else:
                x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
            a, c = x, x
            for h in self.hidden_sizes:
                a = act(orthogonal_dense(h, np.sqrt(2))(a))
            for h in self.hidden_sizes:
                c = act(orthogonal_dense(h, np.sqrt(2))(c))
        head = orthogonal_dense(self.action_dim, 0.01)(a)
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_dim,))
            actor_out = (head, log_std)
        else:
            actor_out = head
        value = orthogonal_dense(1, 1.0)(c)[:, 0]
        return actor_out, value


class QNetwork(nn.Module):
    """Q-network for Discrete actions (Mnih et al. 2015): an MLP torso (``torso='mlp'``), the
    :class:`NatureCNN` torso of Nature DQN (``torso='nature_cnn'``, stacked uint8 frames) or a
    :class:`SmallCNN` followed by the MLP (``torso='small_cnn'``, small images), with a
    linear head or a dueling head (Wang et al. 2016, "Dueling Network Architectures for Deep RL", eq. 9).

    Orthogonal initialisation as :class:`ActorCritic`: hidden layers gain ``sqrt(2)``, the output
    heads gain 1, biases 0.

    Attributes:
        action_dim: number of actions ``A``.
        hidden_sizes: hidden widths of the MLP (unused by the Nature CNN torso).
        activation: ``"tanh"`` or ``"relu"`` (MLP only).
        torso: one of :data:`TORSOS` (``nature_cnn``: ``(B, C, H, W)`` frames, see :class:`NatureCNN`),
            or a user torso factory (:func:`resolve_torso`; ``hidden_sizes`` unused).
        obs_shape: one observation's shape (tells :class:`SmallCNN` the channel layout).
        dueling: ``False`` -> ``Q = Dense(A)(torso)``; ``True`` -> separate value ``V (B, 1)`` and
            advantage ``A (B, A)`` heads on the shared torso, ``Q = V + A - mean_a A``.
        layer_norm: ``True`` -> an ``nn.LayerNorm`` after every hidden Dense of the MLP (before
            its activation) and after each convolution of the CNN torsos (see :class:`NatureCNN`,
            :class:`SmallCNN`): PQN's network (Gallici et al. 2024, "Simplifying Deep Temporal
            Difference Learning", section 4), which trains without a target network. ``False``
            (default) adds no parameters: the parameter tree is that of a plain DQN network.
        num_atoms: ``1`` -> Q-values; ``K > 1`` -> ``K`` outputs per action (C51's logits over a
            fixed support, or QR-DQN's quantiles), returned as ``(B, A, K)``; with ``dueling``
            the value and advantage streams each have ``K`` outputs per action.

    ``__call__(obs)`` takes ``(B, *obs_shape)`` (any numeric dtype; the MLP flattens and casts to
    float32, the CNN divides by 255) and returns ``q``: ``(B, A)`` float32 Q-values (``(B, A, K)``
    with ``num_atoms = K > 1``).
    """

    action_dim: int
    hidden_sizes: Sequence[int] = (120, 84)
    activation: str = "relu"
    dueling: bool = False
    torso: Any = "mlp"
    obs_shape: tuple[int, ...] = ()
    layer_norm: bool = False
    num_atoms: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.num_atoms > 1:  # a distribution per action: (B, A, K)
            return self._head(self._torso(obs), self.num_atoms)
        return self._head(self._torso(obs), 1)[..., 0]

    def _torso(self, obs: jax.Array) -> jax.Array:
        if self.torso == "nature_cnn":
            x = NatureCNN(layer_norm=self.layer_norm)(obs)
        elif callable(self.torso):  # a user torso: the heads sit on its features (normalised with layer_norm)
            x = _norm(self.layer_norm, user_torso_features(self.torso, obs))
        else:
            act = ACTIVATIONS[self.activation]
            if self.torso == "small_cnn":
                x = image_torso(self.torso, self.obs_shape, self.layer_norm)(obs)
            else:
                x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
            for h in self.hidden_sizes:
                x = act(_norm(self.layer_norm, orthogonal_dense(h, np.sqrt(2))(x)))
        return x

    def _head(self, x: jax.Array, k: int) -> jax.Array:
        b = x.shape[0]
        if not self.dueling:
            return orthogonal_dense(self.action_dim * k, 1.0)(x).reshape((b, self.action_dim, k))
        value = orthogonal_dense(k, 1.0)(x).reshape((b, 1, k))
        advantage = orthogonal_dense(self.action_dim * k, 1.0)(x).reshape((b, self.action_dim, k))
        return value + advantage - jnp.mean(advantage, axis=1, keepdims=True)
