"""Anakin mode: act, env step, GAE and PPO update fused into one compiled loop on one device.

``make_train(config)`` returns a :class:`PPOAnakin` whose ``init(key)`` builds a train state and
whose call runs a compiled chunk of ``U`` updates: ``state -> (state, metrics)`` with every metric
shaped ``(U,)``. Both are pure, so ``jax.vmap`` over seeds works on them (Hessel et al. 2021,
"Podracer architectures for scalable RL", the Anakin pattern).
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np
from flax import struct

from tianji_jax.caches import register
from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.config import PPOConfig
from tianji_jax.config_base import not_compiled
from tianji_jax.runtime.ppo_parts import ActorState, LearnerState, PPOParts, make_network

__all__ = ["PPOTrainState", "PPOAnakin", "make_train", "make_network"]


@struct.dataclass
class PPOTrainState:
    """Everything an Anakin PPO run needs to continue (one seed; vmapped runs add a leading axis).

    Attributes:
        actor: :class:`~tianji_jax.runtime.ppo_parts.ActorState` (envs, observations, actor key,
            observation/reward statistics); None after an async run on a host env backend, whose
            env state lives in envpool/gymnasium.
        learner: :class:`~tianji_jax.runtime.ppo_parts.LearnerState` (params, optimizer state,
            learner key, policy version = updates done).
    """

    actor: ActorState
    learner: LearnerState

    @property
    def params(self) -> Any:
        """The network params."""
        return self.learner.params

    @property
    def obs_rms(self) -> RunningMeanStd:
        """Running observation statistics (None for a host-env async run, which has none)."""
        return self.actor.obs_rms if self.actor is not None else None

    @property
    def reward_scaler(self) -> RewardScaler:
        """Discounted-return statistics used for reward scaling (None for a host-env async run)."""
        return self.actor.reward_scaler if self.actor is not None else None

    @property
    def update_count(self) -> jax.Array:
        """int32 updates done (the policy version)."""
        return self.learner.version


class PPOAnakin(PPOParts):
    """Compiled Anakin PPO for one config. Build it with :func:`make_train`.

    Attributes:
        config: the :class:`PPOConfig`.
        updates_per_chunk: ``U``, updates per call.
        init: jitted ``key -> PPOTrainState``.
        chunk: jitted ``PPOTrainState -> (PPOTrainState, metrics)``; metrics is a dict of ``(U,)``
            arrays: ``episode_return_sum``, ``episode_length_sum`` (float32) and ``episode_count``
            (int32) over the episodes that ended during each update's rollout, ``policy_lag_mean``
            / ``policy_lag_max`` (always 0 here), and the loss metrics of
            :func:`~tianji_jax.algos.ppo.ppo_loss` plus ``grad_norm``.

    Raises:
        ValueError: ``updates_per_chunk`` is not an int ``>= 1``.
    """

    def __init__(self, config: PPOConfig, updates_per_chunk: int):
        if isinstance(updates_per_chunk, bool) or not isinstance(updates_per_chunk, int) or updates_per_chunk < 1:
            raise ValueError(f"updates_per_chunk must be an int >= 1, got {updates_per_chunk!r}")
        super().__init__(config)
        self.updates_per_chunk = updates_per_chunk
        self.init = jax.jit(self._init)
        self.chunk = jax.jit(self._chunk)

    def __call__(self, state: PPOTrainState) -> tuple[PPOTrainState, dict[str, jax.Array]]:
        """Run one compiled chunk of ``U`` updates (same as ``self.chunk``)."""
        return self.chunk(state)

    def _init(self, key: jax.Array) -> PPOTrainState:
        k_actor, k_learner = self.split_init_key(key)
        return PPOTrainState(self.init_actor(k_actor), self.init_learner(k_learner))

    def _update(self, state: PPOTrainState, _):
        actor, traj = self.rollout(state.learner.params, state.learner.version, state.actor)
        learner, metrics = self.learn(state.learner, traj)
        return PPOTrainState(actor, learner), metrics

    def _chunk(self, state: PPOTrainState):
        return jax.lax.scan(self._update, state, None, length=self.updates_per_chunk)


_CACHE: dict[tuple[PPOConfig, int], PPOAnakin] = register({})
_CACHE_LOCK = threading.Lock()


def compile_key(config: PPOConfig) -> PPOConfig:
    """``config`` with the fields that do not change compiled code (the ``run``, ``tianji`` and
    ``layout`` field groups: :func:`~tianji_jax.config_base.not_compiled`) set to their defaults:
    equal keys share compiled functions. With learner groups or several processes the key is one
    group's / the global learner's (``total_env_steps`` of its own updates)."""
    runtime = "async" if config.env_spec.on_host else "anakin"  # host envs exist only in async
    multi = {}
    if config.num_processes > 1:  # keep num_updates (learning-rate annealing) of the global batch
        multi = dict(num_processes=1, process_id=0, coordinator=None, heartbeat_timeout_s=60,
                     total_env_steps=config.num_updates * config.batch_size,
                     eval_every_env_steps=config.updates_per_chunk * config.batch_size)
    if config.num_learner_groups > 1:  # each group anneals its learning rate over its own updates
        multi = dict(total_env_steps=config.updates_per_group * config.batch_size,
                     eval_every_env_steps=config.updates_per_chunk * config.batch_size)
    return config.replace(runtime=runtime, **{**not_compiled(config), **multi})


def make_train(config: PPOConfig, updates_per_chunk: int | None = None) -> PPOAnakin:
    """Build (or fetch from the per-process cache) the compiled Anakin PPO for ``config``.

    Args:
        config: a validated :class:`PPOConfig` (gymnax env).
        updates_per_chunk: updates ``U`` per compiled call; default ``config.updates_per_chunk``.

    Returns:
        A :class:`PPOAnakin` (its ``config`` has ``seed=0``: the seed enters through ``init``'s key);
        ``trainer.init(key)`` gives the state, ``trainer(state)`` runs ``U``
        updates. Configs equal up to ``seed`` and ``stop_at_return`` share one
        object, so a second run in a process (any seed) compiles nothing.

    Raises:
        ValueError: ``updates_per_chunk < 1``, or ``config.runtime`` is not ``'anakin'`` (the async
            runtime's actors and learner run through :func:`tianji_jax.train`).
        TypeError: ``config`` is not a :class:`PPOConfig`.

    Example::

        trainer = make_train(PPOConfig(), updates_per_chunk=3)
        states = jax.vmap(trainer.init)(jax.random.split(jax.random.key(0), 4))
        states, metrics = jax.vmap(trainer.chunk)(states)   # metrics: (4, 3) arrays
    """
    if isinstance(config, PPOConfig) and config.runtime != "anakin":
        raise ValueError(f"make_train builds the Anakin runtime only; got runtime={config.runtime!r}. Allowed: "
                         "runtime='anakin', or run the async runtime with tianji_jax.train(config)")
    return shared_train(config, updates_per_chunk)


def shared_train(config: PPOConfig, updates_per_chunk: int | None = None) -> PPOAnakin:
    """:func:`make_train` for a config of any ``runtime``: the async runtime shares the Anakin
    trainer's network, learner initialisation and evaluator (``tianji_jax.train`` builds them here).

    Raises:
        ValueError / TypeError: as :func:`make_train`, the runtime aside.
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    u = config.updates_per_chunk if updates_per_chunk is None else updates_per_chunk
    key = (compile_key(config), u)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = PPOAnakin(key[0], u)
        return _CACHE[key]


def host_metrics(metrics: dict[str, Any]) -> dict[str, np.ndarray]:
    """Move a chunk's metrics to host numpy arrays (one device-to-host transfer)."""
    return {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
