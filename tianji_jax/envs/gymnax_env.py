"""gymnax environments vectorised over ``N`` envs, as pure functions that jit, vmap and scan.

This is the device-side implementation of the env protocol of :mod:`tianji_jax.envs.core`:
``reset(key) -> (state, obs)`` and ``step(key, state, action) -> (state, Timestep)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.envs.core import DeviceEnvSpec, Timestep
from tianji_jax.envs.spaces import Discrete, MultiDiscrete

__all__ = ["GymnaxVecEnv", "VecEnvState"]


@struct.dataclass
class VecEnvState:
    """State of ``N`` gymnax envs plus the running statistics of their current episodes.

    Attributes:
        env_state: the gymnax state pytree, every leaf with leading axis ``N``.
        episode_return: ``(N,)`` float32, undiscounted return of the current episode so far.
        episode_length: ``(N,)`` int32, env steps of the current episode so far.
    """

    env_state: object
    episode_return: jax.Array
    episode_length: jax.Array


class GymnaxVecEnv:
    """``num_envs`` copies of a gymnax env with auto-reset and per-episode statistics.

    gymnax >= 1.0 auto-resets inside ``step`` and returns the true successor observation in
    ``info["final_observation"]``; ``terminated`` and ``truncated`` come separately. Episode return
    and length accumulators are zeroed whenever either is set, so they never carry over a reset.

    Args:
        spec: a resolved device env (:class:`~tianji_jax.envs.core.DeviceEnvSpec`: the registry's
            :class:`~tianji_jax.envs.registry.EnvSpec` of a gymnax, suite or brax id).
        num_envs: ``N >= 1``.

    Raises:
        ValueError: ``num_envs < 1``.
    """

    def __init__(self, spec: DeviceEnvSpec, num_envs: int):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.spec = spec
        self.num_envs = int(num_envs)
        self.observation_space = spec.observation_space
        self.action_space = spec.action_space

    def reset(self, key: jax.Array) -> tuple[VecEnvState, jax.Array]:
        """Reset all envs.

        Args:
            key: a PRNG key.

        Returns:
            ``(state, obs)`` with ``obs`` shaped ``(N, *obs_shape)``.
        """
        keys = jax.random.split(key, self.num_envs)
        obs, env_state = jax.vmap(self.spec.env.reset, in_axes=(0, None))(keys, self.spec.env_params)
        zeros = jnp.zeros((self.num_envs,), jnp.float32)
        return VecEnvState(env_state, zeros, jnp.zeros((self.num_envs,), jnp.int32)), obs

    def check_action(self, action: jax.Array) -> None:
        """Check an action batch's shape and dtype (static, at trace time).

        Raises:
            ValueError: ``action`` is not shaped ``(N, *action_shape)`` or has the wrong dtype kind
                (integer for Discrete and MultiDiscrete, floating for Box); the message gives what was
                expected.
        """
        want = (self.num_envs, *self.action_space.shape)
        kind = "integer" if isinstance(self.action_space, (Discrete, MultiDiscrete)) else "floating"
        shape = tuple(np.shape(action))
        dtype = jnp.asarray(action).dtype if not hasattr(action, "dtype") else action.dtype
        ok_dtype = (jnp.issubdtype(dtype, jnp.integer) if kind == "integer"
                    else jnp.issubdtype(dtype, jnp.floating))
        if shape != want or not ok_dtype:
            raise ValueError(
                f"action: expected shape {want} and {kind} dtype for {self.action_space!r} with "
                f"num_envs={self.num_envs}, got shape {shape} dtype {dtype}")

    def step(self, key: jax.Array, state: VecEnvState, action: jax.Array) -> tuple[VecEnvState, Timestep]:
        """Step all envs once (auto-resetting the finished ones).

        Args:
            key: a PRNG key.
            state: the current :class:`VecEnvState`.
            action: ``(N,)`` int for Discrete, ``(N, len(nvec))`` int for MultiDiscrete or
                ``(N, action_dim)`` float for Box.

        Returns:
            ``(state, timestep)``; see :class:`~tianji_jax.envs.core.Timestep` for shapes.

        Raises:
            ValueError: bad action shape/dtype (see :meth:`check_action`), or an env whose reward
                is not one number per env.
        """
        self.check_action(action)
        keys = jax.random.split(key, self.num_envs)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(
            self.spec.env.step, in_axes=(0, 0, 0, None))(keys, state.env_state, action, self.spec.env_params)
        if reward.size != self.num_envs:
            raise ValueError(f"env {self.spec.name}: reward must hold one number per env, got shape "
                             f"{reward.shape} for num_envs={self.num_envs}")
        reward = jnp.reshape(reward, (self.num_envs,)).astype(jnp.float32)
        terminated = jnp.reshape(terminated, (self.num_envs,)).astype(bool)
        truncated = jnp.reshape(truncated, (self.num_envs,)).astype(bool)
        done = terminated | truncated
        ep_ret = state.episode_return + reward
        ep_len = state.episode_length + 1
        timestep = Timestep(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=info["final_observation"],
            episode_return=jnp.where(done, ep_ret, 0.0),
            episode_length=jnp.where(done, ep_len, 0),
        )
        new_state = VecEnvState(env_state, jnp.where(done, 0.0, ep_ret), jnp.where(done, 0, ep_len))
        return new_state, timestep
