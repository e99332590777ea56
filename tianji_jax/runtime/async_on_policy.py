"""Every on-policy algorithm on the async TianJi runtime: actors on one device, the learner on
another (the on-policy data path: a consume-once trajectory queue with the lag gate at
consumption).

The config's registered agent (:class:`~tianji_jax.algos.on_policy.OnPolicyAgent`: PPO, PQN, ...)
supplies the functions; gymnax actors run the same rollout Anakin fuses on their
device; envpool/gymnasium actors (:class:`~tianji_jax.runtime.actors.host_actor.HostActor`) step the host
env and run only the policy on their device. Either way they run in separate threads from the
learner through :class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tianji_jax.algos.on_policy import LearnerState, OnPolicyAgent
from tianji_jax.algos.on_policy_config import OnPolicyConfig
from tianji_jax.caches import register
from tianji_jax.runtime.layouts import data_parallel
from tianji_jax.runtime.tianji.async_runtime import AsyncRunner, PhaseTimers, RunnerHooks
from tianji_jax.runtime.tianji.auto_schedule import AutoBalancer
from tianji_jax.runtime.actors.host_actor import HostActor, host_policy, params_to_actor
from tianji_jax.runtime.actors.host_normalize import SharedStatistics
from tianji_jax.runtime.layouts.learner_groups import ParamAverager, is_sync_point
from tianji_jax.runtime.tianji.param_store import ParamStore
from tianji_jax.runtime.tianji.scheduled import ScheduledRunner
from tianji_jax.buffers.schedule_file import ScheduleRecorder, load_schedule

__all__ = ["AsyncOnPolicy", "placement", "resume_seed"]

_JIT_CACHE: dict[Any, tuple[Any, Any, Any, OnPolicyAgent]] = register({})
_LOCK = threading.Lock()


def placement(devices: list | None = None, num_learner_devices: int = 1,
              num_learner_groups: int = 1) -> tuple[Any, list]:
    """``(actor_device, learner_devices)``: actors on the first device, the learner(s) on the last
    ``num_learner_devices * num_learner_groups`` (disjoint from the actors' when there are enough
    devices; docs/runtime.md, "Placement": on one device actor inference and learner updates serialise).

    Raises:
        ValueError: more learner devices asked for than there are devices.
    """
    devs = list(devices if devices is not None else jax.devices())
    need = num_learner_devices * num_learner_groups
    if need > len(devs):
        what = (f"num_learner_devices={num_learner_devices}" if num_learner_groups == 1 else
                f"num_learner_groups={num_learner_groups} x num_learner_devices={num_learner_devices}")
        raise ValueError(
            f"{what}: needs {need} devices, only {len(devs)} {devs[0].platform} device(s); allowed "
            f"1..{len(devs)} learner devices in all (on CPU, start Python with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N or set jax_num_cpu_devices before JAX starts)")
    return devs[0], devs[len(devs) - need:]


def resume_seed(seed: int, env_steps: int, process: int = 0) -> int:
    """Base seed of host (envpool/gymnasium) envs in a run resumed at ``env_steps``: their C++
    state is not checkpointed, so they restart from fresh episodes seeded from the run's ``seed``
    and the resume point (never the run's original seeds, so no episode is replayed), in
    [0, 2**31); ``process`` > 0 (multi-host) gives each process its own."""
    entropy = [int(seed), int(env_steps)] + ([int(process)] if process else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0]) % 2**31


def _distributed(config: OnPolicyConfig):
    """The multi-host module, after checking this process joined the job ``config`` describes."""
    from tianji_jax.runtime.layouts import distributed as dist

    if not dist.is_initialized() or (dist.process_count(), dist.process_index()) != (config.num_processes,
                                                                                      config.process_id):
        raise ValueError(
            f"num_processes={config.num_processes}, process_id={config.process_id}: this process has not joined "
            "that jax.distributed job; call tianji_jax.runtime.layouts.distributed.initialize(coordinator, num_processes, "
            "process_id) before JAX starts (tianji train does it for --num-processes)")
    return dist


class AsyncOnPolicy:
    """Wires the actors and the learner(s) of an on-policy algorithm for one run.

    Args:
        config: an on-policy config (:class:`~tianji_jax.config.PPOConfig`, PQN's, ...) with
            ``runtime='async'`` (not checked, so tests can reuse one).
        store: optional :class:`ParamStore` (fault injection in tests).
        restore: continue a run from a checkpoint cut (:meth:`cut`): a dict with ``"learner"``
            (a :class:`LearnerState`), ``"actors"`` (one :class:`ActorState` per actor for gymnax
            actors; None for host actors), ``"counters"`` (the cut's counters) and
            ``"env_steps"`` (env steps of the checkpoint). Host actors cannot restore the C++ env
            state of envpool/gymnasium: they re-seed their envs with :func:`resume_seed` of the
            run seed and ``env_steps`` (a resumed run does not replay the episodes it began
            with), fold ``env_steps`` into their PRNG key, and reset; episodes in progress at the
            checkpoint are lost.

    Learner groups (``config.num_learner_groups`` G > 1): G learner states, one per device of
    the last G devices (:attr:`group_devices`), all starting from the same params (PRNG keys
    folded with the group index); actor ``i`` feeds group ``i % G``; after an update at a sync
    point (:func:`~tianji_jax.runtime.layouts.learner_groups.is_sync_point`) a group waits for the
    others and continues from the mean params (:class:`ParamAverager`; optimizer states stay per
    group). The time a group waits there counts in ``update_s``.

    Multi-host (``num_processes > 1``): ``restore`` is this process's: the learner state of the
    checkpoint (identical on every process), its own actors and counters (its part of the cut),
    host envs re-seeded per process.

    ``record_to`` (with ``config.record_schedule``): the file the run's schedule is recorded in
    (a :class:`~tianji_jax.buffers.schedule_file.ScheduleRecorder`, closed by :meth:`close`).

    Raises:
        ValueError: ``restore`` for a run with learner groups (not supported yet), or actor
            states that do not match ``num_actors``.

    Attributes:
        runner: the :class:`AsyncRunner`, built with its hooks (:class:`RunnerHooks`: the row
            snapshot, the schedule recorder, the ``auto`` balancer, multi-host lockstep).
        learner_states: per learner group, its newest :class:`LearnerState` (one entry without
            groups); :attr:`learner_state` is group 0's.
        averager: the :class:`ParamAverager` of the learner groups (None without groups).
        timers: cumulative seconds ``rollout_s`` (inference + env step, fused on the actor device),
            ``h2d_s`` (params to the actor device and trajectories to the learner device) and
            ``update_s`` (learner update): a :class:`~tianji_jax.runtime.tianji.async_runtime.PhaseTimers`.
        obs_rms: actor 0's newest observation statistics (gymnax actors); the run's shared
            statistics with host actors that normalise (None without normalisation).
        host_norm: host actors with ``normalize_observations`` / ``scale_rewards``: the run's
            :class:`~tianji_jax.runtime.actors.host_normalize.SharedStatistics`, merged from every
            trajectory as it is produced (:meth:`to_learner`) and published with the params (the actors receive
            ``(params, statistics)``; several processes exchange theirs after each update, before the
            publication, so all publish the same); ``restore["norm"]`` (a
            :class:`~tianji_jax.runtime.actors.host_normalize.HostNormStats`) continues them. None otherwise.
        consumed_actor_states: per actor, its :class:`ActorState` right after its newest rollout
            the learner consumed (the actor half of a checkpoint cut; None for host actors).
    """

    def __init__(self, config: OnPolicyConfig, store: ParamStore | None = None, restore: dict | None = None,
                 record_to: Path | None = None):
        from tianji_jax.runtime.anakin import compile_key, jitted_inits, make_agent

        self.config = config
        self.multi = config.num_processes > 1  # multi-host learners (runtime/layouts/distributed.py)
        groups = config.num_learner_groups
        if restore is not None and groups > 1:
            raise ValueError(f"resume of a run with learner groups (num_learner_groups={groups}) is not supported "
                             "yet; allowed: resume runs with num_learner_groups=1")
        if self.multi:
            dist = _distributed(config)
            self.actor_device, self.learner_devices, self.global_learner_devices = dist.placement(
                config.num_learner_devices)
            self.group_devices = [self.learner_devices[0]]
        else:
            self.actor_device, devs = placement(num_learner_devices=config.num_learner_devices,
                                                num_learner_groups=groups)
            self.learner_devices = devs[:config.num_learner_devices]
            self.global_learner_devices = self.learner_devices
            self.group_devices = devs[::config.num_learner_devices]  # one device per group when groups > 1
        self.learner_device = self.learner_devices[0]
        self.mesh = (data_parallel.make_mesh(self.global_learner_devices)
                     if len(self.global_learner_devices) > 1 else None)
        key = (compile_key(config), tuple(d.id for d in self.global_learner_devices))
        with _LOCK:
            if key not in _JIT_CACHE:
                agent = make_agent(key[0])
                learn = jax.jit(agent.learn if self.mesh is None else data_parallel.on_policy_learn(agent, self.mesh))
                _JIT_CACHE[key] = (jax.jit(agent.rollout), learn, host_policy(agent), agent)
            self._rollout, self._learn, self._policy, self.agent = _JIT_CACHE[key]
        self._replicated = self.learner_device if self.mesh is None else NamedSharding(self.mesh, P())
        self.timers = PhaseTimers("rollout_s", "h2d_s", "update_s")
        if config.host_stepped:  # host actors time their two halves apart (gymnax fuses them)
            self.timers = PhaseTimers("rollout_s", "h2d_s", "update_s", "inference_s", "env_step_s")
        k_actor, k_learner = self.agent.split_init_key(jax.random.PRNGKey(config.seed))
        init_learner, init_actor = jitted_inits(config)
        self.learner_states: list[LearnerState] = [None]
        env_seed = config.seed
        if self.multi:  # same seed everywhere: identical replicas without communication; own actor streams
            k_actor = jax.random.fold_in(k_actor, 1_000_003 + jax.process_index())
            # and host envs disjoint from every other process's (actor ids continue across processes)
            env_seed = (config.seed + jax.process_index() * config.num_actors * config.num_envs) % 2**31
        if restore is not None:  # multi-host: every process restores the same learner, its own actors
            k_actor = jax.random.fold_in(k_actor, int(restore["env_steps"]))
            env_seed = resume_seed(config.seed, int(restore["env_steps"]), jax.process_index() if self.multi else 0)
            self.learner_state = (dist.replicate(restore["learner"], self._replicated) if self.multi else
                                  jax.device_put(restore["learner"], self._replicated))
        elif self.multi:
            self.learner_state = dist.replicate(init_learner(k_learner), self._replicated)
        else:
            init = init_learner(k_learner)
            self.learner_states = [jax.device_put(init if g == 0 else init.replace(key=jax.random.fold_in(init.key, g)),
                                                  self._replicated if g == 0 else self.group_devices[g])
                                   for g in range(groups)]
        counters = restore["counters"] if restore is not None else {}
        self._discarded_before = int(counters.get("dropped_partial", 0))
        actor_keys = [k_actor] + [jax.random.fold_in(k_actor, i) for i in range(1, config.num_actors)]
        self.host_actors: list[HostActor] = []
        self.remote = None  # RemoteActors (actor_backend='ray')
        self.watchdog = (dist.Watchdog(config.heartbeat_timeout_s + config.stall_timeout_s + 30) if self.multi
                         else None)  # lockstep collectives: global telemetry, agreed stops, a watchdog on every update
        self.recorder = None  # record_schedule's ScheduleRecorder, made with the runner
        self.host_norm = None
        if config.host_stepped:
            self._actor_states = [None] * config.num_actors
            if config.normalize_observations or config.scale_rewards:
                self.host_norm = SharedStatistics(  # several processes: exchanged after each update
                    config.env_spec.observation_space.shape, None if restore is None else restore.get("norm"),
                    dist.make_process_gather(self.mesh, self.learner_devices) if self.multi else None)
            try:
                if config.actor_backend == "ray":
                    from tianji_jax.runtime.actors.ray_actors import RemoteActors

                    self.remote = RemoteActors(config, lambda traj, i: self.to_learner(traj, i % groups, i),
                                               self.timers.since, seed=env_seed)
                else:
                    for i, k in enumerate(actor_keys):
                        self.host_actors.append(HostActor(config, self._policy, i, k, self.actor_device,
                                                          partial(self.to_learner, group=i % groups, actor_id=i),
                                                          self.timers.since, seed=env_seed,
                                                          initial_carry=(self.agent.initial_carry
                                                                         if self.agent.recurrent else None)))
            except BaseException:
                self.close()
                raise
            actors = list(self.remote.clients if self.remote is not None else self.host_actors)
        else:
            if restore is not None:
                states = restore["actors"]
                if states is None or len(states) != config.num_actors:
                    raise ValueError(f"restore['actors']: need {config.num_actors} actor states (num_actors), got "
                                     f"{None if states is None else len(states)}")
            else:
                states = [init_actor(k) for k in actor_keys]
            self._actor_states = [jax.device_put(st, self.actor_device) for st in states]
            self._obs_rms = self._actor_states[0].obs_rms
            actors = [self._make_actor(i) for i in range(config.num_actors)]
        start = int(self.local_learner_state.version)
        self.recorder = (ScheduleRecorder(record_to, num_actors=config.num_actors, item_steps=config.batch_size,
                                          max_policy_lag=config.policy_lag_bound, start_version=start,
                                          config=config.to_dict())
                         if config.record_schedule and record_to is not None else None)
        hooks = RunnerHooks(
            extra_snapshot=self.row_snapshot, recorder=self.recorder,
            balancer=(AutoBalancer(config.policy_lag_bound, num_actors=config.num_actors // groups)
                      if config.schedule == "auto" and config.replay_schedule is None else None),
            lockstep=dist.Lockstep(self.mesh, self.learner_devices, self.watchdog) if self.multi else None)
        try:
            runner = dict(actors=actors, learn=self._learn_item,
                          initial_params=self._published(self.local_learner_state.params),
                          num_updates=config.updates_per_group, item_steps=config.batch_size,
                          schedule="relaxed" if config.schedule == "auto" else config.schedule,
                          max_policy_lag=config.policy_lag_bound,
                          queue_batches=config.queue_batches, stall_timeout_s=config.stall_timeout_s, store=store,
                          initial_version=start, num_groups=groups, hooks=hooks)
            if config.replay_schedule is not None:  # actors act the recorded versions (runtime/tianji/scheduled.py)
                self.runner = ScheduledRunner(replay=load_schedule(config.replay_schedule), **runner)
            else:  # under 'auto': relaxed, its admission window tuned online by the balancer
                self.runner = AsyncRunner(**runner)
        except BaseException:
            self.close()
            raise
        self.averager = (ParamAverager(groups, self.group_devices, config.stall_timeout_s, self.runner.stop)
                         if groups > 1 else None)
        if self.remote is not None:
            self.remote.bind(self.runner.stop)
        self.consumed_actor_states: list = list(self._actor_states)
        if restore is not None:
            self.runner.buffer.restore_counters(counters)

    @property
    def obs_rms(self) -> Any:
        """The newest observation statistics evaluation reads (see the class docstring)."""
        if self.host_norm is not None:
            return self.host_norm.state().obs_rms if self.config.normalize_observations else None
        return getattr(self, "_obs_rms", None)

    def _published(self, params: Any) -> Any:
        """What the actors receive for ``params``: the params, paired with a copy of the run's
        statistics when host actors normalise (kept as :attr:`published_norm` for the checkpoint
        cut of this version)."""
        if self.host_norm is None:
            return params
        self.published_norm = self.host_norm.published()
        return params, self.published_norm

    @property
    def learner_state(self) -> LearnerState:
        """Learner group 0's newest :class:`LearnerState` (the only one without groups; read it
        after the run)."""
        return self.learner_states[0]

    @learner_state.setter
    def learner_state(self, state: LearnerState) -> None:
        self.learner_states[0] = state

    @property
    def local_learner_state(self) -> LearnerState:
        """The learner state as this process's local replica (the state itself on one host): what
        evaluation, checkpoints and actors use."""
        if not self.multi:
            return self.learner_state
        return _distributed(self.config).local_replica(self.learner_state)

    @property
    def eval_sharding(self) -> Any:
        """Where to put actor-side arrays (observation statistics) to evaluate with the learner's
        params: the learner sharding on one host, this process's first learner device with several."""
        return self.learner_device if self.multi else self._replicated

    def to_learner(self, traj: dict, group: int = 0, actor_id: int = 0) -> dict:
        """Place a trajectory on the learner: its device (learner group ``group``'s with learner
        groups), or sharded along the env axis ``N`` over the data-parallel learner devices
        (``NamedSharding`` over the ``"data"`` mesh axis). A host actor's ``"norm_delta"``
        (actor ``actor_id``'s statistics while producing it) is merged into :attr:`host_norm`
        here, as the trajectory is produced (the actor's thread; Ray: the driver's thread receiving it)."""
        if "norm_delta" in traj:
            traj = dict(traj)
            self.host_norm.add(traj.pop("norm_delta"), actor_id)
        if self.mesh is None:
            return jax.device_put(traj, self.group_devices[group])
        if self.multi:  # this process's columns of the global trajectory (env axis num_processes * N wide)
            return _distributed(self.config).to_global(traj, self.mesh, data_parallel.traj_spec,
                                                       self.config.num_processes)
        return {k: jax.device_put(v, NamedSharding(self.mesh, data_parallel.traj_spec(k))) for k, v in traj.items()}

    def close(self) -> None:
        """Close the host envs of host actors, kill remote Ray actors and shut down the Ray
        instance this run started (idempotent; nothing to do for gymnax actors)."""
        for actor in self.host_actors:
            actor.close()
        if self.remote is not None:
            self.remote.close()
        if self.watchdog is not None:
            self.watchdog.close()
        if self.recorder is not None:
            self.recorder.close()

    def row_snapshot(self) -> dict:
        """What a metrics row needs beyond the runner's counters, taken with them in the learner
        thread right after a publication (the runner's ``extra_snapshot`` hook): the per-phase
        timers, the checkpoint cut of that version (:meth:`cut`; the learner thread takes the
        snapshot right after publishing, the caller handles the event later, when the learner and
        the actors may be ahead), ``dropped_partial``, ``lost_chunks`` and the learner states."""
        cut = self.cut()
        return {**self.timers.read(), "dropped_partial": cut["counters"]["dropped_partial"],
                "lost_chunks": self.lost_chunks, "learner_states": list(self.learner_states), "cut": cut}

    @property
    def lost_chunks(self) -> int:
        """Rollouts lost to remote actor deaths (actor_backend='ray'; never inserted); 0 otherwise."""
        return 0 if self.remote is None else self.remote.lost_chunks

    @property
    def env_steps_discarded(self) -> int:
        """Host actors: env steps dropped before insertion because a rollout started with newer
        params (leftovers of uneven resets, actions in flight); 0 for gymnax actors."""
        return (self._discarded_before
                + sum(a.chunker.transitions_discarded + a.chunker.stale_actions for a in self.host_actors)
                + (0 if self.remote is None else self.remote.env_steps_discarded))

    def cut(self) -> dict:
        """The actor half and the counters of a checkpoint cut; call it in the learner thread right
        after a publication (the runner's ``extra_snapshot`` hook, :meth:`row_snapshot`), so that it belongs to the learner
        state of that version: ``{"actors": consumed_actor_states (copy), "counters": the queue's
        :meth:`~tianji_jax.buffers.queues.TrajectoryQueue.cut_counters` plus "dropped_partial"}``.

        The cut is "the learner at version v together with each actor as it was right after its
        newest consumed rollout": under ``sync`` that is exactly the state an uninterrupted run
        continues from (rollout v uses params v). Rollouts produced after it (waiting in the queue:
        ``counters["in_flight"]`` env steps; or in progress / held back by ``one_step``,
        uncounted) are not part of the cut: a resume discards them
        and the actors roll out again from the cut, with the newest params (under ``one_step`` /
        ``relaxed`` the resumed run is therefore not bit-identical to an uninterrupted one)."""
        counters = {**self.runner.buffer.cut_counters(), "dropped_partial": self.env_steps_discarded}
        cut = {"actors": list(self.consumed_actor_states), "counters": counters}
        if self.host_norm is not None:  # the statistics published with this version
            cut["norm"] = SharedStatistics.as_state(self.published_norm)
        return cut

    def describe_placement(self) -> str:
        """One line naming the devices chosen."""
        if self.remote is not None:
            return self.remote.describe(", ".join(str(d) for d in self.learner_devices))
        same = (" (shared device: acting and learning will serialise there)"
                if self.actor_device in self.learner_devices else "")
        if len(self.group_devices) > 1:
            same = (" (a device shared with the actors: acting and learning will serialise there)"
                    if self.actor_device in self.group_devices else "")
            return (f"placement: actors on {self.actor_device}, {len(self.group_devices)} learner groups on "
                    + ", ".join(f"{d} (group {g})" for g, d in enumerate(self.group_devices)) + same)
        if self.mesh is None:
            return f"placement: actors on {self.actor_device}, learner on {self.learner_device}{same}"
        if self.multi:
            return (f"placement: process {jax.process_index()} of {jax.process_count()}: actors on {self.actor_device}, "
                    f"learner shard on {', '.join(str(d) for d in self.learner_devices)}; "
                    f"{len(self.global_learner_devices)} data-parallel learners over all processes{same}")
        names = ", ".join(str(d) for d in self.learner_devices)
        return (f"placement: actors on {self.actor_device}, {len(self.learner_devices)} data-parallel learners on "
                f"{names}{same}")

    def _make_actor(self, i: int):
        def act(params: Any, version: int):
            with self.timers.span("h2d_s"):
                params = params_to_actor(params, self.actor_device)
            with self.timers.span("rollout_s"):
                state, traj = self._rollout(params, jnp.asarray(version, jnp.int32), self._actor_states[i])
                jax.block_until_ready(traj)
            self._actor_states[i] = state
            if i == 0:
                self._obs_rms = state.obs_rms
            with self.timers.span("h2d_s"):
                traj = jax.block_until_ready(self.to_learner(traj, self.runner.group_of(i)))
            return (traj, state), self.config.batch_size  # the state after it: a checkpoint cut's actor half
        return act

    def _learn_item(self, item, version: int):
        params, metrics = self._update(item, version)
        if self.multi and self.host_norm is not None:  # every process's new statistics, in lockstep
            first = version == self.runner.start_version  # it compiles
            with self.watchdog.section(f"statistics exchange {version + 1}", extra_s=300.0 if first else 0.0):
                self.host_norm.exchange()
        return self._published(params), metrics  # host actors that normalise: with the statistics

    def _update(self, item, version: int):
        traj = item.data
        if not self.config.host_stepped:  # gymnax device actors: (trajectory, actor state right after it)
            traj, self.consumed_actor_states[item.actor_id] = item.data
        if self.multi:  # a collective over every process: one local trajectory each, in lockstep
            first = version == self.runner.start_version  # it compiles (also the first after a resume)
            with self.watchdog.section(f"learner update {version + 1}", extra_s=300.0 if first else 0.0), \
                    self.timers.span("update_s"):
                state, metrics = self._learn(self.learner_state, traj)
                jax.block_until_ready(state.params)
            self.learner_state = state
            dist = _distributed(self.config)
            params = dist.local_replica(state.params)
            # replicas must agree on every process: one line per update (tests compare them)
            dist.log(f"update {version + 1} params_sha256 {dist.params_digest(params)}")
            return params, dist.local_replica(metrics)
        group = self.runner.group_of(item.actor_id)
        with self.timers.span("update_s"):
            state, metrics = self._learn(self.learner_states[group], traj)
            if self.averager is not None and is_sync_point(version + 1, self.config.sync_every,
                                                           self.config.updates_per_group):
                params = self.averager.average(group, state.params, version + 1)
                if params is not None:  # None: the run is stopping
                    state = state.replace(params=params)
            jax.block_until_ready(state.params)
        self.learner_states[group] = state
        return state.params, metrics
