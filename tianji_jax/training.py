"""The host loop over compiled chunks: logging, evaluation, early stopping, run-directory files."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from tianji_jax.config import PPOConfig
from tianji_jax.evaluation import EvalResult, make_evaluate
from tianji_jax.logging import CSVLogger, ProgressDisplay
from tianji_jax.provenance import provenance
from tianji_jax.runtime.anakin import PPOAnakin, PPOTrainState, compile_key, host_metrics, make_train

__all__ = ["train", "evaluate", "load_params", "TrainResult", "METRIC_COLUMNS"]

METRIC_COLUMNS = (
    "env_steps", "update", "wall_time_s", "sps", "episode_return_mean", "episode_length_mean", "episodes",
    "eval_return_mean", "eval_return_std", "policy_loss", "value_loss", "entropy", "approx_kl",
    "clip_fraction", "grad_norm",
)
"""Columns of ``metrics.csv``, one row per compiled chunk. ``env_steps`` counts env steps taken so
far; ``wall_time_s`` is seconds since ``train`` started; ``sps`` is env steps per second over the
chunk; ``episode_*`` cover the training episodes that ended during the chunk (empty if none);
``eval_*`` are over ``eval_episodes`` deterministic episodes after the chunk (empty if disabled);
the loss columns are means over the chunk's gradient steps."""


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        config: the config that ran.
        state: the final :class:`~tianji_jax.runtime.anakin.PPOTrainState`.
        curve: learning curve, a dict mapping each of :data:`METRIC_COLUMNS` to a ``(rows,)``
            float64 numpy array (NaN where a value is missing).
        run_dir: the run directory, or None.
        stopped_early: True when ``stop_at_return`` was reached.
    """

    config: PPOConfig
    state: PPOTrainState
    curve: dict[str, np.ndarray] = field(default_factory=dict)
    run_dir: Path | None = None
    stopped_early: bool = False

    @property
    def params(self) -> Any:
        """The final network params."""
        return self.state.params


def _evaluator(config: PPOConfig, trainer: PPOAnakin, num_episodes: int):
    return make_evaluate(config.env_spec, trainer.apply, trainer.continuous, num_episodes,
                         config.normalize_observations, cache_key=(compile_key(config), num_episodes))


def evaluate(config: PPOConfig, state: PPOTrainState, *, num_episodes: int = 10, seed: int = 0) -> EvalResult:
    """Play ``num_episodes`` episodes with the deterministic policy of ``state``.

    Observation statistics are read from ``state`` and never updated.

    Args:
        config: the run's config.
        state: a train state (unbatched).
        num_episodes: ``M >= 1``.
        seed: seed of the evaluation envs' PRNG key, in [0, 2**32).

    Returns:
        An :class:`~tianji_jax.evaluation.EvalResult` with ``returns`` and ``lengths`` shaped ``(M,)``.

    Raises:
        ValueError: ``num_episodes < 1`` or a seed outside [0, 2**32).
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes must be an int >= 1, got {num_episodes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
    trainer = make_train(config)
    fn = _evaluator(config, trainer, num_episodes)
    returns, lengths = jax.device_get(fn(state.params, state.obs_rms, jax.random.PRNGKey(seed)))
    return EvalResult(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64))


def _mean(total: float, count: int) -> float:
    return total / count if count > 0 else math.nan


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def train(
    config: PPOConfig,
    *,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
    callback: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train PPO in Anakin mode on a gymnax env, looping over compiled chunks on the host.

    Each chunk runs ``config.updates_per_chunk`` updates on device; after it the host logs one
    row of :data:`METRIC_COLUMNS`, evaluates (``eval_episodes`` deterministic episodes on separate
    envs, seeded from ``config.seed`` and the chunk index) and stops early once
    ``eval_return_mean >= stop_at_return``.

    Args:
        config: a :class:`PPOConfig` (validated at construction).
        run_dir: if given, receives ``config.json`` (the resolved config with derived sizes),
            ``provenance.json``, ``metrics.csv`` and ``final_params/`` (orbax).
        progress: show a progress bar on stderr; default: when stderr is a terminal.
        callback: called with each row (a dict) after it is logged.

    Returns:
        A :class:`TrainResult`.

    Raises:
        TypeError: ``config`` is not a :class:`PPOConfig`.
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    start = time.perf_counter()
    num_updates, chunk_u = config.num_updates, config.updates_per_chunk
    trainer = make_train(config)
    remainder = num_updates % chunk_u
    tail_trainer = make_train(config, remainder) if remainder else None
    evaluator = _evaluator(config, trainer, config.eval_episodes) if config.eval_episodes else None

    logger = None
    if run_dir is not None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = {**config.to_dict(), "algo": "ppo", "runtime": "anakin",
                    "derived": {"batch_size": config.batch_size, "minibatch_size": config.minibatch_size,
                                "num_updates": num_updates, "env_steps": config.env_steps,
                                "updates_per_chunk": chunk_u, "num_gradient_steps": config.num_gradient_steps},
                    "description": config.describe()}
        _write_json(run_dir / "config.json", resolved)
        _write_json(run_dir / "provenance.json", provenance())
        logger = CSVLogger(run_dir / "metrics.csv", METRIC_COLUMNS)

    show = sys.stderr.isatty() if progress is None else progress
    display = ProgressDisplay(config.env_steps, show, description=f"PPO {config.env_spec.name}")
    rows: list[dict[str, float]] = []
    state = trainer.init(jax.random.PRNGKey(config.seed))
    updates_done, chunk_index, stopped = 0, 0, False
    try:
        while updates_done < num_updates:
            fn = trainer if num_updates - updates_done >= chunk_u else tail_trainer
            t0 = time.perf_counter()
            state, metrics = fn(state)
            m = host_metrics(metrics)
            chunk_time = time.perf_counter() - t0
            n_upd = int(m["episode_count"].shape[0])
            updates_done += n_upd
            env_steps = updates_done * config.batch_size
            count = int(m["episode_count"].sum())
            row: dict[str, float] = {
                "env_steps": env_steps,
                "update": updates_done,
                "sps": n_upd * config.batch_size / chunk_time,
                "episode_return_mean": _mean(float(m["episode_return_sum"].sum()), count),
                "episode_length_mean": _mean(float(m["episode_length_sum"].sum()), count),
                "episodes": count,
                "eval_return_mean": math.nan,
                "eval_return_std": math.nan,
            }
            for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"):
                row[k] = float(np.mean(m[k]))
            if evaluator is not None:
                eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed ^ 0x5EED), chunk_index)
                returns, _ = jax.device_get(evaluator(state.params, state.obs_rms, eval_key))
                row["eval_return_mean"] = float(np.mean(returns))
                row["eval_return_std"] = float(np.std(returns))
            row["wall_time_s"] = time.perf_counter() - start
            rows.append(row)
            if logger is not None:
                logger.write(row)
            display.update(env_steps, row["sps"], row["episode_return_mean"], row["eval_return_mean"])
            if callback is not None:
                callback(dict(row))
            chunk_index += 1
            if config.stop_at_return is not None and row["eval_return_mean"] >= config.stop_at_return:
                stopped = True
                break
    finally:
        display.close()
        if logger is not None:
            logger.close()
    if run_dir is not None:
        _save_params(run_dir / "final_params", state.params)
    curve = {c: np.asarray([r.get(c, math.nan) for r in rows], np.float64) for c in METRIC_COLUMNS}
    return TrainResult(config=config, state=state, curve=curve, run_dir=run_dir, stopped_early=stopped)


def _save_params(path: Path, params: Any) -> None:
    import orbax.checkpoint as ocp

    path = path.resolve()
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params, force=True)
        ckptr.wait_until_finished()


def load_params(path: str | Path, like: Any = None) -> Any:
    """Load params saved by :func:`train` from ``run_dir/final_params``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    import orbax.checkpoint as ocp

    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"no saved params at {path}")
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, like) if like is not None else ckptr.restore(path)


