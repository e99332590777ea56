"""The host loop over compiled chunks: logging, evaluation, early stopping, run-directory files."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import numpy as np

from tianji_jax.config import CheckpointConfig, DQNConfig, PPOConfig, load_config
from tianji_jax.evaluation import EvalResult, make_evaluate
from tianji_jax.logging import CSVLogger, MetricsSink, ProgressDisplay, TensorBoardLogger
from tianji_jax.profiling import phase, timed
from tianji_jax.provenance import provenance
from tianji_jax.run_status import check_new_run_dir, report_end
from tianji_jax.state_check import check_params_match
from tianji_jax.runtime.anakin import PPOAnakin, PPOTrainState, compile_key, host_metrics, shared_train as make_train
from tianji_jax.runtime.nonfinite import NonFiniteMonitor
from tianji_jax.runtime.tail_compile import TailCompile

__all__ = ["train", "evaluate", "load", "load_params", "TrainResult", "LoadedRun", "METRIC_COLUMNS"]

METRIC_COLUMNS = (
    "env_steps", "update", "wall_time_s", "sps", "episode_return_mean", "episode_length_mean", "episodes",
    "eval_return_mean", "eval_return_std", "policy_loss", "value_loss", "entropy", "approx_kl",
    "clip_fraction", "grad_norm", "policy_lag_mean", "policy_lag_max", "production_sps", "consumed_sps", "reuse",
    "spi_observed", "limiter_error", "dropped_stale", "dropped_partial", "lost_chunks", "actor_wait_frac", "learner_wait_frac", "queue_depth",
    "rollout_s", "inference_s", "env_step_s", "h2d_s", "update_s",
    "epsilon", "replay_ratio_observed", "td_loss", "q_mean", "nonfinite_skips",
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
``lost_chunks`` (rollouts of remote Ray actors lost when their process died, never inserted;
cumulative; 0 with actor threads),
``actor_wait_frac`` / ``learner_wait_frac`` (share of the chunk's wall time spent waiting),
``queue_depth`` (trajectories waiting), and per-phase seconds within the chunk (summed over
actors) ``rollout_s`` (inference + env step), for host envs split into ``inference_s`` (policy on
the actor device, actions back to the host) and ``env_step_s`` (envpool/gymnasium step and
trajectory assembly; both empty for gymnax actors, whose rollout is one fused program),
``h2d_s`` (transfers between devices; with Ray actors also each rollout's round trip beyond the
actor's own rollout time: task dispatch and the object store, the first one's including the actor
process's start-up), ``update_s``.
DQN only (empty for PPO): ``epsilon`` (exploration epsilon of the chunk's last iteration, the mean
over envs and actors: per-env epsilons differ with ``epsilon_schedule='apex'``),
``replay_ratio_observed`` (gradient updates / env steps within the chunk: ``replay_ratio`` once
learning has started, 0 before ``learning_starts``), ``td_loss`` (DQN's loss: mean TD loss of the
chunk's gradient updates; DQN leaves ``policy_loss``/``value_loss``/``entropy``/``approx_kl``/
``clip_fraction`` empty), ``q_mean`` (mean online ``Q(s, a)`` of the sampled transitions); for DQN
``update`` is the policy version (learner blocks run), ``grad_norm`` is before clipping and
``policy_lag_*`` is the age in versions of the sampled replay items (many by design).
Every algorithm: ``nonfinite_skips`` (gradient steps of the chunk skipped because their loss or
gradient was not finite; params and optimizer state were left as they were; after
``max_nonfinite_updates`` consecutive updates with a skip the run stops with an error)."""


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
        already_finished: True when ``resume`` found the run finished: nothing was trained.
    """

    config: PPOConfig
    state: PPOTrainState
    curve: dict[str, np.ndarray] = field(default_factory=dict)
    run_dir: Path | None = None
    stopped_early: bool = False
    already_finished: bool = False

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
        ValueError: ``num_episodes < 1``, a seed outside [0, 2**32), or a ``state`` whose params do not
            fit ``config``'s network (the message names the leaf, both shapes and the likely field).
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes must be an int >= 1, got {num_episodes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
    check_params_match(config, state.params)
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
    config: PPOConfig | DQNConfig | None = None,
    *,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
    callback: Callable[[dict[str, float]], None] | None = None,
    resume: bool = False,
    checkpoint: CheckpointConfig | None = None,
    tensorboard: bool = True,
    wandb: bool = False,
    check_versions: bool = True,
    profile: bool = False,
) -> TrainResult:
    """Train PPO in Anakin mode on a gymnax env, looping over compiled chunks on the host.

    Each chunk runs ``config.updates_per_chunk`` updates on device; after it the host logs one
    row of :data:`METRIC_COLUMNS`, evaluates (``eval_episodes`` deterministic episodes on separate
    envs, seeded from ``config.seed`` and the chunk index), checkpoints (with a ``run_dir``) and
    stops early once ``eval_return_mean >= stop_at_return``.

    A :class:`~tianji_jax.config.DQNConfig` runs DQN in Anakin mode the same way: chunks of
    ``iterations_per_chunk`` iterations (epsilon-greedy rollout -> replay insert -> learner block),
    greedy-policy evaluation, the same run-directory files with ``"algo": "dqn"`` in ``config.json``;
    its rows fill the DQN columns of :data:`METRIC_COLUMNS`.

    Checkpoints (:mod:`tianji_jax.checkpoint`): with a ``run_dir``, the whole train state is saved
    to ``run_dir/checkpoints/<env_steps>/`` after chunks as ``checkpoint`` says (default: every
    chunk) and after the last one, asynchronously. ``resume=True`` continues the run in ``run_dir``
    from its latest complete checkpoint: ``metrics.csv`` is rewritten with the checkpoint's rows and
    appended to, and an Anakin run on gymnax then gives bit-for-bit the params, counters and
    metrics (all but the timing columns) of an uninterrupted run. A corrupt newest checkpoint
    (unreadable, or failing its checksums) is skipped with one line on stderr; resuming from an
    older one continues in a new directory, ``<run_dir>-from-<step>``, leaving ``run_dir`` as it is
    (:mod:`tianji_jax.checkpoint_verify`; the result's ``run_dir`` names it).

    Async runs checkpoint a consistent cut taken in the learner thread right after a publication:
    the learner state of version ``v`` (params, optimizer state, key, version), each gymnax
    actor's state right after its newest rollout the learner consumed (envs, observations, key,
    observation / reward statistics, episode accumulators; DQN: the n-step window), the replay
    buffer (DQN, with ``checkpoint_replay``), and in ``meta["async_counters"]`` the buffer's and
    rate limiter's counters and DQN's epsilon. Under schedule ``sync`` (PPO and DQN, gymnax) a
    resume is bit-for-bit the uninterrupted run (all but the timing and rate columns). Under
    ``one_step`` / ``relaxed``, rollouts produced after the cut are discarded and acted again
    from the cut with the newest params (``async_counters["in_flight"]``, reported on stderr at
    resume, counts the env steps of those already inserted into the queue; a rollout still being
    acted or held back at the cut is discarded too, uncounted), so the resumed run continues
    correctly but not bit-identically. Host (envpool/gymnasium) actors cannot save their C++ env
    state: on resume they re-seed their envs from the run seed and the resume step
    (:func:`~tianji_jax.runtime.async_ppo.resume_seed`) and reset, losing the episodes in
    progress. Multi-host async runs (``num_processes > 1``) and runs with learner groups
    (``num_learner_groups > 1``) cannot be resumed yet; with learner groups each row, its
    evaluation and its checkpoint (for ``load``/``eval``) use the learner group whose update
    completed the row (``meta["learner_group"]``), and the last row the groups' averaged params.

    Args:
        config: a :class:`PPOConfig` or :class:`DQNConfig` (validated at construction); with
            ``resume=True`` it may be None (read from ``run_dir/config.json``) and otherwise must
            equal the checkpoint's up to ``stop_at_return`` / ``stall_timeout_s``.
        run_dir: if given, receives ``config.json`` (the resolved config with derived sizes),
            ``provenance.json``, ``metrics.csv``, ``checkpoints/``, ``tensorboard/`` and
            ``final_params/`` (orbax).
        progress: show a progress bar on stderr; default: when stderr is a terminal (when it is
            not, one summary line is printed there at the end: ``run_status.summary_line``).
        callback: called with each row (a dict) after it is logged and checkpointed.
        resume: continue the run in ``run_dir`` (needs ``run_dir``).
        checkpoint: a :class:`~tianji_jax.config.CheckpointConfig`; default ``CheckpointConfig()``,
            or on resume the one the run was started with. Ignored without ``run_dir``.
        tensorboard: with a ``run_dir``, also write every column to TensorBoard event files in
            ``run_dir/tensorboard`` (tensorboardX).
        wandb: also log to Weights & Biases (needs the optional ``wandb`` package and a ``run_dir``).
        check_versions: on resume, require the run's jax/jaxlib/flax/optax/gymnax versions.
        profile: write a ``jax.profiler`` trace of the call and ``timers.json`` (seconds per host-loop
            phase: compiled chunks, evaluation, checkpoints, logging, compilation; the async
            runtime's per-phase columns summed) to ``run_dir/profile/``
            (:mod:`tianji_jax.profiling`); needs ``run_dir``. Off by default: tracing costs time
            and disk.

    Returns:
        A :class:`TrainResult` (on resume its ``curve`` holds the restored rows too).

    Raises:
        TypeError: ``config`` is neither a :class:`PPOConfig` nor a :class:`DQNConfig`.
        FileExistsError: ``run_dir`` already holds a run (``metrics.csv`` rows or checkpoints) and
            ``resume`` is False (a run directory is never overwritten; one without either is reused).
        NotADirectoryError: ``run_dir`` is an existing file.
        ValueError: ``resume`` or ``profile`` without ``run_dir``; the run's checkpoint was written
            by a multi-host async run or one with learner groups (or an older tianji_jax without
            async resume), or (DQN)
            without its replay buffer.
        tianji_jax.checkpoint.CheckpointError: ``run_dir`` holds no intact checkpoint.
        tianji_jax.checkpoint.ConfigMismatchError: ``config`` or the package versions differ from
            the checkpoint's (the message names the fields).
        ImportError: ``wandb=True`` without the ``wandb`` package.
    """
    if resume:
        if run_dir is None:
            raise ValueError("resume=True needs run_dir (the directory of the run to continue)")
        if config is None:
            config = load_config(run_dir)
    if config is None:
        raise TypeError("config must be a PPOConfig or a DQNConfig, got None (None is allowed only with resume=True)")
    if not isinstance(config, (PPOConfig, DQNConfig)):
        raise TypeError(f"config must be a PPOConfig or a DQNConfig, got {type(config).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, CheckpointConfig):
        raise TypeError(f"checkpoint must be a CheckpointConfig, got {type(checkpoint).__name__}")
    if run_dir is not None and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise NotADirectoryError(f"run_dir={str(run_dir)!r} is a file; allowed: a new directory, or (with resume) "
                                 "the directory of an earlier run")
    if wandb and run_dir is None:
        raise ValueError("wandb=True needs run_dir")
    if profile and run_dir is None:
        raise ValueError("profile=True needs run_dir (the trace and timers.json go to run_dir/profile/)")
    if profile and not resume:  # before the trace touches it
        check_new_run_dir(run_dir)
    opts = dict(run_dir=run_dir, progress=progress, callback=callback, resume=resume, checkpoint=checkpoint,
                tensorboard=tensorboard, wandb=wandb, check_versions=check_versions)
    run = report_end(_train_dqn if isinstance(config, DQNConfig) else _train_ppo)  # a summary line off a terminal
    if not profile:
        return run(config, **opts)
    from tianji_jax.profiling import profile_run

    with profile_run(run_dir) as timers:
        result = run(config, **opts)
        timers.curve = result.curve
    return result


class _RunFiles:
    """The run directory of one :func:`train` call: config/provenance files, the metrics sink
    (CSV + TensorBoard + W&B), checkpoints, and the state restored on resume. Without a
    ``run_dir`` only the in-memory rows are kept."""

    def __init__(self, config: PPOConfig | DQNConfig, algo: str, derived: dict, *, run_dir: str | Path | None,
                 resume: bool, checkpoint: CheckpointConfig | None, tensorboard: bool, wandb: bool, check_versions: bool,
                 resumable: bool):
        from tianji_jax import checkpoint as ckpt
        from tianji_jax.checkpoint_verify import restore_for_resume

        self.config, self.algo, self.resumable = config, algo, resumable
        self.ckpt_cfg = checkpoint if checkpoint is not None else CheckpointConfig()
        self.rows: list[dict[str, float]] = []
        self.sink: MetricsSink | None = None
        self.ckptr: ckpt.RunCheckpointer | None = None
        self.restored: ckpt.Restored | None = None
        self.last_saved: int | None = None
        self.wall_offset = 0.0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.config_dict = {**config.to_dict(), "algo": algo}
        self.packages = provenance()["packages"]
        if self.run_dir is None:
            return
        run_dir = self.run_dir
        if resume:
            def check(meta: dict) -> None:  # a checkpoint this config cannot continue (raised, not skipped)
                if meta.get("algo") != algo:
                    raise ckpt.ConfigMismatchError(f"cannot resume: the checkpoint is a {meta.get('algo')!r} run, "
                                                   f"the config given is {algo!r}")
                ckpt.check_compatible(meta["config"], self.config_dict,
                                      meta.get("packages") if check_versions else None,
                                      self.packages if check_versions else None)
                if not meta.get("resumable", False):
                    groups, procs = getattr(config, "num_learner_groups", 1), getattr(config, "num_processes", 1)
                    why = (f"written by a run with learner groups (num_learner_groups={groups})" if groups > 1 else
                           f"written by a multi-host async run (num_processes={procs})" if procs > 1 else
                           "written by a tianji_jax that did not checkpoint the async runtime's actors and counters")
                    raise ValueError(f"the checkpoints in {str(run_dir)!r} cannot be resumed: {why}; they serve "
                                     "tianji_jax.load and tianji eval. Allowed: resume single-process runs without "
                                     "learner groups, written by this version")
                if algo == "dqn" and not meta.get("includes_replay", False):
                    raise ValueError(f"the checkpoint in {str(run_dir)!r} was saved without the replay buffer "
                                     "(checkpoint_replay=False), which a DQN resume needs; it serves load/eval only")

            # the newest intact checkpoint; an older one than the newest continues in a new directory
            self.restored, run_dir = restore_for_resume(run_dir, lambda m: _state_template(
                config, m.get("has_actor", True), m.get("stacked_actors", 0)), check)
            self.run_dir, meta = run_dir, self.restored.meta
            if checkpoint is None and isinstance(meta.get("checkpoint"), dict):  # the run's own settings
                self.ckpt_cfg = CheckpointConfig(**meta["checkpoint"])
            self.ckptr = ckpt.RunCheckpointer(run_dir, **self._ckpt_opts())
            self.rows = list(self.restored.rows)
            self.last_saved = self.restored.step
            self.wall_offset = float(self.rows[-1]["wall_time_s"]) if self.rows else 0.0
            _write_json(run_dir / f"provenance_resume_{self.restored.step}.json", provenance())
        else:
            check_new_run_dir(run_dir)  # rows or checkpoints; a run stopped before its first row may start again
            run_dir.mkdir(parents=True, exist_ok=True)
            resolved = {**self.config_dict, "derived": derived, "description": config.describe()}
            _write_json(run_dir / "config.json", resolved)
            _write_json(run_dir / "provenance.json", provenance())
            self.ckptr = ckpt.RunCheckpointer(run_dir, **self._ckpt_opts())
        loggers: list[Any] = [CSVLogger(run_dir / "metrics.csv", METRIC_COLUMNS, rows=self.rows)]
        try:
            if tensorboard:
                purge = self.restored.step + 1 if self.restored is not None else None
                loggers.append(TensorBoardLogger(run_dir / "tensorboard", purge_step=purge))
            if wandb:
                from tianji_jax.logging import WandbLogger

                loggers.append(WandbLogger(run_dir, self.config_dict, resume=resume))
        except BaseException:
            for lg in loggers:
                lg.close()
            raise
        self.sink = MetricsSink(loggers)

    def _ckpt_opts(self) -> dict:
        c = self.ckpt_cfg
        return dict(keep_checkpoints=c.keep_checkpoints, keep_best_checkpoints=c.keep_best_checkpoints,
                    async_save=c.async_checkpointing)

    @property
    def state(self) -> Any:
        """The restored train state, or None."""
        return self.restored.state if self.restored is not None else None

    @property
    def finished(self) -> bool:
        """The restored checkpoint is the run's last (it had ended or stopped early)."""
        return self.restored is not None and bool(self.restored.meta.get("finished", False))

    def log(self, row: dict[str, float]) -> None:
        """Keep ``row`` and write it to the sink."""
        self.rows.append(row)
        if self.sink is not None:
            with phase("log"):
                self.sink.write(row)

    def maybe_save(self, state: Any, env_steps: int, extra: dict, *, finished: bool) -> None:
        """Checkpoint ``state`` at ``env_steps`` if the interval says so or the run is ``finished``."""
        if self.ckptr is None or self.last_saved == env_steps:
            return
        every = self.ckpt_cfg.checkpoint_every_env_steps
        due = every is None or self.last_saved is None or env_steps // every > self.last_saved // every
        if not (due or finished):
            return
        include_replay = self.algo == "dqn" and self.ckpt_cfg.checkpoint_replay
        meta = {"algo": self.algo, "config": self.config_dict, "packages": self.packages, "env_steps": int(env_steps),
                "rows": self.rows, "includes_replay": include_replay, "resumable": self.resumable,
                "finished": bool(finished), "runtime": getattr(self.config, "runtime", "anakin"),
                "checkpoint": self.ckpt_cfg.to_dict(), **extra}
        exclude = (".replay",) if self.algo == "dqn" and not include_replay else ()
        last = self.rows[-1] if self.rows else {}
        with phase("checkpoint"):
            self.ckptr.save(env_steps, state, meta, eval_return=float(last.get("eval_return_mean", math.nan)),
                            exclude_prefixes=exclude)
        self.last_saved = env_steps

    def last_checkpoint(self, env_steps: int) -> str | None:
        """The directory of the newest complete checkpoint at or before ``env_steps``, or None."""
        if self.ckptr is None:
            return None
        steps = [st for st in self.ckptr.steps() if st <= env_steps]
        return str(self.ckptr.directory / str(steps[-1])) if steps else None

    def close(self) -> None:
        """Finish pending checkpoint writes, close the loggers."""
        try:
            if self.ckptr is not None:
                with phase("checkpoint"):  # waits for pending asynchronous writes
                    self.ckptr.close()
        finally:
            if self.sink is not None:
                self.sink.close()

    def result(self, state: Any, stopped: bool) -> TrainResult:
        curve = {c: np.asarray([r.get(c, math.nan) for r in self.rows], np.float64) for c in METRIC_COLUMNS}
        return TrainResult(config=self.config, state=state, curve=curve, run_dir=self.run_dir, stopped_early=stopped,
                           already_finished=self.finished)


def _train_ppo(config: PPOConfig, *, run_dir, progress, callback, resume, checkpoint, tensorboard, wandb,
               check_versions) -> TrainResult:
    """:func:`train` for a :class:`PPOConfig`."""
    if config.runtime == "async" and config.num_processes == 1:
        from tianji_jax.runtime.async_ppo import placement

        # device errors before the run dir exists
        placement(num_learner_devices=config.num_learner_devices, num_learner_groups=config.num_learner_groups)
    if config.num_processes > 1 and jax.process_index() != 0:  # multi-host: process 0 writes the run
        run_dir, progress = None, False
    start = time.perf_counter()
    num_updates, chunk_u = config.num_updates, config.updates_per_chunk
    trainer = make_train(config)  # Anakin chunk (the async runtime shares its network/evaluator)
    remainder = num_updates % chunk_u
    tail = TailCompile(make_train(config, remainder).chunk) if remainder and config.runtime == "anakin" else None
    evaluator = timed("eval", _evaluator(config, trainer, config.eval_episodes) if config.eval_episodes else None)
    derived = {"batch_size": config.batch_size, "minibatch_size": config.minibatch_size,
               "num_updates": num_updates, "env_steps": config.env_steps,
               "updates_per_chunk": chunk_u, "num_gradient_steps": config.num_gradient_steps}
    files = _RunFiles(config, "ppo", derived, run_dir=run_dir, resume=resume, checkpoint=checkpoint,
                      tensorboard=tensorboard, wandb=wandb, check_versions=check_versions,
                      resumable=config.num_processes == 1 and config.num_learner_groups == 1)
    if files.finished:
        files.close()
        return files.result(files.state, bool(files.restored.meta.get("stopped_early", False)))

    display = _display(config, progress, "PPO")
    emit = _make_emit(config, files, display, start, evaluator)

    def run() -> tuple[Any, bool]:
        if config.runtime == "async":
            return _run_async(config, emit, files, callback)
        state = files.state if files.state is not None else trainer.init(jax.random.PRNGKey(config.seed))
        return _run_anakin(trainer, tail, state, int(state.learner.version), num_updates, chunk_u, config.batch_size,
                           lambda m, done, sps: _base_row(config, m, done, sps), emit, files, callback)

    return _finish(files, display, run)


def _display(config: PPOConfig | DQNConfig, progress: bool | None, algo: str) -> ProgressDisplay:
    """The run's progress bar (shown when ``progress``; None: when stderr is a terminal)."""
    show = sys.stderr.isatty() if progress is None else progress
    return ProgressDisplay(config.env_steps, show, description=f"{algo} {config.env_spec.name}")


def _make_emit(config: PPOConfig | DQNConfig, files: _RunFiles, display: ProgressDisplay, start: float,
               evaluator: Callable | None) -> Callable[[dict[str, float], Any, Any], bool]:
    """The one way a metrics row reaches the run, in every runtime: ``emit(row, params, obs_rms)``
    evaluates ``params`` greedily (``evaluator(params, obs_rms, key) -> (returns, lengths)``, key
    folded from the seed and the row index; None: no evaluation) into ``eval_return_mean`` /
    ``eval_return_std``, stamps ``wall_time_s`` (seconds since ``start``, plus the restored run's),
    logs the row and updates the progress display. ``skips`` (the per-update ``nonfinite_skips``
    of the row, in order) goes into the row's column and a :class:`NonFiniteMonitor`, which raises
    :class:`NonFiniteError` after the row is logged once ``max_nonfinite_updates`` consecutive
    updates skipped a step. Returns True when ``config.stop_at_return`` is reached."""
    monitor = NonFiniteMonitor(config.max_nonfinite_updates, files.last_checkpoint)
    if files.rows:
        monitor.prev_env_steps, monitor.prev_update = int(files.rows[-1]["env_steps"]), int(files.rows[-1]["update"])

    def emit(row: dict[str, float], params: Any, obs_rms: Any, skips: np.ndarray) -> bool:
        row["nonfinite_skips"] = int(np.sum(skips))
        if evaluator is not None:
            eval_key = jax.random.fold_in(jax.random.PRNGKey(config.seed ^ 0x5EED), len(files.rows))
            returns, _ = jax.device_get(evaluator(params, obs_rms, eval_key))
            row["eval_return_mean"] = float(np.mean(returns))
            row["eval_return_std"] = float(np.std(returns))
        row["wall_time_s"] = files.wall_offset + time.perf_counter() - start
        files.log(row)
        display.update(int(row["env_steps"]), row["sps"], row["episode_return_mean"], row["eval_return_mean"],
                       row.get("policy_lag_mean", math.nan))
        monitor.observe(skips, row)
        return config.stop_at_return is not None and row["eval_return_mean"] >= config.stop_at_return

    return emit


def _run_anakin(trainer: Callable, tail: TailCompile | None, state: Any, done: int, total: int, chunk_u: int,
                steps_per_unit: int, make_row: Callable[[dict[str, np.ndarray], int, float], dict[str, float]],
                emit: Callable[..., bool], files: _RunFiles, callback: Callable | None) -> tuple[Any, bool]:
    """The Anakin host loop (PPO and DQN): compiled chunks of ``chunk_u`` units (PPO updates or DQN
    iterations of ``steps_per_unit`` env steps each; the last, shorter one is ``tail``'s) from
    ``done`` to ``total`` units. After each chunk: ``make_row(host metrics, units done, SPS)``,
    :func:`_make_emit`'s ``emit``, a checkpoint when due, then ``callback(row)``; stops early when
    ``emit`` says so. Returns ``(state, stopped)``."""
    stopped = False
    try:
        while done < total:
            fn = trainer if total - done >= chunk_u else tail
            t0 = time.perf_counter()
            with phase("chunk"):
                state, metrics = fn(state)  # DQN's chunk donates the previous state
                m = host_metrics(metrics)
            k = int(m["episode_count"].shape[0])
            done += k
            seconds = time.perf_counter() - t0
            if tail is not None:
                tail.after_chunk(state, seconds, (total - done) // chunk_u)
            row = make_row(m, done, k * steps_per_unit / seconds)
            stopped = emit(row, state.params, getattr(state, "obs_rms", None), m["nonfinite_skips"])  # DQN: no obs_rms
            files.maybe_save(state, done * steps_per_unit, {"stopped_early": stopped},
                             finished=stopped or done >= total)
            if callback is not None:
                callback(dict(row))
            if stopped:
                break
    finally:
        if tail is not None:
            tail.close()
    return state, stopped


def _finish(files: _RunFiles, display: ProgressDisplay, run: Callable[[], tuple[Any, bool]]) -> TrainResult:
    """Run ``run() -> (state, stopped)``, then close the display and the run files whatever
    happened, and save ``final_params`` into the run directory."""
    try:
        state, stopped = run()
    finally:
        display.close()
        files.close()
    if files.run_dir is not None:
        _save_params(files.run_dir / "final_params", state.params)
    return files.result(state, stopped)


def _base_row(config: PPOConfig, m: dict[str, np.ndarray], updates_done: int, sps: float) -> dict[str, float]:
    """A metrics row from the per-update metrics of a chunk (each an array over its updates)."""
    count = int(m["episode_count"].sum())
    row: dict[str, float] = {
        "env_steps": updates_done * config.global_batch_size,
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


def _run_async(config: PPOConfig, emit: Callable[..., bool], files: _RunFiles,
               callback: Callable[[dict[str, float]], None] | None = None):
    """The async host loop: rows every ``updates_per_chunk`` updates while actors and learner run.

    After each row the checkpoint cut of that version (:meth:`AsyncPPO.cut`: the learner state,
    each gymnax actor's state right after its newest consumed rollout, the queue's counters; host
    actors have no saved state) is checkpointed from the host loop; a resume continues from it."""
    from tianji_jax.runtime.async_ppo import AsyncPPO

    ppo = AsyncPPO(config, restore=_async_restore(files.restored))
    print(ppo.describe_placement(), file=sys.stderr, flush=True)
    runner = ppo.runner

    def extra() -> dict:
        with ppo.timers_lock:
            timers = dict(ppo.timers)
        # the learner state as published with this version and the actors' half of the cut (the
        # learner thread takes the snapshot right after publishing; the caller handles the event
        # later, when the learner and the actors may be ahead)
        cut = ppo.cut()
        return {**timers, "dropped_partial": cut["counters"]["dropped_partial"], "lost_chunks": ppo.lost_chunks,
                "learner_states": list(ppo.learner_states), "cut": cut}

    runner.extra_snapshot = extra
    pending: list[Any] = []
    last = runner.take_snapshot()
    stopped = [False]
    updates = [runner.start_version]  # all learner groups' updates (= the version without groups)

    def on_update(version: int, metrics: Any, item: Any) -> bool:
        pending.append((runner.group_of(item.actor_id), version, metrics))
        updates[0] += 1
        version = updates[0]
        if version % config.updates_per_chunk and version != config.num_updates:
            return False
        # learner groups' metrics live on different devices: stack them on the host, in (group,
        # version) order whatever order the groups' updates arrived in (the row's means then sum in
        # one order)
        ordered = [host_metrics(p) for _, _, p in sorted(pending, key=lambda e: e[:2])]
        m = jax.tree.map(lambda *xs: np.stack(xs), *ordered)
        pending.clear()
        snap = runner.snapshot  # counters taken by the learner thread right after this update
        dt = max(snap["time"] - last["time"], 1e-9)
        row = _base_row(config, m, version, (snap["consumed"] - last["consumed"]) / dt)
        row.update(_async_columns(config, snap, last, dt, ppo.timers))
        row.update({
            "consumed_sps": (snap["consumed"] - last["consumed"]) * config.update_epochs / dt,
            "reuse": float(config.update_epochs),
            "lost_chunks": snap["lost_chunks"],
        })
        last.clear()
        last.update(snap)
        # exactly the version just published, whatever the learner does meanwhile; with learner
        # groups the publishing group's (actor g is its first actor: its params and obs_rms match)
        group = runner.group_of(item.actor_id)
        state_v = snap["learner_states"][group]
        learner = _distributed_local(config, state_v) if ppo.multi else state_v
        actors = snap["cut"]["actors"]  # the actors as this version's learner had consumed them
        # obs_rms lives on the actor device, params on the learner's: evaluate on the learner's
        obs_rms = (jax.device_put(actors[group].obs_rms, ppo.eval_sharding if group == 0 else ppo.group_devices[group])
                   if actors[0] is not None else None)
        stop = emit(row, learner.params, obs_rms, m["nonfinite_skips"])
        saved = PPOTrainState(_stack_actors(actors), learner)
        files.maybe_save(jax.device_get(saved) if ppo.multi else saved, version * config.global_batch_size,
                         {"stopped_early": stop, "has_actor": actors[0] is not None,
                          "stacked_actors": len(actors) if len(actors) > 1 and actors[0] is not None else 0,
                          "async_counters": snap["cut"]["counters"], "learner_group": group},
                         finished=stop or version >= config.num_updates)
        if callback is not None:
            callback(dict(row))
        if stop:
            stopped[0] = True
            return True
        return False

    try:
        runner.run(on_update)
    finally:
        ppo.close()
    # the threads have stopped; actor 0 as the final learner version consumed it
    return PPOTrainState(ppo.consumed_actor_states[0], ppo.local_learner_state), stopped[0]


def _async_columns(config: PPOConfig | DQNConfig, snap: dict, last: dict, dt: float,
                   timers: Iterable[str]) -> dict[str, float]:
    """The async runtime's columns of a row (PPO and DQN) from the runner's counter snapshots
    ``snap`` (now) and ``last`` (previous row), ``dt`` seconds apart: production SPS, the rate
    limiter's observed samples-per-insert and error, dropped counts, actor/learner wait fractions,
    queue depth, and each phase timer's seconds in ``timers`` since the previous row."""
    return {
        "production_sps": (snap["produced"] - last["produced"]) / dt,
        "spi_observed": snap["sampled"] / max(snap["limiter_inserted"], 1),
        "limiter_error": snap["limiter_error"],
        "dropped_stale": snap["dropped_stale"],
        "dropped_partial": snap["dropped_partial"],
        "actor_wait_frac": (snap["actor_wait_s"] - last["actor_wait_s"]) / (dt * config.num_actors),
        "learner_wait_frac": (snap["learner_wait_s"] - last["learner_wait_s"]) / dt,
        "queue_depth": snap["depth"],
        **{k: snap[k] - last[k] for k in timers},
    }


def _distributed_local(config: PPOConfig, state: Any) -> Any:
    """This process's local replica of a global learner state (multi-host runs)."""
    from tianji_jax.runtime.async_ppo import _distributed

    return _distributed(config).local_replica(state)


def _save_params(path: Path, params: Any) -> None:
    import orbax.checkpoint as ocp

    from tianji_jax.checkpoint import _single_process_options

    path = path.resolve()
    options = _single_process_options(ocp)
    if options:  # multi-host: orbax refuses process-local jax.Arrays; save host copies
        params = jax.device_get(params)
    with phase("final_params"), ocp.StandardCheckpointer(**options) as ckptr:
        ckptr.save(path, params, force=True)
        ckptr.wait_until_finished()


def load_params(path: str | Path, like: Any = None) -> Any:
    """Load params saved by :func:`train`: ``path`` is the run directory or its ``final_params``.

    Only the network params are saved; observation statistics are not (yet) part of it.

    Args:
        path: a run directory or its ``final_params/``.
        like: optional pytree of arrays or ``jax.ShapeDtypeStruct`` giving structure, shapes,
            dtypes and placement; default: the saved structure on this process's first device
            (whatever device the run trained on).

    Returns:
        The params pytree (float32 arrays of the network's shapes).

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
        if like is None:  # onto this process's default device: the saving run's device (an async learner's
            # cpu:1, say) need not exist here
            meta = ckptr.metadata(path)
            tree = getattr(meta, "item_metadata", meta)
            tree = getattr(tree, "tree", tree)
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            like = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)
        return ckptr.restore(path, like)


@dataclass
class LoadedRun:
    """What :func:`load` returns.

    Attributes:
        config: the run's :class:`PPOConfig` / :class:`DQNConfig` (from ``config.json``).
        state: the train state of the checkpoint (:class:`~tianji_jax.runtime.anakin.PPOTrainState`
            or :class:`~tianji_jax.runtime.dqn_anakin.DQNTrainState`; a DQN checkpoint saved without
            its replay buffer has an empty one; an async host-env run has ``state.actor = None``).
        step: env steps of the checkpoint.
        meta: the checkpoint's metadata (see :mod:`tianji_jax.checkpoint`).
        rows: ``metrics.csv`` rows up to the checkpoint.
    """

    config: PPOConfig | DQNConfig
    state: Any
    step: int
    meta: dict
    rows: list[dict[str, float]]

    @property
    def params(self) -> Any:
        """The network params (DQN: the online Q-network)."""
        return self.state.params

    @property
    def obs_rms(self) -> Any:
        """Observation statistics (PPO with a gymnax actor; None otherwise)."""
        return getattr(self.state, "obs_rms", None)


def _state_template(config: PPOConfig | DQNConfig, has_actor: bool = True, stacked_actors: int = 0) -> Any:
    """An abstract (``jax.eval_shape``) train state of ``config``; ``stacked_actors > 0``: the
    ``actor`` field holds that many actor states stacked on a leading axis (async runs with
    several actors)."""
    key = jax.random.PRNGKey(config.seed)
    if isinstance(config, DQNConfig):
        from tianji_jax.runtime.dqn_anakin import DQNTrainState, shared_dqn_train as make_dqn_train

        trainer = make_dqn_train(config)
        if not has_actor or config.env_spec.on_host:  # host actors keep no device actor state
            return DQNTrainState(None, *jax.eval_shape(
                lambda k: (trainer.init_learner(trainer.split_init_key(k)[1]), trainer.init_replay(config.num_actors)),
                key))
        state = jax.eval_shape(trainer.init, key)
    else:
        trainer = make_train(config)
        if not has_actor or config.env_spec.on_host:
            return PPOTrainState(None, jax.eval_shape(lambda k: trainer.init_learner(trainer.split_init_key(k)[1]),
                                                      key))
        state = jax.eval_shape(trainer.init, key)
    if stacked_actors:
        state = state.replace(actor=jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((stacked_actors, *x.shape), x.dtype), state.actor))
    return state


def _stack_actors(actors: list) -> Any:
    """The ``actor`` field of an async checkpoint: the state of a single actor, or several
    stacked on a leading ``(num_actors,)`` axis (None for host actors)."""
    if actors[0] is None:
        return None
    return actors[0] if len(actors) == 1 else jax.tree.map(lambda *xs: jax.numpy.stack(xs), *actors)


def _unstack_actors(actor: Any, stacked: int) -> list:
    """Inverse of :func:`_stack_actors` for ``num_actors`` actors (``stacked`` from the checkpoint's meta)."""
    if not stacked:
        return [actor]
    return [jax.tree.map(lambda x, i=i: x[i], actor) for i in range(stacked)]


def _async_restore(restored: Any) -> dict | None:
    """The ``restore`` argument of :class:`~tianji_jax.runtime.async_ppo.AsyncPPO` /
    :class:`~tianji_jax.runtime.async_dqn.AsyncDQN` from a restored checkpoint (a
    :class:`~tianji_jax.checkpoint.Restored`, or None for a new run: None); reports on stderr what
    the cut leaves out."""
    if restored is None:
        return None
    meta, state = restored.meta, restored.state
    counters = meta["async_counters"]
    restore = {"learner": state.learner, "counters": counters, "env_steps": restored.step,
               "actors": (_unstack_actors(state.actor, meta.get("stacked_actors", 0))
                          if state.actor is not None else None)}
    if hasattr(state, "replay"):
        restore["replay"] = state.replay
    host = state.actor is None
    print(f"resuming the async run at policy version {int(state.learner.version)} ({restored.step} env steps): "
          f"{int(counters.get('in_flight', 0))} env steps inserted after the checkpoint (and any rollout then in "
          "progress) are discarded and acted again" + ("; host envs are re-seeded and reset (their episodes in progress are lost)" if host else ""),
          file=sys.stderr, flush=True)
    return restore


def load(run_dir: str | Path, *, step: int | None = None, config: PPOConfig | DQNConfig | None = None) -> LoadedRun:
    """Load a run's config and the train state of one of its checkpoints.

    Args:
        run_dir: a run directory written by :func:`train` (``config.json`` + ``checkpoints/``).
        step: env steps of the checkpoint (``LoadedRun.meta`` / the directory names under
            ``checkpoints/``); default: the latest intact one (a newer corrupt one is skipped
            with a one-line ``checkpoint <step> skipped: <reason>`` on stderr).
        config: the run's config, needed only when it used an environment object (config.json
            cannot rebuild it).

    Returns:
        A :class:`LoadedRun`; arrays are on the default device.

    Raises:
        tianji_jax.checkpoint.CheckpointError: ``run_dir`` is not a run directory, holds no complete
            checkpoint, has no checkpoint at ``step``, or the checkpoint (``step``, else every one)
            is corrupt (a one-line message; no orbax traceback).
    """
    from tianji_jax import checkpoint as ckpt

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ckpt.CheckpointError(f"{str(run_dir)!r} does not exist")
    if config is None:
        try:
            config = load_config(run_dir)
        except FileNotFoundError as err:
            raise ckpt.CheckpointError(str(err)) from None
        except (ValueError, TypeError) as err:
            raise ckpt.CheckpointError(f"{run_dir / 'config.json'}: {err}") from None
    from tianji_jax.checkpoint_verify import restore_newest_intact

    ckptr = ckpt.RunCheckpointer(run_dir, read_only=True)
    try:  # without a step: the newest intact checkpoint (a corrupt newer one is reported on stderr)
        restored, _ = restore_newest_intact(ckptr, lambda m: _state_template(
            config, m.get("has_actor", True), m.get("stacked_actors", 0)), step=step)
    finally:
        ckptr.close()
    meta, stacked = restored.meta, restored.meta.get("stacked_actors", 0)
    state = restored.state
    if stacked:  # an async run with several actors: actor 0's state (all of them are in the checkpoint)
        state = state.replace(actor=_unstack_actors(state.actor, stacked)[0])
    return LoadedRun(config=config, state=state, step=restored.step, meta=meta, rows=restored.rows)


# ------------------------------------------------------------------------------------------------
# DQN (Anakin): the same host loop and run-directory files over compiled DQN chunks
# ------------------------------------------------------------------------------------------------
def _dqn_evaluator(config: DQNConfig, num_episodes: int):
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


def _evaluate_dqn(config: DQNConfig, state: Any, num_episodes: int, seed: int) -> EvalResult:
    fn = _dqn_evaluator(config, num_episodes)
    returns, lengths = jax.device_get(fn(state.params, None, jax.random.PRNGKey(seed)))
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


def _train_dqn(config: DQNConfig, *, run_dir, progress, callback, resume, checkpoint, tensorboard, wandb,
               check_versions) -> TrainResult:
    """:func:`train` for a :class:`~tianji_jax.config.DQNConfig`: Anakin chunks of
    ``iterations_per_chunk`` iterations (act -> insert -> learn), a row of :data:`METRIC_COLUMNS`
    after each, greedy evaluation, checkpoints, early stopping; the same run-directory files as PPO
    (``config.json`` with ``"algo": "dqn"``)."""
    from tianji_jax.runtime.dqn_anakin import shared_dqn_train as make_dqn_train

    start = time.perf_counter()
    n_iter, chunk_u = config.num_iterations, config.iterations_per_chunk
    trainer = make_dqn_train(config)
    remainder = n_iter % chunk_u
    tail = TailCompile(make_dqn_train(config, remainder).chunk) if remainder else None
    evaluator = timed("eval", _dqn_evaluator(config, config.eval_episodes) if config.eval_episodes else None)
    derived = {"iteration_env_steps": config.iteration_env_steps,
               "updates_per_step": config.updates_per_step, "num_iterations": n_iter,
               "env_steps": config.env_steps, "iterations_per_chunk": chunk_u,
               "learning_iterations": config.learning_iterations,
               "num_gradient_steps": config.num_gradient_steps,
               "epsilon_decay_steps": config.epsilon_decay_steps,
               "replay_bytes": config.replay_bytes}
    files = _RunFiles(config, "dqn", derived, run_dir=run_dir, resume=resume, checkpoint=checkpoint,
                      tensorboard=tensorboard, wandb=wandb, check_versions=check_versions,
                      resumable=True)
    if files.finished:
        files.close()
        return files.result(files.state, bool(files.restored.meta.get("stopped_early", False)))

    display = _display(config, progress, "DQN")
    emit = _make_emit(config, files, display, start, evaluator)

    def run() -> tuple[Any, bool]:
        if config.runtime == "async":
            return _run_async_dqn(config, files, emit, callback)
        state = files.state if files.state is not None else trainer.init(jax.random.PRNGKey(config.seed))
        return _run_anakin(trainer, tail, state, int(state.actor.env_steps) // config.iteration_env_steps, n_iter,
                           chunk_u, config.iteration_env_steps, lambda m, _done, sps: _dqn_row(config, m, sps), emit,
                           files, callback)

    return _finish(files, display, run)


def _run_async_dqn(config: DQNConfig, files: _RunFiles, emit: Callable[..., bool],
                   callback: Callable | None) -> tuple[Any, bool]:
    """The async DQN host loop: a row every ``iterations_per_chunk`` learner blocks (about
    ``eval_every_env_steps`` env steps) while actors and learner run; ``env_steps`` counts env
    steps that reached the replay buffer."""
    from tianji_jax.runtime.async_dqn import AsyncDQN
    from tianji_jax.runtime.dqn_anakin import DQNTrainState

    every = config.iterations_per_chunk
    dqn = AsyncDQN(config, snapshot_every=every, restore=_async_restore(files.restored))
    print(dqn.describe_placement(), file=sys.stderr, flush=True)
    runner = dqn.runner

    def extra() -> dict:
        with dqn.timers_lock:
            timers = dict(dqn.timers)
        # device copies of (learner, replay) and the actors' half of the checkpoint cut, which the
        # learner thread took at this block when a row is due
        return {**timers, "state_copy": dqn.snapshot, "cut": dqn.snapshot_cut,
                "dropped_partial": dqn.env_steps_discarded}

    runner.extra_snapshot = extra
    pending: list[dict] = []
    last = runner.take_snapshot()
    stopped = [False]

    def on_update(version: int, metrics: dict, _item: Any) -> bool:
        pending.append(metrics)
        if version % every and version != config.learning_iterations:
            return False
        m = {k: np.asarray([p[k] for p in pending]) for k in pending[0]}
        pending.clear()
        snap = runner.snapshot  # counters taken by the learner thread right after this block
        dt = max(snap["time"] - last["time"], 1e-9)
        inserted, sampled = snap["inserted"], snap["sampled"]
        count = int(m["episode_count"].sum())
        after = max(1, inserted - config.learning_starts)
        row = {
            "env_steps": inserted, "update": version, "sps": (inserted - last["inserted"]) / dt,
            "episode_return_mean": _mean(float(m["episode_return_sum"].sum()), count),
            "episode_length_mean": _mean(float(m["episode_length_sum"].sum()), count),
            "episodes": count, "eval_return_mean": math.nan, "eval_return_std": math.nan,
            "grad_norm": float(np.mean(m["grad_norm"])), "policy_lag_mean": float(np.mean(m["policy_lag_mean"])),
            "policy_lag_max": float(np.max(m["policy_lag_max"])), "epsilon": float(m["epsilon"][-1]),
            # gradient updates per env step inserted after learning_starts (as the Anakin rows count it)
            "replay_ratio_observed": sampled / config.batch_size / after,
            "td_loss": float(np.mean(m["td_loss"])), "q_mean": float(np.mean(m["q_mean"])),
            "consumed_sps": (sampled - last["sampled"]) / dt, "reuse": math.nan,
            **_async_columns(config, snap, last, dt, dqn.timers),
        }
        last.clear()
        last.update(snap)
        learner, replay_copy = snap["state_copy"]  # exactly this version (the live replay is donated)
        stopped[0] = emit(row, learner.params, None, m["nonfinite_skips"])
        actors = snap["cut"]["actors"]
        state = DQNTrainState(_stack_actors(actors), learner, replay_copy)
        files.maybe_save(state, inserted, {"stopped_early": stopped[0], "async_counters": snap["cut"]["counters"],
                                           "stacked_actors": len(actors) if len(actors) > 1 and actors[0] is not None else 0,
                                           "has_actor": state.actor is not None},
                         finished=stopped[0] or version == config.learning_iterations)
        if callback is not None:  # after the checkpoint, as in the other loops
            callback(dict(row))
        return stopped[0]

    try:
        runner.run(on_update)  # the threads have stopped: the learner's states are safe to read
    finally:
        dqn.close()
    return DQNTrainState(dqn.consumed_actor_states[0], dqn.learner_state, dqn.replay_state), stopped[0]
