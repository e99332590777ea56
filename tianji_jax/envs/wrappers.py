"""Wrappers for device (gymnax-interface) envs, and the ``|`` id syntax that selects them.

Each wrapper is itself a gymnax-interface env (gymnax >= 1.0): ``reset(key, params) -> (obs, state)``,
``step(key, state, action, params) -> (obs, state, reward, terminated, truncated, info)``,
``default_params``, ``observation_space(params)``, ``action_space(params)``, ``name`` and (where the
inner env has it) ``num_actions``. Wrappers compose and run through
:class:`~tianji_jax.envs.gymnax_env.GymnaxVecEnv` unchanged:

* the inner env auto-resets inside its ``step`` (gymnax >= 1.0) and reports the true successor
  observation in ``info["final_observation"]``; every wrapper that changes observations transforms
  both ``obs`` and ``info["final_observation"]``, so ``final_obs`` stays the wrapped successor;
* ``terminated``, ``truncated`` and ``reward`` pass through unchanged, and ``default_params`` is the
  inner env's, so ``max_steps_in_episode`` (the time limit evaluation reads) is unchanged too.

Id syntax (see :func:`apply_wrappers`): ``"gymnax:<id>|<wrapper>|<wrapper>..."``, applied left to
right, innermost first, e.g. ``"gymnax:CartPole-v1|mask=0,2"``, ``"gymnax:Breakout-MinAtar|frame_stack=4"``,
``"gymnax:Pendulum-v1|clip_action"``. Host backends (envpool, gymnasium) take the same wrappers
with the same semantics (:mod:`tianji_jax.envs.host_wrappers`), and the host modifier ``latency_ms`` (:data:`~tianji_jax.envs.id_syntax.HOST_WRAPPER_SYNTAX`,
:class:`~tianji_jax.envs.latency.LatencyVecEnv`): ``"envpool:CartPole-v1|latency_ms=5"`` makes each
batched step of a training env take at least 5 milliseconds (a slow external simulator), which a
gymnax id refuses (device envs step inside compiled code).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.envs.id_syntax import HOST_WRAPPER_SYNTAX, WRAPPER_SYNTAX

__all__ = ["Wrapper", "ObservationMask", "FrameStack", "FrameStackState", "ClipAction", "WRAPPER_SYNTAX",
           "HOST_WRAPPER_SYNTAX", "apply_wrappers", "is_wrapper_name"]


_INTERFACE = ("reset", "step", "default_params", "observation_space", "action_space")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))



def _gspaces():
    """gymnax's spaces module, imported on first use: importing gymnax starts JAX's backend, which
    must not happen at import (multi-host processes join ``jax.distributed`` before it starts)."""
    from tianji_jax.envs.spaces import import_gymnax

    return import_gymnax().environments.spaces


class Wrapper:
    """Base of the env wrappers: a gymnax-interface env that forwards everything to ``env``.

    Subclasses override what they change. Only the gymnax interface, ``name`` and ``num_actions``
    are forwarded (no ``step_env``/``get_obs``, which would bypass the wrapper).

    Args:
        env: a gymnax-interface env object (gymnax >= 1.0 ``step`` returning six values, with
            ``info["final_observation"]``), possibly another wrapper.

    Raises:
        ValueError: ``env`` lacks part of the gymnax interface (names the missing attributes).
    """

    def __init__(self, env: Any):
        missing = [a for a in _INTERFACE if not hasattr(env, a)]
        if missing:
            raise ValueError(f"{type(self).__name__}: env of type {type(env).__name__} is not a gymnax-style "
                             f"environment; missing {missing}")
        self._env = env

    @property
    def env(self) -> Any:
        """The env this wrapper wraps (possibly another wrapper)."""
        return self._env

    @property
    def unwrapped(self) -> Any:
        """The innermost env, below every wrapper."""
        env = self._env
        while isinstance(env, Wrapper):
            env = env.env
        return env

    @property
    def tag(self) -> str:
        """This wrapper in the id syntax, e.g. ``"mask=0,2"``."""
        return type(self).__name__

    @property
    def name(self) -> str:
        """The inner env's name followed by ``|<tag>``, e.g. ``"CartPole-v1|mask=0,2"``."""
        return f"{getattr(self._env, 'name', type(self._env).__name__)}|{self.tag}"

    @property
    def num_actions(self) -> int:
        """The inner env's ``num_actions``.

        Raises:
            AttributeError: the inner env has none.
        """
        return self._env.num_actions

    @property
    def default_params(self) -> Any:
        """The inner env's default params (so ``max_steps_in_episode`` is the inner time limit)."""
        return self._env.default_params

    def _params(self, params: Any) -> Any:
        return self.default_params if params is None else params

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, Any]:
        """Reset one env: ``(obs, state)``; ``params`` None means :attr:`default_params`."""
        return self._env.reset(key, self._params(params))

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None) -> tuple:
        """Step one env: ``(obs, state, reward, terminated, truncated, info)`` as gymnax >= 1.0
        (auto-reset inside; ``info["final_observation"]`` is the true successor observation)."""
        return self._env.step(key, state, action, self._params(params))

    def observation_space(self, params: Any) -> Any:
        """The gymnax observation space of one env."""
        return self._env.observation_space(params)

    def action_space(self, params: Any) -> Any:
        """The gymnax action space of one env."""
        return self._env.action_space(params)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class ObservationMask(Wrapper):
    """Keep only the components ``keep`` of a 1-D observation, in that order.

    E.g. CartPole without the two velocities: ``keep=(0, 2)`` turns the float32 ``(4,)`` observation
    ``[x, x_dot, theta, theta_dot]`` into ``(2,)`` ``[x, theta]`` (same dtype; the space's bounds
    are the kept components' bounds). Applied to ``obs`` and ``info["final_observation"]``.

    Args:
        env: a gymnax-interface env with a 1-D Box observation space.
        keep: non-empty tuple of distinct ints in ``0 .. D-1`` (``D`` = observation length).

    Raises:
        ValueError: empty, duplicate, non-integer or out-of-range indices, or an observation that is
            not a 1-D Box; the one-line message names ``keep``, the observation shape and the
            allowed range.
    """

    def __init__(self, env: Any, keep: Sequence[int]):
        super().__init__(env)
        space = env.observation_space(env.default_params)
        shape = tuple(int(s) for s in space.shape) if isinstance(space, _gspaces().Box) else None
        allowed = (f"allowed: distinct integer indices in 0..{shape[0] - 1}" if shape and len(shape) == 1
                   else "allowed: a 1-D Box observation")
        keep_t = tuple(keep) if isinstance(keep, (tuple, list)) else keep
        if shape is None or len(shape) != 1:
            reason = f"the observation ({type(space).__name__}) is not a 1-D Box"
        elif not isinstance(keep_t, tuple) or not keep_t:
            reason = "no indices"
        elif not all(_is_int(i) for i in keep_t):
            reason = "indices must be ints"
        elif len(set(int(i) for i in keep_t)) != len(keep_t):
            reason = "duplicate indices"
        elif not all(0 <= int(i) < shape[0] for i in keep_t):
            reason = "index out of range"
        else:
            reason = None
        if reason:
            raise ValueError(f"ObservationMask: keep={keep!r} for observation shape {shape}: {reason}; {allowed}")
        self.keep = tuple(int(i) for i in keep_t)
        self._index = np.asarray(self.keep, np.int32)

    @property
    def tag(self) -> str:
        """``"mask=i,j,..."``."""
        return "mask=" + ",".join(str(i) for i in self.keep)

    def _mask(self, obs: jax.Array) -> jax.Array:
        return jnp.take(jnp.asarray(obs), self._index, axis=-1)

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, Any]:
        """Reset one env: ``(obs[keep], state)``, obs shaped ``(len(keep),)``."""
        obs, state = self._env.reset(key, self._params(params))
        return self._mask(obs), state

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None) -> tuple:
        """Step one env; ``obs`` and ``info["final_observation"]`` are masked to ``(len(keep),)``."""
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, self._params(params))
        info = {**info, "final_observation": self._mask(info["final_observation"])}
        return self._mask(obs), state, reward, terminated, truncated, info

    def observation_space(self, params: Any) -> Any:
        """Box of shape ``(len(keep),)`` with the kept components' bounds and the inner dtype."""
        space = self._env.observation_space(params)
        low = np.broadcast_to(np.asarray(space.low, np.float64), space.shape)[self._index]
        high = np.broadcast_to(np.asarray(space.high, np.float64), space.shape)[self._index]
        return _gspaces().Box(low, high, (len(self.keep),), space.dtype)


def stack_frames(frames: Any, xp: Any = jnp) -> Any:
    """``(k, *obs_shape)`` frames (oldest first) in :class:`FrameStack`'s layout: 1-D ``(k * D,)``,
    channels-last images ``(H, W, k * C)``, any other rank ``(*obs_shape, k)``. ``xp``: ``jnp`` or
    ``np`` (the host envs' :class:`~tianji_jax.envs.host_wrappers.HostFrameStack` uses the same)."""
    if frames.ndim == 2:
        return xp.reshape(frames, (-1,))
    if frames.ndim == 4:  # (k, H, W, C) -> (H, W, k * C)
        k, h, w, c = frames.shape
        return xp.reshape(xp.moveaxis(frames, 0, 2), (h, w, k * c))
    return xp.moveaxis(frames, 0, -1)


def stacked_bounds(low: np.ndarray, high: np.ndarray, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of ``num_frames`` stacked observations with bounds ``low``/``high`` (float64, already
    of the observation's shape): the ``k - 1`` older slots widened to include 0 (the fill value)."""
    older = num_frames - 1  # slots that may hold the zero fill; the newest never does
    lo = np.stack([np.minimum(low, 0.0)] * older + [low])
    hi = np.stack([np.maximum(high, 0.0)] * older + [high])
    return stack_frames(lo, np), stack_frames(hi, np)


@struct.dataclass
class FrameStackState:
    """State of :class:`FrameStack`.

    Attributes:
        env_state: the inner env's state.
        frames: ``(k, *obs_shape)`` (inner observation dtype), the last ``k`` observations of the
            current episode, oldest first; slots before the episode's first observation are zero.
    """

    env_state: Any
    frames: jax.Array


class FrameStack(Wrapper):
    """The last ``k = num_frames`` observations of the current episode, oldest first.

    Layout: a 1-D observation ``(D,)`` becomes the concatenation ``(k * D,)``
    ``[o_{t-k+1}, ..., o_t]``; a channels-last image ``(H, W, C)`` (MinAtar's planes) stacks its
    frames along the channel axis, ``(H, W, k * C)`` with channels ``[j * C, (j + 1) * C)`` frame
    ``j`` (the newest last), so the image torsos see more channels; any other rank (grey ``(H,
    W)``, ...) gains a new trailing axis ``(*obs_shape, k)`` with ``[..., -1]`` the newest. The
    dtype is the inner observation's.

    After a reset the older ``k - 1`` slots are zero. The inner env auto-resets inside its ``step``
    (gymnax >= 1.0); where ``terminated | truncated``, ``obs`` is the new episode's reset
    observation with ``k - 1`` zero slots (no frame of the old episode), while
    ``info["final_observation"]`` stacks the old episode's last ``k`` observations, its true final
    observation newest (what bootstrapping from a truncation needs). The observation space's bounds
    of the ``k - 1`` older slots are widened to include 0 (the fill value).

    Args:
        env: a gymnax-interface env with a Box observation space.
        num_frames: ``k >= 1`` (1 only adds the trailing axis for images).

    Raises:
        ValueError: ``num_frames`` not an int >= 1, or a non-Box observation space.
    """

    def __init__(self, env: Any, num_frames: int):
        super().__init__(env)
        if not _is_int(num_frames) or num_frames < 1:
            raise ValueError(f"FrameStack: num_frames={num_frames!r}; allowed: an integer >= 1")
        space = env.observation_space(env.default_params)
        if not isinstance(space, _gspaces().Box):
            raise ValueError(f"FrameStack: observation space {type(space).__name__} is not a Box; allowed: a Box")
        self.num_frames = int(num_frames)

    @property
    def tag(self) -> str:
        """``"frame_stack=k"``."""
        return f"frame_stack={self.num_frames}"

    def _stack(self, frames: jax.Array, xp: Any = jnp) -> jax.Array:
        return stack_frames(frames, xp)

    def _fresh(self, obs: jax.Array) -> jax.Array:
        obs = jnp.asarray(obs)
        return jnp.zeros((self.num_frames, *obs.shape), obs.dtype).at[-1].set(obs)

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, FrameStackState]:
        """Reset one env: the stacked observation (the reset observation newest, zeros before it)
        and a :class:`FrameStackState`."""
        obs, env_state = self._env.reset(key, self._params(params))
        frames = self._fresh(obs)
        return self._stack(frames), FrameStackState(env_state, frames)

    def step(self, key: jax.Array, state: FrameStackState, action: Any, params: Any = None) -> tuple:
        """Step one env; see the class docstring for what ``obs`` and ``info["final_observation"]``
        hold when the episode ends."""
        obs, env_state, reward, terminated, truncated, info = self._env.step(
            key, state.env_state, action, self._params(params))
        final = jnp.asarray(info["final_observation"], state.frames.dtype)
        continued = jnp.concatenate([state.frames[1:], final[None]], axis=0)
        done = jnp.reshape(jnp.logical_or(terminated, truncated), ())
        frames = jnp.where(done, self._fresh(jnp.asarray(obs, state.frames.dtype)), continued)
        info = {**info, "final_observation": self._stack(continued)}
        return self._stack(frames), FrameStackState(env_state, frames), reward, terminated, truncated, info

    def observation_space(self, params: Any) -> Any:
        """Box of the stacked shape (see the class docstring); the older slots' bounds include 0."""
        space = self._env.observation_space(params)
        shape = tuple(int(s) for s in space.shape)
        low, high = stacked_bounds(np.broadcast_to(np.asarray(space.low, np.float64), shape),
                                   np.broadcast_to(np.asarray(space.high, np.float64), shape), self.num_frames)
        return _gspaces().Box(low, high, low.shape, space.dtype)


class ClipAction(Wrapper):
    """Clip continuous actions elementwise to the action Box's ``[low, high]`` before the inner
    step (the action keeps its dtype and shape, e.g. float32 ``(1,)`` for Pendulum).

    Args:
        env: a gymnax-interface env with a Box action space.

    Raises:
        ValueError: the action space is not a Box.
    """

    def __init__(self, env: Any):
        super().__init__(env)
        space = env.action_space(env.default_params)
        if not isinstance(space, _gspaces().Box):
            raise ValueError(f"ClipAction: action space {type(space).__name__} is not a Box; allowed: a Box "
                             "(continuous) action space")

    @property
    def tag(self) -> str:
        """``"clip_action"``."""
        return "clip_action"

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any = None) -> tuple:
        """Step one env with ``clip(action, low, high)``."""
        params = self._params(params)
        space = self._env.action_space(params)
        action = jnp.asarray(action)
        clipped = jnp.clip(action, space.low, space.high).astype(action.dtype)
        return self._env.step(key, state, clipped, params)


class _Unparsed(Exception):
    """A wrapper value that does not parse."""


def _ints(value: str) -> tuple[int, ...]:
    parts = [p.strip() for p in value.split(",")]
    if not all(re.fullmatch(r"-?[0-9]+", p) for p in parts):
        raise _Unparsed(value)
    return tuple(int(p) for p in parts)


def parse_wrapper_term(term: str, prefix: str = "") -> tuple[str, Any]:
    """One wrapper term of the id syntax as ``(name, value)``: ``("mask", (0, 2))``,
    ``("frame_stack", 4)``, ``("clip_action", None)`` (device and host envs share the syntax).

    Raises:
        ValueError: one line (starting with ``prefix``): an unknown name (lists the allowed ones) or
            a value that does not parse (gives the allowed values).
    """
    name, eq, value = (s.strip() for s in term.strip().partition("="))
    if name not in WRAPPER_SYNTAX:
        raise ValueError(f"{prefix}unknown wrapper {name!r} (in {term.strip()!r}); allowed wrappers: "
                         f"{list(WRAPPER_SYNTAX)}")
    try:
        if name == "clip_action":
            if eq:
                raise _Unparsed(value)
            return name, None
        values = _ints(value)
        if name == "mask":
            return name, values
        if len(values) != 1:  # frame_stack's own range check is FrameStack's
            raise _Unparsed(value)
        return name, values[0]
    except _Unparsed:
        got = f"value {value!r}" if eq else "no value"
        raise ValueError(f"{prefix}wrapper {name!r} got {got}; allowed: {WRAPPER_SYNTAX[name]}") from None


def is_wrapper_name(name: str) -> bool:
    """Whether ``name`` (an id term's part before ``=``) names a device or host wrapper
    (:data:`~tianji_jax.envs.id_syntax.WRAPPER_SYNTAX`, ``HOST_WRAPPER_SYNTAX``), not an env's own option such as brax's ``backend``."""
    return name in WRAPPER_SYNTAX or name in HOST_WRAPPER_SYNTAX


def wrapper_tag(name: str, value: Any) -> str:
    """The canonical spelling of a parsed term (``"mask=0,2"``, ``"frame_stack=4"``, ``"clip_action"``)."""
    if name == "clip_action":
        return name
    return f"{name}=" + (",".join(str(i) for i in value) if name == "mask" else str(value))


def apply_wrappers(env: Any, terms: Sequence[str], env_text: str = "") -> tuple[Any, str]:
    """Wrap ``env`` in the wrappers named by ``terms`` (the ``|``-separated parts of an env id after
    the base id), left to right, innermost first.

    Terms (:data:`~tianji_jax.envs.id_syntax.WRAPPER_SYNTAX`): ``mask=i,j,...`` (:class:`ObservationMask`), ``frame_stack=k``
    (:class:`FrameStack`), ``clip_action`` (:class:`ClipAction`). Whitespace around terms and
    values is ignored.

    Args:
        env: the gymnax-interface env to wrap.
        terms: e.g. ``["mask=0,2", "frame_stack=4"]``.
        env_text: the whole env id, quoted at the start of error messages.

    Returns:
        ``(wrapped_env, suffix)`` with ``suffix`` the canonical spelling, e.g. ``"|mask=0,2|frame_stack=4"``.

    Raises:
        ValueError: one line naming the wrapper and value: an unknown wrapper name (lists the
            allowed names), a host modifier (``latency_ms``: host envs only), a value that does not parse (gives the allowed values), or a value the
            wrapper refuses for this env (e.g. an index outside the observation).
    """
    prefix = f"env={env_text!r}: " if env_text else ""
    suffix = ""
    for term in terms:
        if term.strip().partition("=")[0].strip() in HOST_WRAPPER_SYNTAX:
            raise ValueError(f"{prefix}{term.strip().partition('=')[0].strip()!r} applies to host envs (envpool:, "
                             f"gymnasium:) only, since device envs step inside compiled code; allowed wrappers: "
                             f"{list(WRAPPER_SYNTAX)}")
        name, value = parse_wrapper_term(term, prefix)
        try:
            env = ClipAction(env) if name == "clip_action" else (
                ObservationMask(env, value) if name == "mask" else FrameStack(env, value))
        except ValueError as err:
            raise ValueError(f"{prefix}wrapper {term.strip()!r}: {err}") from None
        suffix += f"|{env.tag}"
    return env, suffix
