"""The env protocol every backend implements (gymnax on device now; envpool/gymnasium on host later).

A vectorised env of ``N`` envs exposes ``observation_space`` and ``action_space`` (one env's, see
:mod:`tianji_jax.envs.spaces`), ``num_envs``, ``reset(key) -> (state, obs)`` and
``step(key, state, action) -> (state, Timestep)``. Auto-reset happens inside ``step``: ``obs`` is
what the policy acts on next, ``final_obs`` is the true successor of this step (equal to ``obs``
unless the episode ended), so truncation can bootstrap from it.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct

__all__ = ["Timestep", "DeviceEnvSpec"]


class DeviceEnvSpec(Protocol):
    """What a device vector env needs of a resolved env (the registry's
    :class:`~tianji_jax.envs.registry.EnvSpec` has it): the env and its params, one env's spaces
    and a name for messages.

    Attributes:
        name: the env's id, as messages name it.
        env: a gymnax-style env object (``reset(key, params)``, ``step(key, state, action, params)``).
        env_params: its params pytree.
        observation_space: one env's observation space (:mod:`tianji_jax.envs.spaces`).
        action_space: one env's action space.
    """

    name: str
    env: Any
    env_params: Any
    observation_space: Any
    action_space: Any


@struct.dataclass
class Timestep:
    """One vectorised env step. ``N`` = number of envs.

    Attributes:
        obs: ``(N, *obs_shape)`` observation to act on next (after auto-reset).
        reward: ``(N,)`` float32 reward of this step, always one number per env.
        terminated: ``(N,)`` bool, the episode reached a terminal state (no bootstrap).
        truncated: ``(N,)`` bool, the episode was cut by a time limit (bootstrap from ``final_obs``).
            Where both are set, termination wins.
        final_obs: ``(N, *obs_shape)`` true successor observation of this step.
        episode_return: ``(N,)`` float32 undiscounted return of the episode that ended at this step
            (0 where none ended).
        episode_length: ``(N,)`` int32 length in env steps of the episode that ended (0 where none).
    """

    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array

    @property
    def done(self) -> jax.Array:
        """``(N,)`` bool, ``terminated | truncated``: an episode ended at this step."""
        return self.terminated | self.truncated
