"""The host loop shared by every algorithm and runtime: how a metrics row reaches the run
(:func:`make_emit`: evaluation, logging, progress, non-finite monitor, early stop), the Anakin loop
over compiled chunks (:func:`run_anakin`), the async runtime's loop (:func:`run_async`), the end
of a run (:func:`finish`), the async runtime's columns (:func:`async_columns`) and resume argument
(:func:`async_restore`). The algorithms' own pieces (row builders, what a row checkpoints) are in
:mod:`tianji_jax.run.host_on_policy` and :mod:`tianji_jax.run.host_replay`."""

from __future__ import annotations

import collections
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import numpy as np

from tianji_jax.algos.config_base import AgentConfig
from tianji_jax.run.logging import ProgressDisplay
from tianji_jax.run.profiling import phase
from tianji_jax.run.results import TrainResult
from tianji_jax.run.run_files import RunFiles, unstack_actors
from tianji_jax.runtime.anakin import host_metrics
from tianji_jax.runtime.nonfinite import NonFiniteMonitor

__all__ = ["mean_or_nan", "make_display", "make_emit", "average_sps", "eval_steps_so_far", "run_anakin", "finish", "save_params",
           "async_columns", "async_restore", "AsyncRow", "RateWindow", "RATE_WINDOW_S", "run_async"]

RATE_WINDOW_S = 1.0
"""Shortest span (seconds) over which an async metrics row's rates are measured (see :class:`RateWindow`)."""


def mean_or_nan(total: float, count: int) -> float:
    """``total / count``, or NaN when ``count`` is 0 (a chunk in which no episode ended)."""
    return total / count if count > 0 else math.nan


def make_display(config: AgentConfig, progress: bool | None, algo: str) -> ProgressDisplay:
    """The run's progress bar (shown when ``progress``; None: when stderr is a terminal)."""
    show = sys.stderr.isatty() if progress is None else progress
    return ProgressDisplay(config.env_steps, show, description=f"{algo} {config.env_spec.name}")


def make_emit(config: AgentConfig, files: RunFiles, display: ProgressDisplay, start: float,
              evaluator: Callable | None) -> Callable[[dict[str, float], Any, Any], bool]:
    """The one way a metrics row reaches the run, in every runtime: ``emit(row, params, obs_rms)``
    evaluates ``params`` greedily (``evaluator(params, obs_rms, key) -> (returns, lengths)``, key
    folded from the seed and the row index; None: no evaluation) into ``eval_return_mean`` /
    ``eval_return_std`` and adds the episodes' lengths to ``eval_env_steps`` (cumulative; a resumed
    run starts from its last row's value, see :func:`eval_steps_so_far`; NaN without evaluation),
    stamps ``wall_time_s`` (seconds since ``start``, plus the restored run's), logs the row and
    updates the progress display. ``skips`` (the per-update ``nonfinite_skips`` of the row, in
    order) goes into the row's column and a :class:`NonFiniteMonitor`, which raises
    :class:`NonFiniteError` after the row is logged once ``max_nonfinite_updates`` consecutive
    updates skipped a step. Returns True when ``config.stop_at_return`` is reached."""
    monitor = NonFiniteMonitor(config.max_nonfinite_updates, files.last_checkpoint)
    if files.rows:
        monitor.prev_env_steps, monitor.prev_update = int(files.rows[-1]["env_steps"]), int(files.rows[-1]["update"])
    eval_steps = [eval_steps_so_far(files.rows)]

    def emit(row: dict[str, float], params: Any, obs_rms: Any, skips: np.ndarray) -> bool:
        row["nonfinite_skips"] = int(np.sum(skips))
        if evaluator is not None:
            eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed ^ 0x5EED), len(files.rows))
            returns, lengths = jax.device_get(evaluator(params, obs_rms, eval_key))
            row["eval_return_mean"] = float(np.mean(returns))
            row["eval_return_std"] = float(np.std(returns))
            eval_steps[0] += int(np.sum(np.asarray(lengths, np.int64)))
            row["eval_env_steps"] = eval_steps[0]
        else:
            row["eval_env_steps"] = math.nan
        row["wall_time_s"] = files.wall_offset + time.perf_counter() - start
        files.log(row)
        display.update(int(row["env_steps"]), row["sps"], row["episode_return_mean"], row["eval_return_mean"],
                       row.get("policy_lag_mean", math.nan), average_sps=average_sps(row))
        monitor.observe(skips, row)
        return config.stop_at_return is not None and row["eval_return_mean"] >= config.stop_at_return

    return emit


def average_sps(row: dict[str, float]) -> float:
    """The run's average env steps per second up to ``row``: its ``env_steps`` over its
    ``wall_time_s`` (wall time since the start, evaluation and compilation included; a resumed
    run's both count the restored rows too); NaN before any wall time has passed."""
    wall = float(row.get("wall_time_s", math.nan))
    return float(row["env_steps"]) / wall if wall > 0 else math.nan


def eval_steps_so_far(rows: list[dict[str, float]]) -> int:
    """The ``eval_env_steps`` a run continues from: the last finite value in ``rows`` (the rows a
    resumed run restored), 0 when there is none (a new run; rows without evaluation, or written
    before the column existed)."""
    for r in reversed(rows):
        v = r.get("eval_env_steps", math.nan)
        if isinstance(v, (int, float)) and math.isfinite(v):
            return int(v)
    return 0


def run_anakin(trainer: Any, state: Any, done: int, total: int, chunk_u: int, steps_per_unit: int,
               make_row: Callable[[dict[str, np.ndarray], int, float], dict[str, float]],
               emit: Callable[..., bool], files: RunFiles, callback: Callable | None) -> tuple[Any, bool]:
    """The Anakin host loop (every algorithm): compiled chunks of ``chunk_u`` units (on-policy
    updates or replay iterations of ``steps_per_unit`` env steps each) from ``done`` to ``total``
    units, each ``trainer.chunk(state, active)`` with ``active = min(chunk_u, total - done)``, so
    the last, shorter chunk runs the same compiled program (its inactive units change nothing).
    After each chunk: ``make_row(host metrics of the active units, units done, SPS)``,
    :func:`make_emit`'s ``emit``, a checkpoint when due, then ``callback(row)``; stops early when
    ``emit`` says so. Returns ``(state, stopped)``."""
    stopped = False
    while done < total:
        k = min(chunk_u, total - done)
        t0 = time.perf_counter()
        with phase("chunk"):
            state, metrics = trainer.chunk(state, np.int32(k))  # a replay chunk donates the previous state
            m = {name: v[:k] for name, v in host_metrics(metrics).items()}
        done += k
        seconds = time.perf_counter() - t0
        row = make_row(m, done, k * steps_per_unit / seconds)
        stopped = emit(row, state.params, getattr(state, "obs_rms", None), m["nonfinite_skips"])  # replay: no obs_rms
        files.maybe_save(state, done * steps_per_unit, {"stopped_early": stopped}, finished=stopped or done >= total)
        if callback is not None:
            callback(dict(row))
        if stopped:
            break
    return state, stopped


def finish(files: RunFiles, display: ProgressDisplay, run: Callable[[], tuple[Any, bool]]) -> TrainResult:
    """Run ``run() -> (state, stopped)``, then close the display and the run files whatever
    happened, and save ``final_params`` into the run directory."""
    try:
        state, stopped = run()
    finally:
        display.close()
        files.close()
    if files.run_dir is not None:
        save_params(files.run_dir / "final_params", state.params)
    return files.result(state, stopped)


def finished_result(files: RunFiles) -> TrainResult:
    """The result of resuming a run that had already finished (nothing is trained). When its
    ``final_params`` are missing or incomplete (the run was interrupted while writing them, after
    its last checkpoint: :func:`final_params_complete`), they are written from that checkpoint,
    which holds the same params, with one line on stderr saying so."""
    files.close()
    path = files.run_dir / "final_params" if files.run_dir is not None else None
    if path is not None and not final_params_complete(path):
        save_params(path, files.state.params)
        print(f"tianji_jax.train: the run had finished but its final params were missing or incomplete (interrupted "
              f"while they were written); wrote them from checkpoint {files.restored.step} to {path}", file=sys.stderr)
    return files.result(files.state, bool(files.restored.meta.get("stopped_early", False)))


def final_params_complete(path: Path) -> bool:
    """Whether ``path`` (a run's ``final_params/``) holds a finished orbax save: the directory
    exists under its final name (orbax writes into ``final_params.orbax-checkpoint-tmp`` and renames
    it when done), orbax counts it finalized, and both its metadata files are there."""
    from orbax.checkpoint import utils as ocp_utils

    path = Path(path)
    return (path.is_dir() and (path / "_METADATA").is_file() and (path / "_CHECKPOINT_METADATA").is_file()
            and ocp_utils.is_checkpoint_finalized(path))


def save_params(path: Path, params: Any) -> None:
    """Save ``params`` with orbax to ``path`` (the run's ``final_params/``), replacing what is there;
    multi-host: host copies (orbax refuses process-local arrays)."""
    import orbax.checkpoint as ocp

    from tianji_jax.checkpoint.io import single_process_options

    path = path.resolve()
    options = single_process_options(ocp)
    if options:  # multi-host: orbax refuses process-local jax.Arrays; save host copies
        params = jax.device_get(params)
    with phase("final_params"), ocp.StandardCheckpointer(**options) as ckptr:
        ckptr.save(path, params, force=True)
        ckptr.wait_until_finished()


@dataclass(frozen=True)
class RateWindow:
    """The span an async metrics row's rates (``sps``, ``production_sps``, ``consumed_sps``, the wait
    fractions) are measured over: the row's own interval when it lasts at least
    :data:`RATE_WINDOW_S`, else the trailing window that reaches back to the newest earlier update
    at least that old (the run's start, compilation included, while the run is younger). A row
    made 35 ms after the previous one (one update per row, a rollout already queued) otherwise
    reports the rate of a single hand-off, e.g. a consumption rate of 100x the run's and a
    production rate of 0.

    Attributes:
        start: the counters (``time`` in perf_counter seconds, ``produced``, ``consumed``, ...) at
            the window's start.
        seconds: the window's length (> 0).
    """

    start: dict
    seconds: float

    def rate(self, snap: dict, key: str) -> float:
        """``snap[key]`` minus its value at the window's start, per second of the window."""
        return (snap[key] - self.start[key]) / self.seconds


def async_columns(config: AgentConfig, snap: dict, last: dict, window: RateWindow,
                  timers: Iterable[str]) -> dict[str, float]:
    """The async runtime's columns of a row (PPO and DQN) from the runner's counter snapshots
    ``snap`` (now) and ``last`` (previous row): production SPS and the actor/learner wait fractions
    over ``window`` (:class:`RateWindow`), the rate limiter's observed samples-per-insert and error,
    dropped and lost counts, queue depth, the knobs in force, and each phase timer's seconds in
    ``timers`` since the previous row."""
    return {
        "production_sps": window.rate(snap, "produced"),
        "spi_observed": snap["sampled"] / max(snap["limiter_inserted"], 1),
        "limiter_error": snap["limiter_error"],
        "dropped_stale": snap["dropped_stale"],
        "dropped_partial": snap["dropped_partial"],
        "lost_chunks": snap["lost_chunks"],
        "actor_wait_frac": window.rate(snap, "actor_wait_s") / config.num_actors,
        "learner_wait_frac": window.rate(snap, "learner_wait_s"),
        "queue_depth": snap["depth"],
        **{k: snap.get(k, math.nan) for k in ("lag_window", "queue_limit", "spi_band")},
        **{k: snap[k] - last[k] for k in timers},
    }


def _counters(snap: dict) -> dict:
    """The scalar counters of a runner snapshot (not the learner states or cuts it may carry)."""
    return {k: v for k, v in snap.items() if isinstance(v, (int, float, np.integer, np.floating))}


@dataclass(frozen=True)
class AsyncRow:
    """What an algorithm makes of the updates behind one async metrics row (see :func:`run_async`).

    Attributes:
        row: the metrics row (``METRIC_COLUMNS`` keys; evaluation columns NaN, filled by ``emit``).
        params, obs_rms: what evaluation acts with (``obs_rms`` None without normalisation).
        skips: per-update ``nonfinite_skips`` of the row's updates (the non-finite monitor).
        state: the train state to checkpoint (host or device arrays).
        env_steps: the checkpoint's env-step count.
        meta: extra checkpoint metadata (the cut's counters, actor layout, ...).
    """

    row: dict
    params: Any
    obs_rms: Any
    skips: np.ndarray
    state: Any
    env_steps: int
    meta: dict


def run_async(runner: Any, files: RunFiles, emit: Callable[..., bool], callback: Callable | None, *, every: int,
              total: int, make_row: Callable[[list, dict, dict, RateWindow, int], AsyncRow],
              close: Callable[[], None]) -> bool:
    """The async runtime's host loop, for every algorithm: run ``runner`` (an
    :class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner`) and, after every ``every``-th update of
    all learner groups together (and the ``total``-th), build a row, evaluate / log / check it
    (``emit``), checkpoint, then call ``callback(row)``; ``close()`` runs when the threads have
    stopped, whatever happened. Returns whether the run stopped early (``emit`` said so).

    ``make_row(pending, snap, last, window, n)``: ``pending`` the row's updates as ``(version,
    metrics, item)`` in arrival order, ``snap`` / ``last`` the runner's counter snapshots of this
    update and of the previous row, ``window`` the :class:`RateWindow` the row's rates are measured
    over, ``n`` the updates so far; returns an :class:`AsyncRow`.

    Raises:
        whatever a runtime thread or ``make_row`` raised (the threads are stopped first).
    """
    pending: list = []
    last = runner.take_snapshot()
    history = collections.deque([_counters(last)])  # the start's and updates' counters, oldest first (RateWindow)
    stopped = [False]
    count = [runner.start_version]  # updates of all learner groups (= the version without groups)

    def on_update(version: int, metrics: Any, item: Any) -> bool:
        pending.append((version, metrics, item))
        count[0] += 1
        n = count[0]
        snap = runner.snapshot  # counters taken by the learner thread right after this update
        now = snap["time"]
        while len(history) > 1 and history[1]["time"] <= now - RATE_WINDOW_S:
            history.popleft()  # history[0]: the newest update at least RATE_WINDOW_S old, else the oldest kept
        if n % every and n != total:
            history.append(_counters(snap))
            return False
        start = last if now - last["time"] >= RATE_WINDOW_S else history[0]
        window = RateWindow(_counters(start), max(now - start["time"], 1e-9))
        out = make_row(list(pending), snap, dict(last), window, n)
        history.append(_counters(snap))
        pending.clear()
        last.clear()
        last.update(snap)
        stopped[0] = bool(emit(out.row, out.params, out.obs_rms, out.skips))
        files.maybe_save(out.state, out.env_steps, {"stopped_early": stopped[0], **out.meta},
                         finished=stopped[0] or n >= total)
        if callback is not None:  # after the checkpoint, as in the Anakin loop
            callback(dict(out.row))
        return stopped[0]

    try:
        runner.run(on_update)  # the threads have stopped when it returns or raises
    finally:
        close()
    return stopped[0]


def async_restore(restored: Any) -> dict | None:
    """The ``restore`` argument of :class:`~tianji_jax.runtime.async_on_policy.AsyncOnPolicy` /
    :class:`~tianji_jax.runtime.async_replay.AsyncReplay` from a restored checkpoint (a
    :class:`~tianji_jax.checkpoint.core.Restored`, or None for a new run: None); reports on stderr what
    the cut leaves out."""
    if restored is None:
        return None
    meta, state = restored.meta, restored.state
    counters = meta["async_counters"]
    from tianji_jax.runtime.actors.host_normalize import HostNormStats

    norm = state.actor if isinstance(state.actor, HostNormStats) else None  # host actors' statistics
    restore = {"learner": state.learner, "counters": counters, "env_steps": restored.step, "norm": norm,
               "actors": (unstack_actors(state.actor, meta.get("stacked_actors", 0))
                          if state.actor is not None and norm is None else None)}
    if hasattr(state, "replay"):
        restore["replay"] = state.replay
    host = state.actor is None or norm is not None
    print(f"resuming the async run at policy version {int(state.learner.version)} ({restored.step} env steps): "
          f"{int(counters.get('in_flight', 0))} env steps inserted after the checkpoint (and any rollout then in "
          "progress) are discarded and acted again" + ("; host envs are re-seeded and reset (their episodes in progress are lost)" if host else ""),
          file=sys.stderr, flush=True)
    return restore
