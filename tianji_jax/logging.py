"""Metric sinks: a thread-safe CSV writer and a console progress display (rich)."""

from __future__ import annotations

import csv
import math
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["CSVLogger", "ProgressDisplay"]


class CSVLogger:
    """Append rows to ``path`` with a fixed column order; safe to call from several threads.

    Args:
        path: the CSV file (parent directories are created).
        columns: column names; a row missing a column writes an empty cell.

    Raises:
        ValueError: a row holds a key that is not a column.
    """

    def __init__(self, path: str | Path, columns: Sequence[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = list(columns)
        self._lock = threading.Lock()
        self._file = open(self.path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
        self._writer.writeheader()
        self._file.flush()

    def write(self, row: dict[str, Any]) -> None:
        """Write one row and flush it to disk."""
        extra = set(row) - set(self.columns)
        if extra:
            raise ValueError(f"row has unknown columns {sorted(extra)}; columns: {self.columns}")
        with self._lock:
            self._writer.writerow({k: _fmt(v) for k, v in row.items()})
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


class ProgressDisplay:
    """Console progress bar over env steps with SPS and returns; a no-op when ``enabled`` is False."""

    def __init__(self, total_env_steps: int, enabled: bool, description: str = "train"):
        self.enabled = enabled
        if not enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,} env steps"),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
            console=Console(file=sys.stderr), transient=False)
        self._task = self._progress.add_task(description, total=total_env_steps, info="")
        self._progress.start()

    def update(self, env_steps: int, sps: float, episode_return: float, eval_return: float) -> None:
        if not self.enabled:
            return
        info = f"SPS {sps:,.0f}  return {episode_return:.1f}"
        if not math.isnan(eval_return):
            info += f"  eval {eval_return:.1f}"
        self._progress.update(self._task, completed=env_steps, info=info)

    def close(self) -> None:
        if self.enabled:
            self._progress.stop()
