"""The public training API: :func:`train`, :func:`evaluate`, :func:`load`, :func:`load_params` and
what they return (:class:`TrainResult`, :class:`LoadedRun`, :data:`METRIC_COLUMNS`, defined in
:mod:`tianji_jax.run.results`). The host loop behind :func:`train` is in :mod:`tianji_jax.run.host_loop`
(shared by every algorithm and runtime), :mod:`tianji_jax.run.host_on_policy` and :mod:`tianji_jax.run.host_replay`
(each algorithm's rows and async loop); the run directory in :mod:`tianji_jax.run.run_files`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from tianji_jax.run import host_on_policy, host_replay  # noqa: F401 - re-exported for callers
from tianji_jax.algos.registry import algorithm_for
from tianji_jax.algos.config_base import AgentConfig
from tianji_jax.config import CheckpointConfig, UntrustedCodeError, load_config
from tianji_jax.run.evaluation import EvalResult
from tianji_jax.run.host_loop import async_restore as _async_restore  # noqa: F401  (imported from here by tests)
from tianji_jax.run.host_loop import final_params_complete
from tianji_jax.run.results import METRIC_COLUMNS, LoadedRun, TrainResult
from tianji_jax.run.run_files import state_template, unstack_actors
from tianji_jax.run.run_status import check_new_run_dir, report_end
from tianji_jax.runtime.anakin import PPOTrainState, shared_train as make_train
from tianji_jax.checkpoint.state_check import check_params_match, check_state_kind

__all__ = ["train", "evaluate", "load", "load_params", "TrainResult", "LoadedRun", "METRIC_COLUMNS"]


def evaluate(config: AgentConfig, state: PPOTrainState, *, num_episodes: int = 10, seed: int = 0) -> EvalResult:
    """Play ``num_episodes`` episodes with the deterministic policy of ``state``.

    Observation statistics are read from ``state`` and never updated. With a
    :class:`~tianji_jax.config.DQNConfig` (and a DQN train state) the policy is greedy in Q.

    Args:
        config: the run's config.
        state: a train state (unbatched).
        num_episodes: ``M >= 1``.
        seed: seed of the evaluation envs' PRNG key, in [0, 2**32).

    Returns:
        An :class:`~tianji_jax.run.evaluation.EvalResult`: a dict with keys ``"returns"`` (float64) and
        ``"lengths"`` (int64), each shaped ``(M,)``, and ``mean`` / ``std`` properties.

    Raises:
        ValueError: ``num_episodes < 1``, a seed outside [0, 2**32), a ``state`` of another data path's
            algorithm, or one whose params do not fit ``config``'s network (the message names the
            leaf, both shapes and the likely field).
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes must be an int >= 1, got {num_episodes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
    algo = algorithm_for(config)
    check_state_kind(config, state)
    check_params_match(config, state.params)
    return algo.evaluate_fn()(config, state, num_episodes, seed)


def train(
    config: AgentConfig | None = None,
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
    trust_code: bool = False,
) -> TrainResult:
    """Train PPO in Anakin mode on a gymnax env, looping over compiled chunks on the host.

    Each chunk runs ``config.updates_per_chunk`` updates on device; after it the host logs one
    row of :data:`METRIC_COLUMNS`, evaluates (``eval_episodes`` deterministic episodes on separate
    envs, seeded from ``config.seed`` and the chunk index; their env steps are counted in
    ``eval_env_steps``, not in ``env_steps``), checkpoints (with a ``run_dir``) and
    stops early once ``eval_return_mean >= stop_at_return``.

    A :class:`~tianji_jax.config.DQNConfig` runs DQN in Anakin mode the same way: chunks of
    ``iterations_per_chunk`` iterations (epsilon-greedy rollout -> replay insert -> learner block),
    greedy-policy evaluation, the same run-directory files with ``"algo": "dqn"`` in ``config.json``;
    its rows fill the DQN columns of :data:`METRIC_COLUMNS`.

    Checkpoints (:mod:`tianji_jax.checkpoint.core`): with a ``run_dir``, the whole train state is saved
    to ``run_dir/checkpoints/<env_steps>/`` after chunks as ``checkpoint`` says (default: every
    chunk) and after the last one, asynchronously. ``resume=True`` continues the run in ``run_dir``
    from its latest complete checkpoint: ``metrics.csv`` is rewritten with the checkpoint's rows and
    appended to, and an Anakin run on gymnax then gives bit-for-bit the params, counters and
    metrics (all but the timing columns) of an uninterrupted run. A corrupt newest checkpoint
    (unreadable, or failing its checksums) is skipped with one line on stderr; resuming from an
    older one continues in a new directory, ``<run_dir>-from-<step>``, leaving ``run_dir`` as it is
    (:mod:`tianji_jax.checkpoint.verify`; the result's ``run_dir`` names it).

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
    (:func:`~tianji_jax.runtime.async_on_policy.resume_seed`) and reset, losing the episodes in
    progress. A multi-host async run (``num_processes > 1``) resumes from one consistent cut:
    every process is relaunched with ``resume=True`` and restores the learner from process 0's
    checkpoint and its own actors from its part (``RUN_DIR/process_parts/``; the run directory must
    be on a filesystem every process sees). Runs with learner groups
    (``num_learner_groups > 1``) cannot be resumed yet; with learner groups each row, its
    evaluation and its checkpoint (for ``load``/``eval``) use the learner group whose update
    completed the row (``meta["learner_group"]``), and the last row the groups' averaged params.

    Args:
        config: the config of a registered algorithm (:class:`~tianji_jax.config.PPOConfig`,
            :class:`~tianji_jax.config.PQNConfig`, :class:`~tianji_jax.config.DQNConfig`,
            :class:`~tianji_jax.config.SACConfig`, or one registered by another package; validated at construction); with
            ``resume=True`` it may be None (read from ``run_dir/config.json``) and otherwise must
            equal the checkpoint's up to ``stop_at_return`` / ``stall_timeout_s``.
        run_dir: if given, receives ``config.json`` (the resolved config with derived sizes),
            ``provenance.json``, ``metrics.csv``, ``checkpoints/``, ``tensorboard/`` and
            ``final_params/`` (orbax).
        progress: show a progress bar on stderr; default: when stderr is a terminal (when it is
            not); one summary line is printed there at the end (``run_status.summary_line``, with
            the env steps evaluation took against training's).
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
            (:mod:`tianji_jax.run.profiling`); needs ``run_dir``. Off by default: tracing costs time
            and disk.
        trust_code: with ``resume=True`` and no ``config``: allow importing the code the run's
            ``config.json`` names (a user torso ``"package.module:factory"``); a config passed
            in is the caller's own and needs nothing.

    Returns:
        A :class:`TrainResult` (on resume its ``curve`` holds the restored rows too).

    Raises:
        TypeError: ``config`` is not the config of a registered algorithm.
        FileExistsError: ``run_dir`` already holds a run (``metrics.csv`` rows or checkpoints) and
            ``resume`` is False (a run directory is never overwritten; one without either is reused).
        NotADirectoryError: ``run_dir`` is an existing file.
        ValueError: ``resume`` or ``profile`` without ``run_dir``; the run's checkpoint was written
            by a run with learner groups (or an older tianji_jax without async resume), or (DQN)
            without its replay buffer; :class:`~tianji_jax.config.UntrustedCodeError` (a
            ValueError): ``resume`` without ``config`` of a run whose config names code, without
            ``trust_code=True``.
        tianji_jax.checkpoint.core.CheckpointError: ``run_dir`` holds no intact checkpoint, or (``resume``
            without ``config``) is not a run directory.
        tianji_jax.checkpoint.core.ConfigMismatchError: ``config`` or the package versions differ from
            the checkpoint's (the message names the fields).
        ImportError: ``wandb=True`` without the ``wandb`` package.
    """
    if resume:
        if run_dir is None:
            raise ValueError("resume=True needs run_dir (the directory of the run to continue)")
        if config is None:
            from tianji_jax import checkpoint as ckpt

            try:
                config = load_config(run_dir, trust_code=trust_code)
            except FileNotFoundError as err:  # as tj.load: not a run directory
                raise ckpt.CheckpointError(str(err)) from None
    if config is None:
        raise TypeError("config must be the config of a registered algorithm (e.g. PPOConfig), got None (None is "
                        "allowed only with resume=True)")
    algo = algorithm_for(config)  # TypeError naming the registered config classes
    if checkpoint is not None and not isinstance(checkpoint, CheckpointConfig):
        raise TypeError(f"checkpoint must be a CheckpointConfig, got {type(checkpoint).__name__}")
    if run_dir is not None and str(run_dir).strip() == "":
        raise ValueError("run_dir must be a directory path or None, got an empty string")
    if run_dir is not None and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise NotADirectoryError(f"run_dir={str(run_dir)!r} is a file; allowed: a new directory, or (with resume) "
                                 "the directory of an earlier run")
    if wandb and run_dir is None:
        raise ValueError("wandb=True needs run_dir")
    if profile and run_dir is None:
        raise ValueError("profile=True needs run_dir (the trace and timers.json go to run_dir/profile/)")
    if profile and not resume:  # before the trace touches it
        check_new_run_dir(run_dir)
    if getattr(config, "record_schedule", False):  # before the run dir is touched
        if run_dir is None:
            raise ValueError("record_schedule=True writes RUN_DIR/schedule.jsonl; give train() a run_dir")
        if resume:
            raise ValueError("record_schedule=True: a schedule covers a run from its start, so a resumed run does "
                             "not record; allowed: resume with record_schedule=False (RUN_DIR/schedule.jsonl keeps "
                             "the updates recorded before the interruption)")
    if getattr(config, "replay_schedule", None) and resume:
        raise ValueError("replay_schedule: a replay runs from the schedule's start; allowed: a new run")
    opts = dict(run_dir=run_dir, progress=progress, callback=callback, resume=resume, checkpoint=checkpoint,
                tensorboard=tensorboard, wandb=wandb, check_versions=check_versions)
    run = report_end(algo.train_fn())  # a summary line off a terminal
    if not profile:
        return run(config, **opts)
    from tianji_jax.run.profiling import profile_run

    with profile_run(run_dir) as timers:
        result = run(config, **opts)
        timers.curve = result.curve
    return result


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
        FileNotFoundError: no saved params at ``path`` (or ``path/final_params``); for a run
            directory whose final params are missing or incomplete (an unfinished run, or one
            interrupted while writing them), the one-line message names the fix,
            ``tianji train --resume RUN_DIR``.
    """
    import orbax.checkpoint as ocp

    path = Path(path).resolve()
    run_dir = path.parent if path.name == "final_params" else path
    if (run_dir / "config.json").is_file() and not final_params_complete(run_dir / "final_params"):
        state = "incomplete" if any(run_dir.glob("final_params*")) else "missing"
        raise FileNotFoundError(f"{run_dir}: the run's final params are {state} (the run is unfinished, or was "
                                f"interrupted while writing them); complete them with: tianji train --resume {run_dir}")
    if (path / "final_params").is_dir():
        path = path / "final_params"
    if not final_params_complete(path):
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


def load(run_dir: str | Path, *, step: int | None = None, config: AgentConfig | None = None,
         trust_code: bool = False) -> LoadedRun:
    """Load a run's config and the train state of one of its checkpoints.

    Args:
        run_dir: a run directory written by :func:`train` (``config.json`` + ``checkpoints/``).
        step: env steps of the checkpoint (``LoadedRun.meta`` / the directory names under
            ``checkpoints/``); default: the latest intact one (a newer corrupt one is skipped
            with a one-line ``checkpoint <step> skipped: <reason>`` on stderr).
        config: the run's config, needed only when it used an environment object (config.json
            cannot rebuild it).
        trust_code: allow importing the code the run's ``config.json`` names (a user torso
            ``"package.module:factory"``, which rebuilding the network imports and calls); without
            it such a run is refused (a run directory from elsewhere must not run code unasked).

    Returns:
        A :class:`LoadedRun`; arrays are on the default device.

    Raises:
        tianji_jax.checkpoint.core.CheckpointError: ``run_dir`` is not a run directory, holds no complete
            checkpoint, has no checkpoint at ``step``, or the checkpoint (``step``, else every one)
            is corrupt (a one-line message; no orbax traceback).
        tianji_jax.config.UntrustedCodeError: (a ValueError) the run's config names code and
            ``trust_code`` is False (one line naming the field and ``trust_code=True``).
    """
    from tianji_jax import checkpoint as ckpt

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ckpt.CheckpointError(f"{str(run_dir)!r} " + ("is a file, not a run directory (the directory "
                                                          "that holds config.json and checkpoints/)"
                                                          if run_dir.exists() else "does not exist"))
    if config is None:
        try:
            config = load_config(run_dir, trust_code=trust_code)
        except FileNotFoundError as err:
            raise ckpt.CheckpointError(str(err)) from None
        except UntrustedCodeError:
            raise
        except (ValueError, TypeError) as err:
            raise ckpt.CheckpointError(f"{run_dir / 'config.json'}: {err}") from None
    from tianji_jax.checkpoint.fallback import restore_newest_intact

    ckptr = ckpt.RunCheckpointer(run_dir, read_only=True)
    try:  # without a step: the newest intact checkpoint (a corrupt newer one is reported on stderr)
        restored, _ = restore_newest_intact(ckptr, lambda m: state_template(
            config, m.get("has_actor", True), m.get("stacked_actors", 0)), step=step)
    finally:
        ckptr.close()
    meta, stacked = restored.meta, restored.meta.get("stacked_actors", 0)
    state = restored.state
    if stacked:  # an async run with several actors: actor 0's state (all of them are in the checkpoint)
        state = state.replace(actor=unstack_actors(state.actor, stacked)[0])
    return LoadedRun(config=config, state=state, step=restored.step, meta=meta, rows=restored.rows)
