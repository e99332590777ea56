"""The TianJi runtime plumbing: actor threads, one learner thread, a ParamStore and a TrajectoryQueue.

No math here: actors and the learner are callables. Components talk only through the queue
(trajectories), the ParamStore (params) and an event queue to the caller (metrics); there is no
global barrier. Every wait has a timeout and sees the stop event; a failure in any thread stops
the run and is re-raised in the caller with its original traceback.

Schedules (docs/runtime.md, "The lag contract"):
    ``sync``      rollout k uses params version k (the actor waits for it): lag 0, bit-reproducible.
    ``one_step``  rollout k+1 uses params version k, deterministically (Cleanba/Sebulba): lag <= 1.
    ``relaxed``   actors use the newest params they find and never wait for the learner, except when
                  a rollout started now could not be consumed within K or the rate limiter says the
                  queue is full (admission control, :meth:`TrajectoryQueue.admit`); the lag gate
                  still drops any sample older than K.
``sync`` and ``one_step`` take one actor (their determinism depends on it).

Learner groups (``num_groups`` G > 1, TianJi's independent learners): G learner threads, each with
its own ParamStore (its own policy version) and TrajectoryQueue; actor ``i`` feeds group
``i % G`` and acts with that group's params, so lag is always measured against the group that
produced the params. Averaging params across groups is the learn function's business
(:mod:`tianji_jax.runtime.layouts.learner_groups`); the schedules' one-actor rule applies per group.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from tianji_jax.buffers.queues import TrajectoryItem, TrajectoryQueue
from tianji_jax.buffers.rate_limiter import RateLimiter
from tianji_jax.runtime.tianji.param_store import ParamStore

__all__ = ["PhaseTimers", "AsyncRunner", "RunnerHooks", "StallError", "PeerStoppedError", "SCHEDULES", "Telemetry", "COMPILE_ALLOWANCE_S"]

SCHEDULES = ("sync", "one_step", "relaxed")

COMPILE_ALLOWANCE_S = 300.0
"""Seconds added to ``stall_timeout_s`` for a wait on the other side's *first* result (the
learner's first publication, a learner's first data), which includes XLA compiling that side's
first update or rollout: on a loaded machine a compile can outlast any sensible stall timeout, and
a stall is only declared against a side that has shown progress before (as the multi-host
watchdog's first-update allowance)."""

ActFn = Callable[[Any, int], "tuple[Any, int] | None"]
"""``act(params, version) -> (data, num_steps)``: one rollout with ``params`` (stamped ``version``);
None only once the runner's ``stop`` event is set (a remote actor gave up waiting: the actor ends)."""
LearnFn = Callable[[TrajectoryItem, int], tuple[Any, Any]]
"""``learn(item, learner_version) -> (new_params, metrics)``: one update; the runner publishes
``new_params`` as version ``learner_version + 1``."""


class StallError(RuntimeError):
    """A component received no fresh data or params for ``stall_timeout_s``."""


@dataclass
class Telemetry:
    """Cumulative seconds waited and worked per side (read by the caller for wait fractions).

    Time spent inside a :meth:`span` counts as it passes: :meth:`read` adds the elapsed part of
    every span still open, so the difference of two reads is the time actually spent between them
    (a long wait that straddles a snapshot is split over both rows instead of being charged whole
    to the row in which it ends, which made per-row wait fractions exceed 1)."""

    actor_wait_s: float = 0.0
    actor_busy_s: float = 0.0
    learner_wait_s: float = 0.0
    learner_busy_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _open: dict = field(default_factory=dict)  # id -> (name, perf_counter start) of spans in progress

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Count the time spent in the ``with`` block towards ``name``, visible to :meth:`read`
        while the block runs."""
        token = object()
        with self.lock:
            self._open[id(token)] = (name, time.perf_counter())
        try:
            yield
        finally:
            with self.lock:
                _, t0 = self._open.pop(id(token))
                setattr(self, name, getattr(self, name) + time.perf_counter() - t0)

    def read(self, now: float | None = None) -> dict[str, float]:
        """The four counters in seconds, open spans included up to ``now`` (``time.perf_counter()``
        seconds; default: the moment of the call)."""
        with self.lock:
            now = time.perf_counter() if now is None else now
            out = {k: getattr(self, k) for k in ("actor_wait_s", "learner_wait_s", "actor_busy_s", "learner_busy_s")}
            for name, t0 in self._open.values():
                out[name] += now - t0
        return out


class PhaseTimers:
    """Cumulative seconds per named phase (``rollout_s``, ``h2d_s``, ``update_s``, ...), added from
    any thread: :meth:`span` times a ``with`` block, :meth:`since` adds ``perf_counter() - t0`` (the
    ``timer(name, t0)`` callback host actors and Ray clients take), :meth:`read` copies them.

    Args:
        names: the phases, each starting at 0 seconds (others are created when first added).
    """

    def __init__(self, *names: str):
        self._seconds = dict.fromkeys(names, 0.0)
        self._lock = threading.Lock()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Add the seconds spent in the ``with`` block to ``name`` (also when it raises)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.since(name, t0)

    def since(self, name: str, t0: float) -> None:
        """Add ``time.perf_counter() - t0`` seconds to ``name``."""
        seconds = time.perf_counter() - t0
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def read(self) -> dict[str, float]:
        """A copy of every phase's cumulative seconds."""
        with self._lock:
            return dict(self._seconds)


class PeerStoppedError(RuntimeError):
    """Multi-host: another process of the job stopped the run (its callback raised, it was
    interrupted, or it stopped early); every process's learners stopped after the same update."""


@dataclass(frozen=True)
class RunnerHooks:
    """What a runner calls besides its actors and learners, all given when the runner is built
    (none is assigned to it afterwards). Every field is optional.

    Attributes:
        extra_snapshot: ``() -> dict``: more counters merged into every telemetry snapshot
            (:meth:`AsyncRunner.take_snapshot`), called in the learner thread that takes it, right
            after a publication (the wiring's per-phase timers and its half of a checkpoint cut).
        recorder: a :class:`~tianji_jax.buffers.schedule_file.ScheduleRecorder` (one learner
            group): every update's consumed rollout and the rollouts the gate dropped before it.
        balancer: an :class:`~tianji_jax.runtime.tianji.auto_schedule.AutoBalancer`, the ``auto``
            schedule's controller: started on the runner's buffers when the run starts, called
            after every update.
        lockstep: ``(runner, local) -> snapshot`` (multi-host,
            :class:`~tianji_jax.runtime.layouts.distributed.Lockstep`): turns the local snapshot function
            into the global one every process's learners agree on, stops included.
    """

    extra_snapshot: Callable[[], dict] | None = None
    recorder: Any = None
    balancer: Any = None
    lockstep: Callable[[Any, Callable[[], dict]], dict] | None = None


class AsyncRunner:
    """Runs actors and a learner concurrently until ``num_updates`` updates are done.

    Args:
        actors: one :data:`ActFn` per actor thread.
        learn: the :data:`LearnFn`.
        initial_params: params published as version 0.
        num_updates: learner updates to run (>= 1).
        item_steps: env steps per trajectory (``T * N``); the learner consumes one item per update.
        schedule: one of :data:`SCHEDULES`.
        max_policy_lag: ``K``; ``sync`` needs 0, ``one_step`` needs >= 1.
        queue_batches: trajectories that may wait in the queue (>= 2, the deadlock rule with ``spi=1``).
        stall_timeout_s: a learner without fresh data, or an actor without the params it waits
            for, this long stops the run with :class:`StallError`.
        store: a :class:`ParamStore` to use (tests inject faulty ones); default a new one.
        admission: ``relaxed`` only: admission control (an actor starts a rollout only when it can
            be consumed within K; :meth:`TrajectoryQueue.admit`). False: actors roll out with the
            newest params at once and then wait for room, so stale rollouts reach the lag gate
            and are dropped (used to exercise the gate; wasteful otherwise).
        initial_version: version of ``initial_params`` (0 for a new run; the restored learner's
            version on resume): the learner stops at ``num_updates`` in total, and ``sync`` /
            ``one_step`` actors start their first rollout with these params without waiting.
        num_groups: learner groups G (>= 1); ``num_updates`` is per group, the actors split
            evenly (actor ``i`` in group ``i % G``). :attr:`store` and :attr:`buffer` are group
            0's (:attr:`stores`, :attr:`buffers` hold all).

    Raises:
        ValueError: bad schedule/lag/actor-count combination (actors not a multiple of
            ``num_groups``), a negative ``initial_version``, or a rate-limiter band that could
            deadlock, before any thread starts.
    """

    def __init__(self, *, actors: list[ActFn], learn: LearnFn, initial_params: Any, num_updates: int,
                 item_steps: int, schedule: str = "relaxed", max_policy_lag: int = 1, queue_batches: int = 2,
                 stall_timeout_s: float = 60.0, store: ParamStore | None = None, admission: bool = True,
                 initial_version: int = 0, num_groups: int = 1, hooks: RunnerHooks = RunnerHooks()):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if not actors:
            raise ValueError("actors: need at least one actor")
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
            raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}")
        if len(actors) % num_groups:
            raise ValueError(f"num_actors={len(actors)} must be a multiple of num_groups={num_groups} (the actors "
                             "split evenly over the learner groups)")
        if schedule in ("sync", "one_step") and len(actors) != num_groups:
            raise ValueError(f"num_actors must be {num_groups} (one per learner group) for schedule {schedule!r} "
                             f"(its determinism needs one actor); got {len(actors)}. Use schedule 'relaxed' for "
                             "several actors")
        if schedule == "sync" and max_policy_lag != 0:
            raise ValueError(f"max_policy_lag must be 0 for schedule 'sync', got {max_policy_lag}")
        if schedule == "one_step" and max_policy_lag < 1:
            raise ValueError(f"max_policy_lag must be >= 1 for schedule 'one_step', got {max_policy_lag}")
        if stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be > 0, got {stall_timeout_s}")
        self.num_groups = num_groups
        self.hooks = hooks
        self.buffers = [TrajectoryQueue(RateLimiter(spi=1.0, min_size=item_steps, min_diff=0,
                                                    max_diff=queue_batches * item_steps, batch_items=item_steps,
                                                    chunk_items=item_steps), max_policy_lag)
                        for _ in range(num_groups)]
        self.buffer = self.buffers[0]
        if isinstance(initial_version, bool) or not isinstance(initial_version, int) or initial_version < 0:
            raise ValueError(f"initial_version must be an int >= 0, got {initial_version!r}")
        self.start_version = initial_version
        self.stores = [store if store is not None and g == 0 else ParamStore(initial_params, initial_version)
                       for g in range(num_groups)]
        self.store = self.stores[0]
        self.updates_done = [0] * num_groups  # updates each group's learner finished in this process
        self.actors, self.learn = actors, learn
        self.num_updates, self.item_steps = int(num_updates), int(item_steps)
        self.schedule, self.stall_timeout_s = schedule, float(stall_timeout_s)
        self.admission = bool(admission)
        self.stop = threading.Event()
        # multi-host (lockstep learners, distributed.Lockstep): the caller's wish to stop, which
        # every process's learners agree on at the same update before they stop
        self.lockstep = hooks.lockstep is not None
        self.stop_request = threading.Event()
        self.stopped_by_peer: int | None = None  # the update after which another process stopped the run
        self.events: queue.Queue = queue.Queue()
        self.telemetry = Telemetry()
        self.actor_logs: list[list[int]] = [[] for _ in actors]  # versions each actor acted with
        self.last_consumed_version = -1
        self.snapshot: dict[str, Any] = {}  # the snapshot of the event being handled by on_update
        self._threads: list[threading.Thread] = []

    # -- threads ------------------------------------------------------------------------------------
    def _guard(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
                exc.add_note(f"raised in tianji thread {name!r}")
                self.events.put(("error", name, exc, traceback.format_exc(), None, None))
                self.stop.set()
                self._wake()
        return run

    def _wake(self) -> None:
        for buf in self.buffers:
            buf.wake()

    def group_of(self, actor_id: int) -> int:
        """The learner group actor ``actor_id`` feeds (``actor_id % num_groups``)."""
        return actor_id % self.num_groups

    def _stall_limit(self, started: bool) -> float:
        """Seconds a wait may last before :class:`StallError`: ``stall_timeout_s``, plus
        :data:`COMPILE_ALLOWANCE_S` while the other side has not ``started`` (its first result
        includes its compilation)."""
        return self.stall_timeout_s + (0.0 if started else COMPILE_ALLOWANCE_S)

    def _wait_params(self, actor_id: int, min_version: int, have: int) -> tuple[Any, int] | None:
        store = self.stores[self.group_of(actor_id)]
        limit = self._stall_limit(self.updates_done[self.group_of(actor_id)] > 0)  # the learner finished one
        with self.telemetry.span("actor_wait_s"):
            got = store.wait_for(min_version, limit, self.stop)
        if got is None and not self.stop.is_set():
            raise StallError(
                f"actor {actor_id} received no params of version >= {min_version} for {limit:g} s; "
                f"last published version {store.version}, last seen by this actor {have}")
        return got

    def _insert(self, item: TrajectoryItem) -> bool:
        buffer = self.buffers[self.group_of(item.actor_id)]
        with self.telemetry.span("actor_wait_s"):
            while not self.stop.is_set():
                if buffer.put(item, 0.5, self.stop):
                    return True
            return False

    def _admit(self, group: int) -> bool:
        with self.telemetry.span("actor_wait_s"):
            while not self.stop.is_set():
                if self.buffers[group].admit(self.item_steps, 0.5, self.stop):
                    return True
            return False

    def _relaxed_actor_loop(self, actor_id: int) -> None:
        group = self.group_of(actor_id)
        while not self.stop.is_set():
            if not self._admit(group):
                return
            params, version = self.stores[group].latest()  # read after admission: the newest there is
            item = self._roll_out(actor_id, params, version)
            if item is None:
                return
            self.buffers[group].put(item, 0.0, self.stop, admitted=True)

    def _roll_out(self, actor_id: int, params: Any, version: int) -> TrajectoryItem | None:
        """Actor ``actor_id``'s next rollout with ``params`` (stamped ``version``), logged in
        :attr:`actor_logs` and numbered; None when the run stopped while it was in flight."""
        with self.telemetry.span("actor_busy_s"):
            out = self.actors[actor_id](params, version)
        if out is None:
            return None
        data, steps = out
        self.actor_logs[actor_id].append(version)
        return TrajectoryItem(data=data, version=version, actor_id=actor_id, num_steps=steps,
                              rollout=len(self.actor_logs[actor_id]) - 1)

    def _actor_loop(self, actor_id: int) -> None:
        if self.schedule == "relaxed" and self.admission:
            return self._relaxed_actor_loop(actor_id)
        store = self.stores[self.group_of(actor_id)]
        params, version = store.latest()
        pending: TrajectoryItem | None = None
        start = r = self.start_version  # rollout index = the version sync acts with
        while not self.stop.is_set():
            if self.schedule == "one_step" and r > start:
                # fetch params r-1 *before* inserting rollout r-1: the learner cannot be past r-1 yet
                got = self._wait_params(actor_id, r - 1, version)
                if got is None:
                    return
                params, version = got
                if not self._insert(pending):
                    return
            else:
                if pending is not None and not self._insert(pending):
                    return
                if self.schedule == "relaxed":  # without admission control
                    params, version = store.latest()
                elif self.schedule == "sync" and r > start:
                    got = self._wait_params(actor_id, r, version)
                    if got is None:
                        return
                    params, version = got
            pending = self._roll_out(actor_id, params, version)
            if pending is None:  # stopped while the rollout was in flight
                return
            r += 1

    def _learner_loop(self, group: int = 0) -> None:
        store, buffer = self.stores[group], self.buffers[group]
        version = store.version
        last_fresh = time.monotonic()
        fed = False  # an item arrived (the actors' first rollouts, which compile, are done)
        while version < self.num_updates and not self.stop.is_set():
            with self.telemetry.span("learner_wait_s"):
                item = buffer.get(version, 0.5, self.stop)
            if item is None:
                self._check_stall(last_fresh, f"learner{f' group {group}' if self.num_groups > 1 else ''} received "
                                  f"no fresh data", f"last published version {version}, last consumed sample version "
                                  f"{self.last_consumed_version}", started=fed)
                continue
            last_fresh, fed = time.monotonic(), True
            self.last_consumed_version = item.version
            if self.hooks.recorder is not None:  # record_schedule: what this update consumes, what was dropped
                self.hooks.recorder.record(version, item, buffer.drop_log or [])
                buffer.drop_log = []
            with self.telemetry.span("learner_busy_s"):
                params, metrics = self.learn(item, version)
            self.updates_done[group] += 1
            version += 1
            store.publish(params, version)
            if self.hooks.balancer is not None:  # the auto schedule's controller (runtime/tianji/auto_schedule.py)
                self.hooks.balancer.after_update(group, buffer, self.telemetry)
            self.events.put(("update", version, metrics, item, self.take_snapshot(), group))
        self.events.put(("done", version, None, None, self.take_snapshot(), group))

    def _check_stall(self, last_fresh: float, what: str, state: str, started: bool = True) -> None:
        """Raise :class:`StallError` ("``what`` for T s; ``state``") when nothing fresh arrived for
        :meth:`_stall_limit` seconds since ``last_fresh`` (``time.monotonic()``) and the run is not
        stopping; ``started``: the other side delivered before (else the compile allowance applies)."""
        limit = self._stall_limit(started)
        if not self.stop.is_set() and time.monotonic() - last_fresh > limit:
            raise StallError(f"{what} for {limit:g} s; {state}")

    def take_snapshot(self) -> dict[str, Any]:
        """:meth:`local_snapshot`, or, multi-host, the sum of every process's
        (``hooks.lockstep``: a collective, taken in lockstep after each update)."""
        if self.hooks.lockstep is not None:
            return self.hooks.lockstep(self, self.local_snapshot)
        return self.local_snapshot()

    def local_snapshot(self) -> dict[str, Any]:
        """Counters at this moment, taken in the learner thread right after a publication, so
        that a metrics row's rates use counts and a time that belong together (the caller's
        thread may handle the event later): ``time`` (perf_counter seconds), the buffer's
        ``produced`` / ``consumed`` / ``inserted`` / ``dropped_stale`` / ``depth``, the limiter's
        ``sampled`` / ``limiter_inserted`` / ``limiter_error``, the telemetry's wait and busy
        seconds, group 0's knobs (``lag_window`` / ``queue_limit`` or ``spi_band``), plus whatever
        ``hooks.extra_snapshot()`` returns (per-phase timers). With learner groups the counts are sums
        over the groups' queues."""
        now = time.perf_counter()
        waits = self.telemetry.read(now)  # the same instant as the row's time: fractions stay <= 1
        bufs = self.buffers
        snap = {"time": now, "produced": sum(b.produced for b in bufs),
                "consumed": sum(getattr(b, "consumed", 0) for b in bufs),
                "inserted": sum(getattr(b, "inserted", 0) for b in bufs),
                "dropped_stale": sum(b.dropped_stale for b in bufs), "depth": sum(b.depth() for b in bufs),
                "sampled": sum(b.limiter.sampled for b in bufs),
                "limiter_inserted": sum(b.limiter.inserted for b in bufs),
                "limiter_error": sum(b.limiter.error for b in bufs), **bufs[0].knobs(), **waits}
        if self.hooks.extra_snapshot is not None:
            snap.update(self.hooks.extra_snapshot())
        return snap

    # -- caller ------------------------------------------------------------------------------------
    def run(self, on_update: Callable[[int, Any, TrajectoryItem], bool], join_timeout_s: float = 5.0) -> int:
        """Start the threads and call ``on_update(version, metrics, item)`` in the caller's thread
        after every update; it returns True to stop early. Returns the newest published version
        (the sum of the groups' versions with learner groups; ``version`` passed to
        ``on_update`` is the publishing group's, that of ``group_of(item.actor_id)``).

        Multi-host (:attr:`lockstep`): when the caller stops (``on_update`` returned True or
        raised) the learners do not stop at once, which would leave the other processes waiting in
        the next collective; the request rides on the next update's global telemetry sum, and every
        process's learner stops after that same update (:class:`~tianji_jax.runtime.layouts.distributed.Lockstep`;
        waited for up to ``stall_timeout_s`` + 30 s, then the threads are stopped anyway).

        Raises:
            The original exception of a failed thread (with a note naming the thread), or
            :class:`StallError`; RuntimeError if a thread does not stop within ``join_timeout_s``;
            :class:`PeerStoppedError` (multi-host) when another process stopped the run.
        """
        groups = range(self.num_groups)
        names = ([f"actor-{i}" for i in range(len(self.actors))]
                 + (["learner"] if self.num_groups == 1 else [f"learner-{g}" for g in groups]))
        targets = ([lambda i=i: self._actor_loop(i) for i in range(len(self.actors))]
                   + ([self._learner_loop] if self.num_groups == 1 else
                      [lambda g=g: self._learner_loop(g) for g in groups]))
        self._threads = [threading.Thread(target=self._guard(n, t), name=f"tianji-{n}", daemon=True)
                         for n, t in zip(names, targets)]
        if self.hooks.balancer is not None:  # its first knob values, on the buffers (a subclass's own kind)
            self.hooks.balancer.start(self.buffers)
        if self.hooks.recorder is not None:
            self.buffer.drop_log = []  # the queue logs what its gate drops, for the recorder
        for t in self._threads:
            t.start()
        latest = [self.start_version] * self.num_groups  # each group's newest published version
        finished = 0  # learner groups that ran all their updates
        error: BaseException | None = None
        try:
            while True:
                try:
                    kind, version, payload, item, snap, group = self.events.get(timeout=0.1)
                except queue.Empty:
                    continue
                if kind == "error":
                    error = payload
                    break
                if kind == "done":
                    finished += 1
                    if finished == self.num_groups:
                        break
                    continue
                latest[group] = version
                self.snapshot = snap
                if on_update(version, payload, item):
                    break
        finally:
            if self.lockstep and error is None and finished < self.num_groups:
                self._agree_stop()
            self.stop.set()
            self._wake()
            deadline = time.monotonic() + join_timeout_s
            for t in self._threads:
                t.join(max(0.0, deadline - time.monotonic()))
            alive = [t.name for t in self._threads if t.is_alive()]
        if error is None:  # a thread may have failed while we were shutting down
            while not self.events.empty():
                kind, _, payload, _, _, _ = self.events.get_nowait()
                if kind == "error":
                    error = payload
                    break
        if error is not None:
            raise error
        if alive:
            raise RuntimeError(f"threads did not stop within {join_timeout_s} s: {alive}")
        if self.stopped_by_peer is not None:
            raise PeerStoppedError(f"another process of this multi-host job stopped the run after update "
                                   f"{self.stopped_by_peer} (its own output says why); this process stopped with it "
                                   "at the same update")
        return sum(latest)

    def _agree_stop(self) -> None:
        """Multi-host: ask every process's learners to stop after the same update (see :meth:`run`)
        and wait until this process's learner threads have."""
        self.stop_request.set()
        deadline = time.monotonic() + self.stall_timeout_s + 30.0
        for t in self._threads[len(self.actors):]:  # the learner threads (after the actors', see run)
            t.join(max(0.0, deadline - time.monotonic()))

    def stop_agreed(self, by_peer: bool) -> None:
        """Multi-host: the processes agreed to stop after the update just published (called by the
        learner thread from :class:`~tianji_jax.runtime.layouts.distributed.Lockstep`); ``by_peer``:
        this process did not ask, so :meth:`run` raises :class:`PeerStoppedError`."""
        if by_peer:
            self.stopped_by_peer = self.start_version + sum(self.updates_done)
        self.stop.set()
        self._wake()
