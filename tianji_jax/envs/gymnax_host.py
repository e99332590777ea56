"""Device envs (gymnax, the JAX suites, brax) behind the host env API, for actors that step envs on the
host: Ray actor processes (``actor_backend='ray'`` with a gymnax id) drive their envs through
:class:`GymnaxHostVecEnv` as they drive envpool and gymnasium envs.

The envs stay JAX programs (one jitted, vmapped step of all ``N`` envs on the process's CPU device);
what changes is the contract around them. Host backends reset a finished env on its *next* step
(that step is not a transition: ``valid=False``); gymnax resets inside the step that ends the
episode and returns the true successor in ``info["final_observation"]``. :class:`GymnaxHostVecEnv`
gives the host contract exactly: a step that ends an episode returns the true final observation as
``obs`` (and ``final_obs``); the env's next step ignores its action, leaves its state as gymnax reset
it, and returns the new episode's first observation with ``valid=False``, reward 0 and neither flag
set. So the host actors' chunker and episode statistics see what they see from envpool.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.envs.gymnax_env import GymnaxVecEnv
from tianji_jax.envs.host_common import HostStep, _check_num_envs, _EpisodeTracker, _HostVecEnv
from tianji_jax.envs.spaces import Box, Discrete

__all__ = ["GymnaxHostVecEnv"]


def _where_rows(rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """``a`` where ``rows`` ``(N,)`` is True, else ``b`` (leaves with leading axis ``N``)."""
    return jnp.where(rows.reshape((-1,) + (1,) * (jnp.ndim(b) - 1)), a, b)


class GymnaxHostVecEnv(_HostVecEnv):
    """``num_envs`` copies of a device env (a resolved non-host :class:`~tianji_jax.envs.registry.EnvSpec`)
    with the :meth:`reset` / :meth:`step` API and next-step auto-reset of
    :class:`~tianji_jax.envs.host.EnvpoolVecEnv` in sync mode (see the module docstring).

    Args:
        spec: the env (gymnax, a JAX suite or brax; its device wrappers included).
        num_envs: ``N >= 1``.
        seed: the first :meth:`reset` draws the envs' keys from ``PRNGKey(seed)``; each step splits
            the key it carries.
        device: where the envs run (default: the first CPU device).

    Attributes:
        observation_space, action_space, num_envs, batch_size (``= num_envs``), is_async (False),
        env_id (the spec's name).

    Raises:
        ValueError: ``num_envs < 1``, or an action space other than Discrete / Box (the host API's;
            MultiDiscrete envs run on device actors only).
    """

    def __init__(self, spec: Any, num_envs: int, seed: int = 0, device: Any = None):
        self.num_envs = _check_num_envs(num_envs)
        self.batch_size, self.is_async, self.env_id = self.num_envs, False, spec.name
        if not isinstance(spec.action_space, (Discrete, Box)):
            raise ValueError(f"env {spec.name!r}: actors on the host take Discrete and Box action spaces, got "
                             f"{spec.action_space!r} (run it with actor_backend='threads')")
        self.observation_space, self.action_space = spec.observation_space, spec.action_space
        self._vec = GymnaxVecEnv(spec, self.num_envs)
        self._device = device if device is not None else jax.devices("cpu")[0]
        self._key = jax.device_put(jax.random.PRNGKey(int(seed) % 2**32), self._device)
        self._tracker = _EpisodeTracker(self.num_envs)
        self._all = np.arange(self.num_envs, dtype=np.int32)
        self._reset = jax.jit(self._vec.reset)
        self._step = jax.jit(self._step_all)
        self._state = self._first = self._pending = None
        self._closed = False

    def _step_all(self, key: jax.Array, state: Any, first: jax.Array, pending: jax.Array, action: jax.Array):
        """One step of every env; ``pending`` envs (done at the previous step, already reset by
        gymnax) keep their state and show ``first`` (their new first observation)."""
        new, ts = self._vec.step(key, state, action)
        done = (ts.terminated | ts.truncated) & ~pending
        state = jax.tree.map(lambda old, nxt: _where_rows(pending, old, nxt), state, new)
        obs = _where_rows(pending, first, _where_rows(done, ts.final_obs, ts.obs))
        first = _where_rows(pending, first, ts.obs)  # a done env's new first observation, shown next step
        return (state, obs, first, jnp.where(pending, 0.0, ts.reward), ts.terminated & ~pending,
                ts.truncated & ~pending, done)

    def reset(self) -> HostStep:
        """Reset all envs and return their first observations (every row ``valid=False``).

        Raises:
            RuntimeError: the env is closed.
        """
        if self._closed:
            raise RuntimeError(f"GymnaxHostVecEnv({self.env_id!r}) is closed")
        self._key, key = jax.random.split(self._key)
        self._state, obs = self._reset(key)
        self._first, self._pending = obs, jnp.zeros((self.num_envs,), bool)
        self._tracker.restart()
        n = self.num_envs
        zeros = np.zeros(n, bool)
        return self._make_step(self._all, np.asarray(obs), np.zeros(n, np.float32), zeros, zeros, np.zeros(n),
                               np.ones(n, bool))

    def step(self, actions: Any, env_id: Any = None) -> HostStep:
        """Act for all envs and return all of them (rows in env id order).

        Args:
            actions: ``(N,)`` int (Discrete) or ``(N, *action_shape)`` float (Box), row ``i`` for
                env ``env_id[i]``.
            env_id: ``None`` (= ``0..N-1``) or any permutation of ``0..N-1``.

        Raises:
            RuntimeError: :meth:`reset` not called yet, or the env is closed.
            ValueError: ``env_id`` is not a permutation of all env ids, or bad actions.
        """
        if self._closed:
            raise RuntimeError(f"GymnaxHostVecEnv({self.env_id!r}) is closed")
        if self._state is None:
            raise RuntimeError("step() before reset(): call reset() first")
        ids = self._all if env_id is None else self.check_env_id(env_id, self._all)
        acts = self.check_actions(actions, self.num_envs)
        ordered = np.empty_like(acts)
        ordered[ids] = acts
        self._key, key = jax.random.split(self._key)
        self._state, obs, self._first, reward, term, trunc, done = self._step(
            key, self._state, self._first, self._pending, jax.device_put(ordered, self._device))
        self._pending = done
        obs, reward, term, trunc = jax.device_get((obs, reward, term, trunc))
        return self._make_step(self._all, np.asarray(obs), reward, term, trunc, reward, np.ones(self.num_envs, bool))

    def close(self) -> None:
        """Release the envs (idempotent)."""
        self._closed = True
        self._state = self._first = self._pending = None
