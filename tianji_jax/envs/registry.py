"""Resolve an env spec (``"gymnax:CartPole-v1"`` or an env object) into an :class:`EnvSpec`.

Resolution creates the environment object and reads its spaces; it never steps the env. Reading
gymnax spaces may run (and compile, once per process) a few tiny eager ``jnp`` operations.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tianji_jax.envs.spaces import Box, Discrete, from_gymnax_space

__all__ = ["EnvSpec", "resolve_env", "BACKENDS"]

BACKENDS = ("gymnax",)
"""Env backends known to the resolver. Host backends (envpool, gymnasium) come with the async runtime."""


@dataclass(frozen=True, eq=False)
class EnvSpec:
    """A resolved environment.

    Attributes:
        backend: ``"gymnax"``.
        name: the registered id, or the class name of a user object.
        env: the gymnax-style environment object.
        env_params: its default params (a pytree).
        observation_space: :class:`Box` of one env's observation.
        action_space: :class:`Discrete` or :class:`Box` of one env's action.
    """

    backend: str
    name: str
    env: Any
    env_params: Any
    observation_space: Box
    action_space: Discrete | Box

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """Shape of one env's observation."""
        return self.observation_space.shape

    @property
    def action_kind(self) -> str:
        """``"discrete"`` for Discrete, ``"continuous"`` for a 1-D Box."""
        if isinstance(self.action_space, Discrete):
            return "discrete"
        if isinstance(self.action_space, Box) and len(self.action_space.shape) == 1:
            return "continuous"
        return "unsupported"

    @property
    def max_episode_steps(self) -> int:
        """Time limit of one episode in env steps (gymnax ``max_steps_in_episode``)."""
        limit = getattr(self.env_params, "max_steps_in_episode", None)
        if limit is None:
            raise ValueError(f"env {self.name}: its params have no max_steps_in_episode, which "
                             "evaluation needs to bound an episode")
        return int(limit)


def _gymnax_ids() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs)


def resolve_env(env: Any) -> EnvSpec:
    """Resolve ``env`` into an :class:`EnvSpec`.

    Args:
        env: ``"gymnax:<id>"``, a bare gymnax id such as ``"CartPole-v1"``, or a gymnax-style
            environment object (``reset``, ``step``, ``default_params``, ``observation_space``,
            ``action_space``).

    Raises:
        ValueError: unknown backend (allowed: :data:`BACKENDS`), unknown id (the message lists the
            closest registered ids), an object missing part of the gymnax interface, or a space
            type other than Discrete/Box.
    """
    if isinstance(env, str):
        backend, sep, env_id = env.partition(":")
        if not sep:
            backend, env_id = "gymnax", env
        if backend not in BACKENDS:
            hint = (" (envpool and gymnasium backends belong to the async runtime, not yet available)"
                    if backend in ("envpool", "gymnasium") else "")
            raise ValueError(f"env={env!r}: unknown backend {backend!r}; allowed backends: {list(BACKENDS)}{hint}")
        known = _gymnax_ids()
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.4)
            raise ValueError(
                f"env={env!r}: unknown gymnax env id {env_id!r}; closest known ids: "
                f"{close or known[:5]} (all: gymnax.registered_envs)")
        import gymnax

        obj, params = gymnax.make(env_id)
        name = env_id
    else:
        missing = [a for a in ("reset", "step", "default_params", "observation_space", "action_space")
                   if not hasattr(env, a)]
        if missing:
            raise ValueError(
                f"env: object of type {type(env).__name__} is not a gymnax-style environment; missing "
                f"{missing}. Pass 'gymnax:<id>' or an object implementing the gymnax Environment API")
        backend, obj, params, name = "gymnax", env, env.default_params, type(env).__name__
    try:
        obs_space = from_gymnax_space(obj.observation_space(params))
        act_space = from_gymnax_space(obj.action_space(params))
    except TypeError as err:
        raise ValueError(f"env={name!r}: {err}") from None
    if not isinstance(obs_space, Box):
        raise ValueError(f"env={name!r}: observation space must be a Box, got {obs_space!r}")
    if np.dtype(obs_space.dtype).kind not in "fiub":
        raise ValueError(f"env={name!r}: observation dtype {obs_space.dtype} is not numeric")
    return EnvSpec(backend, name, obj, params, obs_space, act_space)
