"""Metric sinks: CSV, TensorBoard (tensorboardX) and optional Weights & Biases behind one thread-safe
:class:`MetricsSink`, and a console progress display (rich)."""

from __future__ import annotations

import csv
import math
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["CSVLogger", "ProgressDisplay", "TensorBoardLogger", "WandbLogger", "MetricsSink"]


class CSVLogger:
    """Append rows to ``path`` with a fixed column order; safe to call from several threads.

    Args:
        path: the CSV file (parent directories are created; an existing file is replaced).
        columns: column names; a row missing a column writes an empty cell.
        rows: rows written right after the header (a resumed run rewrites the rows of its
            checkpoint this way, then appends); the file is replaced atomically.

    Raises:
        ValueError: a row holds a key that is not a column.
    """

    def __init__(self, path: str | Path, columns: Sequence[str], rows: Sequence[dict[str, Any]] = ()):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = list(columns)
        self._lock = threading.Lock()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            for row in rows:
                self._check(row)
                writer.writerow({k: _fmt(v) for k, v in row.items()})
        tmp.replace(self.path)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns)

    def _check(self, row: dict[str, Any]) -> None:
        extra = set(row) - set(self.columns)
        if extra:
            raise ValueError(f"row has unknown columns {sorted(extra)}; columns: {self.columns}")

    def write(self, row: dict[str, Any]) -> None:
        """Write one row and flush it to disk."""
        self._check(row)
        with self._lock:
            self._writer.writerow({k: _fmt(v) for k, v in row.items()})
            self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            self._file.close()


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class TensorBoardLogger:
    """TensorBoard event files (tensorboardX; no TensorFlow) with one scalar per metrics column.

    Each row becomes one scalar per column whose value is a finite number, tagged with the column
    name, at ``global_step = row[step_column]`` (env steps); empty (NaN) cells are skipped.

    Args:
        logdir: directory of the event files (``RUN_DIR/tensorboard``).
        purge_step: a resumed run passes the first env-step count it will log again: TensorBoard
            then hides the events at or after it that the interrupted run wrote.
        step_column: the column used as the step.
    """

    def __init__(self, logdir: str | Path, purge_step: int | None = None, step_column: str = "env_steps"):
        from tensorboardX import SummaryWriter

        self.logdir = Path(logdir)
        self.step_column = step_column
        self._writer = SummaryWriter(logdir=str(self.logdir), purge_step=purge_step, flush_secs=10)

    def write(self, row: dict[str, Any]) -> None:
        """Add one scalar per finite column of ``row`` (not thread-safe by itself: use :class:`MetricsSink`)."""
        step = int(row[self.step_column])
        for k, v in row.items():
            f = _finite(v)
            if f is not None and k != self.step_column:
                self._writer.add_scalar(k, f, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class WandbLogger:
    """Weights & Biases run (only when the ``wandb`` package is installed and asked for).

    Args:
        run_dir: the run directory (wandb's files go to ``RUN_DIR/wandb``; the run is named after it).
        config: the resolved config dict, recorded as the W&B run's config.
        project: W&B project name.
        resume: continue the W&B run whose id is stored in ``RUN_DIR/wandb_id.txt``.

    Raises:
        ImportError: ``wandb`` is not installed (it is an optional dependency: ``pip install wandb``).
    """

    def __init__(self, run_dir: str | Path, config: dict[str, Any], project: str = "tianji_jax",
                 resume: bool = False):
        try:
            import wandb
        except ImportError:
            raise ImportError("wandb=True needs the optional package wandb (pip install wandb); it is not "
                              "installed. Metrics still go to metrics.csv and TensorBoard.") from None
        run_dir = Path(run_dir)
        id_file = run_dir / "wandb_id.txt"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else wandb.util.generate_id()
        id_file.write_text(run_id + "\n")
        self._run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", config=config,
                               dir=str(run_dir))

    def write(self, row: dict[str, Any]) -> None:
        """Log the finite columns of ``row`` at ``step = env_steps``."""
        data = {k: f for k, v in row.items() if (f := _finite(v)) is not None}
        self._run.log(data, step=int(row["env_steps"]))

    def close(self) -> None:
        """Finish the W&B run."""
        self._run.finish()


class MetricsSink:
    """The one place rows go: fans each row out to its loggers under a single lock, so actor,
    learner and host threads may all call :meth:`write`.

    Args:
        loggers: objects with ``write(row)`` and ``close()`` (e.g. :class:`CSVLogger`,
            :class:`TensorBoardLogger`, :class:`WandbLogger`).
    """

    def __init__(self, loggers: Sequence[Any] = ()):
        self.loggers = list(loggers)
        self._lock = threading.Lock()
        self._closed = False

    def write(self, row: dict[str, Any]) -> None:
        """Write ``row`` (a dict column -> value; NaN for an empty cell) to every logger.

        Raises:
            RuntimeError: the sink is closed.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("MetricsSink.write after close()")
            for logger in self.loggers:
                logger.write(row)

    def close(self) -> None:
        """Close every logger once (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for logger in self.loggers:
                logger.close()


class ProgressDisplay:
    """Console progress bar over env steps with the chunk's and the run's average SPS, returns and
    policy lag; a no-op when
    ``enabled`` is False."""

    def __init__(self, total_env_steps: int, enabled: bool, description: str = "train"):
        self.enabled = enabled
        if not enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,} env steps"),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
            # not a terminal (a log file, a notebook's stderr): rich would assume 80 columns and cut
            # the SPS/return/lag field; give it room instead
            console=Console(file=sys.stderr, width=None if sys.stderr.isatty() else 160), transient=False)
        self._task = self._progress.add_task(description, total=total_env_steps, info="")
        self._progress.start()

    def update(self, env_steps: int, sps: float, episode_return: float, eval_return: float,
               policy_lag: float = math.nan, average_sps: float = math.nan) -> None:
        """Show ``env_steps`` done, the rates, the training and evaluation returns and the mean
        policy lag (NaN values are left out). Two rates: ``sps``, the current chunk's (its row's
        ``sps`` column: ``chunk 12,345 SPS``), and ``average_sps``, the run's average env steps per
        second of wall time since the start, evaluation and compilation included (``avg 9,876 SPS
        (wall, eval incl.)``)."""
        if not self.enabled:
            return
        info = f"chunk {sps:,.0f} SPS"
        if not math.isnan(average_sps):
            info += f", avg {average_sps:,.0f} SPS (wall, eval incl.)"
        info += f"  return {episode_return:.1f}"
        if not math.isnan(eval_return):
            info += f"  eval {eval_return:.1f}"
        if not math.isnan(policy_lag):
            info += f"  lag {policy_lag:.2f}"
        self._progress.update(self._task, completed=env_steps, info=info)

    def close(self) -> None:
        """Stop the display."""
        if self.enabled:
            self._progress.stop()
