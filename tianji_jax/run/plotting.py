"""Learning-curve figures from run directories' ``metrics.csv`` (matplotlib's Figure API, no pyplot).

:func:`plot_runs` draws, one line per run, the return against env steps and against wall time,
plus (when any run used the async runtime) a histogram of the policy lag of its chunks.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["read_metrics", "plot_runs", "return_lines", "RETURN_TITLE_STEPS", "RETURN_TITLE_TIME", "LAG_TITLE"]

RETURN_TITLE_STEPS = "return vs env steps"
RETURN_TITLE_TIME = "return vs wall time"
LAG_TITLE = "policy lag of consumed samples (async runs)"


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """The columns of ``run_dir/metrics.csv`` as float64 arrays (NaN for empty cells).

    Raises:
        FileNotFoundError: ``run_dir`` has no ``metrics.csv`` (not a run directory).
        ValueError: the file has no ``env_steps`` column or a cell is not a number.
    """
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory: no metrics.csv in it")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    if "env_steps" not in columns:
        raise ValueError(f"{path} has no env_steps column (columns: {columns})")
    out = {}
    for c in columns:
        try:
            out[c] = np.asarray([float(r[c]) if r[c] not in ("", None) else math.nan for r in rows], np.float64)
        except ValueError as err:
            raise ValueError(f"{path}: column {c!r} holds a value that is not a number: {err}") from None
    return out


def _is_async(run_dir: Path, metrics: dict[str, np.ndarray]) -> bool:
    try:
        if json.loads((run_dir / "config.json").read_text()).get("runtime") == "async":
            return True
    except (OSError, ValueError):
        pass
    prod = metrics.get("production_sps")
    return prod is not None and bool(np.any(np.isfinite(prod)))


def _return_column(metrics: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
    """``eval_return_mean`` when the run evaluated, else ``episode_return_mean``."""
    for c in ("eval_return_mean", "episode_return_mean"):
        if c in metrics and np.any(np.isfinite(metrics[c])):
            return c, metrics[c]
    n = len(metrics["env_steps"])
    return "episode_return_mean", np.full(n, math.nan)


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path | None = None, labels: Sequence[str] | None = None):
    """Draw the learning curves of ``run_dirs`` and write a PNG.

    Panels: ``RETURN_TITLE_STEPS`` (return against env steps) and ``RETURN_TITLE_TIME`` (against
    ``wall_time_s``, seconds), one line per run (``eval_return_mean``, or ``episode_return_mean``
    for a run without evaluation; the y label says which); and, when any run is async,
    ``LAG_TITLE``: a histogram per async run of its chunks' ``policy_lag_mean`` and
    ``policy_lag_max`` values (in policy versions).

    Args:
        run_dirs: one or more run directories (each with ``metrics.csv``).
        out: PNG path; default ``<first run dir>/plot.png``. Parent directories are created.
        labels: legend label per run; default the directory names.

    Returns:
        The matplotlib ``Figure`` (its axes carry the titles above). It is not registered with
        pyplot: in a notebook, display it as a cell's value or with ``IPython.display.display``.

    Raises:
        ValueError: no run directory, ``labels`` of the wrong length, or a run whose ``metrics.csv``
            has no rows yet (nothing is written then).
        FileNotFoundError: a directory without ``metrics.csv``.
        ImportError: matplotlib (an optional dependency) is not installed.
    """
    try:  # the Figure API: no pyplot state, and the caller's backend (e.g. a notebook's inline one) is left alone
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib, an optional dependency: pip install matplotlib") from None

    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("run_dirs must name at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels has {len(labels)} entries, run_dirs {len(run_dirs)}; they must match")
    labels = list(labels) if labels is not None else [d.name or str(d) for d in run_dirs]
    runs = [read_metrics(d) for d in run_dirs]
    empty = [str(d) for d, m in zip(run_dirs, runs) if not len(m["env_steps"])]
    if empty:
        raise ValueError(f"nothing to plot: metrics.csv of {', '.join(empty)} has no rows yet (the run logged no "
                         "chunk)")
    async_runs = [(lab, m) for d, lab, m in zip(run_dirs, labels, runs) if _is_async(d, m)]
    n_panels = 3 if async_runs else 2
    fig = Figure(figsize=(5.5 * n_panels, 4.2), layout="constrained")
    axes = fig.subplots(1, n_panels)
    ax_steps, ax_time = axes[0], axes[1]
    ylabels = set()
    for lab, m in zip(labels, runs):
        col, ret = _return_column(m)
        ylabels.add(col)
        ax_steps.plot(m["env_steps"], ret, marker=".", label=lab)
        wall = m.get("wall_time_s", np.full(len(ret), math.nan))
        ax_time.plot(wall, ret, marker=".", label=lab)
    ylabel = " / ".join(sorted(ylabels))
    ax_steps.set(title=RETURN_TITLE_STEPS, xlabel="env steps", ylabel=ylabel)
    ax_time.set(title=RETURN_TITLE_TIME, xlabel="wall time (s)", ylabel=ylabel)
    for ax in (ax_steps, ax_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if async_runs:
        ax_lag = axes[2]
        values = []
        for lab, m in async_runs:
            for col in ("policy_lag_mean", "policy_lag_max"):
                v = m.get(col, np.array([]))
                v = v[np.isfinite(v)]
                if len(v):
                    values.append((f"{lab} {col.removeprefix('policy_lag_')}", v))
        top = max([float(v.max()) for _, v in values] + [1.0])
        bins = np.linspace(0, math.ceil(top) + 1, 2 * (math.ceil(top) + 1) + 1)
        for name, v in values:
            ax_lag.hist(v, bins=bins, alpha=0.5, label=name)
        ax_lag.set(title=LAG_TITLE, xlabel="policy lag (versions), per chunk", ylabel="chunks")
        ax_lag.legend(fontsize="small")
    out = Path(out) if out is not None else run_dirs[0] / "plot.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return fig


def return_lines(fig: Any, title: str = RETURN_TITLE_STEPS) -> list:
    """The return lines of the panel titled ``title`` in a figure from :func:`plot_runs` (for tests).

    Returns:
        The panel's matplotlib ``Line2D`` objects, one per run.

    Raises:
        ValueError: no panel of ``fig`` has that title (the message lists the titles).
    """
    for ax in fig.axes:
        if ax.get_title() == title:
            return list(ax.get_lines())
    raise ValueError(f"no panel titled {title!r}; titles: {[ax.get_title() for ax in fig.axes]}")
