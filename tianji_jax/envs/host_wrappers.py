"""The device wrappers' semantics for host vector envs (envpool, gymnasium): ``mask``,
``frame_stack`` and ``clip_action`` in the same id syntax (``"envpool:HalfCheetah-v4|clip_action"``,
``"gymnasium:CartPole-v1|mask=0,2|frame_stack=4"``), so one env id means the same observations and
actions whichever backend steps it.

Each wrapper wraps a host vector env (``reset() -> HostStep``, ``step(actions, env_id=None) ->
HostStep``, ``close()``; :mod:`tianji_jax.envs.host`) and reads everything else through. The host
backends reset an env on the step after a done one (that step is not a transition: ``valid`` is
False); the wrappers follow that convention:

* :class:`HostObservationMask`: ``obs`` and ``final_obs`` keep the components ``keep`` (a 1-D Box).
* :class:`HostFrameStack`: per env, the last ``k`` observations of the current episode, oldest first,
  in :class:`~tianji_jax.envs.wrappers.FrameStack`'s layout; a reset row (``valid`` False, or
  :meth:`reset`) starts a new stack with zeros in the ``k - 1`` older slots; ``final_obs`` stacks
  the episode's last ``k`` observations, its true final one newest.
* :class:`HostClipAction`: float actions clipped elementwise to the action Box's bounds before the
  inner step (what CleanRL's ``ppo_continuous_action`` does with ``gym.wrappers.ClipAction``: the
  policy's Gaussian samples are unbounded, and MuJoCo's control cost reads the action given).

The spec (:class:`~tianji_jax.envs.registry.EnvSpec`) carries the wrappers' canonical terms
(``host_wrappers``) and their spaces; :meth:`~tianji_jax.envs.registry.EnvSpec.make_host_env`
applies them to training and evaluation envs alike (unlike ``latency_ms``, which models the
training simulator's cost only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from tianji_jax.envs.spaces import Box

__all__ = ["HostObservationMask", "HostFrameStack", "HostClipAction", "host_wrapper", "wrapped_spaces"]

HOST_WRAPPERS = ("mask", "frame_stack", "clip_action")


class _HostWrapper:
    """Read-through base of the host env wrappers (here and :class:`~tianji_jax.envs.latency.LatencyVecEnv`):
    every attribute not set here is the inner env's; ``close`` closes the inner env; a context manager."""

    def __init__(self, env: Any):
        self.env = env

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self) -> Any:
        """The inner env's reset (a ``HostStep`` of every env)."""
        return self.env.reset()

    def step(self, actions: Any, env_id: Any = None) -> Any:
        """The inner env's step (a ``HostStep``)."""
        return self.env.step(actions, env_id)

    def close(self) -> None:
        """Close the inner env."""
        self.env.close()

    def __enter__(self) -> "_HostWrapper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _mask_space(space: Any, keep: tuple[int, ...]) -> Box:
    if not isinstance(space, Box) or len(space.shape) != 1:
        raise ValueError(f"ObservationMask: keep={keep!r} for observation {space!r}: the observation is not a 1-D "
                         "Box; allowed: a 1-D Box observation")
    d = space.shape[0]
    if not keep or len(set(keep)) != len(keep) or not all(0 <= i < d for i in keep):
        raise ValueError(f"ObservationMask: keep={keep!r} for observation shape ({d},): empty, duplicate or out-of-"
                         f"range indices; allowed: distinct integer indices in 0..{d - 1}")
    idx = np.asarray(keep)
    return Box((len(keep),), space.dtype, np.broadcast_to(space.low, space.shape)[idx].copy(),
               np.broadcast_to(space.high, space.shape)[idx].copy())


def _stack_space(space: Any, k: int) -> Box:
    from tianji_jax.envs.wrappers import stacked_bounds

    if not isinstance(space, Box) or k < 1:
        raise ValueError(f"FrameStack: num_frames={k!r} on observation {space!r}; allowed: an integer >= 1 on a Box")
    low, high = stacked_bounds(np.broadcast_to(np.asarray(space.low, np.float64), space.shape),
                               np.broadcast_to(np.asarray(space.high, np.float64), space.shape), k)
    return Box(tuple(low.shape), space.dtype, low, high)


class HostObservationMask(_HostWrapper):
    """Keep the components ``keep`` of a 1-D observation (``obs`` and ``final_obs``), in that order.

    Raises:
        ValueError: not a 1-D Box observation, or empty, duplicate or out-of-range indices.
    """

    def __init__(self, env: Any, keep: Sequence[int]):
        super().__init__(env)
        self.keep = tuple(int(i) for i in keep)
        self.observation_space = _mask_space(env.observation_space, self.keep)
        self._index = np.asarray(self.keep)

    def _masked(self, out: Any) -> Any:
        return dataclasses.replace(out, obs=out.obs[..., self._index], final_obs=out.final_obs[..., self._index])

    def reset(self) -> Any:
        """The inner reset, observations masked to ``(B, len(keep))``."""
        return self._masked(self.env.reset())

    def step(self, actions: Any, env_id: Any = None) -> Any:
        """The inner step, ``obs`` and ``final_obs`` masked to ``(B, len(keep))``."""
        return self._masked(self.env.step(actions, env_id))


class HostFrameStack(_HostWrapper):
    """The last ``k`` observations of each env's current episode (see the module docstring).

    Attributes:
        frames: ``(N, k, *inner_obs_shape)`` (inner dtype), each env's stack, oldest first.

    Raises:
        ValueError: ``num_frames`` not an int >= 1, or a non-Box observation.
    """

    def __init__(self, env: Any, num_frames: int):
        super().__init__(env)
        if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)):
            raise ValueError(f"FrameStack: num_frames={num_frames!r}; allowed: an integer >= 1")
        self.num_frames = int(num_frames)
        inner = env.observation_space
        self.observation_space = _stack_space(inner, self.num_frames)
        self.frames = np.zeros((int(env.num_envs), self.num_frames, *inner.shape), np.dtype(inner.dtype))

    def _stacked(self, frames: np.ndarray) -> np.ndarray:
        from tianji_jax.envs.wrappers import stack_frames

        return np.stack([stack_frames(f, np) for f in frames]) if len(frames) else frames.reshape(
            (0, *self.observation_space.shape))

    def _apply(self, out: Any) -> Any:
        ids = np.asarray(out.env_id, np.int64)
        obs = np.asarray(out.obs, self.frames.dtype)
        continued = np.concatenate([self.frames[ids, 1:], np.asarray(out.final_obs, self.frames.dtype)[:, None]], 1)
        fresh = np.zeros_like(continued)
        fresh[:, -1] = obs
        new = ~np.asarray(out.valid, bool)  # a reset row: a new episode's first observation
        frames = np.where(new.reshape((-1,) + (1,) * (continued.ndim - 1)), fresh, continued)
        frames[~new, -1] = obs[~new]  # the observation to act on (the final one at a done step)
        self.frames[ids] = frames
        return dataclasses.replace(out, obs=self._stacked(frames), final_obs=self._stacked(continued))

    def reset(self) -> Any:
        """The inner reset (every row a reset row): each stack is zeros and the first observation."""
        return self._apply(self.env.reset())

    def step(self, actions: Any, env_id: Any = None) -> Any:
        """The inner step with stacked ``obs`` and ``final_obs`` (see the module docstring)."""
        return self._apply(self.env.step(actions, env_id))


class HostClipAction(_HostWrapper):
    """Clip actions elementwise to the action Box's ``[low, high]`` before the inner step (their
    dtype kept).

    Raises:
        ValueError: the action space is not a Box.
    """

    def __init__(self, env: Any):
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, Box):
            raise ValueError(f"ClipAction: action space {space!r} is not a Box; allowed: a Box (continuous) action space")
        self._low, self._high = np.asarray(space.low), np.asarray(space.high)

    def step(self, actions: Any, env_id: Any = None) -> Any:
        """The inner step with ``clip(actions, low, high)``."""
        actions = np.asarray(actions)
        return self.env.step(np.clip(actions, self._low, self._high).astype(actions.dtype), env_id)


def host_wrapper(env: Any, term: tuple[str, Any]) -> Any:
    """``env`` wrapped in the wrapper of one parsed term ``(name, value)`` (``("mask", (0, 2))``,
    ``("frame_stack", 4)``, ``("clip_action", None)``)."""
    name, value = term
    if name == "mask":
        return HostObservationMask(env, value)
    if name == "frame_stack":
        return HostFrameStack(env, value)
    if name == "clip_action":
        return HostClipAction(env)
    raise ValueError(f"unknown host wrapper {name!r}; allowed: {list(HOST_WRAPPERS)}")


def wrapped_spaces(obs_space: Box, act_space: Any, terms: Sequence[tuple[str, Any]]) -> tuple[Box, Any]:
    """The observation and action spaces after the wrappers of ``terms``, left to right (what the
    wrapped env reports, computed without creating an env).

    Raises:
        ValueError: a term the spaces refuse (as the wrapper's constructor would).
    """
    for name, value in terms:
        if name == "mask":
            obs_space = _mask_space(obs_space, tuple(value))
        elif name == "frame_stack":
            obs_space = _stack_space(obs_space, int(value))
        elif name == "clip_action" and not isinstance(act_space, Box):
            raise ValueError(f"ClipAction: action space {act_space!r} is not a Box; allowed: a Box (continuous) "
                             "action space")
    return obs_space, act_space
