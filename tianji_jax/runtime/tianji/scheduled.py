"""Replaying a recorded schedule (:mod:`tianji_jax.buffers.schedule_file`): a runner whose actors act
exactly the recorded policy versions and whose learner consumes exactly the recorded rollouts, so
a ``relaxed`` run's interleaving happens again and gives bit-identical params. Runtime plumbing,
no math.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from tianji_jax.buffers.queues import TrajectoryItem, TrajectoryQueue
from tianji_jax.buffers.rate_limiter import RateLimiter
from tianji_jax.runtime.tianji.async_runtime import AsyncRunner, StallError
from tianji_jax.runtime.tianji.param_store import ParamStore
from tianji_jax.buffers.schedule_file import Schedule

__all__ = ["ScheduledRunner", "ScheduledQueue", "VersionedParamStore"]


class VersionedParamStore(ParamStore):
    """A :class:`ParamStore` that also keeps older versions for as long as a scheduled rollout still
    needs them: :meth:`wait_exact` returns exactly the version asked for.

    Args:
        params, version: as :class:`ParamStore`.
        readers: rollouts that will read each version (:meth:`Schedule.readers`); a version with no
            reader left is forgotten unless it is the newest.
    """

    def __init__(self, params: Any, version: int, readers: collections.Counter):
        super().__init__(params, version)
        self._readers = collections.Counter(readers)
        self._kept: dict[int, Any] = {int(version): params} if self._readers[int(version)] else {}

    def publish(self, params: Any, version: int) -> None:
        """As :meth:`ParamStore.publish`, keeping ``params`` while rollouts still need ``version``."""
        with self._cond:
            if self._readers[int(version)]:
                self._kept[int(version)] = params
        super().publish(params, version)

    def wait_exact(self, version: int, timeout_s: float, stop: threading.Event) -> Any | None:
        """The params of exactly ``version`` once it is published; None after ``timeout_s`` seconds
        or once ``stop`` is set. Each call counts as one reader of ``version``.

        Raises:
            RuntimeError: ``version`` was published but not kept (no reader was scheduled for it).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._version < version:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return None
                self._cond.wait(min(left, 0.1))
            if version not in self._kept:
                raise RuntimeError(f"params of version {version} were not kept (the schedule lists no rollout "
                                   f"acted with it); newest {self._version}")
            params = self._kept[version]
            self._readers[version] -= 1
            if self._readers[version] <= 0:
                del self._kept[version]
            return params


class ScheduledQueue(TrajectoryQueue):
    """The learner's queue when a schedule is replayed: update ``u`` gets exactly the recorded
    rollout (waiting for it), rollouts recorded as dropped are dropped when they arrive, and a put
    never waits (the schedule, not the rate limiter, bounds what is produced). Counters as
    :class:`~tianji_jax.buffers.queues.TrajectoryQueue`'s.

    Args:
        schedule: the :class:`Schedule` to replay.
    """

    def __init__(self, schedule: Schedule):
        steps = schedule.item_steps
        super().__init__(RateLimiter(spi=1.0, min_size=steps, min_diff=0, max_diff=2 * steps, batch_items=steps,
                                     chunk_items=steps), schedule.max_policy_lag)
        self.schedule = schedule
        self._dropped = {(a, r) for a, r, _ in schedule.dropped}
        self._waiting: dict[tuple[int, int], TrajectoryItem] = {}

    def admit(self, num_steps: int, timeout_s: float, stop: threading.Event) -> bool:
        """Not used when replaying (actors act the recorded versions, nothing else admits them).

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("a replayed schedule has no admission control (actors act the recorded versions)")

    def put(self, item: TrajectoryItem, timeout_s: float, stop: threading.Event, admitted: bool = False) -> bool:
        """Hold ``item`` for the update that consumes it, or drop it if the schedule says so (counted
        in ``dropped_stale``); never waits."""
        with self._cond:
            item.seq = self._seq
            self._seq += 1
            self.produced += item.num_steps
            if (item.actor_id, item.rollout) in self._dropped:
                self.dropped_stale += item.num_steps
            else:
                self._waiting[(item.actor_id, item.rollout)] = item
                self.limiter.record_insert(item.num_steps)
            self._cond.notify_all()
            return True

    def get(self, learner_version: int, timeout_s: float, stop: threading.Event) -> TrajectoryItem | None:
        """The rollout update ``learner_version`` consumed in the recorded run, once it has arrived;
        None after ``timeout_s`` seconds, once ``stop`` is set, or past the schedule's end.

        Raises:
            RuntimeError: the arrived rollout was acted with another version than recorded (the
                replayed run diverged from the schedule: a defect).
        """
        u = learner_version - self.schedule.start_version
        if not 0 <= u < len(self.schedule.consumed):
            return None
        a, r, v = self.schedule.consumed[u]
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (a, r) not in self._waiting:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return None
                self._cond.wait(min(left, 0.1))
            item = self._waiting.pop((a, r))
            if item.version != v:
                raise RuntimeError(f"replayed update {learner_version}: actor {a}'s rollout {r} was acted with "
                                   f"version {item.version}, the schedule says {v}")
            self.consumed += item.num_steps
            self.limiter.record_sample(item.num_steps)
            return item

    def knobs(self) -> dict[str, float]:
        """No knob is in force when replaying (no admission control, no rate limit): NaN columns."""
        return {"lag_window": float("nan"), "queue_limit": float("nan")}

    def depth(self) -> int:
        """Rollouts held now."""
        with self._cond:
            return len(self._waiting)

    @property
    def resident(self) -> int:
        """Env steps held now."""
        with self._cond:
            return sum(it.num_steps for it in self._waiting.values())


class ScheduledRunner(AsyncRunner):
    """An :class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner` that replays ``replay``: actor
    ``a``'s rollout ``r`` acts with exactly the recorded version (waiting for it to be published), the
    learner's update ``u`` consumes exactly the recorded rollout (:class:`ScheduledQueue`), and
    the run ends after the schedule's last update (or ``num_updates``, whichever comes first). An
    actor stops after its last recorded rollout.

    Args:
        replay: the :class:`~tianji_jax.buffers.schedule_file.Schedule` to replay.
        **kwargs: as :class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner` (``schedule`` must
            be ``"relaxed"``, which a config's ``'auto'`` also runs as: the others are
            deterministic already; one learner group).

    Raises:
        ValueError: another schedule, learner groups, an actor count or rollout size other than
            the schedule's, or a start version other than the schedule's, before any thread starts.
    """

    def __init__(self, *, replay: Schedule, **kwargs: Any):
        super().__init__(**kwargs)
        if self.schedule != "relaxed" or self.num_groups != 1:
            raise ValueError(f"replaying a schedule needs schedule='relaxed' and one learner group; got "
                             f"schedule={self.schedule!r}, num_groups={self.num_groups}")
        for name, want, got in (("num_actors", replay.num_actors, len(self.actors)),
                                ("env steps per rollout", replay.item_steps, self.item_steps),
                                ("start version", replay.start_version, self.start_version)):
            if want != got:
                raise ValueError(f"the replayed schedule was recorded with {name} {want}; this run has {got}")
        self.replayed = replay
        self.store = self.stores[0] = VersionedParamStore(*self.stores[0].latest(), replay.readers())
        self.buffer = self.buffers[0] = ScheduledQueue(replay)
        self.num_updates = min(self.num_updates, replay.start_version + len(replay.consumed))
        self._versions = replay.versions()

    def _actor_loop(self, actor_id: int) -> None:
        for r, version in enumerate(self._versions[actor_id]):
            limit = self._stall_limit(self.updates_done[0] > 0)
            with self.telemetry.span("actor_wait_s"):
                params = self.store.wait_exact(version, limit, self.stop)
            if params is None:
                if self.stop.is_set():
                    return
                raise StallError(f"actor {actor_id} waited {limit:g} s for params of version {version} (its "
                                 f"scheduled rollout {r}); last published version {self.store.version}")
            item = self._roll_out(actor_id, params, version)  # numbered r: its actor_logs entry
            if item is None:  # stopped while the rollout was in flight
                return
            self.buffer.put(item, 0.0, self.stop)
