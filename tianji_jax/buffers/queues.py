"""Buffers between actors and learners, with the lag gate and the rate limiter in one place
(docs/runtime.md, "The lag contract"): ``TrajectoryQueue``, the on-policy FIFO (gate at consumption, admission by
lag), and ``ReplayIngress``, the off-policy path into a learner-owned replay (gate at insert).
Both share the actor side (:class:`_Inbox`: admit / put / counters)."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

from tianji_jax.buffers.rate_limiter import RateLimiter

__all__ = ["TrajectoryItem", "TrajectoryQueue", "ReplayIngress"]


@dataclass
class TrajectoryItem:
    """One inserted trajectory.

    Attributes:
        data: pytree of arrays with leading axes ``(T, N)`` (on the learner's device).
        version: policy version the actor acted with (int).
        actor_id: which actor produced it.
        num_steps: env steps it holds (``T * N``), the limiter's item count.
        seq: insert counter (0, 1, ...).
        rollout: the actor's rollout number in this run (0, 1, ...; -1 when not counted).
    """

    data: Any
    version: int
    actor_id: int
    num_steps: int
    seq: int = -1
    rollout: int = -1


class _Inbox:
    """The actor side both buffers share: version-stamped items in a FIFO guarded by one condition,
    admission (:meth:`admit` reserves limiter room before a rollout starts; subclasses add their
    own rule in :meth:`_can_admit`), :meth:`put`, and the counters. Every wait has a timeout and
    sees the stop event."""

    def __init__(self, limiter: RateLimiter, max_policy_lag: int):
        if max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
        self.limiter = limiter
        self.max_policy_lag = int(max_policy_lag)
        self._cond = threading.Condition()
        self._items: collections.deque[TrajectoryItem] = collections.deque()
        self._seq = 0
        self._admitted_items = 0
        self._admitted_steps = 0
        self.produced = 0
        self.dropped_stale = 0

    def _can_admit(self, num_steps: int) -> bool:
        return self.limiter.can_insert(self._admitted_steps + num_steps)

    def admit(self, num_steps: int, timeout_s: float, stop: threading.Event) -> bool:
        """Wait until a rollout of ``num_steps`` env steps may start (the limiter has room for it
        next to the rollouts already admitted, and the subclass's rule holds), then reserve that
        room; False after ``timeout_s`` seconds or once ``stop`` is set (nothing reserved). Pair
        every True with ``put(..., admitted=True)``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._can_admit(num_steps):
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return False
                self._cond.wait(min(left, 0.1))
            self._admitted_items += 1
            self._admitted_steps += num_steps
            return True

    def put(self, item: TrajectoryItem, timeout_s: float, stop: threading.Event, admitted: bool = False) -> bool:
        """Insert ``item`` once the limiter allows (counted as inserted by the limiter now);
        False after ``timeout_s`` seconds or once ``stop`` is set (nothing inserted).
        ``admitted=True``: the room was reserved by :meth:`admit`, and the insert never waits.

        Raises:
            RuntimeError: ``admitted=True`` without a matching :meth:`admit`.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if admitted:
                if self._admitted_items < 1:
                    raise RuntimeError("put(admitted=True) without a matching admit()")
                self._admitted_items -= 1
                self._admitted_steps = max(0, self._admitted_steps - item.num_steps)
            while not admitted and not self.limiter.can_insert(item.num_steps):
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return False
                self._cond.wait(min(left, 0.1))
            item.seq = self._seq
            self._seq += 1
            self._items.append(item)
            self.produced += item.num_steps
            self.limiter.record_insert(item.num_steps)
            self._cond.notify_all()
            return True

    def _taken(self) -> int:
        """Env steps the learner has taken (consumed / inserted into its replay)."""
        raise NotImplementedError

    def _set_taken(self, steps: int) -> None:
        raise NotImplementedError

    def cut_counters(self) -> dict[str, int]:
        """The counters of a checkpoint cut, read in the learner thread between two takes:
        ``taken`` (env steps the learner consumed / inserted into its replay), ``dropped_stale``,
        ``sampled`` (the limiter's samples) and ``in_flight`` (env steps inserted but not yet
        taken: what a resume from this cut discards and the actors produce again)."""
        with self._cond:
            taken = self._taken()
            return {"taken": taken, "dropped_stale": self.dropped_stale, "sampled": self.limiter.sampled,
                    "in_flight": self.produced - taken - self.dropped_stale}

    def restore_counters(self, counters: dict[str, int]) -> None:
        """Continue from a cut of :meth:`cut_counters` (before any thread starts): nothing
        resident, ``produced = taken + dropped_stale``, and the limiter's inserts (net of drops)
        and samples as at the cut, so the rate limiter's band continues where it was.

        Raises:
            RuntimeError: the buffer already holds items or reservations.
        """
        with self._cond:
            if self._items or self._admitted_items:
                raise RuntimeError("restore_counters on a buffer in use")
            taken, dropped = int(counters["taken"]), int(counters["dropped_stale"])
            self._set_taken(taken)
            self.dropped_stale = dropped
            self.produced = taken + dropped
            self.limiter.inserted, self.limiter.sampled, self.limiter.dropped = taken, int(counters["sampled"]), dropped

    def wake(self) -> None:
        """Wake every waiter (used at shutdown)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def resident(self) -> int:
        """Env steps held now."""
        with self._cond:
            return sum(it.num_steps for it in self._items)

    def depth(self) -> int:
        """Items held now."""
        with self._cond:
            return len(self._items)


class TrajectoryQueue(_Inbox):
    """Consume-once FIFO of trajectories, version-stamped, lag-gated, rate-limited.

    ``get`` checks *every* resident item against ``max_policy_lag`` (stragglers insert out of
    version order): items with ``learner_version - version > K`` are dropped and counted, and
    their steps leave the limiter's insert count. Accounting invariant, in env steps:
    ``produced == consumed + dropped + resident``.

    Admission control (docs/runtime.md, "The lag contract"): :meth:`admit` lets an actor *start* a rollout only if
    the rollout can still be consumed within ``K``. A rollout begun now with the newest version
    ``v`` is consumed after everything resident, everything already admitted and the update in
    flight (if any), each of which publishes one version, so its lag will be at most
    ``resident + admitted + learning``; :meth:`admit` waits until that is ``<= K`` and the limiter
    has room, then reserves the room. With one actor nothing admitted is ever dropped; with
    several, admitted rollouts can finish out of order, and the gate in :meth:`get` still holds.

    Args:
        limiter: a :class:`~tianji_jax.buffers.rate_limiter.RateLimiter` (PPO: ``spi=1``).
        max_policy_lag: ``K >= 0``, in policy versions.

    Raises:
        ValueError: ``max_policy_lag < 0``.
    """

    def __init__(self, limiter: RateLimiter, max_policy_lag: int):
        super().__init__(limiter, max_policy_lag)
        self.consumed = 0
        self._learning = False
        self.admit_window = self.max_policy_lag  # rollouts ahead admission allows (<= K; the auto schedule moves it)
        self.drop_log: list[tuple[int, int, int]] | None = None  # a list: dropped (actor, rollout, version) go there

    def _taken(self) -> int:
        return self.consumed

    def _set_taken(self, steps: int) -> None:
        self.consumed = steps

    def _can_admit(self, num_steps: int) -> bool:
        ahead = len(self._items) + self._admitted_items + int(self._learning)
        return ahead <= self.admit_window and super()._can_admit(num_steps)

    def set_window(self, window: int) -> None:
        """Admit a rollout only while at most ``window`` (``1..K``) are ahead of it, and give the
        rate limiter room for ``max(2, window + 1)`` trajectories (never binding below the window;
        2 is the deadlock rule's minimum). The lag gate stays at K.

        Raises:
            ValueError: ``window`` outside ``1..max(1, K)``.
        """
        if not 1 <= window <= max(1, self.max_policy_lag):
            raise ValueError(f"window must be in 1..{max(1, self.max_policy_lag)} (max_policy_lag), got {window}")
        with self._cond:
            self.admit_window = int(window)
            self.limiter.max_diff = max(2, window + 1) * self.limiter.chunk_items
            self._cond.notify_all()

    def knobs(self) -> dict[str, float]:
        """The knobs in force: ``lag_window`` (admission window, versions) and ``queue_limit``
        (trajectories the rate limiter lets wait)."""
        return {"lag_window": self.admit_window, "queue_limit": int(self.limiter.max_diff // self.limiter.chunk_items)}

    # -- learner side -------------------------------------------------------------------------------
    def _drop_stale(self, learner_version: int) -> None:
        keep = collections.deque()
        for it in self._items:
            if learner_version - it.version > self.max_policy_lag:
                self.dropped_stale += it.num_steps
                self.limiter.record_drop(it.num_steps)
                if self.drop_log is not None:
                    self.drop_log.append((it.actor_id, it.rollout, it.version))
            else:
                keep.append(it)
        if len(keep) != len(self._items):
            self._items = keep
            self._cond.notify_all()

    def get(self, learner_version: int, timeout_s: float, stop: threading.Event) -> TrajectoryItem | None:
        """Oldest item with lag ``<= K`` at ``learner_version``; None after ``timeout_s`` seconds
        or once ``stop`` is set.

        Calling ``get`` also tells the queue that the learner's previous update is published (so
        it no longer counts as in flight for :meth:`admit`); a returned item is in flight until
        the next call."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._learning:
                self._learning = False
                self._cond.notify_all()
            while True:
                self._drop_stale(learner_version)
                if self._items and self.limiter.can_sample(self._items[0].num_steps):
                    item = self._items.popleft()
                    self.consumed += item.num_steps
                    self.limiter.record_sample(item.num_steps)
                    self._learning = True
                    self._cond.notify_all()
                    return item
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return None
                self._cond.wait(min(left, 0.1))


class ReplayIngress(_Inbox):
    """The off-policy path into a learner-owned replay buffer: inbox, lag gate at insert, rate limiter.

    Actors :meth:`admit` (the limiter has room) and :meth:`put` chunks of transitions (device
    arrays on the learner's device); the learner :meth:`take` s them, inserts them into its replay
    state itself (so only the learner thread ever touches the device buffer), and learns when the
    limiter allows a block. Off-policy the lag gate applies *at insert* (docs/runtime.md, "The lag contract"): a
    chunk acted with params more than ``K`` versions behind the learner when the learner takes it
    is dropped and counted; sampling from replay is ungated (age bounded by capacity).

    Samples-per-insert ``spi = replay_ratio * batch_size`` (items sampled per env step inserted);
    a block samples ``updates_per_step * batch_size`` items. Accounting, in env steps:
    ``produced == inserted + dropped_stale + resident`` (``resident``: in the inbox).

    Args:
        limiter: a :class:`~tianji_jax.buffers.rate_limiter.RateLimiter` counting env steps inserted and
            items sampled.
        max_policy_lag: ``K >= 0``, in policy versions.

    Raises:
        ValueError: ``max_policy_lag < 0``.
    """

    def __init__(self, limiter: RateLimiter, max_policy_lag: int):
        super().__init__(limiter, max_policy_lag)
        self.inserted = 0

    def _taken(self) -> int:
        return self.inserted

    def _set_taken(self, steps: int) -> None:
        self.inserted = steps

    def take(self, learner_version: int, sample_items: int | None, timeout_s: float, stop: threading.Event
             ) -> tuple[list[TrajectoryItem], bool]:
        """Learner side: every waiting chunk with lag ``<= K`` (staler ones are dropped and leave the
        limiter's insert count), and whether a block of ``sample_items`` samples may run now (if
        True it is recorded as sampled). Waits up to ``timeout_s`` for either; ``([], False)`` on
        timeout or stop. ``sample_items=None``: wait for chunks only (the ``sync`` schedule
        decides its blocks itself and records them with :meth:`record_sample`)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                fresh = []
                for it in self._items:
                    if learner_version - it.version > self.max_policy_lag:
                        self.dropped_stale += it.num_steps
                        self.limiter.record_drop(it.num_steps)
                    else:
                        fresh.append(it)
                        self.inserted += it.num_steps
                had = bool(self._items)
                self._items.clear()
                can = sample_items is not None and self.limiter.can_sample(sample_items)
                if can:
                    self.limiter.record_sample(sample_items)
                if had or can:
                    self._cond.notify_all()
                if fresh or can:
                    return fresh, can
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return [], False
                self._cond.wait(min(left, 0.1))

    @property
    def band_min(self) -> float:
        """The narrowest samples-per-insert half-band that cannot deadlock, in items: ``B + spi * c``."""
        lim = self.limiter
        return lim.batch_items + lim.spi * lim.chunk_items

    @property
    def band(self) -> float:
        """The limiter band's half-width now, in items."""
        return (self.limiter.max_diff - self.limiter.min_diff) / 2

    def set_band(self, half: float) -> None:
        """Keep ``I*spi - S`` within ``half`` items of the band's centre (``half >= band_min``).

        Raises:
            ValueError: ``half < band_min`` (the deadlock rule).
        """
        if half < self.band_min:
            raise ValueError(f"band half-width {half} < {self.band_min} (batch_items + spi * chunk_items: narrower "
                             "could deadlock)")
        with self._cond:
            centre = (self.limiter.min_diff + self.limiter.max_diff) / 2
            self.limiter.min_diff, self.limiter.max_diff = centre - half, centre + half
            self._cond.notify_all()

    def knobs(self) -> dict[str, float]:
        """The knob in force: ``spi_band`` (the limiter band's half-width, in sampled items)."""
        return {"spi_band": self.band}

    def record_sample(self, sample_items: int) -> None:
        """Count ``sample_items`` samples with the limiter (a block the learner ran without asking
        :meth:`take`: the ``sync`` schedule)."""
        with self._cond:
            self.limiter.record_sample(sample_items)
            self._cond.notify_all()
