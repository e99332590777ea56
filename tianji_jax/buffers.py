"""Buffers between actors and learners. ``TrajectoryQueue``: the on-policy FIFO with the lag gate
and the rate limiter in one place (design.md section 4)."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

from tianji_jax.rate_limiter import RateLimiter

__all__ = ["TrajectoryItem", "TrajectoryQueue"]


@dataclass
class TrajectoryItem:
    """One inserted trajectory.

    Attributes:
        data: pytree of arrays with leading axes ``(T, N)`` (on the learner's device).
        version: policy version the actor acted with (int).
        actor_id: which actor produced it.
        num_steps: env steps it holds (``T * N``), the limiter's item count.
        seq: insert counter (0, 1, ...).
    """

    data: Any
    version: int
    actor_id: int
    num_steps: int
    seq: int = -1


class TrajectoryQueue:
    """Consume-once FIFO of trajectories, version-stamped, lag-gated, rate-limited.

    ``get`` checks *every* resident item against ``max_policy_lag`` (stragglers insert out of
    version order): items with ``learner_version - version > K`` are dropped and counted, and
    their steps leave the limiter's insert count. Accounting invariant, in env steps:
    ``produced == consumed + dropped + resident``.

    Args:
        limiter: a :class:`~tianji_jax.rate_limiter.RateLimiter` (PPO: ``spi=1``).
        max_policy_lag: ``K >= 0``.
    """

    def __init__(self, limiter: RateLimiter, max_policy_lag: int):
        if max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
        self.limiter = limiter
        self.max_policy_lag = int(max_policy_lag)
        self._cond = threading.Condition()
        self._items: collections.deque[TrajectoryItem] = collections.deque()
        self._seq = 0
        self.produced = 0
        self.consumed = 0
        self.dropped_stale = 0

    # -- actor side ---------------------------------------------------------------------------------
    def put(self, item: TrajectoryItem, timeout_s: float, stop: threading.Event) -> bool:
        """Insert ``item`` once the limiter allows; False on timeout or stop (nothing inserted)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self.limiter.can_insert(item.num_steps):
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

    # -- learner side -------------------------------------------------------------------------------
    def _drop_stale(self, learner_version: int) -> None:
        keep = collections.deque()
        for it in self._items:
            if learner_version - it.version > self.max_policy_lag:
                self.dropped_stale += it.num_steps
                self.limiter.record_drop(it.num_steps)
            else:
                keep.append(it)
        if len(keep) != len(self._items):
            self._items = keep
            self._cond.notify_all()

    def get(self, learner_version: int, timeout_s: float, stop: threading.Event) -> TrajectoryItem | None:
        """Oldest item with lag ``<= K`` at ``learner_version``; None on timeout or stop."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._drop_stale(learner_version)
                if self._items and self.limiter.can_sample(self._items[0].num_steps):
                    item = self._items.popleft()
                    self.consumed += item.num_steps
                    self.limiter.record_sample(item.num_steps)
                    self._cond.notify_all()
                    return item
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return None
                self._cond.wait(min(left, 0.1))

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
        """Trajectories held now."""
        with self._cond:
            return len(self._items)
