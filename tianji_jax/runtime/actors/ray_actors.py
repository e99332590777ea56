"""Decoupled actor nodes on Ray Core (docs/runtime.md, "Learner layouts", TianJi's role split).

Each remote actor is a Ray actor process (on any node of a Ray cluster) that owns a host env
(envpool/gymnasium) and a CPU copy of the policy, and runs the same
:class:`~tianji_jax.runtime.actors.host_actor.HostActor` loop a local actor thread runs. The process
builds that actor from the algorithm registered for the config (its ``host_actor`` factory,
:class:`~tianji_jax.algos.registry.Algorithm`), so one worker serves every algorithm whose data
path has host actors: PPO's trajectories and DQN's n-step transitions (or Atari frame chunks)
alike. The learner
process keeps the :class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner` unchanged: one thin
:class:`RayActorClient` per remote actor stands in for an actor thread's ``act(params, version)``,
so admission control, the lag gate and the rate limiter all apply at the learner's ingress
exactly as for local actors.

Transport (the design's ``publish`` / ``put`` / ``poll``):

* ``publish(params, version)``: :class:`ParamPublisher` copies the params to host memory and
  ``ray.put``-s them once per version; every actor's rollout task takes that one object ref.
* ``put(chunk, meta)``: a rollout task returns one chunk as host (numpy) arrays (PPO: the
  ``(T, N)`` trajectory of :data:`~tianji_jax.runtime.actors.chunker.CHUNK_KEYS`; DQN: its n-step
  transitions; every step stamped with the version it was acted with) plus its metadata
  (:class:`ChunkMeta`) through the object store.
* ``poll()``: the client waits on the task with ``ray.wait`` in short slices, watching the
  runner's stop event and a deadline, so nothing blocks forever.

Failures: actors are created with ``max_restarts`` (Ray re-creates a dead actor process) and
``max_task_retries=0`` (Ray never re-runs a rollout task, so a chunk can never arrive twice). A
rollout lost to an actor death is counted in :attr:`RayActorClient.lost_chunks` and the client
submits a new rollout to the restarted actor, which re-creates its env with a new seed
(``incarnation``) and reports itself in :class:`ChunkMeta`. When an actor has died more than
``max_restarts`` times the run stops with :class:`RemoteActorError`.

Ray is optional: ``pip install tianji-jax[ray]``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any, Callable

import jax


__all__ = ["require_ray", "RayContext", "ParamPublisher", "RayActorClient", "ChunkMeta", "RemoteActorError",
           "STARTUP_TIMEOUT_S", "make_ray_actors", "RemoteActors"]

STARTUP_TIMEOUT_S = 300.0
"""Seconds :func:`make_ray_actors` waits for every remote actor to start."""

_INSTALL_HINT = "Ray actor nodes need Ray: pip install 'tianji-jax[ray]' (or pip install 'ray>=2.60,<3')"


def require_ray():
    """Import and return the ``ray`` module.

    Raises:
        ImportError: Ray is not installed (the message says how to install it).
    """
    try:
        import ray
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err
    return ray


class RemoteActorError(RuntimeError):
    """A remote actor died and Ray would not restart it again (``max_restarts`` used up), or it
    returned a chunk other than the one asked for."""


@dataclasses.dataclass(frozen=True)
class ChunkMeta:
    """What a remote actor reports with each chunk.

    Attributes:
        actor_id: index of the actor (0 .. num_actors - 1).
        incarnation: how many times the client had seen this actor die when it asked for this
            chunk (0 for the first process); the env seed depends on it.
        seq: chunk index within the actor process (0, 1, ...); ``(actor_id, pid, seq)`` is unique
            per chunk.
        version: the policy version every step of the chunk was acted with.
        pid: the actor process id; node_id: the Ray node it runs on (hex).
        rollout_s, inference_s, env_step_s: seconds the actor spent on the rollout (inference +
            env step), and on each half.
        env_steps_discarded: cumulative env steps the actor's chunker dropped since it started
            (leftovers when a rollout starts with newer params; ``dropped_partial`` in metrics).
        num_steps: env steps in the chunk (what the runtime's counters add).
    """

    actor_id: int
    incarnation: int
    seq: int
    version: int
    pid: int
    node_id: str
    rollout_s: float
    inference_s: float
    env_step_s: float
    env_steps_discarded: int
    num_steps: int


class _RolloutWorker:
    """The body of a remote actor (wrapped by ``ray.remote`` in :func:`make_ray_actors`).

    Owns the host actor of the config's registered algorithm (``Algorithm.host_actor``), built
    lazily on the first rollout of each incarnation, with its policy jitted on this process's
    first CPU device. Not used directly.
    """

    def __init__(self, config: Any, actor_id: int, seed: int):
        self.config, self.actor_id, self.seed_base = config, int(actor_id), int(seed)
        self.actor = None
        self.incarnation: int | None = None
        self.seq = 0
        self.run_env_steps = 0  # the run's env steps as of the newest rollout request (DQN's epsilon)

    def _start(self, incarnation: int) -> None:
        import ray

        from tianji_jax.algos.registry import algorithm_for

        if self.actor is not None:
            self.actor.close()
        cfg = self.config
        # a new env seed per incarnation, disjoint from every other actor's and incarnation's envs;
        # a process Ray restarted while it was idle is asked for the old incarnation (the client
        # learns of the death only from the next chunk's pid), so it mixes its pid in
        salt = os.getpid() if ray.get_runtime_context().was_current_actor_reconstructed else 0
        seed = (self.seed_base + (incarnation + salt) * cfg.num_actors * cfg.num_envs) % 2**32
        from tianji_jax.runtime.tianji.async_runtime import PhaseTimers

        self.timers = PhaseTimers("rollout_s", "inference_s", "env_step_s", "h2d_s")
        make = algorithm_for(cfg).host_actor_fn()
        self.actor = make(cfg, self.actor_id, jax.devices("cpu")[0], seed=seed, timer=self.timers.since,
                          key_folds=(self.actor_id, incarnation, salt), run_env_steps=lambda: self.run_env_steps)
        self.incarnation = incarnation

    def rollout(self, params: Any, version: int, incarnation: int,
                run_env_steps: int = 0) -> tuple[Any, ChunkMeta]:
        """One chunk acted with ``params`` (host numpy pytree) stamped ``version``, as host
        arrays; ``run_env_steps``: the run's env steps so far (schedules such as DQN's epsilon)."""
        import ray

        if self.incarnation != incarnation:
            self._start(incarnation)
        self.run_env_steps = int(run_env_steps)
        before = self.timers.read()
        data, steps = self.actor(params, version)
        data = jax.device_get(data)
        d = {k: v - before[k] for k, v in self.timers.read().items()}
        meta = ChunkMeta(self.actor_id, incarnation, self.seq, int(version), os.getpid(),
                         ray.get_runtime_context().get_node_id(), d["rollout_s"], d["inference_s"],
                         d["env_step_s"], self.actor.chunker.transitions_discarded + self.actor.chunker.stale_actions,
                         int(steps))
        self.seq += 1
        return data, meta

    def info(self) -> tuple[int, str]:
        """``(pid, node_id)`` of this actor process."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def start(self) -> tuple[int, str]:
        """Import JAX and create the envs now (not in the first rollout); ``(pid, node_id)``."""
        if self.incarnation is None:
            self._start(0)
        return self.info()

    def close(self) -> None:
        """Close the env (the process ends when the actor handle is released)."""
        if self.actor is not None:
            self.actor.close()
            self.actor = None


class RayContext:
    """The Ray connection of a run: joins ``address``, reuses an existing connection, or starts a
    private single-node instance; :meth:`close` undoes only what it did.

    Args:
        address: None: reuse this process's Ray connection if there is one, else start a private
            local instance bound to 127.0.0.1 (no dashboard, usage stats off, its own temp dir,
            so it never joins another process's cluster); ``"auto"`` or ``"HOST:PORT"``: connect
            to that running cluster (``ray start --head`` on the learner node).
        num_cpus: CPUs the private local instance offers (default: ``os.cpu_count()``).

    Raises:
        ImportError: Ray is not installed.
    """

    def __init__(self, address: str | None, num_cpus: int | None = None):
        ray = require_ray()
        self.owned = False
        self._temp_dir: str | None = None
        if ray.is_initialized():
            return
        # ray.init forks this process; OpenBLAS's fork handler stops its threads under a LAPACK call in
        # flight (e.g. an orthogonal initialiser's QR), which then never returns: finish every computation
        jax.block_until_ready(jax.live_arrays())
        if address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            self._temp_dir = tempfile.mkdtemp(prefix="tianji-ray-")
            ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                     _temp_dir=self._temp_dir, num_cpus=num_cpus or os.cpu_count(), log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        self.owned = True

    def close(self) -> None:
        """Shut Ray down if this context started or joined it (idempotent)."""
        if self.owned:
            require_ray().shutdown()
            self.owned = False
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None


class ParamPublisher:
    """Params in the object store, one ``ray.put`` per policy version, shared by every actor.

    :meth:`ref` returns the object ref for ``(params, version)``: the first caller for a new version
    (or a new object republished at it: a replay learner's fresh observation statistics) copies
    ``params`` to host memory and puts them; later callers get the same ref. Only the newest ref
    is held (Ray frees older ones once the rollouts using them finish). Thread-safe.

    Attributes:
        puts: number of ``ray.put`` calls made (one per version published to actors).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._version, self._source = None, None  # the version and the object (identity) the ref holds
        self._ref = None
        self.puts = 0

    def ref(self, params: Any, version: int):
        """The object ref of ``params`` (a pytree of arrays) for policy ``version``."""
        ray = require_ray()
        with self._lock:
            if self._version != version or params is not self._source:
                self._ref = ray.put(jax.device_get(params))
                self._version, self._source = int(version), params
                self.puts += 1
            return self._ref


class RayActorClient:
    """The learner-side stand-in for one remote actor: the runtime's ``act(params, version)``.

    Each call submits one rollout task with the shared params ref and polls it (``ray.wait`` in
    ``poll_s`` slices) until it finishes, the runner's :attr:`stop` event is set (returns None: the
    actor loop ends) or ``timeout_s`` passes (:class:`TimeoutError`). If the actor died during the
    task (Ray reports ``ActorDiedError`` or ``ActorUnavailableError``), the chunk is counted in
    :attr:`lost_chunks` and a new rollout is submitted every ``poll_s`` until the actor Ray
    restarts takes it; the admission the runner made for the call carries over, so nothing is
    consumed twice and no queue room leaks. A restart is recognised by the new process id of the
    next chunk (counted in :attr:`deaths`, also when the process died idle and nothing was lost).
    A resubmission refused with ``ActorDiedError`` means Ray has used up ``max_restarts``:
    :class:`RemoteActorError`.

    Args:
        handle: the Ray actor handle (created by :func:`make_ray_actors`).
        actor_id: the actor's index.
        publisher: the run's shared :class:`ParamPublisher`.
        to_learner: ``to_learner(traj) -> traj`` places a chunk on the learner device(s).
        timer: ``timer(name, t0)`` adds ``perf_counter() - t0`` to a named phase.
        max_restarts: the actor's Ray ``max_restarts`` (reported in errors).
        timeout_s: longest wait for one rollout (seconds); ``timeout_s + STARTUP_TIMEOUT_S`` from an
            actor death during the call (the restarted process starts as at creation).
        poll_s: ``ray.wait`` slice (seconds).
        run_env_steps: ``() -> int``, the run's env steps so far, sent with every rollout request
            (DQN's epsilon schedule reads it); None sends 0.

    Attributes:
        stop: a :class:`threading.Event`; set it to the runner's stop event.
        lost_chunks: rollouts submitted and never delivered (the actor died with them in flight);
            never inserted.
        deaths: actor restarts seen (a chunk from a new process), plus a final death.
        incarnation: restarts seen so far (sent with each rollout; seeds a restarted actor's envs).
        unavailable_retries: resubmissions the actor refused while Ray was restarting it
            (nothing was produced, nothing counted as lost).
        chunks: the :class:`ChunkMeta` of every chunk returned, in order (an independent log:
            tests check ``(actor_id, pid, seq)`` is never repeated).
        env_steps_discarded: the actor's latest reported chunker discards (all incarnations).
    """

    def __init__(self, handle: Any, actor_id: int, publisher: ParamPublisher, to_learner, timer, *,
                 max_restarts: int, timeout_s: float, poll_s: float = 0.2,
                 run_env_steps: Callable[[], int] | None = None):
        self.handle, self.actor_id, self.publisher = handle, int(actor_id), publisher
        self.run_env_steps = run_env_steps or (lambda: 0)
        self.to_learner, self._time = to_learner, timer
        self.max_restarts, self.timeout_s, self.poll_s = int(max_restarts), float(timeout_s), float(poll_s)
        self.stop = threading.Event()
        self.lost_chunks = 0
        self.deaths = 0
        self.unavailable_retries = 0
        self.incarnation = 0
        self.chunks: list[ChunkMeta] = []
        self._discarded_before = 0  # discards of dead incarnations
        self._discarded_now = 0

    @property
    def env_steps_discarded(self) -> int:
        """Env steps the actor's chunker dropped, over all its incarnations (the earlier
        processes' final counts plus the current process's latest report)."""
        return self._discarded_before + self._discarded_now

    def __call__(self, params: Any, version: int) -> tuple[dict, int] | None:
        ray = require_ray()
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline = time.monotonic() + (limit := self.timeout_s)
        failures = 0  # failed rollout tasks in this call
        while True:
            t0 = time.perf_counter()
            ref = self.publisher.ref(params, version)
            self._time("h2d_s", t0)
            t_submit = time.perf_counter()
            task = self._submit(ref, int(version))
            while True:
                ready, _ = ray.wait([task], timeout=self.poll_s)
                if ready:
                    break
                if self.stop.is_set():
                    ray.cancel(task)
                    return None
                if time.monotonic() > deadline:
                    ray.cancel(task)
                    raise TimeoutError(f"remote actor {self.actor_id}: no rollout within {limit:g} s "
                                       f"(version {version}, incarnation {self.incarnation})")
            try:
                traj, meta = ray.get(task, timeout=self.timeout_s)
            except RayActorError as err:  # ActorDiedError or ActorUnavailableError (Ray reports either)
                failures += 1
                if failures == 1:  # the rollout in flight is gone: never delivered, so never consumed
                    self.lost_chunks += 1  # and the restarted process starts again, as at creation:
                    limit = self.timeout_s + STARTUP_TIMEOUT_S
                    deadline = time.monotonic() + limit
                else:
                    self.unavailable_retries += 1
                    if not isinstance(err, ActorUnavailableError):  # dead for good: Ray ran out of restarts
                        self.deaths += 1
                        raise RemoteActorError(
                            f"remote actor {self.actor_id} died {self.deaths} time(s) and Ray no longer restarts "
                            f"it (max_restarts={self.max_restarts}): {err}") from err
                if self.stop.wait(self.poll_s):
                    return None
                continue
            wall = time.perf_counter() - t_submit
            if meta.version != version or meta.actor_id != self.actor_id:
                raise RemoteActorError(f"remote actor {self.actor_id} returned a chunk of actor {meta.actor_id}, "
                                       f"version {meta.version}; asked for version {version}")
            if self.chunks and meta.pid != self.chunks[-1].pid:  # a new process: Ray restarted the actor
                self._died()
            self._discarded_now = meta.env_steps_discarded
            self.chunks.append(meta)
            # the actor's own phases; what the round trip took beyond them is transfer + dispatch
            for name in ("rollout_s", "inference_s", "env_step_s"):
                self._time(name, time.perf_counter() - getattr(meta, name))
            self._time("h2d_s", time.perf_counter() - max(0.0, wall - meta.rollout_s))
            t0 = time.perf_counter()
            traj = jax.block_until_ready(self.to_learner(traj))
            self._time("h2d_s", t0)
            return traj, meta.num_steps

    def _submit(self, params_ref: Any, version: int):
        """Submit one rollout task to the actor; returns its object ref."""
        return self.handle.rollout.remote(params_ref, version, self.incarnation, int(self.run_env_steps()))

    def _died(self) -> None:
        self.deaths += 1
        self.incarnation += 1  # the next rollout re-creates the envs with a new seed
        self._discarded_before += self._discarded_now
        self._discarded_now = 0

    def info(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """``(pid, node_id)`` of the actor's current process (waits up to ``timeout_s``)."""
        ray = require_ray()
        return ray.get(self.handle.info.remote(), timeout=timeout_s)


def make_ray_actors(config: Any, publishers: list[ParamPublisher], to_learner, timer,
                    run_env_steps: Callable[[], int] | None = None, seed: int | None = None) -> list[RayActorClient]:
    """Create ``config.num_actors`` remote actors and their clients; client ``i`` takes params from
    ``publishers[i % len(publishers)]`` (one per learner group) and places chunks with
    ``to_learner(chunk, i)``; the actors seed their envs from ``seed`` (default ``config.seed``;
    a resumed run passes a fresh one). Each actor asks for one CPU
    (Ray places it on any node with a free CPU: start the learner's head node with
    ``ray start --head --num-cpus=0`` to keep actors off it), ``max_restarts=config.ray_max_restarts``
    and ``max_task_retries=0``, and runs JAX on CPU (``JAX_PLATFORMS=cpu``). Needs a Ray
    connection (:class:`RayContext`).

    The actors start (process, JAX import, envs) before this returns, so the runtime's
    ``stall_timeout_s`` does not have to cover it.

    Raises:
        ImportError: Ray is not installed.
        ValueError: the cluster has fewer CPU slots than ``config.num_actors`` (they would never start).
        TimeoutError: the actors did not start within :data:`STARTUP_TIMEOUT_S` (they are killed).
        Whatever creating an actor's envs raised, with its remote traceback (``RayTaskError``).
    """
    ray = require_ray()
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < config.num_actors:
        raise ValueError(f"num_actors={config.num_actors}: each remote actor needs one CPU slot and the Ray cluster "
                         f"offers {cpus:g}; allowed: at most {int(cpus)} (or add nodes / CPUs)")
    options: dict[str, Any] = dict(num_cpus=1, max_restarts=config.ray_max_restarts, max_task_retries=0,
                                   max_concurrency=1, runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}})
    cls = ray.remote(**options)(_RolloutWorker)
    run = uuid.uuid4().hex[:8]
    seed = config.seed if seed is None else int(seed)
    handles = [cls.options(name=f"tianji-{run}-actor-{i}").remote(config, i, seed) for i in range(config.num_actors)]
    try:  # start-up (process, JAX import, envs) outside the runtime's stall window; env errors show here
        ray.get([h.start.remote() for h in handles], timeout=STARTUP_TIMEOUT_S)
    except BaseException as err:
        for h in handles:
            ray.kill(h, no_restart=True)
        if isinstance(err, ray.exceptions.GetTimeoutError):
            raise TimeoutError(f"{config.num_actors} remote actor(s) did not start within {STARTUP_TIMEOUT_S:g} s "
                               "(is every actor's CPU slot free in the Ray cluster?)") from err
        raise
    return [RayActorClient(h, i, publishers[i % len(publishers)], lambda chunk, i=i: to_learner(chunk, i), timer,
                           max_restarts=config.ray_max_restarts, timeout_s=config.stall_timeout_s,
                           run_env_steps=run_env_steps)
            for i, h in enumerate(handles)]


class RemoteActors:
    """The remote actors of one run, for any algorithm: the Ray connection, one
    :class:`ParamPublisher` per learner group (versions count per group) and one
    :class:`RayActorClient` per actor (the runtime's actor callables; actor ``i`` acts with group
    ``i % G``'s params), with what the runtimes read from them.

    Args:
        config: the run's config (``actor_backend='ray'``, ``ray_address``, ``ray_max_restarts``,
            ``num_actors``, ``stall_timeout_s``, ``num_learner_groups`` where it has one).
        to_learner: ``to_learner(chunk, actor_id) -> chunk`` places a chunk (host arrays) on the
            learner (of the actor's group).
        timer: ``timer(name, t0)`` as :class:`RayActorClient`.
        run_env_steps: as :class:`RayActorClient`.
        seed: the actors' env seed base (default ``config.seed``; a resumed run passes a fresh one,
            so its envs do not replay the episodes the run began with).

    A private local instance offers a CPU slot per actor, even past the cores it has.

    Raises:
        as :class:`RayContext` and :func:`make_ray_actors` (Ray is shut down again first).
    """

    def __init__(self, config: Any, to_learner: Callable, timer: Callable[[str, float], None],
                 run_env_steps: Callable[[], int] | None = None, seed: int | None = None):
        self.context = RayContext(config.ray_address, num_cpus=max(os.cpu_count() or 1, config.num_actors))
        self.publishers = [ParamPublisher() for _ in range(getattr(config, "num_learner_groups", 1))]
        self.publisher = self.publishers[0]
        try:
            self.clients = make_ray_actors(config, self.publishers, to_learner, timer, run_env_steps, seed)
        except BaseException:
            self.context.close()
            raise

    def bind(self, stop: threading.Event) -> None:
        """Let a rollout in flight return as soon as ``stop`` (the runner's) is set."""
        for client in self.clients:
            client.stop = stop

    @property
    def lost_chunks(self) -> int:
        """Chunks lost to remote actor deaths (never inserted)."""
        return sum(c.lost_chunks for c in self.clients)

    @property
    def env_steps_discarded(self) -> int:
        """Env steps the remote actors' chunkers dropped, over all their incarnations."""
        return sum(c.env_steps_discarded for c in self.clients)

    def describe(self, learner: str) -> str:
        """The placement line: ``"placement: N remote actor(s) on Ray (CPU policy copies), learner on ..."``."""
        return f"placement: {len(self.clients)} remote actor(s) on Ray (CPU policy copies), learner on {learner}"

    def close(self) -> None:
        """Kill the remote actors and shut down the Ray instance this run started (idempotent)."""
        if self.context is None:
            return
        ray = require_ray()
        if ray.is_initialized():
            for client in self.clients:
                ray.kill(client.handle, no_restart=True)
        self.context.close()
        self.context = None
