"""DQN's part of the host loop: its greedy evaluator (:func:`dqn_evaluator`, :func:`evaluate_dqn`),
:func:`train_dqn` (what :func:`~tianji_jax.training.train` runs for a
:class:`~tianji_jax.config.DQNConfig`: the same host loop and run-directory files as PPO over
compiled DQN chunks), its metrics rows (:func:`dqn_row`) and the async runtime's host loop
(:func:`run_async_dqn`). The pieces every algorithm shares are in :mod:`tianji_jax.host_loop`,
looked up there at call time."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from tianji_jax import host_loop  # its functions looked up at call time, where tests patch them
from tianji_jax.config import DQNConfig
from tianji_jax.evaluation import EvalResult
from tianji_jax.profiling import timed
from tianji_jax.results import TrainResult
from tianji_jax.run_files import RunFiles, stack_actors
from tianji_jax.runtime.tail_compile import TailCompile

__all__ = ["dqn_evaluator", "evaluate_dqn", "train_dqn", "dqn_row", "run_async_dqn"]


def dqn_evaluator(config: DQNConfig, num_episodes: int):
    """Greedy-policy evaluator ``(params, obs_rms, key) -> (returns, lengths)`` (``argmax_a Q``,
    Mnih et al. 2015; ``obs_rms`` unused, as in PPO's signature) on ``num_episodes`` separate envs
    (a separate host env for envpool/gymnasium)."""
    from tianji_jax.evaluation import make_policy_evaluate
    from tianji_jax.runtime.dqn_anakin import dqn_compile_key, shared_dqn_train as make_dqn_train

    trainer = make_dqn_train(config)
    if config.env_spec.on_host:
        from tianji_jax.runtime.host_actor import make_host_evaluate

        return make_host_evaluate(config, jax.jit(trainer.greedy_action), num_episodes)
    device_eval = make_policy_evaluate(config.env_spec, trainer.greedy_action, num_episodes,
                                       cache_key=("dqn", dqn_compile_key(config), num_episodes))
    return lambda params, _obs_rms, key: device_eval(params, key)


def evaluate_dqn(config: DQNConfig, state: Any, num_episodes: int, seed: int) -> EvalResult:
    """:func:`~tianji_jax.training.evaluate` for a DQN train state: ``num_episodes`` greedy episodes,
    the evaluation envs' key from ``seed`` (arguments checked by the caller)."""
    fn = dqn_evaluator(config, num_episodes)
    returns, lengths = jax.device_get(fn(state.params, None, jax.random.PRNGKey(seed)))
    return EvalResult(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64))


def dqn_row(config: DQNConfig, m: dict[str, np.ndarray], sps: float) -> dict[str, float]:
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
        "episode_return_mean": host_loop.mean_or_nan(float(m["episode_return_sum"].sum()), count),
        "episode_length_mean": host_loop.mean_or_nan(float(m["episode_length_sum"].sum()), count),
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


def train_dqn(config: DQNConfig, *, run_dir, progress, callback, resume, checkpoint, tensorboard, wandb,
              check_versions) -> TrainResult:
    """:func:`~tianji_jax.training.train` for a :class:`~tianji_jax.config.DQNConfig`: Anakin chunks of
    ``iterations_per_chunk`` iterations (act -> insert -> learn), a row of :data:`METRIC_COLUMNS`
    after each, greedy evaluation, checkpoints, early stopping; the same run-directory files as PPO
    (``config.json`` with ``"algo": "dqn"``)."""
    from tianji_jax.runtime.dqn_anakin import shared_dqn_train as make_dqn_train

    start = time.perf_counter()
    n_iter, chunk_u = config.num_iterations, config.iterations_per_chunk
    trainer = make_dqn_train(config)
    remainder = n_iter % chunk_u
    tail = TailCompile(make_dqn_train(config, remainder).chunk) if remainder else None
    evaluator = timed("eval", dqn_evaluator(config, config.eval_episodes) if config.eval_episodes else None)
    derived = {"iteration_env_steps": config.iteration_env_steps,
               "updates_per_step": config.updates_per_step, "num_iterations": n_iter,
               "env_steps": config.env_steps, "iterations_per_chunk": chunk_u,
               "learning_iterations": config.learning_iterations,
               "num_gradient_steps": config.num_gradient_steps,
               "epsilon_decay_steps": config.epsilon_decay_steps,
               "replay_bytes": config.replay_bytes}
    files = RunFiles(config, "dqn", derived, run_dir=run_dir, resume=resume, checkpoint=checkpoint,
                     tensorboard=tensorboard, wandb=wandb, check_versions=check_versions,
                     resumable=config.num_learner_groups == 1)
    if files.finished:
        files.close()
        return files.result(files.state, bool(files.restored.meta.get("stopped_early", False)))

    display = host_loop.make_display(config, progress, "DQN")
    emit = host_loop.make_emit(config, files, display, start, evaluator)

    def run() -> tuple[Any, bool]:
        if config.runtime == "async":
            return run_async_dqn(config, files, emit, callback)
        state = files.state if files.state is not None else trainer.init(jax.random.PRNGKey(config.seed))
        return host_loop.run_anakin(trainer, tail, state, int(state.actor.env_steps) // config.iteration_env_steps,
                                    n_iter, chunk_u, config.iteration_env_steps,
                                    lambda m, _done, sps: dqn_row(config, m, sps), emit, files, callback)

    return host_loop.finish(files, display, run)


def run_async_dqn(config: DQNConfig, files: RunFiles, emit: Callable[..., bool],
                  callback: Callable | None) -> tuple[Any, bool]:
    """The async DQN host loop: a row every ``iterations_per_chunk`` learner blocks (about
    ``eval_every_env_steps`` env steps) while actors and learner run; ``env_steps`` counts env
    steps that reached the replay buffer."""
    from tianji_jax.runtime.async_dqn import AsyncDQN
    from tianji_jax.runtime.dqn_anakin import DQNTrainState

    every = config.iterations_per_chunk
    dqn = AsyncDQN(config, restore=host_loop.async_restore(files.restored))
    print(dqn.describe_placement(), file=sys.stderr, flush=True)
    runner = dqn.runner
    total = config.learning_iterations // config.num_learner_groups * config.num_learner_groups

    def extra() -> dict:
        with dqn.timers_lock:
            timers = dict(dqn.timers)
        snap = {**timers, "state_copy": None, "cut": None, "dropped_partial": dqn.env_steps_discarded,
                "lost_chunks": dqn.lost_chunks}
        group, block = runner.publishing_group, runner.start_version + runner.published
        if group is not None and (block % every == 0 or block == total):  # a row is due at this block
            # in the publishing learner thread, before its next insert donates the replay: a
            # device copy of (learner, replay) of exactly this block and the actors' half of the cut
            snap["state_copy"], snap["cut"] = dqn.row_state(group)
        return snap

    runner.extra_snapshot = extra

    def make_row(pending: list, snap: dict, last: dict, dt: float, version: int) -> host_loop.AsyncRow:
        m = {k: np.asarray([p[k] for _, p, _ in pending]) for k in pending[0][1]}
        inserted, sampled = snap["inserted"], snap["sampled"]
        count = int(m["episode_count"].sum())
        after = max(1, inserted - config.learning_starts)
        row = {
            "env_steps": inserted, "update": version, "sps": (inserted - last["inserted"]) / dt,
            "episode_return_mean": host_loop.mean_or_nan(float(m["episode_return_sum"].sum()), count),
            "episode_length_mean": host_loop.mean_or_nan(float(m["episode_length_sum"].sum()), count),
            "episodes": count, "eval_return_mean": math.nan, "eval_return_std": math.nan,
            "grad_norm": float(np.mean(m["grad_norm"])), "policy_lag_mean": float(np.mean(m["policy_lag_mean"])),
            "policy_lag_max": float(np.max(m["policy_lag_max"])), "epsilon": float(m["epsilon"][-1]),
            # gradient updates per env step inserted after learning_starts (as the Anakin rows count it)
            "replay_ratio_observed": sampled / config.batch_size / after,
            "td_loss": float(np.mean(m["td_loss"])), "q_mean": float(np.mean(m["q_mean"])),
            "consumed_sps": (sampled - last["sampled"]) / dt, "reuse": math.nan,
            **host_loop.async_columns(config, snap, last, dt, dqn.timers),
        }
        learner, replay_copy = snap["state_copy"]  # exactly this version (the live replay is donated)
        actors = snap["cut"]["actors"]
        state = DQNTrainState(stack_actors(actors), learner, replay_copy)
        meta = {"async_counters": snap["cut"]["counters"], "learner_groups": config.num_learner_groups,
                "stacked_actors": len(actors) if len(actors) > 1 and actors[0] is not None else 0,
                "has_actor": state.actor is not None}
        return host_loop.AsyncRow(row, learner.params, None, m["nonfinite_skips"], state, inserted, meta)

    stopped = host_loop.run_async(runner, files, emit, callback, every=every, total=total, make_row=make_row,
                                  close=dqn.close)
    return DQNTrainState(dqn.consumed_actor_states[0], dqn.learner_state, dqn.replay_state), stopped
