"""One training run on the host, above the runtimes: the loops that drive a data path's chunks or
async updates and turn their metrics into rows (:mod:`~tianji_jax.run.host_loop`,
:mod:`~tianji_jax.run.host_on_policy`, :mod:`~tianji_jax.run.host_replay`), the run directory
(:mod:`~tianji_jax.run.run_files`, :mod:`~tianji_jax.run.run_status`), what a run returns
(:mod:`~tianji_jax.run.results`), evaluation, the metric sinks and progress display, plots,
provenance and per-phase timers."""

from tianji_jax.run.evaluation import EvalResult
from tianji_jax.run.host_on_policy import train_on_policy
from tianji_jax.run.host_replay import train_replay
from tianji_jax.run.logging import CSVLogger, MetricsSink, ProgressDisplay, TensorBoardLogger, WandbLogger
from tianji_jax.run.plotting import plot_runs, read_metrics
from tianji_jax.run.profiling import PhaseTimers, profile_run
from tianji_jax.run.results import METRIC_COLUMNS, LoadedRun, TrainResult
from tianji_jax.run.run_files import RunFiles

__all__ = ["train_on_policy", "train_replay", "TrainResult", "LoadedRun", "METRIC_COLUMNS", "EvalResult", "RunFiles",
           "CSVLogger", "MetricsSink", "ProgressDisplay", "TensorBoardLogger", "WandbLogger", "plot_runs",
           "read_metrics", "PhaseTimers", "profile_run"]
