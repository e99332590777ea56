"""The on-policy data path's part of the host loop, for every on-policy algorithm (PPO, PQN, a
registered one): its evaluator (:func:`on_policy_evaluator`), :func:`train_on_policy` (what
:func:`~tianji_jax.training.train` runs for an on-policy config), its metrics rows
(:func:`on_policy_row`) and the async runtime's host loop (:func:`run_async_on_policy`). The
pieces every algorithm shares are in :mod:`tianji_jax.run.host_loop`, looked up there at call time."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from tianji_jax.run import host_loop  # its functions looked up at call time, where tests patch them
from tianji_jax.algos.on_policy_config import OnPolicyConfig
from tianji_jax.algos.registry import agent_class_for, algorithm_for
from tianji_jax.run.evaluation import EvalResult, make_evaluate, make_recurrent_evaluate
from tianji_jax.run.profiling import timed
from tianji_jax.run.results import TrainResult
from tianji_jax.run.run_files import RunFiles, stack_actors
from tianji_jax.buffers.schedule_file import FILE_NAME as SCHEDULE_FILE
from tianji_jax.runtime.anakin import (OnPolicyAnakin, OnPolicyTrainState, compile_key, host_metrics, one_device,
                                       shared_train as make_train)

__all__ = ["on_policy_evaluator", "train_on_policy", "on_policy_row", "run_async_on_policy"]


def on_policy_evaluator(config: OnPolicyConfig, trainer: OnPolicyAnakin, num_episodes: int):
    """Deterministic-policy evaluator ``(params, obs_rms, key) -> (returns, lengths)`` of ``config`` on
    ``num_episodes`` separate envs (a separate host env for envpool/gymnasium), built from
    ``trainer``'s network; compiled once per config and episode count. A recurrent agent's policy
    carries its core's state through each episode (:func:`~tianji_jax.run.evaluation.make_recurrent_evaluate`
    on gymnax envs; on host envs :func:`~tianji_jax.runtime.actors.host_actor.make_host_evaluate` with the
    agent's ``greedy_step``)."""
    agent = trainer.agent
    if agent.recurrent and config.env_spec.on_host:
        from tianji_jax.runtime.actors.host_actor import make_host_evaluate

        return make_host_evaluate(config, jax.jit(agent.greedy_step), num_episodes, initial_carry=agent.initial_carry)
    if agent.recurrent:
        return make_recurrent_evaluate(config.env_spec, agent.apply_step, agent.initial_carry, agent.continuous,
                                       num_episodes, config.normalize_observations,
                                       cache_key=(compile_key(config), num_episodes))
    if config.env_spec.on_host:  # envpool / gymnasium: episodes on a separate host env
        from tianji_jax.runtime.actors.host_actor import make_host_evaluate

        return make_host_evaluate(config, jax.jit(trainer.agent.greedy), num_episodes)
    return make_evaluate(config.env_spec, trainer.agent.apply, trainer.agent.continuous, num_episodes,
                         config.normalize_observations, cache_key=(compile_key(config), num_episodes))


def evaluate_on_policy(config: OnPolicyConfig, state: OnPolicyTrainState, num_episodes: int, seed: int) -> EvalResult:
    """:func:`~tianji_jax.training.evaluate` for an on-policy train state: ``num_episodes`` episodes of
    the deterministic policy (argmax / mean action) with the state's observation statistics frozen,
    the evaluation envs' key from ``seed`` (arguments checked by the caller)."""
    fn = on_policy_evaluator(config, make_train(one_device(config)), num_episodes)  # evaluation: one device
    returns, lengths = jax.device_get(fn(state.params, state.obs_rms, jax.random.PRNGKey(seed)))
    return EvalResult(returns=np.asarray(returns, np.float64), lengths=np.asarray(lengths, np.int64))


def train_on_policy(config: OnPolicyConfig, *, run_dir, progress, callback, resume, checkpoint, tensorboard, wandb,
                    check_versions) -> TrainResult:
    """:func:`~tianji_jax.training.train` for an on-policy config (its registered algorithm's agent
    on Anakin or the async runtime)."""
    if config.runtime == "async" and config.num_processes == 1:
        from tianji_jax.runtime.async_on_policy import placement

        # device errors before the run dir exists
        placement(num_learner_devices=config.num_learner_devices, num_learner_groups=config.num_learner_groups)
    elif config.runtime == "anakin" and config.num_learner_devices > 1:
        from tianji_jax.runtime.layouts.data_parallel import mesh_devices

        mesh_devices(config.num_learner_devices)
    if config.num_processes > 1 and jax.process_index() != 0:  # multi-host: process 0 writes the run (the
        progress = False  # others only their parts of its checkpoints, into its directory: RunFiles)
    start = time.perf_counter()
    num_updates, chunk_u = config.num_updates, config.updates_per_chunk
    trainer = make_train(config)  # Anakin chunk (the async runtime shares its network/evaluator)
    evaluator = timed("eval", on_policy_evaluator(config, trainer, config.eval_episodes) if config.eval_episodes else None)
    derived = {"batch_size": config.batch_size, "minibatch_size": config.minibatch_size,
               "num_updates": num_updates, "env_steps": config.env_steps,
               "updates_per_chunk": chunk_u, "num_gradient_steps": config.num_gradient_steps}
    algo = algorithm_for(config)
    files = RunFiles(config, algo.name, derived, run_dir=run_dir, resume=resume, checkpoint=checkpoint,
                     tensorboard=tensorboard, wandb=wandb, check_versions=check_versions,
                     resumable=config.num_learner_groups == 1)
    if files.finished:
        return host_loop.finished_result(files)

    display = host_loop.make_display(config, progress, algo.name.upper())
    emit = host_loop.make_emit(config, files, display, start, evaluator)

    def run() -> tuple[Any, bool]:
        if config.runtime == "async":
            return run_async_on_policy(config, files, emit, callback)
        state = files.state if files.state is not None else trainer.init(jax.random.PRNGKey(config.seed))
        return host_loop.run_anakin(trainer, state, int(state.learner.version), num_updates, chunk_u,
                                    config.batch_size, lambda m, done, sps: on_policy_row(config, m, done, sps), emit,
                                    files, callback)

    return host_loop.finish(files, display, run)


def on_policy_row(config: OnPolicyConfig, m: dict[str, np.ndarray], updates_done: int, sps: float
                  ) -> dict[str, float]:
    """A metrics row from the per-update metrics of a chunk (each an array over its updates): the
    episode and lag columns, and the agent's ``ROW_METRICS`` averaged over the updates."""
    count = int(m["episode_count"].sum())
    row: dict[str, float] = {
        "env_steps": updates_done * config.global_batch_size,
        "update": updates_done,
        "sps": sps,
        "episode_return_mean": host_loop.mean_or_nan(float(m["episode_return_sum"].sum()), count),
        "episode_length_mean": host_loop.mean_or_nan(float(m["episode_length_sum"].sum()), count),
        "episodes": count,
        "eval_return_mean": math.nan,
        "eval_return_std": math.nan,
        "policy_lag_mean": float(np.mean(m["policy_lag_mean"])),
        "policy_lag_max": float(np.max(m["policy_lag_max"])),
    }
    agent = agent_class_for(config)
    for k in agent.ROW_METRICS:
        row[k] = float(np.mean(m[k]))
    row.update(agent.row_extra(config, m, updates_done))
    return row


def run_async_on_policy(config: OnPolicyConfig, files: RunFiles, emit: Callable[..., bool],
                  callback: Callable[[dict[str, float]], None] | None = None):
    """The async host loop: rows every ``updates_per_chunk`` updates while actors and learner run.

    After each row the checkpoint cut of that version (:meth:`AsyncOnPolicy.cut`: the learner state,
    each gymnax actor's state right after its newest consumed rollout, the queue's counters; host
    actors save only the run's normalisation statistics, when they normalise) is checkpointed from the host loop; a resume continues from it.
    Multi-host: the learner state is replicated and process 0's checkpoint holds it with process
    0's actors and counters; every other process writes its own actors and counters as its part
    of the same cut (:meth:`~tianji_jax.run.run_files.RunFiles.maybe_save`)."""
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy
    from tianji_jax.runtime.actors.host_normalize import SharedStatistics

    # record_schedule: which rollout each update consumes, and what the gate drops (train() refused a
    # missing run_dir and a resume before the run dir was touched)
    wired = AsyncOnPolicy(config, restore=host_loop.async_restore(files.restored),
                          record_to=files.run_dir / SCHEDULE_FILE if config.record_schedule else None)
    print(wired.describe_placement(), file=sys.stderr, flush=True)
    runner = wired.runner

    def make_row(pending: list, snap: dict, last: dict, window: host_loop.RateWindow, version: int) -> host_loop.AsyncRow:
        # learner groups' metrics live on different devices: stack them on the host, in (group,
        # version) order whatever order the groups' updates arrived in (the row's means then sum in
        # one order)
        keyed = sorted(((runner.group_of(it.actor_id), v, p) for v, p, it in pending), key=lambda e: e[:2])
        m = jax.tree.map(lambda *xs: np.stack(xs), *[host_metrics(p) for _, _, p in keyed])
        row = on_policy_row(config, m, version, window.rate(snap, "consumed"))
        row.update(host_loop.async_columns(config, snap, last, window, wired.timers.read()))
        row.update({"consumed_sps": window.rate(snap, "consumed") * config.update_epochs,
                    "reuse": float(config.update_epochs)})
        # exactly the version just published, whatever the learner does meanwhile; with learner
        # groups the publishing group's (actor g is its first actor: its params and obs_rms match)
        group = runner.group_of(pending[-1][2].actor_id)
        state_v = snap["learner_states"][group]
        learner = _distributed_local(config, state_v) if wired.multi else state_v
        actors = snap["cut"]["actors"]  # the actors as this version's learner had consumed them
        # obs_rms lives on the actor device, params on the learner's: evaluate on the learner's
        obs_rms = (jax.device_put(actors[group].obs_rms, wired.eval_sharding if group == 0 else wired.group_devices[group])
                   if actors[0] is not None else None)
        saved = OnPolicyTrainState(stack_actors(actors), learner)
        norm = snap["cut"].get("norm")  # host actors that normalise: the run's statistics of this version
        if norm is not None:
            obs_rms = jax.device_put(norm.obs_rms, wired.eval_sharding)
            saved = OnPolicyTrainState(norm, learner)
        meta = {"has_actor": actors[0] is not None,
                "stacked_actors": len(actors) if len(actors) > 1 and actors[0] is not None else 0,
                "async_counters": snap["cut"]["counters"], "learner_group": group}
        return host_loop.AsyncRow(row, learner.params, obs_rms, m["nonfinite_skips"],
                                  jax.device_get(saved) if wired.multi else saved, version * config.global_batch_size,
                                  meta)

    stopped = host_loop.run_async(runner, files, emit, callback, every=config.updates_per_chunk,
                                  total=config.num_updates, make_row=make_row, close=wired.close)  # closes the recorder too
    # the threads have stopped; actor 0 as the final learner version consumed it (host actors that
    # normalise: the run's statistics as published with that version, as its checkpoint holds them)
    actor = (wired.consumed_actor_states[0] if wired.host_norm is None else
             SharedStatistics.as_state(wired.published_norm))  # published with the final version
    return OnPolicyTrainState(actor, wired.local_learner_state), stopped


def _distributed_local(config: OnPolicyConfig, state: Any) -> Any:
    """This process's local replica of a global learner state (multi-host runs; the runtime
    checked this process joined ``config``'s job when it was wired)."""
    from tianji_jax.runtime.layouts import distributed as dist

    return dist.local_replica(state)
