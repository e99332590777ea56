"""Anakin mode for every registered algorithm: acting and learning fused into one compiled loop on
one device (Hessel et al. 2021, "Podracer architectures for scalable RL", the Anakin pattern).

``make_train(config)`` switches on the algorithm's data path, in this one place:

* **on-policy** (PPO, PQN, ...): an :class:`OnPolicyAnakin` around the config's
  :class:`~tianji_jax.algos.on_policy.OnPolicyAgent`; each update is the agent's rollout then its
  learn step on that trajectory;
* **replay** (the DQN family, SAC, ...): a :class:`ReplayAnakin` around the config's
  :class:`~tianji_jax.algos.replay_agent.ReplayAgent`; each iteration is the agent's rollout, the
  insert of its n-step transitions into the device-resident replay, then (once more than
  ``learning_starts`` env steps were taken) its learner block.

Both have ``init(key)`` building a train state and a call running a compiled chunk
``state -> (state, metrics)`` with every metric shaped ``(U,)``. Both are pure, so ``jax.vmap``
over seeds works on them. With ``num_learner_devices = L > 1`` one run's envs are sharded over
``L`` devices and its gradients averaged over them (:mod:`~tianji_jax.runtime.layouts.data_parallel`):
the program computes what the async ``sync`` schedule with ``L`` learner devices computes.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.caches import register
from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.algos.on_policy import ActorState, LearnerState, OnPolicyAgent
from tianji_jax.algos.on_policy_config import OnPolicyConfig
from tianji_jax.algos.registry import agent_class_for, algorithm_for
from tianji_jax.algos.replay_agent import ReplayActorState, ReplayAgent, ReplayLearnerState
from tianji_jax.algos.config_base import not_compiled
from tianji_jax.runtime.layouts import data_parallel

__all__ = ["OnPolicyTrainState", "OnPolicyAnakin", "PPOTrainState", "PPOAnakin", "ReplayTrainState", "ReplayAnakin",
           "DQNTrainState", "DQNAnakin", "make_train", "make_dqn_train", "compile_key", "shared_train", "make_agent",
           "one_device", "host_metrics"]


def _scan(step: Any, state: Any, length: int, active: jax.Array | None) -> tuple[Any, dict[str, jax.Array]]:
    """``length`` steps ``step(state, None) -> (state, metrics)`` in one ``lax.scan``; with
    ``active`` (an int32 scalar, traced) only the first ``active`` steps run and the others leave
    the state as it is with zero metrics, so a run's last, shorter chunk is the same compiled
    program as its full ones (no second compilation)."""
    if active is None:
        return jax.lax.scan(step, state, None, length=length)
    shapes = jax.eval_shape(step, state, None)[1]

    def masked(carry, i):
        return jax.lax.cond(i < active, lambda s: step(s, None),
                            lambda s: (s, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)), carry)

    return jax.lax.scan(masked, state, jnp.arange(length, dtype=jnp.int32))


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
        chunk: jitted ``(OnPolicyTrainState, active=None) -> (OnPolicyTrainState, metrics)``
            (``active``: an int32 scalar ``<= U``, run only the first ``active`` updates; the
            others return zero metrics; the host loop passes it for every chunk so that a run's
            last, shorter chunk reuses the compiled program); metrics is a dict of ``(U,)`` arrays: ``episode_return_sum``, ``episode_length_sum`` (float32) and
            ``episode_count`` (int32) over the episodes that ended during each update's rollout,
            ``policy_lag_mean`` / ``policy_lag_max`` (always 0 here), ``nonfinite_skips`` and the
            agent's loss metrics (PPO: those of :func:`~tianji_jax.algos.ppo.ppo_loss` plus
            ``grad_norm``).
        devices: the ``L`` devices of a data-parallel run, or None (one device). With ``L > 1``
            the actor state is sharded by env column, the learner state replicated, every
            update's gradients averaged over the devices; ``chunk`` then places its input state
            first (it is a function around the jitted program, not ``jax.vmap``-able).

    Raises:
        ValueError: ``updates_per_chunk`` is not an int ``>= 1``.
    """

    def __init__(self, agent: OnPolicyAgent, updates_per_chunk: int, devices: list | None = None):
        if isinstance(updates_per_chunk, bool) or not isinstance(updates_per_chunk, int) or updates_per_chunk < 1:
            raise ValueError(f"updates_per_chunk must be an int >= 1, got {updates_per_chunk!r}")
        self.agent = agent
        self.config = agent.config
        self.updates_per_chunk = updates_per_chunk
        self.devices = list(devices) if devices is not None and len(devices) > 1 else None
        self._learn = agent.learn
        if self.devices is None:
            self.init = jax.jit(self._init)
            self.chunk = jax.jit(self._chunk)
            return
        mesh = data_parallel.make_mesh(self.devices)
        self._learn = data_parallel.on_policy_learn(agent, mesh)
        self.sharding = OnPolicyTrainState(_actor_shardings(self.config, mesh), _replicated(mesh))
        self.init, self.chunk = _placed(self._init, self._chunk, self.sharding, _replicated(mesh), donate=False)

    def __call__(self, state: OnPolicyTrainState) -> tuple[OnPolicyTrainState, dict[str, jax.Array]]:
        """Run one compiled chunk of ``U`` updates (same as ``self.chunk``)."""
        return self.chunk(state)

    def _init(self, key: jax.Array) -> OnPolicyTrainState:
        k_actor, k_learner = self.agent.split_init_key(key)
        return OnPolicyTrainState(self.agent.init_actor(k_actor), self.agent.init_learner(k_learner))

    def _update(self, state: OnPolicyTrainState, _):
        # act: T steps of the N envs with the newest params
        actor, traj = self.agent.rollout(state.learner.params, state.learner.version, state.actor)
        # learn: one update on that trajectory (version + 1; data-parallel: gradients averaged)
        learner, metrics = self._learn(state.learner, traj)
        return OnPolicyTrainState(actor, learner), metrics

    def _chunk(self, state: OnPolicyTrainState, active: jax.Array | None = None):
        return _scan(self._update, state, self.updates_per_chunk, active)


PPOAnakin = OnPolicyAnakin
"""The name PPO's Anakin trainer had (kept for the public API)."""


@struct.dataclass
class ReplayTrainState:
    """Everything an Anakin replay run needs to continue (one seed; vmapped runs add a leading axis).

    Attributes:
        actor: :class:`~tianji_jax.algos.replay_agent.ReplayActorState` (envs, observations,
            n-step window, actor key, env steps taken); None after an async run on a host env backend.
        learner: :class:`~tianji_jax.algos.replay_agent.ReplayLearnerState` (online and target
            params, optimizer state, learner key, policy version, gradient steps).
        replay: the device-resident buffer (:class:`~tianji_jax.buffers.replay.ReplayState`, or DQN's
            frame replay for envpool Atari).
    """

    actor: ReplayActorState
    learner: ReplayLearnerState
    replay: Any

    @property
    def params(self) -> Any:
        """The online params."""
        return self.learner.params

    @property
    def obs_rms(self) -> Any:
        """The observation statistics evaluation acts with (``normalize_observations``), else None."""
        return self.learner.obs_rms

    @property
    def env_steps(self) -> jax.Array:
        """int32 env steps taken."""
        return self.actor.env_steps

    @property
    def update_count(self) -> jax.Array:
        """int32 policy version (learner blocks run)."""
        return self.learner.version


DQNTrainState = ReplayTrainState
"""DQN's train state (the replay train state; the name kept for the public API)."""


class ReplayAnakin:
    """Compiled Anakin run of a replay agent for one config. Build it with :func:`make_train`.

    Reads top to bottom: each iteration is the agent's rollout (``T = num_steps`` steps of the
    ``N`` envs, n-step transitions), their insert into replay, then, once more than
    ``learning_starts`` env steps were taken, its learner block of ``updates_per_step`` gradient
    updates; a chunk scans ``U`` iterations, donating the state so XLA updates the replay in place.

    Attributes:
        config: the config (a :class:`~tianji_jax.algos.replay_config.ReplayConfig` subclass).
        agent: the :class:`~tianji_jax.algos.replay_agent.ReplayAgent`.
        iterations_per_chunk: ``U``.
        init: jitted ``key -> ReplayTrainState``.
        chunk: jitted ``(ReplayTrainState, active=None) -> (ReplayTrainState, metrics)`` with the
            state donated (the old state's buffers are deleted) and ``active`` as for
            :class:`OnPolicyAnakin`; ``metrics`` is a dict of ``(U,)`` arrays, one
            entry per iteration: the rollout's ``episode_return_sum``, ``episode_length_sum``
            (float32), ``episode_count`` (int32) and the agent's exploration metric (DQN:
            ``epsilon``), ``acting_version`` (int32, the version the actor acted with),
            ``env_steps`` (int32 after the iteration), ``learned`` (bool: a learner block ran),
            ``gradient_steps`` (int32 updates in the iteration: 0 or ``updates_per_step``),
            ``replay_size`` (int32), and the learner's metrics (``grad_norm``,
            ``policy_lag_mean``, ``policy_lag_max``, ``nonfinite_skips`` and the agent's
            ``ROW_METRICS``; 0 where it did not learn).
        devices: the ``L`` devices of a data-parallel run, or None (one device). With ``L > 1``
            the replay is ``L`` shards of ``buffer_capacity / L`` stacked on a leading axis
            (:mod:`~tianji_jax.runtime.layouts.replay_sharded`: each device inserts its own env columns'
            transitions and samples ``batch_size / L`` from its shard), the actor state sharded by
            env column, the learner replicated; ``chunk`` places its input state first.

    Raises:
        ValueError: ``iterations_per_chunk`` is not an int ``>= 1``.
    """

    def __init__(self, agent: ReplayAgent, iterations_per_chunk: int, devices: list | None = None):
        from tianji_jax.runtime.layouts import replay_sharded

        if (isinstance(iterations_per_chunk, bool) or not isinstance(iterations_per_chunk, int)
                or iterations_per_chunk < 1):
            raise ValueError(f"iterations_per_chunk must be an int >= 1, got {iterations_per_chunk!r}")
        self.agent = agent
        self.config = agent.config
        self.iterations_per_chunk = iterations_per_chunk
        self.devices = list(devices) if devices is not None and len(devices) > 1 else None
        self._init_replay, self._insert, self._learn = agent.init_replay, agent.insert, agent.learn
        self._replay_size = agent.replay_size
        if self.devices is None:
            self.init = jax.jit(self._init)
            self.chunk = jax.jit(self._chunk, donate_argnums=0)
            return
        mesh, num = data_parallel.make_mesh(self.devices), len(self.devices)
        insert, self._learn = replay_sharded.block_fns(agent, mesh)
        self._init_replay = lambda: replay_sharded.init_sharded_replay(agent, num)
        self._insert = lambda rs, *data: insert(rs, *replay_sharded.split_by_env(data, self.config.num_envs, num))
        self._replay_size = lambda rs: jnp.sum(agent.replay_size(rs))
        self.sharding = ReplayTrainState(_actor_shardings(self.config, mesh), _replicated(mesh),
                                         data_parallel.shardings(mesh, jax.sharding.PartitionSpec("data")))
        self.init, self.chunk = _placed(self._init, self._chunk, self.sharding, _replicated(mesh), donate=True)

    def __call__(self, state: ReplayTrainState) -> tuple[ReplayTrainState, dict[str, jax.Array]]:
        """Run one compiled chunk of ``U`` iterations (same as ``self.chunk``; donates ``state``)."""
        return self.chunk(state)

    def _init(self, key: jax.Array) -> ReplayTrainState:
        agent = self.agent
        k_actor, k_learner = agent.split_init_key(key)
        return ReplayTrainState(agent.init_actor(k_actor), agent.init_learner(k_learner), self._init_replay())

    def _iteration(self, state: ReplayTrainState, _):
        agent, cfg, learner = self.agent, self.config, state.learner
        # act: T steps of the N envs with the newest params, n-step transitions
        actor, items, item_version, mask, stats = agent.rollout(agent.acting_params(learner), learner.version,
                                                                state.actor)
        # insert them into replay, stamped with the acting version (raw observations; normalisation's
        # statistics fold them in as they enter)
        rs = self._insert(state.replay, items, item_version, mask)
        learner = agent.observe(learner, items, mask)
        # learn: a block of updates_per_step gradient updates once learning started (version + 1)
        learn_now = actor.env_steps > cfg.learning_starts
        shapes = jax.eval_shape(self._learn, learner, rs, actor.env_steps)[2]
        learner, rs, learn_metrics = jax.lax.cond(
            learn_now, lambda op: self._learn(op[0], op[1], actor.env_steps),
            lambda op: (*op, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)), (learner, rs))
        metrics = {
            **stats,
            **learn_metrics,
            "acting_version": state.learner.version,
            "env_steps": actor.env_steps,
            "learned": learn_now,
            "gradient_steps": jnp.where(learn_now, cfg.updates_per_step, 0).astype(jnp.int32),
            "replay_size": self._replay_size(rs),
        }
        return ReplayTrainState(actor, learner, rs), metrics

    def _chunk(self, state: ReplayTrainState, active: jax.Array | None = None):
        return _scan(self._iteration, state, self.iterations_per_chunk, active)


DQNAnakin = ReplayAnakin
"""The name DQN's Anakin trainer had (kept for the public API)."""


def _replicated(mesh: Any) -> Any:
    """Every leaf replicated over ``mesh``."""
    return data_parallel.shardings(mesh, jax.sharding.PartitionSpec())


def _actor_shardings(config: Any, mesh: Any) -> Any:
    """The actor state's shardings: env axis over the mesh (found by shape), the rest replicated."""
    num = mesh.devices.size
    specs = data_parallel.actor_specs(config, lambda c: agent_class_for(c)(c), num)
    return data_parallel.shardings(mesh, specs)


def _placed(init: Any, chunk: Any, sharding: Any, replicated: Any, donate: bool) -> tuple[Any, Any]:
    """``(init, chunk)`` of a data-parallel Anakin run: the chunk jitted with the train state's
    shardings, first moving its input state onto them (a no-op for a state the program returned,
    one transfer for a restored one). ``init`` runs on the first device and then places its
    state: the same program replicated over two CPU devices was seen to stall forever in XLA's
    CPU runtime (SAC's learner init; no collective in it, no CPU used)."""
    first = jax.jit(init)
    compiled = jax.jit(chunk, out_shardings=(sharding, replicated), donate_argnums=0 if donate else ())

    def placed_init(key: Any) -> Any:
        return jax.device_put(first(key), sharding)

    def placed_chunk(state: Any, active: Any = None) -> tuple[Any, dict]:
        return compiled(jax.device_put(state, sharding), active)

    return placed_init, placed_chunk


_CACHE: dict[tuple[Any, int], OnPolicyAnakin | ReplayAnakin] = register({})
_CACHE_LOCK = threading.RLock()


def _on_policy(config: Any) -> bool:
    """The one switch on the data path (the algorithm registered for ``config``'s class).

    Raises:
        TypeError: no registered algorithm takes this config class.
    """
    return algorithm_for(config).data_path == "on_policy"


def compile_key(config: Any) -> Any:
    """``config`` with the fields that do not change compiled code (the ``run``, ``tianji`` and
    ``layout`` field groups: :func:`~tianji_jax.algos.config_base.not_compiled`) set to their defaults:
    equal keys share compiled functions. Host envs keep ``runtime='async'`` (the only runtime
    they allow). On-policy runs with learner groups or several processes key on one group's / the
    global learner's ``total_env_steps`` (their learning-rate annealing); multi-host replay runs
    key on the replay ratio per *local* env step (``replay_ratio * num_processes``), so a learner
    block runs ``updates_per_step`` of the global iteration; replay actors receive their
    exploration parameters as arguments, so ``num_actors`` does not enter a key."""
    runtime = "async" if config.env_spec.on_host else "anakin"  # host envs exist only in async
    multi = {}
    if _on_policy(config):
        if config.num_processes > 1:  # keep num_updates (learning-rate annealing) of the global batch
            multi = dict(num_processes=1, process_id=0, coordinator=None, heartbeat_timeout_s=60,
                         total_env_steps=config.num_updates * config.batch_size,
                         eval_every_env_steps=config.updates_per_chunk * config.batch_size)
        if config.num_learner_groups > 1:  # each group anneals its learning rate over its own updates
            multi = dict(total_env_steps=config.updates_per_group * config.batch_size,
                         eval_every_env_steps=config.updates_per_chunk * config.batch_size)
    elif config.num_processes > 1:  # a learner block runs the updates of every process's env steps
        multi = dict(replay_ratio=config.replay_ratio * config.num_processes)
    return config.replace(runtime=runtime, **{**not_compiled(config), **multi})


dqn_compile_key = compile_key  # the name DQN's had


def make_train(config: Any, updates_per_chunk: int | None = None) -> OnPolicyAnakin | ReplayAnakin:
    """Build (or fetch from the per-process cache) the compiled Anakin run of a config of any
    registered algorithm (:class:`PPOConfig`, :class:`DQNConfig`, ...).

    Args:
        config: a validated config (gymnax env) with ``runtime='anakin'``.
        updates_per_chunk: updates (on-policy) or iterations (replay) ``U`` per compiled call;
            default ``config.updates_per_chunk`` / ``config.iterations_per_chunk``.

    Returns:
        An :class:`OnPolicyAnakin` or :class:`ReplayAnakin` (its ``config`` has ``seed=0``: the
        seed enters through ``init``'s key); ``trainer.init(key)`` gives the state,
        ``trainer(state)`` runs ``U`` updates. Configs equal up to ``seed`` and ``stop_at_return``
        share one object, so a second run in a process (any seed) compiles nothing.

    Raises:
        ValueError: ``updates_per_chunk < 1``, or ``config.runtime`` is not ``'anakin'`` (the
            async runtime's actors and learner run through :func:`tianji_jax.train`).
        TypeError: ``config`` is not the config of a registered algorithm.

    Example::

        trainer = make_train(PPOConfig(), updates_per_chunk=3)
        states = jax.vmap(trainer.init)(jax.random.split(jax.random.key(0), 4))
        states, metrics = jax.vmap(trainer.chunk)(states)   # metrics: (4, 3) arrays
    """
    if getattr(config, "runtime", "anakin") != "anakin":
        raise ValueError(f"make_train builds the Anakin runtime only; got runtime={config.runtime!r}. Allowed: "
                         "runtime='anakin', or run the async runtime with tianji_jax.train(config)")
    return shared_train(config, updates_per_chunk)


def make_dqn_train(config: Any, iterations_per_chunk: int | None = None) -> ReplayAnakin:
    """:func:`make_train` under the name (and keyword) DQN's had: ``iterations_per_chunk`` is ``U``.

    Raises:
        ValueError / TypeError: as :func:`make_train`.
    """
    return make_train(config, iterations_per_chunk)


def shared_train(config: Any, updates_per_chunk: int | None = None) -> OnPolicyAnakin | ReplayAnakin:
    """:func:`make_train` for a config of any ``runtime``: the async runtime shares the Anakin
    trainer's networks, learner initialisation and evaluator (``tianji_jax.train`` builds them here).

    Raises:
        ValueError / TypeError: as :func:`make_train`, the runtime aside.
    """
    on_policy = _on_policy(config)
    u = updates_per_chunk
    if u is None:
        u = config.updates_per_chunk if on_policy else config.iterations_per_chunk
    devices = None  # data-parallel Anakin: the run's envs sharded over the first L devices
    if getattr(config, "runtime", "anakin") == "anakin" and getattr(config, "num_learner_devices", 1) > 1:
        devices = data_parallel.mesh_devices(config.num_learner_devices)
    key = (compile_key(config), u, None if devices is None else tuple(d.id for d in devices))
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = (OnPolicyAnakin if on_policy else ReplayAnakin)(make_agent(key[0]), u, devices)
        return _CACHE[key]


def one_device(config: Any) -> Any:
    """``config`` as loading, templating or evaluating its run needs it: a data-parallel Anakin
    run (``num_learner_devices > 1``) changes where it trains, not its state's shapes or its
    policy, so those need one device (a run trained on 4 devices loads and evaluates on 1)."""
    if getattr(config, "runtime", "anakin") == "anakin" and getattr(config, "num_learner_devices", 1) > 1:
        return config.replace(num_learner_devices=1)
    return config


_AGENTS: dict[Any, OnPolicyAgent | ReplayAgent] = register({})


def make_agent(config: Any) -> OnPolicyAgent | ReplayAgent:
    """The agent of ``config``'s registered algorithm for its compile key (one per key and
    process, shared by Anakin, the async learner and actors, and evaluation)."""
    key = compile_key(config)
    with _CACHE_LOCK:
        if key not in _AGENTS:
            _AGENTS[key] = agent_class_for(config)(key)
        return _AGENTS[key]


_INITS: dict[Any, tuple[Callable, Callable]] = register({})


def jitted_inits(config: Any) -> tuple[Callable, Callable]:
    """``(init_learner, init_actor)`` of ``config``'s agent, each jitted once per compile key: an
    async run's start-up builds its states with one compiled program each instead of dozens of
    op-by-op dispatches (each op its own compilation: about 1-2 s cold per run on CPU). The same
    values as the eager calls (Anakin's chunk runs them inside its own program)."""
    key = compile_key(config)
    with _CACHE_LOCK:
        if key not in _INITS:
            agent = make_agent(key)
            _INITS[key] = (jax.jit(agent.init_learner), jax.jit(agent.init_actor))
        return _INITS[key]


def host_metrics(metrics: dict[str, Any]) -> dict[str, np.ndarray]:
    """Move a chunk's metrics to host numpy arrays (one device-to-host transfer)."""
    return {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
