"""The TianJi runtime for the replay data path: :class:`ReplayRunner`, an
:class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner` whose learners drain a
:class:`~tianji_jax.buffers.queues.ReplayIngress` (lag gate at insert, samples-per-insert rate limiter)
into learner-owned replay instead of consuming a trajectory queue. No math: the caller's
``insert`` and ``learn`` callables own the replay and the update (for DQN,
:class:`~tianji_jax.runtime.async_replay.AsyncReplay`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from tianji_jax.buffers.queues import ReplayIngress, TrajectoryItem
from tianji_jax.buffers.rate_limiter import RateLimiter
from tianji_jax.runtime.tianji.async_runtime import AsyncRunner, RunnerHooks, StallError

__all__ = ["ReplayRunner"]


class ReplayRunner(AsyncRunner):
    """:class:`AsyncRunner` whose learner drains a :class:`ReplayIngress` instead of a FIFO.

    ``relaxed`` (default): actors run the relaxed loop (admission by the limiter, newest params).
    The learner loop takes every waiting chunk (the gate at insert drops stale ones), calls
    ``insert(chunks, group)``, and when the limiter allows a block calls ``learn(group,
    version)`` and publishes version + 1.

    ``sync`` (one actor per group): the Anakin iteration order. The actor acts chunk k once the
    learner has processed chunk k-1, with the params published then; the learner inserts each
    chunk and runs one block right after it once more than ``min_size`` env steps are inserted
    (the blocks' samples are recorded with the limiter, which then only reports). Lag 0,
    deterministic.

    Learner groups (``num_groups`` G > 1): G learner threads, each with its own ingress, rate
    limiter, ParamStore (policy version) and, in the caller's ``insert`` / ``learn``, its own
    replay; actor ``i`` feeds group ``i % G`` (as :class:`AsyncRunner`). ``num_updates`` and
    ``min_size`` are per group. ``hooks.extra_snapshot`` runs in the publishing group's thread with
    :attr:`publishing_group` set and :attr:`published` counting blocks in event order.

    Args:
        actors: one ``act(params, version) -> (data, num_steps)`` per actor thread.
        insert: ``insert(list[TrajectoryItem], group)``, called in the group's learner thread.
        learn: ``learn(group, version) -> (params, metrics)``, one learner block of ``group``.
        initial_params: params published as version 0.
        num_updates: learner blocks each group runs.
        chunk_steps: env steps per actor chunk (``c``).
        spi: samples per inserted env step (``replay_ratio * batch_size``).
        block_samples: items sampled per block (``updates_per_step * batch_size``).
        min_size: env steps a group inserts before its first block (``learning_starts`` / G).
        max_policy_lag: ``K`` of the gate at insert.
        stall_timeout_s: no chunk and no block this long stops the run with :class:`StallError`.
        initial_version: version of ``initial_params`` (the restored learner's on resume).
        schedule: ``"relaxed"`` or ``"sync"`` (``max_policy_lag`` must then be 0).
        num_groups: learner groups G (>= 1).
        band_factor: the limiter band's half-width as a multiple (>= 1) of the narrowest that
            cannot deadlock, ``block_samples + spi * chunk_steps`` (``replay_ratio_tolerance``).
        total_inserts: env steps a group inserts in the whole run (``relaxed``: its last block
            waits until they are inserted, so the run takes at least the env steps it describes,
            as Anakin's last iteration inserts before it learns; at most a chunk more, which the
            limiter's band admits before that block; None: no wait).

    Raises:
        ValueError: no actors, a bad schedule/lag/actor-count combination or timeout, before any
            thread starts.
    """

    def __init__(self, *, actors: list, insert: Callable[[list[TrajectoryItem], int], None], learn: Callable,
                 initial_params: Any, num_updates: int, chunk_steps: int, spi: float, block_samples: int,
                 min_size: int, max_policy_lag: int, stall_timeout_s: float = 60.0, initial_version: int = 0,
                 schedule: str = "relaxed", num_groups: int = 1, band_factor: float = 1.0,
                 total_inserts: int | None = None, hooks: RunnerHooks = RunnerHooks()):
        if schedule not in ("sync", "relaxed"):
            raise ValueError(f"schedule must be one of ('sync', 'relaxed') for replay, got {schedule!r}")
        super().__init__(actors=actors, learn=learn, initial_params=initial_params, num_updates=num_updates,
                         item_steps=chunk_steps, schedule=schedule, max_policy_lag=max_policy_lag,
                         queue_batches=2, stall_timeout_s=stall_timeout_s, initial_version=initial_version,
                         num_groups=num_groups, hooks=hooks)
        self.min_size = int(min_size)
        self.total_inserts = total_inserts
        self._processed = [0] * num_groups  # sync: chunks each group's learner has inserted (and learned after)
        self._processed_cond = threading.Condition()
        # Reverb's SampleToInsertRatio: the band sits around min_size * spi and is (band_factor times)
        # as wide as the deadlock rule needs on each side, so neither side can block forever.
        if not band_factor >= 1.0:
            raise ValueError(f"band_factor must be >= 1 (the deadlock rule's band), got {band_factor}")
        tol = band_factor * (block_samples + spi * chunk_steps)
        centre = min_size * spi
        self.buffers = [ReplayIngress(RateLimiter(spi=spi, min_size=max(1, min_size), min_diff=centre - tol,
                                                  max_diff=centre + tol, batch_items=block_samples,
                                                  chunk_items=chunk_steps), max_policy_lag)
                        for _ in range(num_groups)]
        self.buffer = self.buffers[0]
        self.insert, self.block_samples = insert, int(block_samples)
        self._publish_lock = threading.Lock()
        self.published = 0  # learner blocks published by all groups in this process, in event order
        self.publishing_group: int | None = None  # the group whose event is being made (else None)

    def _actor_loop(self, actor_id: int) -> None:
        if self.schedule != "sync":
            return super()._actor_loop(actor_id)
        act = self.actors[actor_id]
        group = self.group_of(actor_id)
        r = 0
        while not self.stop.is_set():
            with self.telemetry.span("actor_wait_s"), self._processed_cond:  # the learner done with chunk r - 1
                # the compile allowance until the group's first block (its first learn compiles)
                limit = self._stall_limit(self.updates_done[group] > 0)
                deadline = time.monotonic() + limit
                while self._processed[group] < r:
                    if self.stop.is_set():
                        return
                    if time.monotonic() > deadline:
                        raise StallError(f"actor {actor_id} waited {limit:g} s for the learner to "
                                         f"process chunk {r - 1}; last published version "
                                         f"{self.stores[group].version}")
                    self._processed_cond.wait(0.1)
            params, version = self.stores[group].latest()
            with self.telemetry.span("actor_busy_s"):
                data, steps = act(params, version)
            self.actor_logs[actor_id].append(version)
            if not self._insert(TrajectoryItem(data=data, version=version, actor_id=actor_id, num_steps=steps)):
                return
            r += 1

    def _publish(self, group: int, version: int, params: Any, metrics: Any) -> None:
        """Publish ``group``'s params as ``version`` and queue its update event. The snapshot and
        the event are made under one lock, so :attr:`published` (blocks of all groups, counted in
        event order) and :attr:`publishing_group` are exact inside ``hooks.extra_snapshot``."""
        self.updates_done[group] += 1
        self.stores[group].publish(params, version)
        with self._publish_lock:
            self.published += 1
            self.publishing_group = group
            try:
                self.events.put(("update", version, metrics, None, self.take_snapshot(), group))
            finally:
                self.publishing_group = None

    def _sync_learner_loop(self, group: int) -> None:
        buffer = self.buffers[group]
        version = self.stores[group].version
        last_fresh = time.monotonic()
        fed = False
        while version < self.num_updates and not self.stop.is_set():
            with self.telemetry.span("learner_wait_s"):
                chunks, _ = buffer.take(version, None, 0.5, self.stop)
            if not chunks:
                self._check_stall(last_fresh, "learner received no transitions", f"last published version {version}",
                                  started=fed)
                continue
            last_fresh, fed = time.monotonic(), True
            for chunk in chunks:
                with self.telemetry.span("learner_busy_s"):
                    self.insert([chunk], group)
                    if buffer.inserted > self.min_size:  # as Anakin: learn once past learning_starts
                        buffer.record_sample(self.block_samples)
                        params, metrics = self.learn(group, version)
                        version += 1
                        self._publish(group, version, params, metrics)
                with self._processed_cond:
                    self._processed[group] += 1
                    self._processed_cond.notify_all()
        self.events.put(("done", version, None, None, self.take_snapshot(), group))

    def _learner_loop(self, group: int = 0) -> None:
        if self.schedule == "sync":
            return self._sync_learner_loop(group)
        buffer = self.buffers[group]
        version = self.stores[group].version
        last_fresh = time.monotonic()
        fed = False
        while version < self.num_updates and not self.stop.is_set():
            # the last block waits for the run's last inserts (else it may run up to a band early)
            short = (version == self.num_updates - 1 and self.total_inserts is not None
                     and buffer.inserted < self.total_inserts)
            with self.telemetry.span("learner_wait_s"):
                chunks, can_learn = buffer.take(version, None if short else self.block_samples, 0.5, self.stop)
            if short:
                can_learn = False  # re-checked after these chunks' insert
            if chunks:
                with self.telemetry.span("learner_busy_s"):
                    self.insert(chunks, group)
                last_fresh, fed = time.monotonic(), True
            if not can_learn:
                self._check_stall(last_fresh, "learner received no transitions and could not sample",
                                  f"last published version {version}", started=fed)
                continue
            with self.telemetry.span("learner_busy_s"):
                params, metrics = self.learn(group, version)
            version += 1
            if self.hooks.balancer is not None:  # the auto schedule's controller (runtime/tianji/auto_schedule.py)
                self.hooks.balancer.after_update(group, buffer, self.telemetry)
            self._publish(group, version, params, metrics)
        self.events.put(("done", version, None, None, self.take_snapshot(), group))
