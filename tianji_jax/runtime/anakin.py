"""Anakin mode for every on-policy algorithm: rollout and update fused into one compiled loop on
one device.

``make_train(config)`` returns an :class:`OnPolicyAnakin` around the config's agent (PPO's
:class:`~tianji_jax.algos.ppo.agent.PPOAgent`, PQN's, or a registered one) whose ``init(key)``
builds a train state and whose call runs a compiled chunk of ``U`` updates: ``state -> (state,
metrics)`` with every metric shaped ``(U,)``. Both are pure, so ``jax.vmap`` over seeds works on
them (Hessel et al. 2021, "Podracer architectures for scalable RL", the Anakin pattern).
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np
from flax import struct

from tianji_jax.caches import register
from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.algos.on_policy import ActorState, LearnerState, OnPolicyAgent
from tianji_jax.algos.on_policy_config import OnPolicyConfig
from tianji_jax.algos.registry import agent_class_for
from tianji_jax.config_base import not_compiled

__all__ = ["OnPolicyTrainState", "OnPolicyAnakin", "PPOTrainState", "PPOAnakin", "make_train", "compile_key",
           "shared_train", "host_metrics"]


@struct.dataclass
class OnPolicyTrainState:
    """Everything an Anakin on-policy run needs to continue (one seed; vmapped runs add a leading axis).

    Attributes:
        actor: :class:`~tianji_jax.algos.on_policy.ActorState` (envs, observations, actor key,
            observation/reward statistics); None after an async run on a host env backend, whose
            env state lives in envpool/gymnasium.
        learner: :class:`~tianji_jax.algos.on_policy.LearnerState` (params, optimizer state,
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


PPOTrainState = OnPolicyTrainState
"""PPO's train state (the on-policy train state; the name kept for the public API)."""


class OnPolicyAnakin:
    """Compiled Anakin run of an on-policy agent for one config. Build it with :func:`make_train`.

    Reads top to bottom: each update is the agent's rollout (act + env step, ``T`` steps) then its
    learn step on that trajectory; a chunk scans ``U`` updates.

    Attributes:
        config: the config (an :class:`~tianji_jax.algos.on_policy_config.OnPolicyConfig`).
        agent: the :class:`~tianji_jax.algos.on_policy.OnPolicyAgent` (network, acting, learning).
        updates_per_chunk: ``U``, updates per call.
        init: jitted ``key -> OnPolicyTrainState``.
        chunk: jitted ``OnPolicyTrainState -> (OnPolicyTrainState, metrics)``; metrics is a dict of
            ``(U,)`` arrays: ``episode_return_sum``, ``episode_length_sum`` (float32) and
            ``episode_count`` (int32) over the episodes that ended during each update's rollout,
            ``policy_lag_mean`` / ``policy_lag_max`` (always 0 here), ``nonfinite_skips`` and the
            agent's loss metrics (PPO: those of :func:`~tianji_jax.algos.ppo.ppo_loss` plus
            ``grad_norm``).

    Raises:
        ValueError: ``updates_per_chunk`` is not an int ``>= 1``.
    """

    def __init__(self, agent: OnPolicyAgent, updates_per_chunk: int):
        if isinstance(updates_per_chunk, bool) or not isinstance(updates_per_chunk, int) or updates_per_chunk < 1:
            raise ValueError(f"updates_per_chunk must be an int >= 1, got {updates_per_chunk!r}")
        self.agent = agent
        self.config = agent.config
        self.updates_per_chunk = updates_per_chunk
        self.init = jax.jit(self._init)
        self.chunk = jax.jit(self._chunk)

    def __call__(self, state: OnPolicyTrainState) -> tuple[OnPolicyTrainState, dict[str, jax.Array]]:
        """Run one compiled chunk of ``U`` updates (same as ``self.chunk``)."""
        return self.chunk(state)

    def _init(self, key: jax.Array) -> OnPolicyTrainState:
        k_actor, k_learner = self.agent.split_init_key(key)
        return OnPolicyTrainState(self.agent.init_actor(k_actor), self.agent.init_learner(k_learner))

    def _update(self, state: OnPolicyTrainState, _):
        # act: T steps of the N envs with the newest params
        actor, traj = self.agent.rollout(state.learner.params, state.learner.version, state.actor)
        # learn: one update on that trajectory (version + 1)
        learner, metrics = self.agent.learn(state.learner, traj)
        return OnPolicyTrainState(actor, learner), metrics

    def _chunk(self, state: OnPolicyTrainState):
        return jax.lax.scan(self._update, state, None, length=self.updates_per_chunk)


PPOAnakin = OnPolicyAnakin
"""The name PPO's Anakin trainer had (kept for the public API)."""

_CACHE: dict[tuple[OnPolicyConfig, int], OnPolicyAnakin] = register({})
_CACHE_LOCK = threading.RLock()


def compile_key(config: OnPolicyConfig) -> OnPolicyConfig:
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


def make_train(config: OnPolicyConfig, updates_per_chunk: int | None = None) -> OnPolicyAnakin:
    """Build (or fetch from the per-process cache) the compiled Anakin run of an on-policy config
    (:class:`PPOConfig`, PQN's config, or a registered on-policy algorithm's).

    Args:
        config: a validated on-policy config (gymnax env).
        updates_per_chunk: updates ``U`` per compiled call; default ``config.updates_per_chunk``.

    Returns:
        An :class:`OnPolicyAnakin` (its ``config`` has ``seed=0``: the seed enters through ``init``'s key);
        ``trainer.init(key)`` gives the state, ``trainer(state)`` runs ``U``
        updates. Configs equal up to ``seed`` and ``stop_at_return`` share one
        object, so a second run in a process (any seed) compiles nothing.

    Raises:
        ValueError: ``updates_per_chunk < 1``, or ``config.runtime`` is not ``'anakin'`` (the async
            runtime's actors and learner run through :func:`tianji_jax.train`).
        TypeError: ``config`` is not an on-policy config of a registered algorithm.

    Example::

        trainer = make_train(PPOConfig(), updates_per_chunk=3)
        states = jax.vmap(trainer.init)(jax.random.split(jax.random.key(0), 4))
        states, metrics = jax.vmap(trainer.chunk)(states)   # metrics: (4, 3) arrays
    """
    if isinstance(config, OnPolicyConfig) and config.runtime != "anakin":
        raise ValueError(f"make_train builds the Anakin runtime only; got runtime={config.runtime!r}. Allowed: "
                         "runtime='anakin', or run the async runtime with tianji_jax.train(config)")
    return shared_train(config, updates_per_chunk)


def shared_train(config: OnPolicyConfig, updates_per_chunk: int | None = None) -> OnPolicyAnakin:
    """:func:`make_train` for a config of any ``runtime``: the async runtime shares the Anakin
    trainer's network, learner initialisation and evaluator (``tianji_jax.train`` builds them here).

    Raises:
        ValueError / TypeError: as :func:`make_train`, the runtime aside.
    """
    if not isinstance(config, OnPolicyConfig):
        raise TypeError(f"config must be an on-policy config (PPOConfig, PQNConfig, ...), got {type(config).__name__}")
    u = config.updates_per_chunk if updates_per_chunk is None else updates_per_chunk
    key = (compile_key(config), u)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = OnPolicyAnakin(make_agent(key[0]), u)
        return _CACHE[key]


_AGENTS: dict[OnPolicyConfig, OnPolicyAgent] = register({})


def make_agent(config: OnPolicyConfig) -> OnPolicyAgent:
    """The agent of ``config``'s registered algorithm for its compile key (one per key and
    process, shared by Anakin, the async learner and actors, and evaluation)."""
    key = compile_key(config)
    with _CACHE_LOCK:
        if key not in _AGENTS:
            _AGENTS[key] = agent_class_for(config)(key)
        return _AGENTS[key]


def host_metrics(metrics: dict[str, Any]) -> dict[str, np.ndarray]:
    """Move a chunk's metrics to host numpy arrays (one device-to-host transfer)."""
    return {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
