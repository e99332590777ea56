"""``tianji train --profile`` / ``train(..., profile=True)``: a ``jax.profiler`` trace of the run and a
dump of where the host loop's wall time went, both in ``RUN_DIR/profile/``.

Files (all times in seconds of wall clock, ``time.perf_counter``):

- ``RUN_DIR/profile/plugins/profile/<timestamp>/*.xplane.pb`` and ``*.trace.json.gz``: the
  ``jax.profiler`` trace of the call's first :data:`TRACE_WINDOW_S` seconds (open with TensorBoard's
  profile plugin / XProf, or the ``.trace.json.gz`` with Perfetto, https://ui.perfetto.dev). The
  window holds start-up, the first compilations and the first chunks; a trace of a whole run would
  not fit in memory (it records every XLA op executed: a DQN run of 500k env steps on CPU passed
  24 GB). A background thread stops and writes it when the window ends, while training goes on;
  the timers below cover the whole run.
- ``RUN_DIR/profile/timers.json`` (multi-host: ``timers_process<i>.json`` on process ``i > 0``)::

    {"units": "seconds", "wall_s": W, "completed": true,
     "phases": {"chunk": {"total_s", "count", "max_s", "first_s"}, "eval": ..., "checkpoint": ...,
                "log": ..., "final_params": ...},
     "phases_total_s": sum of the phases' total_s (<= wall_s), "other_s": wall_s - phases_total_s,
     "chunk_s": [seconds of each compiled chunk, in order],
     "compile_s": {"trace", "lower", "backend_compile", "total"},
     "runtime": {"rollout_s", "inference_s", "env_step_s", "h2d_s", "update_s",
                 "actor_wait_frac_mean", "learner_wait_frac_mean"},
     "trace_dir": "plugins/profile/<timestamp>", "trace_window_s": seconds the trace covered,
     "trace_write_s": seconds stop_trace took (inside wall_s when the window ended first)}

  The phases are disjoint intervals of the thread that called ``train``: ``chunk`` (one compiled
  Anakin chunk, run and its metrics copied to the host; the first one includes its compilation),
  ``eval`` (evaluation episodes after a row), ``checkpoint`` (handing a checkpoint to orbax, and at
  the end waiting for pending asynchronous writes), ``log`` (writing a row to metrics.csv /
  TensorBoard / W&B), ``final_params`` (saving ``final_params/``). ``other_s`` is the rest: setup
  (building the trainer, compiling ``init``, creating the run directory), the host loop's own
  overhead (progress display, callbacks, building rows) and, in the async runtime, waiting for the
  learner's next row while actors and learner run in their threads. ``compile_s`` sums jax's
  compilation events (tracing to a jaxpr, lowering to MLIR, XLA backend compilation) in every
  thread; they overlap the phases above and are not part of ``phases_total_s``. ``runtime`` (async
  runtime only; empty for Anakin) sums the per-phase columns of ``metrics.csv`` over its rows:
  these seconds are summed over actor threads and run concurrently with the host loop and with each
  other, so they are not part of ``wall_s``'s split either; the wait fractions are means over rows.

A resumed run (``resume=True`` / ``--resume``) with profiling adds a new trace directory and
replaces ``timers.json`` with the timers of the resumed part.

The trace and the timers cost nothing when profiling is off: phases are recorded only in a
context started by :func:`profile_run`, and the code paths of a normal run check one context
variable per phase.
"""

from __future__ import annotations

import contextvars
import json
import math
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

__all__ = ["PhaseTimers", "profile_run", "phase", "timed", "PROFILE_DIR", "TIMERS_FILE", "PHASES", "RUNTIME_COLUMNS",
           "TRACE_WINDOW_S"]

PROFILE_DIR = "profile"
"""Subdirectory of the run directory that receives the trace and the timers."""
TIMERS_FILE = "timers.json"
PHASES = ("chunk", "eval", "checkpoint", "log", "final_params")
TRACE_WINDOW_S = 5.0
"""Seconds of the run the ``jax.profiler`` trace covers, from the start of :func:`profile_run`."""
"""Host-loop phases recorded in ``timers.json`` (see the module docstring)."""
RUNTIME_COLUMNS = ("rollout_s", "inference_s", "env_step_s", "h2d_s", "update_s")
"""Per-phase ``metrics.csv`` columns of the async runtime summed into ``timers.json``'s ``runtime``."""
_COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "backend_compile",
}

_CURRENT: contextvars.ContextVar[PhaseTimers | None] = contextvars.ContextVar("tianji_phase_timers", default=None)


class PhaseTimers:
    """Wall-clock seconds per host-loop phase, plus jax compilation time, of one profiled run.

    Only the thread (context) that entered :func:`profile_run` records phases; compilation events
    are counted from every thread while the run is profiled.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = {p: 0.0 for p in PHASES}
        self.counts: dict[str, int] = {p: 0 for p in PHASES}
        self.max: dict[str, float] = {p: 0.0 for p in PHASES}
        self.first: dict[str, float] = {p: math.nan for p in PHASES}
        self.chunk_s: list[float] = []
        self.compile_s: dict[str, float] = {v: 0.0 for v in _COMPILE_EVENTS.values()}
        self.curve: dict[str, np.ndarray] | None = None  # the run's curve, for the ``runtime`` section
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        """Record ``seconds`` spent in phase ``name`` (one of :data:`PHASES`).

        Raises:
            ValueError: an unknown phase name.
        """
        if name not in self.totals:
            raise ValueError(f"unknown phase {name!r}; allowed: {list(PHASES)}")
        self.totals[name] += seconds
        self.counts[name] += 1
        self.max[name] = max(self.max[name], seconds)
        if self.counts[name] == 1:
            self.first[name] = seconds
        if name == "chunk":
            self.chunk_s.append(seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` body as phase ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def _on_event(self, event: str, duration: float, **_: Any) -> None:
        key = _COMPILE_EVENTS.get(event)
        if key is not None:
            with self._lock:
                self.compile_s[key] += float(duration)

    def summary(self, wall_s: float, curve: dict[str, np.ndarray] | None, completed: bool) -> dict[str, Any]:
        """The ``timers.json`` object (see the module docstring); ``curve`` gives the async runtime's
        per-row columns (None: ``runtime`` is left empty)."""
        phases = {p: {"total_s": self.totals[p], "count": self.counts[p], "max_s": self.max[p],
                      "first_s": None if math.isnan(self.first[p]) else self.first[p]} for p in PHASES}
        total = float(sum(self.totals.values()))
        runtime: dict[str, float] = {}
        if curve is not None:
            for c in RUNTIME_COLUMNS:
                v = np.asarray(curve.get(c, []), np.float64)
                if np.isfinite(v).any():
                    runtime[c] = float(np.nansum(v))
            for c in ("actor_wait_frac", "learner_wait_frac"):
                v = np.asarray(curve.get(c, []), np.float64)
                if np.isfinite(v).any():
                    runtime[c + "_mean"] = float(np.nanmean(v))
        with self._lock:
            compile_s = {**self.compile_s, "total": float(sum(self.compile_s.values()))}
        return {"units": "seconds", "wall_s": wall_s, "completed": completed, "phases": phases,
                "phases_total_s": total, "other_s": wall_s - total, "chunk_s": list(self.chunk_s),
                "compile_s": compile_s, "runtime": runtime}


def phase(name: str):
    """A context manager timing phase ``name`` of the profiled run in this context; a no-op
    (``nullcontext``) when no run is profiled."""
    timers = _CURRENT.get()
    return timers.phase(name) if timers is not None else nullcontext()


def timed(name: str, fn: Callable | None) -> Callable | None:
    """``fn`` itself when no run is profiled in this context (or ``fn`` is None); otherwise a
    wrapper that waits for ``fn``'s (jax) outputs (``jax.block_until_ready``) and records the call
    as phase ``name``."""
    timers = _CURRENT.get()
    if fn is None or timers is None:
        return fn

    def wrapper(*args, **kwargs):
        with timers.phase(name):
            return jax.block_until_ready(fn(*args, **kwargs))

    return wrapper


class _TraceWindow:
    """Stops the running ``jax.profiler`` trace once: after ``window_s`` seconds from a timer
    thread, or at :meth:`stop` (the end of the run), whichever comes first."""

    def __init__(self, window_s: float):
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self.window_s: float | None = None  # seconds the trace covered, once stopped
        self.write_s = 0.0
        self._timer = threading.Timer(window_s, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        """Stop and write the trace if it still runs (waits while the timer thread writes it)."""
        with self._lock:
            if self.window_s is not None:
                return
            self.window_s = time.perf_counter() - self._start
            t0 = time.perf_counter()
            jax.profiler.stop_trace()
            self.write_s = time.perf_counter() - t0

    def close(self) -> None:
        """Cancel the timer and stop the trace if the timer has not."""
        self._timer.cancel()
        self.stop()


@contextmanager
def profile_run(run_dir: str | Path, trace_window_s: float = TRACE_WINDOW_S) -> Iterator[PhaseTimers]:
    """Profile the ``with`` body: a ``jax.profiler`` trace of its first ``trace_window_s`` seconds
    into ``run_dir/profile/`` and, on exit (also when the body raises), ``run_dir/profile/timers.json``
    over the whole body.

    Set ``timers.curve`` (a :data:`~tianji_jax.training.METRIC_COLUMNS` curve) inside the body to
    fill the ``runtime`` section.

    Args:
        run_dir: the run directory; files go to ``run_dir/profile/``.
        trace_window_s: seconds (> 0) of the body the trace covers; the timers cover all of it.

    Raises:
        ValueError: ``trace_window_s`` is not a number > 0.
        RuntimeError: a ``jax.profiler`` trace is already running in this process.
    """
    if isinstance(trace_window_s, bool) or not isinstance(trace_window_s, (int, float)) or not trace_window_s > 0:
        raise ValueError(f"trace_window_s must be a number of seconds > 0, got {trace_window_s!r}")
    out = Path(run_dir) / PROFILE_DIR
    timers = PhaseTimers()
    token = _CURRENT.set(timers)
    listener = timers._on_event
    jax.monitoring.register_event_duration_secs_listener(listener)
    start = time.perf_counter()
    completed = False
    try:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # XLA ops, jax's host events and thread activity, not every Python call
        before = set(out.glob("plugins/profile/*"))
        try:
            jax.profiler.start_trace(str(out), profiler_options=options)
        except RuntimeError as err:
            raise RuntimeError(f"profile: cannot start a jax.profiler trace ({err}); stop the running trace "
                               "first (jax.profiler.stop_trace)") from None
        window = _TraceWindow(trace_window_s)
        try:
            yield timers
            completed = True
        finally:
            wall_s = time.perf_counter() - start
            window.close()
            summary = timers.summary(wall_s, timers.curve, completed)
            summary["trace_window_s"], summary["trace_write_s"] = window.window_s, window.write_s
            new = sorted(set(out.glob("plugins/profile/*")) - before)
            summary["trace_dir"] = str(new[-1].relative_to(out)) if new else None
            name = TIMERS_FILE if jax.process_index() == 0 else f"timers_process{jax.process_index()}.json"
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        _CURRENT.reset(token)
