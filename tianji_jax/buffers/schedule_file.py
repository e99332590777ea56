"""Reproducible async runs: record which rollout every learner update consumed, and re-run that
interleaving exactly (``record_schedule`` / ``replay_schedule``).

Under the ``relaxed`` schedule the order in which actors' rollouts reach the learner, and the
policy version each rollout was acted with, depend on thread timing, so two runs with the same
seed differ. Everything else is deterministic on one machine: an actor's k-th rollout is a
function of its own state and the params it acts with; an update is a function of the learner
state and the rollout it consumes. A **schedule** fixes the timing-dependent part:

- per learner update ``u`` (the learner's version before it), the rollout it consumed: actor
  ``a``, that actor's rollout number ``r`` (0, 1, ... in the run) and the version ``v`` it was
  acted with;
- the rollouts the lag gate dropped before it (same triples).

File format (JSON lines, ``RUN_DIR/schedule.jsonl``): a header line ``{"format":
"tianji-schedule/1", "num_actors", "item_steps", "max_policy_lag", "start_version", "config"}``
(``config``: the recording run's, optional) and one
line per update ``{"update": u, "actor": a, "rollout": r, "version": v, "dropped": [[a, r, v],
...]}``.

Replaying it (:class:`~tianji_jax.runtime.tianji.scheduled.ScheduledRunner`): actor ``a`` acts its
rollout ``r`` with exactly version ``v`` (it waits until that version is published; the store
keeps each version until every rollout that needs it has read it); the learner's update ``u``
takes exactly the recorded rollout (it waits for it); a rollout the record lists as dropped is
dropped when it arrives. The result is bit-identical params for the same config on the same
machine. This module is the file (plain Python, no JAX); the
replaying runner is :mod:`tianji_jax.runtime.tianji.scheduled`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "FILE_NAME", "Schedule", "ScheduleRecorder", "load_schedule"]

FORMAT = "tianji-schedule/1"
FILE_NAME = "schedule.jsonl"
"""The recorded schedule's name inside the run directory."""


@dataclass(frozen=True)
class Schedule:
    """A recorded interleaving (see the module docstring).

    Attributes:
        num_actors: actor threads of the recorded run.
        item_steps: env steps per rollout (``num_envs * num_steps``).
        max_policy_lag: K of the recorded run.
        start_version: the learner version of the first recorded update (0: a run from its start).
        consumed: per update, in order, ``(actor, rollout, version)`` of the rollout it consumed.
        dropped: ``(actor, rollout, version)`` of every rollout the lag gate dropped.
        config: the recording run's config (``to_dict()``), or None in a file without it.
    """

    num_actors: int
    item_steps: int
    max_policy_lag: int
    start_version: int
    consumed: tuple[tuple[int, int, int], ...]
    dropped: tuple[tuple[int, int, int], ...]
    config: dict | None = None

    @property
    def max_lag(self) -> int:
        """The largest lag of a consumed rollout (update minus its version); 0 when empty."""
        return max((self.start_version + u - v for u, (_, _, v) in enumerate(self.consumed)), default=0)

    def versions(self) -> list[list[int]]:
        """Per actor, the version each of its rollouts acted with, by rollout number (rollouts
        still in flight when the recorded run ended are not part of it)."""
        by_actor: list[dict[int, int]] = [{} for _ in range(self.num_actors)]
        for a, r, v in self.consumed + self.dropped:
            by_actor[a][r] = v
        return [[got[r] for r in range(len(got))] for got in by_actor]

    def readers(self) -> collections.Counter:
        """How many rollouts act with each version (what the replaying param store keeps)."""
        return collections.Counter(v for _, _, v in self.consumed + self.dropped)


def load_schedule(path: str | Path) -> Schedule:
    """Read and check a schedule file written by :class:`ScheduleRecorder`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a schedule file, or one that is inconsistent (updates out of order, an
            actor or rollout number out of range, a version above the update that consumed or
            dropped it, an actor's rollouts with a gap or with versions going backwards, a
            consumed rollout older than the lag bound); the message names the file and the line.
    """
    path = Path(path)
    st = path.stat()  # FileNotFoundError
    # parsed once per file version: every config validation (each replace()) checks the file;
    # each caller gets its own copy of the mutable config dict, so the cached one stays as read
    schedule = _parse(str(path), st.st_mtime_ns, st.st_size)
    return schedule if schedule.config is None else dataclasses.replace(schedule, config=copy.deepcopy(schedule.config))


@functools.lru_cache(maxsize=8)
def _parse(name: str, mtime_ns: int, size: int) -> Schedule:
    """:func:`load_schedule`'s work, memoised on the file's path, modification time and size
    (a file changed in place is parsed again; errors are never cached)."""
    path = Path(name)
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    where = f"replay_schedule={str(path)!r}"
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{where}: not a schedule file (its first line must be a {FORMAT!r} header, as "
                         "record_schedule=True writes to RUN_DIR/schedule.jsonl)")
    try:
        n, steps, lag, start = (int(header[k]) for k in ("num_actors", "item_steps", "max_policy_lag",
                                                          "start_version"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: header line lacks {exc}") from None
    consumed, dropped = [], []
    for i, line in enumerate(lines[1:], start=2):
        try:
            e = json.loads(line)
            u, got = int(e["update"]), (int(e["actor"]), int(e["rollout"]), int(e["version"]))
            drops = [tuple(int(x) for x in d) for d in e["dropped"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{where}, line {i}: not an update line (need update, actor, rollout, version, "
                             "dropped)") from None
        if u != start + len(consumed):
            raise ValueError(f"{where}, line {i}: update {u}, expected {start + len(consumed)} (updates in order)")
        for a, r, v in [got, *drops]:
            if not (0 <= a < n and r >= 0 and 0 <= v <= u):
                raise ValueError(f"{where}, line {i}: rollout (actor {a}, number {r}, version {v}) out of range "
                                 f"(actors 0..{n - 1}, versions 0..{u})")
        if u - got[2] > lag:
            raise ValueError(f"{where}, line {i}: update {u} consumed a rollout of version {got[2]}, lag "
                             f"{u - got[2]} > max_policy_lag {lag}")
        consumed.append(got)
        dropped += drops
    config = header.get("config")
    schedule = Schedule(n, steps, lag, start, tuple(consumed), tuple(dropped),
                        config if isinstance(config, dict) else None)
    seen: list[dict[int, int]] = [{} for _ in range(n)]
    for a, r, v in schedule.consumed + schedule.dropped:
        if r in seen[a]:
            raise ValueError(f"{where}: actor {a}'s rollout {r} appears twice")
        seen[a][r] = v
    for a, got in enumerate(seen):
        if sorted(got) != list(range(len(got))):
            raise ValueError(f"{where}: actor {a}'s rollouts {sorted(got)} have a gap (each rollout is consumed or "
                             "dropped, in order)")
        vs = [got[r] for r in range(len(got))]
        back = [r for r in range(1, len(vs)) if vs[r] < vs[r - 1]]
        if back:
            raise ValueError(f"{where}: actor {a}'s rollout {back[0]} acted with version {vs[back[0]]} after "
                             f"version {vs[back[0] - 1]} (an actor's versions never go backwards)")
    return schedule


class ScheduleRecorder:
    """Writes a run's schedule, one line per learner update, from the learner thread.

    Args:
        path: the file to write (created; an existing file is replaced).
        num_actors, item_steps, max_policy_lag, start_version, config: the header (see :class:`Schedule`;
            ``config`` JSON-able, a replay compares its own with it).
    """

    def __init__(self, path: str | Path, *, num_actors: int, item_steps: int, max_policy_lag: int,
                 start_version: int = 0, config: dict | None = None):
        self.path = Path(path)
        self._file = open(self.path, "w")
        self._lock = threading.Lock()
        self._write({"format": FORMAT, "num_actors": num_actors, "item_steps": item_steps,
                     "max_policy_lag": max_policy_lag, "start_version": start_version,
                     **({} if config is None else {"config": config})})

    def _write(self, entry: dict) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(json.dumps(entry, separators=(",", ":"), default=str) + "\n")
            self._file.flush()

    def record(self, update: int, item: Any, dropped: list[tuple[int, int, int]]) -> None:
        """Update ``update`` (the learner's version before it) consumed ``item`` (a
        :class:`~tianji_jax.buffers.queues.TrajectoryItem`); ``dropped``:
        ``(actor, rollout, version)`` of the rollouts the gate dropped since the previous update."""
        self._write({"update": update, "actor": item.actor_id, "rollout": item.rollout, "version": item.version,
                     "dropped": [list(d) for d in dropped]})

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            self._file.close()
