"""The replay data path's part of the host loop, for every replay algorithm (the DQN family,
SAC, ...): its deterministic-policy evaluator (:func:`replay_evaluator`, :func:`evaluate_replay`),
:func:`train_replay` (what :func:`~tianji_jax.training.train` runs for a replay config: the same
host loop and run-directory files as the on-policy algorithms over compiled replay chunks), its
metrics rows (:func:`replay_row`) and the async runtime's host loop (:func:`run_async_replay`).
The agent supplies its row columns (``ROW_METRICS``, ``EXPLORE_METRIC``). The pieces every algorithm shares are in :mod:`tianji_jax.run.host_loop`,
looked up there at call time."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from tianji_jax.run import host_loop  # its functions looked up at call time, where tests patch them
from tianji_jax.run.evaluation import EvalResult
from tianji_jax.run.profiling import timed
from tianji_jax.run.results import TrainResult
from tianji_jax.run.run_files import RunFiles, stack_actors

__all__ = ["replay_evaluator", "evaluate_replay", "train_replay", "replay_row", "run_async_replay"]


def replay_evaluator(config: Any, num_episodes: int):
    """Deterministic-policy evaluator ``(params, obs_rms, key) -> (returns, lengths)`` (the
    agent's ``greedy_action``: DQN's ``argmax_a Q``, Mnih et al. 2015; SAC's squashed mean) on
    ``num_episodes`` separate envs (a separate host env for envpool/gymnasium); ``obs_rms`` (the
    learner's observation statistics with ``normalize_observations``, frozen: read, never updated)
    normalises what the policy sees, and is unused (None) otherwise."""
    from tianji_jax.algos.replay_agent import ActingParams
    from tianji_jax.run.evaluation import make_policy_evaluate
    from tianji_jax.runtime.anakin import compile_key, one_device, shared_train

    trainer = shared_train(one_device(config))  # only its agent: evaluation runs on one device
    if config.env_spec.on_host:
        from tianji_jax.runtime.actors.host_actor import make_host_evaluate

        return make_host_evaluate(config, jax.jit(trainer.agent.greedy_action), num_episodes)
    agent = trainer.agent
    device_eval = make_policy_evaluate(config.env_spec, agent.act_greedy, num_episodes,
                                       cache_key=("replay", compile_key(config), num_episodes))

    def evaluate(params: Any, obs_rms: Any, key: jax.Array):
        acting = params if obs_rms is None else ActingParams(params, obs_rms)
        return device_eval(acting, key)
    return evaluate


def evaluate_replay(config: Any, state: Any, num_episodes: int, seed: int) -> EvalResult:
    """:func:`~tianji_jax.training.evaluate` for a replay train state: ``num_episodes``
    deterministic-policy episodes, the evaluation envs' key from ``seed`` (arguments checked by
    the caller)."""
    fn = replay_evaluator(config, num_episodes)
    returns, lengths = jax.device_get(fn(state.params, state.obs_rms, jax.random.PRNGKey(seed)))
    return EvalResult(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64))


def _agent_class(config: Any) -> type:
    from tianji_jax.algos.registry import agent_class_for

    return agent_class_for(config)


def _agent_columns(config: Any, m: dict[str, np.ndarray], reduce) -> dict[str, float]:
    """The agent's own columns of a row: its ``ROW_METRICS`` reduced over the learner blocks with
    ``reduce(name)``, and its exploration metric (the newest value)."""
    agent = _agent_class(config)
    cols = {k: reduce(k) for k in agent.ROW_METRICS}
    if agent.EXPLORE_METRIC is not None:
        cols[agent.EXPLORE_METRIC] = float(m[agent.EXPLORE_METRIC][-1])
    return cols


def replay_row(config: Any, m: dict[str, np.ndarray], sps: float) -> dict[str, float]:
    """A metrics row from the per-iteration metrics of a replay chunk (each an array over its iterations)."""
    count = int(m["episode_count"].sum())
    learned = np.asarray(m["learned"], bool)
    env_steps_chunk = len(learned) * config.iteration_env_steps

    def over_learned(k: str, fn=np.mean) -> float:
        return float(fn(m[k][learned])) if learned.any() else math.nan

    return {
        "env_steps": int(m["env_steps"][-1]),
        "update": int(m["acting_version"][-1]) + int(learned[-1]),  # policy version after the chunk
        "sps": sps,
        "episode_return_mean": host_loop.mean_or_nan(float(m["episode_return_sum"].sum()), count),
        "episode_length_mean": host_loop.mean_or_nan(float(m["episode_length_sum"].sum()), count),
        "episodes": count,
        "eval_return_mean": math.nan,
        "eval_return_std": math.nan,
        "grad_norm": over_learned("grad_norm"),
        "policy_lag_mean": over_learned("policy_lag_mean"),
        "policy_lag_max": over_learned("policy_lag_max", np.max),
        "replay_ratio_observed": float(m["gradient_steps"].sum()) / env_steps_chunk,
        **_agent_columns(config, m, over_learned),
    }


def train_replay(config: Any, *, run_dir, progress, callback, resume, checkpoint, tensorboard, wandb,
                 check_versions) -> TrainResult:
    """:func:`~tianji_jax.training.train` for a replay algorithm's config: Anakin chunks of
    ``iterations_per_chunk`` iterations (act -> insert -> learn), a row of :data:`METRIC_COLUMNS`
    after each, deterministic evaluation, checkpoints, early stopping; the same run-directory files
    as PPO (``config.json`` with ``"algo"`` the registered name); or the async runtime."""
    from tianji_jax.algos.registry import algorithm_for

    from tianji_jax.runtime.anakin import shared_train

    if config.num_processes > 1 and jax.process_index() != 0:  # multi-host: process 0 writes the run
        progress = False
    if config.runtime == "anakin" and config.num_learner_devices > 1:  # device errors before the run dir exists
        from tianji_jax.runtime.layouts.data_parallel import mesh_devices

        mesh_devices(config.num_learner_devices)
    start = time.perf_counter()
    n_iter, chunk_u = config.num_iterations, config.iterations_per_chunk
    trainer = shared_train(config)
    evaluator = timed("eval", replay_evaluator(config, config.eval_episodes) if config.eval_episodes else None)
    derived = {"iteration_env_steps": config.global_iteration_env_steps,
               "updates_per_step": config.updates_per_step, "num_iterations": n_iter,
               "env_steps": config.env_steps, "iterations_per_chunk": chunk_u,
               "learning_iterations": config.learning_iterations,
               "num_gradient_steps": config.num_gradient_steps,
               **config.derived_extra(), "replay_bytes": config.replay_bytes}
    algo = algorithm_for(config).name
    files = RunFiles(config, algo, derived, run_dir=run_dir, resume=resume, checkpoint=checkpoint,
                     tensorboard=tensorboard, wandb=wandb, check_versions=check_versions,
                     resumable=config.num_learner_groups == 1)
    if files.finished:
        return host_loop.finished_result(files)

    display = host_loop.make_display(config, progress, algo.upper())
    emit = host_loop.make_emit(config, files, display, start, evaluator)

    def run() -> tuple[Any, bool]:
        if config.runtime == "async":
            return run_async_replay(config, files, emit, callback)
        state = files.state if files.state is not None else trainer.init(jax.random.PRNGKey(config.seed))
        return host_loop.run_anakin(trainer, state, int(state.actor.env_steps) // config.iteration_env_steps,
                                    n_iter, chunk_u, config.iteration_env_steps,
                                    lambda m, _done, sps: replay_row(config, m, sps), emit, files, callback)

    return host_loop.finish(files, display, run)


def run_async_replay(config: Any, files: RunFiles, emit: Callable[..., bool],
                     callback: Callable | None) -> tuple[Any, bool]:
    """The async replay host loop: a row every ``iterations_per_chunk`` learner blocks (about
    ``eval_every_env_steps`` env steps) while actors and learner run; ``env_steps`` counts env
    steps that reached the replay buffer."""
    from tianji_jax.runtime.async_replay import AsyncReplay
    from tianji_jax.runtime.anakin import ReplayTrainState

    every = config.iterations_per_chunk
    runtime = AsyncReplay(config, restore=host_loop.async_restore(files.restored))
    print(runtime.describe_placement(), file=sys.stderr, flush=True)
    runner = runtime.runner
    total = config.learning_iterations // config.num_learner_groups * config.num_learner_groups

    def make_row(pending: list, snap: dict, last: dict, window: host_loop.RateWindow, version: int) -> host_loop.AsyncRow:
        m = {k: np.asarray([p[k] for _, p, _ in pending]) for k in pending[0][1]}
        inserted, sampled = snap["inserted"], snap["sampled"]
        count = int(m["episode_count"].sum())
        after = max(1, inserted - config.learning_starts)
        row = {
            "env_steps": inserted, "update": version, "sps": window.rate(snap, "inserted"),
            "episode_return_mean": host_loop.mean_or_nan(float(m["episode_return_sum"].sum()), count),
            "episode_length_mean": host_loop.mean_or_nan(float(m["episode_length_sum"].sum()), count),
            "episodes": count, "eval_return_mean": math.nan, "eval_return_std": math.nan,
            "grad_norm": float(np.mean(m["grad_norm"])), "policy_lag_mean": float(np.mean(m["policy_lag_mean"])),
            "policy_lag_max": float(np.max(m["policy_lag_max"])),
            # gradient updates per env step inserted after learning_starts (as the Anakin rows count it)
            "replay_ratio_observed": sampled / config.batch_size / after,
            **_agent_columns(config, m, lambda k: float(np.mean(m[k]))),
            "consumed_sps": window.rate(snap, "sampled"), "reuse": math.nan,
            **host_loop.async_columns(config, snap, last, window, runtime.timers.read()),
        }
        learner, replay_copy = snap["state_copy"]  # exactly this version (the live replay is donated)
        actors = snap["cut"]["actors"]
        state = ReplayTrainState(stack_actors(actors), learner, replay_copy)
        if runtime.multi:  # host copies: orbax saves no process-local device arrays in a multi-host job
            state = jax.device_get(state)
        meta = {"async_counters": snap["cut"]["counters"], "learner_groups": config.num_learner_groups,
                "stacked_actors": len(actors) if len(actors) > 1 and actors[0] is not None else 0,
                "has_actor": state.actor is not None}
        return host_loop.AsyncRow(row, learner.params, learner.obs_rms, m["nonfinite_skips"], state, inserted, meta)

    stopped = host_loop.run_async(runner, files, emit, callback, every=every, total=total, make_row=make_row,
                                  close=runtime.close)
    return (ReplayTrainState(runtime.consumed_actor_states[0], runtime.local_learner_state, runtime.replay_state),
            stopped)
