"""What a run directory holds, read without starting orbax: its ``metrics.csv`` rows and its
checkpoints. It decides whether :func:`tianji_jax.train` may start a new run in an existing
directory (only one that holds neither, as a run interrupted before its first row leaves), what
``tianji train`` can truthfully advise after a Ctrl-C, and the one-line summary of a finished
:func:`tianji_jax.train` call.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["metrics_rows", "checkpoint_entries", "complete_checkpoints", "check_new_run_dir", "interrupt_message",
           "summary_line", "eval_cost", "average_rate", "report_end", "SigintLatch"]


def metrics_rows(run_dir: str | Path) -> int:
    """Data rows in ``run_dir/metrics.csv`` (the header and blank lines not counted; 0 without the file)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        return max(0, sum(1 for line in f if line.strip()) - 1)


def checkpoint_entries(run_dir: str | Path) -> list[str]:
    """Names under ``run_dir/checkpoints/``: complete checkpoints (``<env_steps>``) and unfinished
    ones (orbax's ``<env_steps>.orbax-checkpoint-tmp-<time>``); empty without the directory."""
    path = Path(run_dir) / "checkpoints"
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def complete_checkpoints(run_dir: str | Path) -> list[int]:
    """Env steps of the complete checkpoints in ``run_dir/checkpoints/`` (directories named by a
    number: orbax renames a step's temporary directory to that name once it is written), ascending."""
    path = Path(run_dir) / "checkpoints"
    return sorted(int(n) for n in checkpoint_entries(run_dir) if n.isdigit() and (path / n).is_dir())


_RUN_ENTRIES = frozenset({"config.json", "provenance.json", "metrics.csv", "checkpoints", "tensorboard", "profile",
                          "wandb", "final_params"})
"""What a run directory written by :func:`tianji_jax.train` may hold before its first row."""


def check_new_run_dir(run_dir: str | Path) -> None:
    """Allow a new run in ``run_dir`` unless it already holds one: a ``metrics.csv`` with rows or
    anything under ``checkpoints/``. A directory left by a run stopped before its first row (config
    files, a header-only ``metrics.csv``, an empty ``checkpoints/``) may be used again; a directory
    holding anything else (files tianji_jax did not write) is refused, never overwritten.

    Raises:
        ValueError: ``run_dir`` is an empty string.
        FileExistsError: ``run_dir`` holds a run or files of its own (the message says what and how
            to go on).
    """
    if str(run_dir).strip() == "":
        raise ValueError("run_dir must be a directory path, got an empty string")
    path = Path(run_dir)
    # a run first (its directory may also hold what came after it: a plot, a resume's provenance)
    rows, entries = metrics_rows(run_dir), checkpoint_entries(run_dir)
    if rows or entries:
        held = ", ".join(([f"{rows} metrics.csv row(s)"] if rows else [])
                         + ([f"checkpoints {entries[:3]}"] if entries else []))
        raise FileExistsError(f"run_dir={str(run_dir)!r} already holds a run ({held}); choose a new directory "
                              "or resume it")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in _RUN_ENTRIES) if path.is_dir() else []
    if foreign or (path / "config.json").is_file() and '"algo"' not in (path / "config.json").read_text():
        raise FileExistsError(f"run_dir={str(run_dir)!r} is a directory that tianji_jax did not write (it holds "
                              f"{(foreign or ['config.json'])[:3]}); choose a new or empty directory")


def resume_hint(config: Any, checkpoint: Any = None) -> tuple[str | None, str]:
    """``(why_not, extra_flags)`` for :func:`interrupt_message`: why a run of ``config`` saved with
    the :class:`~tianji_jax.config.CheckpointConfig` ``checkpoint`` cannot be resumed (None if it
    can), and the flags a resume needs besides ``--resume DIR`` (multi-host: every process's
    launch flags)."""
    from tianji_jax.algos.registry import algorithm_for

    why = None
    if getattr(config, "num_learner_groups", 1) > 1:
        why = "runs with learner groups cannot be resumed yet"
    elif (algorithm_for(config).data_path == "replay" and checkpoint is not None
          and not getattr(checkpoint, "checkpoint_replay", True)):
        why = "its checkpoints were saved without the replay buffer (checkpoint_replay=False), which a resume needs"
    procs = getattr(config, "num_processes", 1)
    flags = (f" --num-processes {procs} --process-id I --coordinator HOST:PORT (on every process I of the job)"
             if procs > 1 else "")
    return why, flags


def interrupt_message(run_dir: str | Path, why_not: str | None = None, resume_flags: str = "") -> str:
    """The line ``tianji train`` prints after a Ctrl-C: how to continue the run in ``run_dir``
    (``tianji train --resume DIR`` plus ``resume_flags``), or, when it cannot be resumed
    (``why_not``, see :func:`resume_hint`; or no complete checkpoint yet), why, and what to do
    instead."""
    head = "tianji train: interrupted; "
    if why_not is not None:
        kept = ", ".join(([f"{metrics_rows(run_dir)} metrics row(s)"] if metrics_rows(run_dir) else [])
                         + (["its checkpoints (for tianji eval / tianji_jax.load)"] if complete_checkpoints(run_dir)
                            else [])) or "nothing yet (no metrics row, no checkpoint)"
        return head + f"{run_dir} keeps {kept}; it cannot be resumed: {why_not}"
    if complete_checkpoints(run_dir):
        return (head + f"{run_dir} keeps the metrics and checkpoints written so far (continue the run with: "
                f"tianji train --resume {run_dir}{resume_flags})")
    rows = metrics_rows(run_dir)
    if rows == 0 and not checkpoint_entries(run_dir):
        return (head + f"stopped before the first checkpoint: {run_dir} holds no checkpoint and no metrics, so "
                "there is nothing to resume; run the same command again to start over (the directory can be reused)")
    return (head + f"stopped before the first checkpoint: {run_dir} keeps {rows} metrics row(s) but no complete "
            "checkpoint, so the run cannot be resumed; start again in a new directory (--run-dir)")


def summary_line(result: Any) -> str:
    """One plain-text line about a :class:`~tianji_jax.training.TrainResult`: env steps, wall time,
    the run's average env steps per second (:func:`average_rate`), final and best evaluation
    return (or the last training return without evaluation), the env steps spent in evaluation
    (``eval_env_steps``: ``evaluation: 12,345 env steps (9% of training's)``) and the run
    directory; for a resumed run that had already finished, that there was nothing to do."""
    curve = result.curve
    env_steps = curve.get("env_steps", [])
    if not len(env_steps):
        return "tianji_jax.train: no rows were logged"
    steps, wall = int(env_steps[-1]), float(curve["wall_time_s"][-1])
    evals = [float(x) for x in curve.get("eval_return_mean", []) if math.isfinite(x)]
    if evals:
        returns = f"eval return final {evals[-1]:.2f}, best {max(evals):.2f}"
    else:
        train = float(curve["episode_return_mean"][-1]) if len(curve.get("episode_return_mean", [])) else math.nan
        returns = ("no evaluation; " + (f"training episode return {train:.2f}" if math.isfinite(train)
                                        else "no training episode ended"))
    returns += eval_cost(curve)
    where = f"run dir {result.run_dir}" if result.run_dir is not None else "no run dir"
    if getattr(result, "already_finished", False):
        return (f"tianji_jax.train: nothing to do, the run had already finished: {steps} env steps in {wall:.1f} s; "
                f"{returns}; {where}")
    early = " (stopped at stop_at_return)" if result.stopped_early else ""
    return f"tianji_jax.train: done{early}: {steps} env steps in {wall:.1f} s{average_rate(curve)}; {returns}; {where}"


def average_rate(curve: dict) -> str:
    """``", 12,345 env steps/s average (wall, evaluation included)"``: the run's last ``env_steps``
    over its last ``wall_time_s`` (wall seconds since the start: compilation, evaluation and
    checkpointing included; a resumed run counts its restored rows in both), unlike a row's ``sps``
    (one chunk's rate); empty without rows or wall time."""
    steps, wall = curve.get("env_steps", []), curve.get("wall_time_s", [])
    if not len(steps) or not len(wall) or not math.isfinite(float(wall[-1])) or float(wall[-1]) <= 0:
        return ""
    return f", {float(steps[-1]) / float(wall[-1]):,.0f} env steps/s average (wall, evaluation included)"


def eval_cost(curve: dict) -> str:
    """``"; evaluation: <n> env steps (<p>% of training's)"`` from the last finite ``eval_env_steps``
    of ``curve`` (a :class:`~tianji_jax.training.TrainResult` curve) against its last ``env_steps``;
    empty when the run did not evaluate (or its rows predate the column)."""
    done = [float(x) for x in curve.get("eval_env_steps", []) if math.isfinite(x)]
    if not done:
        return ""
    spent, steps = int(done[-1]), int(curve["env_steps"][-1])
    if steps <= 0:
        return f"; evaluation: {spent:,} env steps"
    pct = 100.0 * spent / steps
    share = f"{pct:.0f}%" if pct >= 1 or pct == 0 else f"{pct:.1g}%"
    return f"; evaluation: {spent:,} env steps ({share} of training's)"


def report_end(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (a ``train`` implementation returning a ``TrainResult``) that afterwards prints
    :func:`summary_line` to stderr: the one line that tells how a run ended, in a terminal, a log
    file, a notebook or a pipe alike (``tianji train`` prints no other)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = run(*args, **kwargs)
        print(summary_line(result), file=sys.stderr, flush=True)
        return result

    return wrapped


class SigintLatch:
    """Ctrl-C that cannot be lost: Python raises ``KeyboardInterrupt`` wherever the main thread is,
    and when that is a garbage-collection callback (JAX registers one) or a finaliser the exception
    is printed as "ignored", with a traceback, and training goes on. Inside the ``with`` block
    SIGINT sets a flag, and raises ``KeyboardInterrupt`` at once unless the signal landed in such
    a callback (:func:`_in_unraisable_context`); :meth:`check` (the run's per-row callback) raises it
    when the flag is set, so the run stops at the next metrics row at the latest. The previous
    handler is restored on exit."""

    def __enter__(self) -> "SigintLatch":
        import signal
        import threading

        self.hit = threading.Event()
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum: int, frame: Any) -> None:
                self.hit.set()
                if not _in_unraisable_context(frame):  # there it would be printed and lost: check() raises it
                    raise KeyboardInterrupt

            self._previous = signal.signal(signal.SIGINT, handler)
        return self

    def check(self, row: object = None) -> None:
        """Raise ``KeyboardInterrupt`` if SIGINT came since ``__enter__``."""
        if self.hit.is_set():
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            import signal

            signal.signal(signal.SIGINT, self._previous)


def _in_unraisable_context(frame: Any) -> bool:
    """Whether ``frame`` (a signal handler's frame argument) runs inside a garbage-collection
    callback (``gc.callbacks``) or a ``__del__`` finaliser, where Python prints an exception as
    "ignored" instead of raising it."""
    import gc

    codes = {getattr(cb, "__code__", None) for cb in gc.callbacks} - {None}
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False
