"""PPO on the async TianJi runtime: gymnax actors on one device, the learner on another.

The actor and learner functions are the same ones Anakin fuses (:mod:`tianji_jax.runtime.ppo_parts`);
here they run in separate threads through :class:`~tianji_jax.runtime.async_runtime.AsyncRunner`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jax
import jax.numpy as jnp

from tianji_jax.config import PPOConfig
from tianji_jax.runtime.async_runtime import AsyncRunner
from tianji_jax.runtime.param_store import ParamStore
from tianji_jax.runtime.ppo_parts import LearnerState, PPOParts

__all__ = ["AsyncPPO", "placement"]

_JIT_CACHE: dict[Any, tuple[Any, Any, PPOParts]] = {}
_LOCK = threading.Lock()


def placement(devices: list | None = None) -> tuple[Any, Any]:
    """``(actor_device, learner_device)``: different devices when there are at least two
    (design.md section 3: on one device actor inference and learner updates serialise)."""
    devs = list(devices if devices is not None else jax.devices())
    return devs[0], devs[-1]


class AsyncPPO:
    """Wires PPO actors and a learner for one run.

    Args:
        config: a :class:`PPOConfig` with ``runtime='async'`` (not checked, so tests can reuse one).
        store: optional :class:`ParamStore` (fault injection in tests).

    Attributes:
        runner: the :class:`AsyncRunner`.
        timers: cumulative seconds ``rollout_s`` (inference + env step, fused on the actor device),
            ``h2d_s`` (params to the actor device and trajectories to the learner device) and
            ``update_s`` (learner update), guarded by ``timers_lock``.
        learner_state: the newest :class:`LearnerState` (read it after the run).
        obs_rms: actor 0's newest observation statistics (for evaluation).
    """

    def __init__(self, config: PPOConfig, store: ParamStore | None = None):
        from tianji_jax.runtime.anakin import compile_key

        self.config = config
        self.actor_device, self.learner_device = placement()
        key = compile_key(config)
        with _LOCK:
            if key not in _JIT_CACHE:
                parts = PPOParts(key)
                _JIT_CACHE[key] = (jax.jit(parts.rollout), jax.jit(parts.learn), parts)
            self._rollout, self._learn, self.parts = _JIT_CACHE[key]
        self.timers = {"rollout_s": 0.0, "h2d_s": 0.0, "update_s": 0.0}
        self.timers_lock = threading.Lock()
        k_actor, k_learner = self.parts.split_init_key(jax.random.PRNGKey(config.seed))
        self.learner_state: LearnerState = jax.device_put(self.parts.init_learner(k_learner), self.learner_device)
        actor_keys = [k_actor] + [jax.random.fold_in(k_actor, i) for i in range(1, config.num_actors)]
        self._actor_states = [jax.device_put(self.parts.init_actor(k), self.actor_device) for k in actor_keys]
        self.obs_rms = self._actor_states[0].obs_rms
        self.runner = AsyncRunner(
            actors=[self._make_actor(i) for i in range(config.num_actors)], learn=self._learn_item,
            initial_params=self.learner_state.params, num_updates=config.num_updates,
            item_steps=config.batch_size, schedule=config.schedule, max_policy_lag=config.policy_lag_bound,
            queue_batches=config.queue_batches, stall_timeout_s=config.stall_timeout_s, store=store)

    def describe_placement(self) -> str:
        """One line naming the devices chosen."""
        same = " (same device: acting and learning will serialise)" if self.actor_device == self.learner_device else ""
        return f"placement: actors on {self.actor_device}, learner on {self.learner_device}{same}"

    def _time(self, name: str, t0: float) -> None:
        with self.timers_lock:
            self.timers[name] += time.perf_counter() - t0

    def _make_actor(self, i: int):
        def act(params: Any, version: int):
            t0 = time.perf_counter()
            params = jax.device_put(params, self.actor_device)
            jax.block_until_ready(params)
            self._time("h2d_s", t0)
            t0 = time.perf_counter()
            state, traj = self._rollout(params, jnp.asarray(version, jnp.int32), self._actor_states[i])
            jax.block_until_ready(traj)
            self._time("rollout_s", t0)
            self._actor_states[i] = state
            if i == 0:
                self.obs_rms = state.obs_rms
            t0 = time.perf_counter()
            traj = jax.block_until_ready(jax.device_put(traj, self.learner_device))
            self._time("h2d_s", t0)
            return traj, self.config.batch_size
        return act

    def _learn_item(self, item, version: int):
        t0 = time.perf_counter()
        state, metrics = self._learn(self.learner_state, item.data)
        jax.block_until_ready(state.params)
        self._time("update_s", t0)
        self.learner_state = state
        return state.params, metrics
