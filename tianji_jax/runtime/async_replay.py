"""Every replay algorithm (the DQN family, SAC, ...) on the async TianJi runtime: actors on one
device feed a replay buffer the learner owns on another, balanced by a samples-per-insert rate
limiter.

Actors run the same rollout Anakin fuses (the agent's
:meth:`~tianji_jax.algos.replay_agent.ReplayAgent.rollout`) and hand n-step transitions, stamped with the version they acted with, to a
:class:`~tianji_jax.buffers.queues.ReplayIngress`. The learner thread drains it (lag gate at insert),
inserts into its device replay state (donated, so XLA updates it in place) and runs learner
blocks of ``updates_per_step`` gradient updates whenever the limiter allows: ``spi =
replay_ratio * batch_size`` items sampled per env step inserted, so the replay ratio holds within
the limiter's band whatever the relative speed of actors and learner.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tianji_jax.caches import register
from tianji_jax.buffers.queues import TrajectoryItem
from tianji_jax.algos.replay_agent import ReplayLearnerState, window_transitions
from tianji_jax.runtime.async_on_policy import _distributed, placement, resume_seed
from tianji_jax.runtime.tianji.async_runtime import RunnerHooks, PhaseTimers
from tianji_jax.runtime.tianji.auto_schedule import AutoBalancer
from tianji_jax.runtime.layouts import replay_sharded
from tianji_jax.runtime.tianji.replay_runner import ReplayRunner
from tianji_jax.runtime.actors.host_actor import params_to_actor
from tianji_jax.runtime.actors.host_normalize import HostNormStats, MeanStd, SharedStatistics
from tianji_jax.algos.normalization import RunningMeanStd
from tianji_jax.runtime.actors.replay_host import ReplayHostActor
from tianji_jax.runtime.layouts.learner_groups import ParamAverager, is_sync_point

__all__ = ["AsyncReplay", "ReplayRunner"]

_JIT_CACHE: dict[Any, tuple] = register({})
_LOCK = threading.Lock()


class AsyncReplay:
    """Wires a replay agent's actors, the replay ingress and the learner for one run.

    gymnax actors run the agent's :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.rollout` on
    the actor device; envpool/gymnasium actors are
    :class:`~tianji_jax.runtime.actors.replay_host.ReplayHostActor` s (host env, the agent's acting step
    on the actor device, the same n-step window builder). Both hand ``(items, item_version, mask, stats)``
    chunks of ``num_envs * num_steps`` transitions to the replay ingress; on envpool Atari
    (``config.frame_replay``) host actors hand frame chunks instead, which the learner stores
    frame by frame (:meth:`~tianji_jax.algos.dqn.agent.DQNAgent.insert_frames`; a gap in an
    actor's chunk numbers, a chunk the gate dropped, restarts its envs' stacks). The replay's
    size is checked against free memory before it is allocated (``MemoryError`` with the numbers). Exploration parameters per
    env come from the agent (:meth:`~tianji_jax.algos.replay_agent.ReplayAgent.actor_explore`;
    DQN: the linear epsilon schedule on the run's inserted-or-waiting env steps, or Ape-X's fixed
    per-env epsilons).

    Args:
        config: a replay algorithm's config with ``runtime='async'``.
        restore: continue a run from a checkpoint cut: a dict with ``"learner"``
            (:class:`~tianji_jax.algos.replay_agent.ReplayLearnerState`), ``"replay"`` (the replay
            state, contents and priorities), ``"actors"`` (one
            :class:`~tianji_jax.algos.replay_agent.ReplayActorState` per actor) and ``"counters"``
            (:meth:`cut`'s); the rate limiter continues from the cut's inserts and samples, and
            epsilon from the env steps produced (``taken + dropped_stale``).

    Learner groups (``config.num_learner_groups`` G > 1): G learner states on the last G devices
    (:attr:`group_devices`), all starting from the same params (learner keys folded with the
    group), each with its own replay of ``buffer_capacity / G`` transitions; actor ``i`` feeds
    group ``i % G``; at a sync point (:func:`~tianji_jax.runtime.layouts.learner_groups.is_sync_point`)
    a group waits for the others and continues from the mean online and target params
    (:class:`~tianji_jax.runtime.layouts.learner_groups.ParamAverager`); optimizer states and replays
    stay per group.

    Raises:
        ValueError: ``restore`` with a number of actor states other than ``num_actors``, or for
            a run with learner groups.

    Attributes:
        runner: the :class:`ReplayRunner`.
        learner_states, replay_states: per learner group, its newest states (on its device(s);
            read after the run); :attr:`learner_state` / :attr:`replay_state` are group 0's.
        episode_stats: per group, ``{"episode_return_sum", "episode_length_sum",
            "episode_count"}`` summed over the chunks inserted since its last block (folded into
            that block's metrics).
        epsilon: mean exploration parameter (DQN: epsilon) over all envs of all actors (each
            actor's latest inserted chunk); reported under the agent's ``EXPLORE_METRIC``.
        host_actors: the :class:`ReplayHostActor` s (empty for gymnax); call :meth:`close` after the run.
        timers: :class:`~tianji_jax.runtime.tianji.async_runtime.PhaseTimers`, cumulative seconds
            ``rollout_s``, ``h2d_s``, ``update_s`` (host envs: also ``inference_s``, ``env_step_s``).
    """

    def __init__(self, config: Any, restore: dict | None = None):
        from tianji_jax.runtime.anakin import compile_key, jitted_inits, make_agent

        self.config = config
        num_learners, groups = config.num_learner_devices, config.num_learner_groups
        procs = config.num_processes
        self.multi = procs > 1  # multi-host learners (runtime/layouts/distributed.py, replay_sharded.make_multi_host_fns)
        if restore is not None and groups > 1:
            raise ValueError(f"resume of a replay run with learner groups (num_learner_groups={groups}) is not "
                             "supported yet; allowed: resume runs with num_learner_groups=1")
        dist = _distributed(config) if self.multi else None
        if self.multi:
            self.actor_device, self.learner_devices, global_learners = dist.placement(num_learners)
            self.group_devices = self.learner_devices[:1]
        else:
            self.actor_device, devs = placement(num_learner_devices=num_learners, num_learner_groups=groups)
            self.learner_devices = devs[:num_learners]
            self.group_devices = devs[::num_learners]  # one device per learner group (the first with one group)
        self.learner_device = self.learner_devices[0]
        key = compile_key(config)
        with _LOCK:
            if key not in _JIT_CACHE:
                agent = make_agent(key)
                _JIT_CACHE[key] = (agent, jax.jit(agent.rollout), jax.jit(agent.insert, donate_argnums=0),
                                   jax.jit(agent.learn, donate_argnums=1), jax.jit(agent.host_act),
                                   jax.jit(agent.observe),
                                   jax.jit(partial(window_transitions, gamma=key.gamma, n=key.n_step)),
                                   jax.jit(agent.insert_frames, donate_argnums=0) if agent.frame_replay else None)
            (self.agent, self._rollout, self._insert, self._learn, host_act, self._observe, build,
             self._insert_frames) = _JIT_CACHE[key]
            if self.multi:  # every process's learners: local replay shards, one global learner block
                skey = (key, "multi", tuple(d.id for d in global_learners))
                if skey not in _JIT_CACHE:
                    _JIT_CACHE[skey] = replay_sharded.make_multi_host_fns(self.agent, self.learner_devices,
                                                                          global_learners)
                mesh, global_mesh, place, self._insert, self._learn = _JIT_CACHE[skey]
            elif num_learners > 1:  # data-parallel learners: replay sharded by env (runtime/layouts/replay_sharded.py)
                skey = (key, tuple(d.id for d in self.learner_devices))
                if skey not in _JIT_CACHE:
                    _JIT_CACHE[skey] = replay_sharded.make_sharded_fns(self.agent, self.learner_devices)
                mesh, place, self._insert, self._learn = _JIT_CACHE[skey]
                global_mesh = mesh
        if num_learners > 1 or self.multi:
            replicated, replay_at = NamedSharding(global_mesh, P()), NamedSharding(mesh, P("data"))
            self._place = lambda items, item_version, mask, group=0: place(items, item_version, mask)
        else:
            replicated = replay_at = self.learner_device
            self._place = lambda *tree, group=0: jax.device_put(tree, self.group_devices[group])
        self.timers = PhaseTimers("rollout_s", "h2d_s", "update_s")
        k_actor, k_learner = self.agent.split_init_key(jax.random.PRNGKey(config.seed))
        init_learner, init_actor = jitted_inits(config)
        env_seed = None
        if self.multi:  # same learner seed everywhere (identical replicas); each process its own actors and envs
            k_actor = jax.random.fold_in(k_actor, 1_000_003 + jax.process_index())
            env_seed = (config.seed + jax.process_index() * config.num_actors * config.num_envs) % 2**31
        keys = [k_actor] + [jax.random.fold_in(k_actor, i) for i in range(1, config.num_actors)]
        on_host = config.host_stepped
        if restore is None:
            # the buffer's size is checked against free memory before it is allocated (MemoryError)
            learner, actors = init_learner(k_learner), None
            replay = (replay_sharded.init_sharded_replay(self.agent, num_learners, check_memory=True,
                                                         total_shards=num_learners * procs)
                      if num_learners > 1 or self.multi
                      else self.agent.init_replay(config.num_actors, check_memory=True,
                                                  capacity=config.buffer_capacity // groups))
        else:
            learner, replay, actors = restore["learner"], restore["replay"], restore["actors"]
            if not on_host and (actors is None or len(actors) != config.num_actors):
                raise ValueError(f"restore['actors']: need {config.num_actors} actor states (num_actors), got "
                                 f"{None if actors is None else len(actors)}")
        # per learner group: the same params, the learner key folded with the group, its own replay
        self.learner_states = [dist.replicate(learner, replicated) if self.multi else
                               jax.device_put(learner, replicated)] + [
            jax.device_put(learner.replace(key=jax.random.fold_in(learner.key, g)), self.group_devices[g])
            for g in range(1, groups)]
        self.replay_states = [jax.device_put(replay, replay_at)] + [
            self.agent.init_replay(config.num_actors, capacity=config.buffer_capacity // groups)
            for _ in range(1, groups)]
        self.replay_states[1:] = [jax.device_put(r, d) for r, d in zip(self.replay_states[1:], self.group_devices[1:])]
        # normalisation with learner groups: one set of statistics, folded in by every group's inserts;
        # with several processes each folds its inserts into a pending delta, exchanged at every block
        self._shared_rms = learner.obs_rms if groups > 1 else None
        self._replicated, self._process_rms = replicated, None
        if self.multi and learner.obs_rms is not None:
            self._process_rms = SharedStatistics(config.env_spec.observation_space.shape, HostNormStats(
                learner.obs_rms, RunningMeanStd.create(())), dist.make_process_gather(global_mesh, self.learner_devices))
        self._rms_lock = threading.Lock()
        self.explore_metric = self.agent.EXPLORE_METRIC
        self._actor_epsilon = [float(np.mean(self.agent.host_explore(0, i, config.num_actors))) for i in range(config.num_actors)]
        self.epsilon = float(np.mean(self._actor_epsilon))
        self._zero_stats()
        self._next_seq = [0] * config.num_actors  # frame replay: the chunk number expected from each actor
        self.host_actors: list[ReplayHostActor] = []
        self.remote = None  # RemoteActors (actor_backend='ray')
        self.watchdog = (dist.Watchdog(config.heartbeat_timeout_s + config.stall_timeout_s + 30) if self.multi
                         else None)  # lockstep collectives: global telemetry, agreed stops, a watchdog on every block
        if on_host:
            self.timers = PhaseTimers("rollout_s", "h2d_s", "update_s", "inference_s", "env_step_s")
            self._actor_states = [None] * config.num_actors
            if restore is not None:  # host env state is not checkpointed: fresh seeds, fresh episodes
                keys = [jax.random.fold_in(k, int(restore["env_steps"])) for k in keys]
                env_seed = resume_seed(config.seed, int(restore["env_steps"]), jax.process_index() if self.multi else 0)
            try:
                if config.actor_backend == "ray":
                    from tianji_jax.runtime.actors.ray_actors import RemoteActors

                    self.remote = RemoteActors(config, self._remote_to_learner, self.timers.since, self._run_env_steps,
                                               seed=config.seed if env_seed is None else env_seed)
                else:
                    for i, k in enumerate(keys):
                        self.host_actors.append(ReplayHostActor(
                            config, self.agent, host_act, build, i, k, self.actor_device,
                            partial(self._place_tree, group=i % groups), self._run_env_steps, self.timers.since,
                            seed=env_seed))
            except BaseException:
                self.close()
                raise
            actors = list(self.remote.clients if self.remote is not None else self.host_actors)
        else:
            if actors is None:
                actors = [init_actor(k) for k in keys]
            self._actor_states = [jax.device_put(a, self.actor_device) for a in actors]
            actors = [self._make_actor(i) for i in range(config.num_actors)]
        self.consumed_actor_states: list = list(self._actor_states)  # after each actor's newest chunk taken
        c = config.iteration_env_steps
        self.runner = ReplayRunner(
            actors=actors, insert=self._insert_chunks,
            learn=self._learn_block, initial_params=self.agent.acting_params(self.local_learner_state),
            num_updates=config.learning_iterations // groups, chunk_steps=c, spi=config.replay_ratio * config.batch_size,
            block_samples=config.updates_per_step * config.batch_size // procs,
            min_size=config.learning_starts // groups // procs,
            max_policy_lag=0 if config.schedule == "sync" else config.max_policy_lag,
            stall_timeout_s=config.stall_timeout_s, initial_version=int(self.learner_state.version),
            schedule="relaxed" if config.schedule == "auto" else config.schedule, num_groups=groups,
            band_factor=config.replay_ratio_tolerance, total_inserts=config.env_steps // groups // procs,
            hooks=RunnerHooks(
                extra_snapshot=self.row_snapshot,
                balancer=(AutoBalancer(max(1, config.max_policy_lag), config.replay_ratio_tolerance,  # under 'auto':
                                       num_actors=config.num_actors // groups)  # relaxed, its SPI band tuned online
                          if config.schedule == "auto" else None),
                lockstep=dist.Lockstep(global_mesh, self.learner_devices, self.watchdog) if self.multi else None))
        self.averager = (ParamAverager(groups, self.group_devices, config.stall_timeout_s, self.runner.stop)
                         if groups > 1 else None)
        if self.remote is not None:
            self.remote.bind(self.runner.stop)
        if restore is not None:
            self.runner.buffer.restore_counters(restore["counters"])
            self.epsilon = float(restore["counters"]["epsilon"])

    @property
    def local_learner_state(self) -> ReplayLearnerState:
        """Learner group 0's state as this process's local replica (the state itself on one host):
        what evaluation, checkpoints and rows use."""
        if not self.multi:
            return self.learner_state
        return _distributed(self.config).local_replica(self.learner_state)

    def row_state(self, group: int) -> tuple[tuple[Any, Any], dict]:
        """``((learner, replay copy), cut)`` of learner group ``group`` right now: call it in that
        group's learner thread right after a block (the runner's ``extra_snapshot`` hook, :meth:`row_snapshot`), before the
        next insert donates its replay. The learner state is not donated, so it is shared, not
        copied; the replay is copied on its device."""
        replay = jax.block_until_ready(jax.tree.map(jnp.copy, self.replay_states[group]))
        learner = self.local_learner_state if self.multi else self.learner_states[group]
        return (learner, replay), self.cut()

    def cut(self) -> dict:
        """The actor half and the counters of a checkpoint cut, taken in the learner thread right
        after a learner block (with :meth:`row_state`): ``{"actors": per actor, its state right after its
        newest chunk the learner inserted into replay (a chunk the gate dropped is rolled out again
        on resume), "counters": the ingress's
        :meth:`~tianji_jax.buffers.queues.ReplayIngress.cut_counters` plus "epsilon" (of the newest
        chunk inserted)}``. Chunks produced after the cut (in the inbox:
        ``counters["in_flight"]`` env steps; or being rolled out, uncounted) are not part of it: a resume discards them and
        the actors act again from the cut."""
        return {"actors": list(self.consumed_actor_states),
                "counters": {**self.runner.buffer.cut_counters(), "epsilon": self.epsilon}}

    @property
    def shared_obs_rms(self) -> Any:
        """With learner groups and ``normalize_observations``: the run's observation statistics,
        of every observation any group inserted so far; None otherwise."""
        return self._shared_rms

    @property
    def learner_state(self) -> ReplayLearnerState:
        """Learner group 0's newest state (the only one without groups; read it after the run)."""
        return self.learner_states[0]

    @learner_state.setter
    def learner_state(self, state: ReplayLearnerState) -> None:
        self.learner_states[0] = state

    @property
    def replay_state(self) -> Any:
        """Learner group 0's replay (donated to every insert / learn: other threads read a
        :meth:`row_state` copy)."""
        return self.replay_states[0]

    @replay_state.setter
    def replay_state(self, state: Any) -> None:
        self.replay_states[0] = state

    def _run_env_steps(self) -> int:
        """The run's env steps so far (what exploration schedules read): every group's produced
        steps; multi-host: this process's times the processes (exact under ``sync``)."""
        return sum(b.produced for b in self.runner.buffers) * self.config.num_processes

    def close(self) -> None:
        """Close the host envs of host actors, kill remote Ray actors and shut down the Ray
        instance this run started (idempotent; nothing to do for gymnax actors)."""
        for actor in self.host_actors:
            actor.close()
        if self.remote is not None:
            self.remote.close()
        if getattr(self, "watchdog", None) is not None:
            self.watchdog.close()

    def row_snapshot(self) -> dict:
        """What a metrics row needs beyond the runner's counters (the runner's ``extra_snapshot``
        hook, run in the publishing learner thread right after a block): the per-phase timers,
        ``dropped_partial``, ``lost_chunks``, the publishing ``group`` and every group's learner
        state (``learner_states``), and when a row is due at this block (every
        ``iterations_per_chunk`` blocks, and the last) ``state_copy`` and ``cut``: a device copy of
        (learner, replay) of exactly this block, taken before the group's next insert donates the
        replay, and the actors' half of the checkpoint cut (:meth:`row_state`); None otherwise."""
        config, runner = self.config, self.runner
        every = config.iterations_per_chunk
        total = config.learning_iterations // config.num_learner_groups * config.num_learner_groups
        group, block = runner.publishing_group, runner.start_version + runner.published
        snap = {**self.timers.read(), "state_copy": None, "cut": None, "dropped_partial": self.env_steps_discarded,
                "lost_chunks": self.lost_chunks, "group": group, "learner_states": list(self.learner_states)}
        if group is not None and (block % every == 0 or block == total):
            snap["state_copy"], snap["cut"] = self.row_state(group)
        return snap

    @property
    def env_steps_discarded(self) -> int:
        """Host actors: env steps dropped before insertion because a rollout started with newer
        params (leftovers of uneven resets, actions in flight); 0 for gymnax actors."""
        return (sum(a.chunker.transitions_discarded + a.chunker.stale_actions for a in self.host_actors)
                + (0 if self.remote is None else self.remote.env_steps_discarded))

    @property
    def lost_chunks(self) -> int:
        """Chunks lost to remote actor deaths (actor_backend='ray'; never inserted); 0 otherwise."""
        return 0 if self.remote is None else self.remote.lost_chunks

    def _remote_to_learner(self, data: tuple, actor_id: int = 0) -> tuple:
        """A remote actor's chunk (host arrays, as :class:`ReplayHostActor` returns it) on its learner
        group's device(s); a frame chunk's sequence number stays a Python int."""
        (items, item_version, mask, stats), _ = data
        if self.agent.frame_replay:
            return (jax.device_put(items, self.learner_device), int(item_version), None, stats), None
        group = actor_id % self.config.num_learner_groups
        return (*self._place(items, item_version, mask, group=group), stats), None

    def _place_tree(self, tree: Any, group: int = 0) -> Any:
        """A host actor's chunk arrays on learner group ``group`` (``(items, item_version, mask)``
        placed by ``_place``; a frame chunk on the learner device)."""
        if self.agent.frame_replay:
            return jax.device_put(tree, self.learner_device)
        return self._place(*tree, group=group)

    def describe_placement(self) -> str:
        """One line naming the devices chosen."""
        learners = ", ".join(str(d) for d in self.learner_devices)
        if self.multi:
            return (f"placement: process {jax.process_index()} of {jax.process_count()}: actors on {self.actor_device}, "
                    f"learner replica(s) and this process's replay shard(s) on {learners}; gradients averaged over "
                    f"{jax.device_count() // jax.local_device_count() * len(self.learner_devices)} learner devices "
                    "of all processes")
        if self.remote is not None:
            return self.remote.describe(f"{learners} (with the replay buffer" + (
                ", sharded by env over the data-parallel learners)" if len(self.learner_devices) > 1 else ")"))
        if len(self.group_devices) > 1:
            shared = " (a device shared with the actors)" if self.actor_device in self.group_devices else ""
            return (f"placement: actors on {self.actor_device}, {len(self.group_devices)} learner groups, each with "
                    f"its own replay, on " + ", ".join(f"{d} (group {g})" for g, d in enumerate(self.group_devices))
                    + shared)
        if len(self.learner_devices) > 1:
            shared = " (a device shared with the actors)" if self.actor_device in self.learner_devices else ""
            return (f"placement: actors on {self.actor_device}, {len(self.learner_devices)} data-parallel learners "
                    f"on {learners}, the replay buffer sharded by env over them{shared}")
        same = " (same device: acting and learning will serialise)" if self.actor_device == self.learner_device else ""
        return f"placement: actors on {self.actor_device}, learner and replay buffer on {self.learner_device}{same}"

    def _zero_stats(self, group: int | None = None) -> None:
        """Zero group ``group``'s episode statistics (every group's when None)."""
        zero = lambda: {"episode_return_sum": 0.0, "episode_length_sum": 0.0, "episode_count": 0}  # noqa: E731
        if group is None:
            self.episode_stats = [zero() for _ in range(self.config.num_learner_groups)]
        else:
            self.episode_stats[group] = zero()

    def _make_actor(self, i: int):
        def act(params: Any, version: int):
            with self.timers.span("h2d_s"):
                params = params_to_actor(params, self.actor_device)
            # epsilon follows the run's env steps (all actors together) step by step inside the
            # rollout, exactly as in Anakin (so the `sync` schedule reproduces it bit for bit), or
            # Ape-X's fixed per-env epsilons of this actor's slice
            produced = self._run_env_steps()
            state = self._actor_states[i].replace(env_steps=jnp.asarray(produced, jnp.int32))
            eps = self.agent.actor_explore(produced, i, self.config.num_actors)
            eps = None if eps is None else jax.device_put(eps, self.actor_device)
            with self.timers.span("rollout_s"):
                state, items, item_version, mask, stats = self._rollout(params, jnp.asarray(version, jnp.int32),
                                                                        state, eps)
                jax.block_until_ready(items)
            self._actor_states[i] = state
            group = i % self.config.num_learner_groups
            with self.timers.span("h2d_s"):  # the episode statistics go to the host here, off the learner's thread
                data = (*jax.block_until_ready(self._place(items, item_version, mask, group=group)),
                        jax.device_get(stats))
            return (data, state), self.config.iteration_env_steps  # the state after it: a cut's actor half
        return act

    def _insert_chunks(self, chunks: list[TrajectoryItem], group: int = 0) -> None:
        with self.timers.span("update_s"):
            self._insert_now(chunks, group)

    def _insert_now(self, chunks: list[TrajectoryItem], group: int) -> None:
        stats_g = self.episode_stats[group]
        for chunk in chunks:
            (items, item_version, mask, stats), self.consumed_actor_states[chunk.actor_id] = chunk.data
            if self.agent.frame_replay:  # items: the frame chunk, item_version: the actor's chunk number
                a = chunk.actor_id
                gap = item_version != self._next_seq[a]  # the gate dropped chunks of this actor before it
                self._next_seq[a] = item_version + 1
                self.replay_state = self._insert_frames(self.replay_state, items,
                                                        np.int32(a * self.config.num_envs), np.bool_(gap))
            else:
                self.replay_states[group] = self._insert(self.replay_states[group], items, item_version, mask)
                if self._process_rms is not None:  # several processes: merged at the next block (exchange)
                    obs, valid = jax.device_get((items.obs, mask))
                    self._process_rms.add({"obs": MeanStd.of_rows(obs, valid), "ret": MeanStd.empty(())},
                                          chunk.actor_id)
                elif self.learner_states[group].obs_rms is not None:
                    self._observe_inserted(group, items, mask)
            host = jax.device_get(stats)
            stats_g["episode_return_sum"] += float(host["episode_return_sum"])
            stats_g["episode_length_sum"] += float(host["episode_length_sum"])
            stats_g["episode_count"] += int(host["episode_count"])
            if self.explore_metric is not None:
                self._actor_epsilon[chunk.actor_id] = float(host[self.explore_metric])
        self.epsilon = float(np.mean(self._actor_epsilon))

    def _observe_inserted(self, group: int, items: Any, mask: Any) -> None:
        """Normalisation: fold the observations that just entered group ``group``'s replay into
        its learner's statistics and republish them with the current params at the current version
        (as Anakin's next iteration acts with them, also before the first learner block). With
        learner groups the statistics are the run's one set (:attr:`shared_obs_rms`), which
        every group's inserts fold into and its learner takes up at each of its inserts."""
        learner = self.learner_states[group]
        if self._shared_rms is None:
            learner = self._observe(learner, items, mask)
        else:
            with self._rms_lock:
                shared = jax.device_put(self._shared_rms, self.group_devices[group])
                learner = self._observe(learner.replace(obs_rms=shared), items, mask)
                self._shared_rms = learner.obs_rms
        self.learner_states[group] = learner
        store = self.runner.stores[group]
        store.publish(self.agent.acting_params(learner), store.version)

    def _learn_block(self, group: int, version: int):
        if self.multi:
            return self._learn_global(version)
        config = self.config
        with self.timers.span("update_s"):
            env_steps = np.int32(sum(b.inserted for b in self.runner.buffers))
            learner, self.replay_states[group], metrics = self._learn(self.learner_states[group],
                                                                      self.replay_states[group], env_steps)
            size = jnp.sum(self.agent.replay_size(self.replay_states[group]))
            per_group = config.learning_iterations // config.num_learner_groups
            if self.averager is not None and is_sync_point(version + 1, config.sync_every, per_group):
                mean = self.averager.average(group, (learner.params, learner.target_params), version + 1)
                if mean is not None:  # None: the run is stopping
                    learner = learner.replace(params=mean[0], target_params=mean[1])
            # one host sync per block: the metrics come out of the same computation as the params
            metrics, size = jax.device_get((metrics, size))
            jax.block_until_ready(learner.params)  # (averaged params: their own computation)
        self.learner_states[group] = learner
        explore = {} if self.explore_metric is None else {self.explore_metric: self.epsilon}
        metrics = {**metrics, **self.episode_stats[group], **explore, "replay_size": int(size)}
        self._zero_stats(group)
        return self.agent.acting_params(learner), metrics

    def _learn_global(self, version: int):
        """Multi-host: one learner block as a collective over every process (each samples its
        own replay shards; called the same number of times, in the same order, everywhere)."""
        dist = _distributed(self.config)
        first = version == self.runner.start_version  # it compiles
        with self.watchdog.section(f"learner block {version + 1}", extra_s=300.0 if first else 0.0), \
                self.timers.span("update_s"):
            # this process's inserts times the processes: the run's env steps under 'sync', close under 'relaxed'
            env_steps = self.runner.buffer.inserted * self.config.num_processes
            if self._process_rms is not None:  # every process's inserts so far, merged in process order
                self._process_rms.exchange()
                rms = dist.replicate(self._process_rms.state().obs_rms, self._replicated)
                self.learner_state = self.learner_state.replace(obs_rms=rms)
            learner, self.replay_state, metrics = self._learn(self.learner_state, self.replay_state, env_steps)
            jax.block_until_ready(learner.params)
        self.learner_state = learner
        params = dist.local_replica(learner.params)
        # replicas must agree on every process: one line per block (tests compare them)
        dist.log(f"update {version + 1} params_sha256 {dist.params_digest(params)}")
        explore = {} if self.explore_metric is None else {self.explore_metric: self.epsilon}
        metrics = {**jax.device_get(dist.local_replica(metrics)), **self.episode_stats[0], **explore,
                   "replay_size": int(jnp.sum(self.agent.replay_size(self.replay_state)))}
        self._zero_stats(0)
        return dist.local_replica(self.agent.acting_params(learner)), metrics  # with the statistics, normalising
