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

from tianji_jax.config import DQNConfig, PPOConfig
from tianji_jax.evaluation import EvalResult, make_evaluate
from tianji_jax.logging import CSVLogger, ProgressDisplay
from tianji_jax.provenance import provenance
from tianji_jax.runtime.anakin import PPOAnakin, PPOTrainState, compile_key, host_metrics, make_train

__all__ = ["train", "evaluate", "load_params", "TrainResult", "METRIC_COLUMNS"]

METRIC_COLUMNS = (
    "env_steps", "update", "wall_time_s", "sps", "episode_return_mean", "episode_length_mean", "episodes",
    "eval_return_mean", "eval_return_std", "policy_loss", "value_loss", "entropy", "approx_kl",
    "clip_fraction", "grad_norm", "policy_lag_mean", "policy_lag_max", "production_sps", "consumed_sps", "reuse",
    "spi_observed", "limiter_error", "dropped_stale", "dropped_partial", "actor_wait_frac", "learner_wait_frac", "queue_depth",
    "rollout_s", "h2d_s", "update_s",
    "epsilon", "replay_ratio_observed", "td_loss", "q_mean",
)
"""Columns of ``metrics.csv``, one row per compiled chunk. ``env_steps`` counts env steps taken so
far; ``wall_time_s`` is seconds since ``train`` started; ``sps`` is env steps per second over the
chunk; ``episode_*`` cover the training episodes that ended during the chunk (empty if none);
``eval_*`` are over ``eval_episodes`` deterministic episodes after the chunk (empty if disabled);
the loss columns are means over the chunk's gradient steps; ``policy_lag_*`` is the lag of the
consumed samples as the learner computes it (learner version minus the per-step stamps; 0 in Anakin).
Async runtime only (empty in Anakin): ``production_sps`` (env steps inserted by actors per second),
``consumed_sps`` (env steps consumed by the learner per second, epoch reuse counted), ``reuse``
(``update_epochs``), ``spi_observed`` (samples / inserts of the rate limiter), ``limiter_error``
(``I*spi - S`` in env steps), ``dropped_stale`` (env steps dropped by the lag gate, cumulative), ``dropped_partial`` (host
envs: env steps an actor dropped before insertion because a rollout started with newer params —
transitions left over from uneven resets and actions in flight — cumulative; 0 for gymnax),
``actor_wait_frac`` / ``learner_wait_frac`` (share of the chunk's wall time spent waiting),
``queue_depth`` (trajectories waiting), and per-phase seconds within the chunk ``rollout_s``
(inference + env step), ``h2d_s`` (transfers between devices), ``update_s``.
DQN only (empty for PPO): ``epsilon`` (exploration epsilon of the chunk's last iteration),
``replay_ratio_observed`` (gradient updates / env steps within the chunk: ``replay_ratio`` once
learning has started, 0 before ``learning_starts``), ``td_loss`` (DQN's loss: mean TD loss of the
chunk's gradient updates; DQN leaves ``policy_loss``/``value_loss``/``entropy``/``approx_kl``/
``clip_fraction`` empty), ``q_mean`` (mean online ``Q(s, a)`` of the sampled transitions); for DQN
``update`` is the policy version (learner blocks run), ``grad_norm`` is before clipping and
``policy_lag_*`` is the age in versions of the sampled replay items (many by design)."""


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        config: the config that ran.
        state: the final :class:`~tianji_jax.runtime.anakin.PPOTrainState`
            (:class:`~tianji_jax.runtime.dqn_anakin.DQNTrainState` for a DQN run).
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
    if config.env_spec.on_host:  # envpool / gymnasium: episodes on a separate host env
        from tianji_jax.runtime.host_actor import make_host_evaluate

        return make_host_evaluate(config, jax.jit(trainer.greedy), num_episodes)
    return make_evaluate(config.env_spec, trainer.apply, trainer.continuous, num_episodes,
                         config.normalize_observations, cache_key=(compile_key(config), num_episodes))


def evaluate(config: PPOConfig, state: PPOTrainState, *, num_episodes: int = 10, seed: int = 0) -> EvalResult:
    """Play ``num_episodes`` episodes with the deterministic policy of ``state``.

    Observation statistics are read from ``state`` and never updated. With a
    :class:`~tianji_jax.config.DQNConfig` (and a DQN train state) the policy is greedy in Q.

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
    if isinstance(config, DQNConfig):  # greedy policy of the online Q-network
        return _evaluate_dqn(config, state, num_episodes, seed)
    trainer = make_train(config)
    fn = _evaluator(config, trainer, num_episodes)
    returns, lengths = jax.device_get(fn(state.params, state.obs_rms, jax.random.PRNGKey(seed)))
    return EvalResult(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64))


def _mean(total: float, count: int) -> float:
    return total / count if count > 0 else math.nan


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def train(
    config: PPOConfig | DQNConfig,
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

    A :class:`~tianji_jax.config.DQNConfig` runs DQN in Anakin mode the same way: chunks of
    ``iterations_per_chunk`` iterations (epsilon-greedy rollout -> replay insert -> learner block),
    greedy-policy evaluation, the same run-directory files with ``"algo": "dqn"`` in ``config.json``;
    its rows fill the DQN columns of :data:`METRIC_COLUMNS`.

    Args:
        config: a :class:`PPOConfig` or :class:`DQNConfig` (validated at construction).
        run_dir: if given, receives ``config.json`` (the resolved config with derived sizes),
            ``provenance.json``, ``metrics.csv`` and ``final_params/`` (orbax).
        progress: show a progress bar on stderr; default: when stderr is a terminal.
        callback: called with each row (a dict) after it is logged.

    Returns:
        A :class:`TrainResult`.

    Raises:
        TypeError: ``config`` is neither a :class:`PPOConfig` nor a :class:`DQNConfig`.
        FileExistsError: ``run_dir`` already holds a run (it is never overwritten).
    """
    if isinstance(config, DQNConfig):
        return _train_dqn(config, run_dir=run_dir, progress=progress, callback=callback)
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig or a DQNConfig, got {type(config).__name__}")
    start = time.perf_counter()
    num_updates, chunk_u = config.num_updates, config.updates_per_chunk
    trainer = make_train(config)  # Anakin chunk (the async runtime shares its network/evaluator)
    remainder = num_updates % chunk_u
    tail_trainer = make_train(config, remainder) if remainder and config.runtime == "anakin" else None
    evaluator = _evaluator(config, trainer, config.eval_episodes) if config.eval_episodes else None

    logger = None
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / "metrics.csv").exists():
            raise FileExistsError(f"run_dir={str(run_dir)!r} already holds a run (metrics.csv); choose a new directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = {**config.to_dict(), "algo": "ppo",
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
    stopped = False

    def emit(row: dict[str, float], params: Any, obs_rms: Any) -> bool:
        """Evaluate, log one row; True when early stopping triggers."""
        chunk_index = len(rows)
        if evaluator is not None:
            eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed ^ 0x5EED), chunk_index)
            returns, _ = jax.device_get(evaluator(params, obs_rms, eval_key))
            row["eval_return_mean"] = float(np.mean(returns))
            row["eval_return_std"] = float(np.std(returns))
        row["wall_time_s"] = time.perf_counter() - start
        rows.append(row)
        if logger is not None:
            logger.write(row)
        display.update(int(row["env_steps"]), row["sps"], row["episode_return_mean"], row["eval_return_mean"])
        if callback is not None:
            callback(dict(row))
        return config.stop_at_return is not None and row["eval_return_mean"] >= config.stop_at_return

    try:
        if config.runtime == "async":
            state, stopped = _run_async(config, emit)
        else:
            state = trainer.init(jax.random.PRNGKey(config.seed))
            updates_done = 0
            while updates_done < num_updates:
                fn = trainer if num_updates - updates_done >= chunk_u else tail_trainer
                t0 = time.perf_counter()
                state, metrics = fn(state)
                m = host_metrics(metrics)
                n_upd = int(m["episode_count"].shape[0])
                updates_done += n_upd
                row = _base_row(config, m, updates_done, n_upd * config.batch_size / (time.perf_counter() - t0))
                if emit(row, state.params, state.obs_rms):
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


def _base_row(config: PPOConfig, m: dict[str, np.ndarray], updates_done: int, sps: float) -> dict[str, float]:
    """A metrics row from the per-update metrics of a chunk (each an array over its updates)."""
    count = int(m["episode_count"].sum())
    row: dict[str, float] = {
        "env_steps": updates_done * config.batch_size,
        "update": updates_done,
        "sps": sps,
        "episode_return_mean": _mean(float(m["episode_return_sum"].sum()), count),
        "episode_length_mean": _mean(float(m["episode_length_sum"].sum()), count),
        "episodes": count,
        "eval_return_mean": math.nan,
        "eval_return_std": math.nan,
        "policy_lag_mean": float(np.mean(m["policy_lag_mean"])),
        "policy_lag_max": float(np.max(m["policy_lag_max"])),
    }
    for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"):
        row[k] = float(np.mean(m[k]))
    return row


def _run_async(config: PPOConfig, emit: Callable[..., bool]):
    """The async host loop: rows every ``updates_per_chunk`` updates while actors and learner run."""
    from tianji_jax.runtime.async_ppo import AsyncPPO

    ppo = AsyncPPO(config)
    print(ppo.describe_placement(), file=sys.stderr, flush=True)
    runner, buf, tel = ppo.runner, ppo.runner.buffer, ppo.runner.telemetry
    pending: list[Any] = []
    last = {"t": time.perf_counter(), "produced": 0, "consumed": 0, "actor_wait": 0.0, "learner_wait": 0.0,
            **{k: 0.0 for k in ppo.timers}}
    stopped = [False]

    def on_update(version: int, metrics: Any, item: Any) -> bool:
        pending.append(metrics)
        if version % config.updates_per_chunk and version != config.num_updates:
            return False
        m = host_metrics(jax.tree.map(lambda *xs: jax.numpy.stack(xs), *pending))
        pending.clear()
        now = time.perf_counter()
        dt = now - last["t"]
        produced, consumed = buf.produced, buf.consumed
        row = _base_row(config, m, version, (consumed - last["consumed"]) / dt)
        with tel.lock:
            actor_wait, learner_wait = tel.actor_wait_s, tel.learner_wait_s
        with ppo.timers_lock:
            timers = dict(ppo.timers)
        row.update({
            "production_sps": (produced - last["produced"]) / dt,
            "consumed_sps": (consumed - last["consumed"]) * config.update_epochs / dt,
            "reuse": float(config.update_epochs),
            "spi_observed": buf.limiter.sampled / max(buf.limiter.inserted, 1),
            "limiter_error": buf.limiter.error,
            "dropped_stale": buf.dropped_stale,
            "dropped_partial": ppo.env_steps_discarded,
            "actor_wait_frac": (actor_wait - last["actor_wait"]) / (dt * config.num_actors),
            "learner_wait_frac": (learner_wait - last["learner_wait"]) / dt,
            "queue_depth": buf.depth(),
            **{k: timers[k] - last[k] for k in timers},
        })
        last.update(t=now, produced=produced, consumed=consumed, actor_wait=actor_wait, learner_wait=learner_wait,
                    **timers)
        if emit(row, ppo.learner_state.params, ppo.obs_rms):
            stopped[0] = True
            return True
        return False

    try:
        runner.run(on_update)
    finally:
        ppo.close()
    return PPOTrainState(ppo._actor_states[0], ppo.learner_state), stopped[0]


def _save_params(path: Path, params: Any) -> None:
    import orbax.checkpoint as ocp

    path = path.resolve()
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params, force=True)
        ckptr.wait_until_finished()


def load_params(path: str | Path, like: Any = None) -> Any:
    """Load params saved by :func:`train`: ``path`` is the run directory or its ``final_params``.

    Only the network params are saved; observation statistics are not (yet) part of it.

    Raises:
        FileNotFoundError: no saved params at ``path`` (or ``path/final_params``).
    """
    import orbax.checkpoint as ocp

    path = Path(path).resolve()
    if (path / "final_params").is_dir():
        path = path / "final_params"
    if not (path / "_METADATA").exists() and not (path / "_CHECKPOINT_METADATA").exists():
        raise FileNotFoundError(f"no saved params at {path} (expected a run directory or its final_params/)")
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, like) if like is not None else ckptr.restore(path)


# ------------------------------------------------------------------------------------------------
# DQN (Anakin): the same host loop and run-directory files over compiled DQN chunks
# ------------------------------------------------------------------------------------------------
def _dqn_evaluator(config: DQNConfig, num_episodes: int):
    """Greedy-policy evaluator (``argmax_a Q``, Mnih et al. 2015) on ``num_episodes`` separate envs."""
    from tianji_jax.evaluation import make_policy_evaluate
    from tianji_jax.runtime.dqn_anakin import dqn_compile_key, make_dqn_train

    trainer = make_dqn_train(config)
    return make_policy_evaluate(config.env_spec, trainer.greedy_action, num_episodes,
                                cache_key=("dqn", dqn_compile_key(config), num_episodes))


def _evaluate_dqn(config: DQNConfig, state: Any, num_episodes: int, seed: int) -> EvalResult:
    fn = _dqn_evaluator(config, num_episodes)
    returns, lengths = jax.device_get(fn(state.params, jax.random.PRNGKey(seed)))
    return EvalResult(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64))


def _dqn_row(config: DQNConfig, m: dict[str, np.ndarray], sps: float) -> dict[str, float]:
    """A metrics row from the per-iteration metrics of a DQN chunk (each an array over its iterations)."""
    count = int(m["episode_count"].sum())
    learned = np.asarray(m["learned"], bool)
    env_steps_chunk = len(learned) * config.iteration_env_steps

    def over_learned(k: str, fn=np.mean) -> float:
        return float(fn(m[k][learned])) if learned.any() else math.nan

    return {
        "env_steps": int(m["env_steps"][-1]),
        "update": int(m["acting_version"][-1]) + int(learned[-1]),  # policy version after the chunk
        "sps": sps,
        "episode_return_mean": _mean(float(m["episode_return_sum"].sum()), count),
        "episode_length_mean": _mean(float(m["episode_length_sum"].sum()), count),
        "episodes": count,
        "eval_return_mean": math.nan,
        "eval_return_std": math.nan,
        "grad_norm": over_learned("grad_norm"),
        "policy_lag_mean": over_learned("policy_lag_mean"),
        "policy_lag_max": over_learned("policy_lag_max", np.max),
        "epsilon": float(m["epsilon"][-1]),
        "replay_ratio_observed": float(m["gradient_steps"].sum()) / env_steps_chunk,
        "td_loss": over_learned("td_loss"),
        "q_mean": over_learned("q_mean"),
    }


def _train_dqn(
    config: DQNConfig,
    *,
    run_dir: str | Path | None,
    progress: bool | None,
    callback: Callable[[dict[str, float]], None] | None,
) -> TrainResult:
    """:func:`train` for a :class:`~tianji_jax.config.DQNConfig`: Anakin chunks of
    ``iterations_per_chunk`` iterations (act -> insert -> learn), a row of :data:`METRIC_COLUMNS`
    after each, greedy evaluation, early stopping; the same run-directory files as PPO
    (``config.json`` with ``"algo": "dqn"``)."""
    from tianji_jax.runtime.dqn_anakin import make_dqn_train

    start = time.perf_counter()
    n_iter, chunk_u = config.num_iterations, config.iterations_per_chunk
    trainer = make_dqn_train(config)
    remainder = n_iter % chunk_u
    tail_trainer = make_dqn_train(config, remainder) if remainder else None
    evaluator = _dqn_evaluator(config, config.eval_episodes) if config.eval_episodes else None

    logger = None
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / "metrics.csv").exists():
            raise FileExistsError(f"run_dir={str(run_dir)!r} already holds a run (metrics.csv); choose a new directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = {**config.to_dict(), "algo": "dqn",
                    "derived": {"iteration_env_steps": config.iteration_env_steps,
                                "updates_per_step": config.updates_per_step, "num_iterations": n_iter,
                                "env_steps": config.env_steps, "iterations_per_chunk": chunk_u,
                                "learning_iterations": config.learning_iterations,
                                "num_gradient_steps": config.num_gradient_steps,
                                "epsilon_decay_steps": config.epsilon_decay_steps,
                                "replay_bytes": config.replay_bytes},
                    "description": config.describe()}
        _write_json(run_dir / "config.json", resolved)
        _write_json(run_dir / "provenance.json", provenance())
        logger = CSVLogger(run_dir / "metrics.csv", METRIC_COLUMNS)

    show = sys.stderr.isatty() if progress is None else progress
    display = ProgressDisplay(config.env_steps, show, description=f"DQN {config.env_spec.name}")
    rows: list[dict[str, float]] = []
    stopped = False
    try:
        state = trainer.init(jax.random.PRNGKey(config.seed))
        done = 0
        while done < n_iter:
            fn = trainer if n_iter - done >= chunk_u else tail_trainer
            t0 = time.perf_counter()
            state, metrics = fn(state)  # donates the previous state
            m = host_metrics(metrics)
            k = int(m["env_steps"].shape[0])
            done += k
            row = _dqn_row(config, m, k * config.iteration_env_steps / (time.perf_counter() - t0))
            if evaluator is not None:
                eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed ^ 0x5EED), len(rows))
                returns, _ = jax.device_get(evaluator(state.params, eval_key))
                row["eval_return_mean"] = float(np.mean(returns))
                row["eval_return_std"] = float(np.std(returns))
            row["wall_time_s"] = time.perf_counter() - start
            rows.append(row)
            if logger is not None:
                logger.write(row)
            display.update(int(row["env_steps"]), row["sps"], row["episode_return_mean"], row["eval_return_mean"])
            if callback is not None:
                callback(dict(row))
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
