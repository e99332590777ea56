"""DQN on the async TianJi runtime: gymnax actors on one device feed a replay buffer the learner
owns on another, balanced by a samples-per-insert rate limiter.

Actors run the same epsilon-greedy rollout Anakin fuses (:class:`~tianji_jax.runtime.dqn_parts.DQNParts`)
and hand n-step transitions, stamped with the version they acted with, to a
:class:`~tianji_jax.buffers.ReplayIngress`. The learner thread drains it (lag gate at insert),
inserts into its device replay state (donated, so XLA updates it in place) and runs learner
blocks of ``updates_per_step`` gradient updates whenever the limiter allows: ``spi =
replay_ratio * batch_size`` items sampled per env step inserted, so the replay ratio holds within
the limiter's band whatever the relative speed of actors and learner.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tianji_jax.caches import register
from tianji_jax.buffers import ReplayIngress, TrajectoryItem
from tianji_jax.config import DQNConfig
from tianji_jax.rate_limiter import RateLimiter
from tianji_jax.runtime.async_ppo import placement, resume_seed
from tianji_jax.runtime import dqn_sharded
from tianji_jax.runtime.async_runtime import AsyncRunner, StallError
from tianji_jax.runtime.dqn_host import DQNHostActor
from tianji_jax.runtime.dqn_parts import DQNParts, actor_epsilons, window_transitions

__all__ = ["AsyncDQN", "ReplayRunner"]

_JIT_CACHE: dict[Any, tuple] = register({})
_LOCK = threading.Lock()


class ReplayRunner(AsyncRunner):
    """:class:`AsyncRunner` whose learner drains a :class:`ReplayIngress` instead of a FIFO.

    ``relaxed`` (default): actors run the relaxed loop (admission by the limiter, newest params).
    The learner loop takes every waiting chunk (the gate at insert drops stale ones), calls
    ``insert(chunks)``, and when the limiter allows a block calls ``learn(None, version)`` and
    publishes version + 1.

    ``sync`` (one actor): the Anakin iteration order. The actor acts chunk k once the learner has
    processed chunk k-1, with the params published then; the learner inserts each chunk and runs
    one block right after it once more than ``min_size`` env steps are inserted (the blocks'
    samples are recorded with the limiter, which then only reports). Lag 0, deterministic.

    Args:
        actors: one ``act(params, version) -> (data, num_steps)`` per actor thread.
        insert: ``insert(list[TrajectoryItem])``, called in the learner thread.
        learn: ``learn(None, version) -> (params, metrics)``, one learner block.
        initial_params: params published as version 0.
        num_updates: learner blocks to run.
        chunk_steps: env steps per actor chunk (``c``).
        spi: samples per inserted env step (``replay_ratio * batch_size``).
        block_samples: items sampled per block (``updates_per_step * batch_size``).
        min_size: env steps inserted before the first block (``learning_starts``).
        max_policy_lag: ``K`` of the gate at insert.
        stall_timeout_s: no chunk and no block this long stops the run with :class:`StallError`.
        initial_version: version of ``initial_params`` (the restored learner's on resume).
        schedule: ``"relaxed"`` or ``"sync"`` (``max_policy_lag`` must then be 0).

    Raises:
        ValueError: no actors, a bad schedule/lag/actor-count combination or timeout, before any
            thread starts.
    """

    def __init__(self, *, actors: list, insert: Callable[[list[TrajectoryItem]], None], learn: Callable,
                 initial_params: Any, num_updates: int, chunk_steps: int, spi: float, block_samples: int,
                 min_size: int, max_policy_lag: int, stall_timeout_s: float = 60.0, initial_version: int = 0,
                 schedule: str = "relaxed"):
        if schedule not in ("sync", "relaxed"):
            raise ValueError(f"schedule must be one of ('sync', 'relaxed') for replay, got {schedule!r}")
        super().__init__(actors=actors, learn=learn, initial_params=initial_params, num_updates=num_updates,
                         item_steps=chunk_steps, schedule=schedule, max_policy_lag=max_policy_lag,
                         queue_batches=2, stall_timeout_s=stall_timeout_s, initial_version=initial_version)
        self.min_size = int(min_size)
        self._processed = 0  # sync: chunks the learner has inserted (and learned after), this process
        self._processed_cond = threading.Condition()
        # Reverb's SampleToInsertRatio: the band sits around min_size * spi and is as wide as the
        # deadlock rule needs on each side, so neither side can block forever.
        tol = block_samples + spi * chunk_steps
        centre = min_size * spi
        self.buffer = ReplayIngress(RateLimiter(spi=spi, min_size=max(1, min_size), min_diff=centre - tol,
                                                max_diff=centre + tol, batch_items=block_samples,
                                                chunk_items=chunk_steps), max_policy_lag)
        self.buffers = [self.buffer]
        self.insert, self.block_samples = insert, int(block_samples)

    def _actor_loop(self, actor_id: int) -> None:
        if self.schedule != "sync":
            return super()._actor_loop(actor_id)
        act = self.actors[actor_id]
        r = 0
        while not self.stop.is_set():
            with self.telemetry.span("actor_wait_s"), self._processed_cond:  # the learner done with chunk r - 1
                deadline = time.monotonic() + self.stall_timeout_s
                while self._processed < r:
                    if self.stop.is_set():
                        return
                    if time.monotonic() > deadline:
                        raise StallError(f"actor {actor_id} waited {self.stall_timeout_s:g} s for the learner to "
                                         f"process chunk {r - 1}; last published version {self.store.version}")
                    self._processed_cond.wait(0.1)
            params, version = self.store.latest()
            with self.telemetry.span("actor_busy_s"):
                data, steps = act(params, version)
            self.actor_logs[actor_id].append(version)
            if not self._insert(TrajectoryItem(data=data, version=version, actor_id=actor_id, num_steps=steps)):
                return
            r += 1

    def _sync_learner_loop(self) -> None:
        version = self.store.version
        last_fresh = time.monotonic()
        while version < self.num_updates and not self.stop.is_set():
            with self.telemetry.span("learner_wait_s"):
                chunks, _ = self.buffer.take(version, None, 0.5, self.stop)
            if not chunks:
                self._check_stall(last_fresh, "learner received no transitions", f"last published version {version}")
                continue
            last_fresh = time.monotonic()
            for chunk in chunks:
                with self.telemetry.span("learner_busy_s"):
                    self.insert([chunk])
                    if self.buffer.inserted > self.min_size:  # as Anakin: learn once past learning_starts
                        self.buffer.record_sample(self.block_samples)
                        params, metrics = self.learn(None, version)
                        version += 1
                        self.store.publish(params, version)
                        self.events.put(("update", version, metrics, None, self.take_snapshot()))
                with self._processed_cond:
                    self._processed += 1
                    self._processed_cond.notify_all()
        self.events.put(("done", version, None, None, self.take_snapshot()))

    def _learner_loop(self) -> None:
        if self.schedule == "sync":
            return self._sync_learner_loop()
        version = self.store.version
        last_fresh = time.monotonic()
        while version < self.num_updates and not self.stop.is_set():
            with self.telemetry.span("learner_wait_s"):
                chunks, can_learn = self.buffer.take(version, self.block_samples, 0.5, self.stop)
            if chunks:
                with self.telemetry.span("learner_busy_s"):
                    self.insert(chunks)
                last_fresh = time.monotonic()
            if not can_learn:
                self._check_stall(last_fresh, "learner received no transitions and could not sample",
                                  f"last published version {version}")
                continue
            with self.telemetry.span("learner_busy_s"):
                params, metrics = self.learn(None, version)
            version += 1
            self.store.publish(params, version)
            self.events.put(("update", version, metrics, None, self.take_snapshot()))
        self.events.put(("done", version, None, None, self.take_snapshot()))


class AsyncDQN:
    """Wires DQN actors, the replay ingress and the learner for one run.

    gymnax actors run :meth:`DQNParts.rollout` on the actor device; envpool/gymnasium actors are
    :class:`~tianji_jax.runtime.dqn_host.DQNHostActor` s (host env, Q-network on the actor
    device, the same n-step window builder). Both hand ``(items, item_version, mask, stats)``
    chunks of ``num_envs * num_steps`` transitions to the replay ingress; on envpool Atari
    (``config.frame_replay``) host actors hand frame chunks instead, which the learner stores
    frame by frame (:meth:`~tianji_jax.runtime.dqn_parts.DQNParts.insert_frames`; a gap in an
    actor's chunk numbers, a chunk the gate dropped, restarts its envs' stacks). The replay's
    size is checked against free memory before it is allocated (``MemoryError`` with the numbers). Exploration epsilons per
    env come from :func:`~tianji_jax.runtime.dqn_parts.actor_epsilons` (linear schedule on the
    run's inserted-or-waiting env steps, or Ape-X's fixed per-env epsilons).

    Args:
        config: a :class:`DQNConfig` with ``runtime='async'``.
        snapshot_every: after every this many learner blocks (and the last), the learner thread
            stores device copies of ``(learner_state, replay_state)`` in ``snapshot`` and the
            matching actor half and counters in ``snapshot_cut`` (see :meth:`cut`); the replay
            state itself is donated to the next insert/learn call, so other threads (checkpoints)
            must read the snapshot, never ``replay_state``.
        restore: continue a run from a checkpoint cut: a dict with ``"learner"``
            (:class:`~tianji_jax.runtime.dqn_parts.DQNLearnerState`), ``"replay"`` (the replay
            state, contents and priorities), ``"actors"`` (one
            :class:`~tianji_jax.runtime.dqn_parts.DQNActorState` per actor) and ``"counters"``
            (:meth:`cut`'s); the rate limiter continues from the cut's inserts and samples, and
            epsilon from the env steps produced (``taken + dropped_stale``).

    Raises:
        ValueError: ``restore`` with a number of actor states other than ``num_actors``.

    Attributes:
        runner: the :class:`ReplayRunner`.
        learner_state, replay_state: the learner's newest states (on the learner device; read
            after the run).
        episode_stats: ``{"episode_return_sum", "episode_length_sum", "episode_count"}`` summed over
            the chunks inserted since the last block (folded into that block's metrics).
        epsilon: mean exploration epsilon over all envs of all actors (each actor's latest inserted chunk).
        host_actors: the :class:`DQNHostActor` s (empty for gymnax); call :meth:`close` after the run.
        timers: cumulative seconds ``rollout_s``, ``h2d_s``, ``update_s`` (guarded by ``timers_lock``).
    """

    def __init__(self, config: DQNConfig, snapshot_every: int | None = None, restore: dict | None = None):
        from tianji_jax.runtime.dqn_anakin import dqn_compile_key

        self.snapshot_every = snapshot_every
        self.snapshot: tuple[Any, Any] | None = None
        self.snapshot_cut: dict | None = None

        self.config = config
        num_learners = config.num_learner_devices
        self.actor_device, self.learner_devices = placement(num_learner_devices=num_learners)
        self.learner_device = self.learner_devices[0]
        key = dqn_compile_key(config)
        with _LOCK:
            if key not in _JIT_CACHE:
                parts = DQNParts(key)
                _JIT_CACHE[key] = (parts, jax.jit(parts.rollout), jax.jit(parts.insert, donate_argnums=0),
                                   jax.jit(parts.learn, donate_argnums=1), jax.jit(parts.host_act),
                                   jax.jit(partial(window_transitions, gamma=key.gamma, n=key.n_step)),
                                   jax.jit(parts.insert_frames, donate_argnums=0))
            (self.parts, self._rollout, self._insert, self._learn, host_act, build,
             self._insert_frames) = _JIT_CACHE[key]
            if num_learners > 1:  # data-parallel learners: replay sharded by env (runtime/dqn_sharded.py)
                skey = (key, tuple(d.id for d in self.learner_devices))
                if skey not in _JIT_CACHE:
                    _JIT_CACHE[skey] = dqn_sharded.make_sharded_fns(self.parts, self.learner_devices)
                mesh, self._place, self._insert, self._learn = _JIT_CACHE[skey]
        if num_learners > 1:
            replicated, replay_at = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
        else:
            replicated = replay_at = self.learner_device
            self._place = lambda *tree: jax.device_put(tree, self.learner_device)
        self.timers = {"rollout_s": 0.0, "h2d_s": 0.0, "update_s": 0.0}
        self.timers_lock = threading.Lock()
        k_actor, k_learner = self.parts.split_init_key(jax.random.PRNGKey(config.seed))
        keys = [k_actor] + [jax.random.fold_in(k_actor, i) for i in range(1, config.num_actors)]
        on_host = config.env_spec.on_host
        if restore is None:
            # the buffer's size is checked against free memory before it is allocated (MemoryError)
            learner, actors = self.parts.init_learner(k_learner), None
            replay = (dqn_sharded.init_sharded_replay(self.parts, num_learners, check_memory=True) if num_learners > 1
                      else self.parts.init_replay(config.num_actors, check_memory=True))
        else:
            learner, replay, actors = restore["learner"], restore["replay"], restore["actors"]
            if not on_host and (actors is None or len(actors) != config.num_actors):
                raise ValueError(f"restore['actors']: need {config.num_actors} actor states (num_actors), got "
                                 f"{None if actors is None else len(actors)}")
        self.learner_state = jax.device_put(learner, replicated)
        self.replay_state = jax.device_put(replay, replay_at)
        self._actor_epsilon = [float(np.mean(actor_epsilons(config, 0, i))) for i in range(config.num_actors)]
        self.epsilon = float(np.mean(self._actor_epsilon))
        self._zero_stats()
        self._next_seq = [0] * config.num_actors  # frame replay: the chunk number expected from each actor
        self.host_actors: list[DQNHostActor] = []
        self.remote = None  # RemoteActors (actor_backend='ray')
        if config.env_spec.on_host:
            self.timers.update(inference_s=0.0, env_step_s=0.0)
            self._actor_states = [None] * config.num_actors
            env_seed = None
            if restore is not None:  # host env state is not checkpointed: fresh seeds, fresh episodes
                keys = [jax.random.fold_in(k, int(restore["env_steps"])) for k in keys]
                env_seed = resume_seed(config.seed, int(restore["env_steps"]))
            try:
                if config.actor_backend == "ray":
                    from tianji_jax.runtime.ray_actors import RemoteActors

                    self.remote = RemoteActors(config, self._remote_to_learner, self._time, self._run_env_steps)
                else:
                    for i, k in enumerate(keys):
                        self.host_actors.append(DQNHostActor(
                            config, self.parts, host_act, build, i, k, self.actor_device, self._place_tree,
                            self._run_env_steps, self._time, seed=env_seed))
            except BaseException:
                self.close()
                raise
            actors = list(self.remote.clients if self.remote is not None else self.host_actors)
        else:
            if actors is None:
                actors = [self.parts.init_actor(k) for k in keys]
            self._actor_states = [jax.device_put(a, self.actor_device) for a in actors]
            actors = [self._make_actor(i) for i in range(config.num_actors)]
        self.consumed_actor_states: list = list(self._actor_states)  # after each actor's newest chunk taken
        c = config.iteration_env_steps
        self.runner = ReplayRunner(
            actors=actors, insert=self._insert_chunks,
            learn=self._learn_block, initial_params=self.learner_state.params, num_updates=config.learning_iterations,
            chunk_steps=c, spi=config.replay_ratio * config.batch_size,
            block_samples=config.updates_per_step * config.batch_size, min_size=config.learning_starts,
            max_policy_lag=0 if config.schedule == "sync" else config.max_policy_lag,
            stall_timeout_s=config.stall_timeout_s, initial_version=int(self.learner_state.version),
            schedule=config.schedule)
        if self.remote is not None:
            self.remote.bind(self.runner.stop)
        if restore is not None:
            self.runner.buffer.restore_counters(restore["counters"])
            self.epsilon = float(restore["counters"]["epsilon"])

    def cut(self) -> dict:
        """The actor half and the counters of a checkpoint cut, taken in the learner thread right
        after a learner block (with ``snapshot``): ``{"actors": per actor, its state right after its
        newest chunk the learner inserted into replay (a chunk the gate dropped is rolled out again
        on resume), "counters": the ingress's
        :meth:`~tianji_jax.buffers.ReplayIngress.cut_counters` plus "epsilon" (of the newest
        chunk inserted)}``. Chunks produced after the cut (in the inbox:
        ``counters["in_flight"]`` env steps; or being rolled out, uncounted) are not part of it: a resume discards them and
        the actors act again from the cut."""
        return {"actors": list(self.consumed_actor_states),
                "counters": {**self.runner.buffer.cut_counters(), "epsilon": self.epsilon}}

    def _run_env_steps(self) -> int:
        return self.runner.buffer.produced

    def close(self) -> None:
        """Close the host envs of host actors, kill remote Ray actors and shut down the Ray
        instance this run started (idempotent; nothing to do for gymnax actors)."""
        for actor in self.host_actors:
            actor.close()
        if self.remote is not None:
            self.remote.close()

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

    def _remote_to_learner(self, data: tuple) -> tuple:
        """A remote actor's chunk (host arrays, as :class:`DQNHostActor` returns it) on the
        learner device; a frame chunk's sequence number stays a Python int."""
        (items, item_version, mask, stats), _ = data
        if self.parts.frame_replay:
            return (jax.device_put(items, self.learner_device), int(item_version), None, stats), None
        return (*self._place(items, item_version, mask), stats), None

    def _place_tree(self, tree: Any) -> Any:
        """A host actor's chunk arrays on the learner (``(items, item_version, mask)`` placed by
        ``_place``; a frame chunk on the learner device)."""
        if self.parts.frame_replay:
            return jax.device_put(tree, self.learner_device)
        return self._place(*tree)

    def describe_placement(self) -> str:
        """One line naming the devices chosen."""
        learners = ", ".join(str(d) for d in self.learner_devices)
        if self.remote is not None:
            return self.remote.describe(f"{learners} (with the replay buffer)")
        if len(self.learner_devices) > 1:
            shared = " (a device shared with the actors)" if self.actor_device in self.learner_devices else ""
            return (f"placement: actors on {self.actor_device}, {len(self.learner_devices)} data-parallel learners "
                    f"on {learners}, the replay buffer sharded by env over them{shared}")
        same = " (same device: acting and learning will serialise)" if self.actor_device == self.learner_device else ""
        return f"placement: actors on {self.actor_device}, learner and replay buffer on {self.learner_device}{same}"

    def _time(self, name: str, t0: float) -> None:
        with self.timers_lock:
            self.timers[name] += time.perf_counter() - t0

    def _zero_stats(self) -> None:
        self.episode_stats = {"episode_return_sum": 0.0, "episode_length_sum": 0.0, "episode_count": 0}

    def _make_actor(self, i: int):
        def act(params: Any, version: int):
            t0 = time.perf_counter()
            params = jax.block_until_ready(jax.device_put(params, self.actor_device))
            self._time("h2d_s", t0)
            # epsilon follows the run's env steps (all actors together) step by step inside the
            # rollout, exactly as in Anakin (so the `sync` schedule reproduces it bit for bit), or
            # Ape-X's fixed per-env epsilons of this actor's slice
            produced = self.runner.buffer.produced
            state = self._actor_states[i].replace(env_steps=jnp.asarray(produced, jnp.int32))
            eps = (None if self.config.epsilon_schedule == "linear"
                   else jax.device_put(actor_epsilons(self.config, produced, i), self.actor_device))
            t0 = time.perf_counter()
            state, items, item_version, mask, stats = self._rollout(params, jnp.asarray(version, jnp.int32), state,
                                                                    eps)
            jax.block_until_ready(items)
            self._time("rollout_s", t0)
            self._actor_states[i] = state
            t0 = time.perf_counter()
            data = jax.block_until_ready((*self._place(items, item_version, mask),
                                          jax.device_put(stats, self.learner_device)))
            self._time("h2d_s", t0)
            return (data, state), self.config.iteration_env_steps  # the state after it: a cut's actor half
        return act

    def _insert_chunks(self, chunks: list[TrajectoryItem]) -> None:
        t0 = time.perf_counter()
        for chunk in chunks:
            (items, item_version, mask, stats), self.consumed_actor_states[chunk.actor_id] = chunk.data
            if self.parts.frame_replay:  # items: the frame chunk, item_version: the actor's chunk number
                a = chunk.actor_id
                gap = item_version != self._next_seq[a]  # the gate dropped chunks of this actor before it
                self._next_seq[a] = item_version + 1
                self.replay_state = self._insert_frames(self.replay_state, items,
                                                        np.int32(a * self.config.num_envs), np.bool_(gap))
            else:
                self.replay_state = self._insert(self.replay_state, items, item_version, mask)
            host = jax.device_get(stats)
            self.episode_stats["episode_return_sum"] += float(host["episode_return_sum"])
            self.episode_stats["episode_length_sum"] += float(host["episode_length_sum"])
            self.episode_stats["episode_count"] += int(host["episode_count"])
            self._actor_epsilon[chunk.actor_id] = float(host["epsilon"])
        self.epsilon = float(np.mean(self._actor_epsilon))
        jax.block_until_ready(self.replay_state)
        self._time("update_s", t0)

    def _learn_block(self, _item: Any, version: int):
        t0 = time.perf_counter()
        env_steps = jnp.asarray(self.runner.buffer.inserted, jnp.int32)
        learner, self.replay_state, metrics = self._learn(self.learner_state, self.replay_state, env_steps)
        jax.block_until_ready(learner.params)
        self._time("update_s", t0)
        self.learner_state = learner
        blocks = version + 1
        if self.snapshot_every and (blocks % self.snapshot_every == 0 or blocks == self.config.learning_iterations):
            self.snapshot = jax.block_until_ready(jax.tree.map(jnp.copy, (learner, self.replay_state)))
            self.snapshot_cut = self.cut()
        metrics = {**jax.device_get(metrics), **self.episode_stats, "epsilon": self.epsilon,
                   "replay_size": int(jnp.sum(self.parts.replay_size(self.replay_state)))}
        self._zero_stats()
        return learner.params, metrics
