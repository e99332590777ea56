"""The env protocol every backend implements (gymnax on device now; envpool/gymnasium on host later).

A vectorised env of ``N`` envs exposes ``observation_space`` and ``action_space`` (one env's, see
:mod:`tianji_jax.envs.spaces`), ``num_envs``, ``reset(key) -> (state, obs)`` and
``step(key, state, action) -> (state, Timestep)``. Auto-reset happens inside ``step``: ``obs`` is
what the policy acts on next, ``final_obs`` is the true successor of this step (equal to ``obs``
unless the episode ended), so truncation can bootstrap from it.
"""

from __future__ import annotations

import jax
from flax import struct

__all__ = ["Timestep"]


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
