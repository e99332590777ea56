"""The run directory of one :func:`~tianji_jax.training.train` call (:class:`RunFiles`:
``config.json``, ``provenance.json``, ``metrics.csv`` and the other metric sinks, checkpoints,
the state restored on resume) and the layout of the train states its checkpoints hold
(:func:`state_template`, :func:`stack_actors`, :func:`unstack_actors`)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tianji_jax.algos.config_base import AgentConfig
from tianji_jax.checkpoint.config import CheckpointConfig
from tianji_jax.run.logging import CSVLogger, MetricsSink, TensorBoardLogger
from tianji_jax.run.profiling import phase
from tianji_jax.run.provenance import provenance
from tianji_jax.run.results import METRIC_COLUMNS, TrainResult
from tianji_jax.run.run_status import check_new_run_dir
from tianji_jax.runtime.anakin import PPOTrainState, one_device, shared_train as make_train

__all__ = ["RunFiles", "state_template", "stack_actors", "unstack_actors"]


_RUN_IDS = itertools.count()  # RunFiles made in this process: every process of a job makes them in the same order
_WAIT_S = 900.0  # seconds one process waits for another's announcement or checkpoint part
_LAUNCH_FIELDS = ("process_id", "coordinator", "heartbeat_timeout_s")
"""Config fields of a multi-host job's launch that may differ between a run and its resume (the
job is launched anew; they do not change what is computed)."""


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


class RunFiles:
    """The run directory of one :func:`~tianji_jax.training.train` call: config/provenance files,
    the metrics sink (CSV + TensorBoard + W&B), checkpoints, and the state restored on resume.
    Without a ``run_dir`` only the in-memory rows are kept.

    Multi-host runs (``num_processes > 1``; docs/runtime.md, "Multi-host checkpoints and resume"):
    process 0 owns the directory and announces it (its resolved path, its checkpoint settings, the
    step it resumes from) in the job's key-value store; every other process ignores its own
    ``run_dir``, writes its part of each checkpoint cut into process 0's directory and, on resume,
    restores the learner from process 0's checkpoint and its own actors and counters from its
    part. The directory must be on a filesystem every process sees, at the same path.

    Args:
        config: the run's config.
        algo: the registered algorithm name (``"ppo"``, ``"pqn"``, ``"dqn"``, ``"sac"``; ``config.json``'s
            and the checkpoints' ``"algo"``).
        derived: the derived sizes written under ``"derived"`` in ``config.json``.
        run_dir, resume, checkpoint, tensorboard, wandb, check_versions: as :func:`~tianji_jax.training.train`'s.
        resumable: whether the checkpoints this run writes can be resumed (``meta["resumable"]``).

    Raises:
        The errors :func:`~tianji_jax.training.train` documents for an occupied ``run_dir`` and for
        a checkpoint that ``config`` cannot continue.
    """

    def __init__(self, config: AgentConfig, algo: str, derived: dict, *, run_dir: str | Path | None,
                 resume: bool, checkpoint: CheckpointConfig | None, tensorboard: bool, wandb: bool, check_versions: bool,
                 resumable: bool):
        from tianji_jax import checkpoint as ckpt

        from tianji_jax.algos.registry import algorithm_for

        self.config, self.algo, self.resumable = config, algo, resumable
        self.replay = algorithm_for(config).data_path == "replay"  # the state holds a replay buffer
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
        self.check_versions = check_versions
        # multi-host (num_processes > 1): process 0 writes the run directory, every other process
        # its part of each checkpoint cut into process 0's directory (``parts_dir``), coordinated
        # through the job's key-value store under ``_kv``
        self.num_processes = getattr(config, "num_processes", 1)
        if self.num_processes > 1:
            from tianji_jax.runtime.layouts import distributed as dist

            if not dist.is_initialized() or dist.process_count() != self.num_processes:
                raise ValueError(f"num_processes={self.num_processes}: this process has not joined that "
                                 "jax.distributed job (tianji train joins it with --num-processes P --process-id I "
                                 "--coordinator HOST:PORT, also for --resume)")
        self.process = jax.process_index() if self.num_processes > 1 else 0
        self.parts_dir: Path | None = None
        self._kv = f"tianji/run_files/{next(_RUN_IDS)}" if self.num_processes > 1 else ""
        if self.process > 0:
            self.run_dir = None  # process 0's directory (announced) receives this process's parts only
            self._follow()
            return
        try:
            self._open(resume, checkpoint is None, tensorboard, wandb, derived)
        except BaseException as err:
            if self._kv:  # the other processes wait for the announcement: tell them why it will not come
                from tianji_jax.checkpoint.verify import one_line
                from tianji_jax.runtime.layouts import distributed as dist

                dist.kv_set(self._kv + "/announce", json.dumps({"error": one_line(err)}))
            raise
        if self._kv:
            from tianji_jax.runtime.layouts import distributed as dist

            self.parts_dir = self.run_dir.resolve() if self.run_dir is not None else None
            dist.kv_set(self._kv + "/announce", json.dumps({
                "run_dir": str(self.parts_dir) if self.parts_dir is not None else "",
                "step": self.restored.step if self.restored is not None else None,
                "checkpoint": self.ckpt_cfg.to_dict()}))

    def _check(self, meta: dict) -> None:
        """Raise for a checkpoint this config cannot continue (raised, not skipped)."""
        from tianji_jax import checkpoint as ckpt

        config, algo, run_dir = self.config, self.algo, self.run_dir or self.parts_dir
        if meta.get("algo") != algo:
            raise ckpt.ConfigMismatchError(f"cannot resume: the checkpoint is a {meta.get('algo')!r} run, "
                                           f"the config given is {algo!r}")
        saved = meta["config"]  # a multi-host job is launched anew: its launch fields may differ
        given = {**self.config_dict, **{k: saved[k] for k in _LAUNCH_FIELDS if k in saved and k in self.config_dict}}
        ckpt.check_compatible(saved, given, meta.get("packages") if self.check_versions else None,
                              self.packages if self.check_versions else None)
        if not meta.get("resumable", False):
            groups, procs = getattr(config, "num_learner_groups", 1), getattr(config, "num_processes", 1)
            why = (f"written by a run with learner groups (num_learner_groups={groups})" if groups > 1 else
                   f"written by a multi-host replay run (num_processes={procs}) of an earlier tianji_jax that "
                   "did not checkpoint every process's replay shards" if procs > 1 else
                   "written by a tianji_jax that did not checkpoint the async runtime's actors and counters")
            raise ValueError(f"the checkpoints in {str(run_dir)!r} cannot be resumed: {why}; they serve "
                             "tianji_jax.load and tianji eval. Allowed: resume runs without learner groups, "
                             "written by this version")
        if self.replay and not meta.get("includes_replay", False):
            raise ValueError(f"the checkpoint in {str(run_dir)!r} was saved without the replay buffer "
                             f"(checkpoint_replay=False), which resuming {algo!r} needs; it serves load/eval only")

    def _template(self, meta: dict) -> Any:
        return state_template(self.config, meta.get("has_actor", True), meta.get("stacked_actors", 0))

    def _open(self, resume: bool, own_checkpoint: bool, tensorboard: bool, wandb: bool, derived: dict) -> None:
        """Create or reopen the run directory (the only process that writes it)."""
        from tianji_jax import checkpoint as ckpt
        from tianji_jax.checkpoint.fallback import restore_for_resume

        if self.run_dir is None:
            return
        run_dir = self.run_dir
        if resume:
            # the newest intact checkpoint; an older one than the newest continues in a new directory
            self.restored, run_dir = restore_for_resume(run_dir, self._template, self._check)
            if self.num_processes > 1:  # every other process's part of the cut, next to it
                self._carry_parts(self.run_dir, run_dir, self.restored.step)
            self.run_dir, meta = run_dir, self.restored.meta
            if own_checkpoint and isinstance(meta.get("checkpoint"), dict):  # the run's own settings
                self.ckpt_cfg = CheckpointConfig(**meta["checkpoint"])
            self.ckptr = ckpt.RunCheckpointer(run_dir, **self._ckpt_opts())
            self.rows = list(self.restored.rows)
            self.last_saved = self.restored.step
            self.wall_offset = float(self.rows[-1]["wall_time_s"]) if self.rows else 0.0
            _write_json(run_dir / f"provenance_resume_{self.restored.step}.json", provenance())
        else:
            check_new_run_dir(run_dir)  # rows or checkpoints; a run stopped before its first row may start again
            run_dir.mkdir(parents=True, exist_ok=True)
            resolved = {**self.config_dict, "derived": derived, "description": self.config.describe()}
            _write_json(run_dir / "config.json", resolved)
            _write_json(run_dir / "provenance.json", provenance())
            self.ckptr = ckpt.RunCheckpointer(run_dir, **self._ckpt_opts())
        loggers: list[Any] = [CSVLogger(run_dir / "metrics.csv", METRIC_COLUMNS, rows=self.rows)]
        try:
            if tensorboard:
                purge = self.restored.step + 1 if self.restored is not None else None
                loggers.append(TensorBoardLogger(run_dir / "tensorboard", purge_step=purge))
            if wandb:
                from tianji_jax.run.logging import WandbLogger

                loggers.append(WandbLogger(run_dir, self.config_dict, resume=resume))
        except BaseException:
            for lg in loggers:
                lg.close()
            raise
        self.sink = MetricsSink(loggers)

    def _carry_parts(self, old: Path, new: Path, step: int) -> None:
        """Process 0 of a multi-host resume: check that every other process's part of checkpoint
        ``step`` is there (in ``old``), and copy them into ``new`` when the resume continues in a
        new directory."""
        import shutil

        from tianji_jax.checkpoint.core import CheckpointError
        from tianji_jax.checkpoint.io import part_path

        missing = [str(part_path(old, step, i)) for i in range(1, self.num_processes)
                   if not part_path(old, step, i).is_file()]
        if missing:
            raise CheckpointError(f"cannot resume the multi-host run in {str(old)!r} at checkpoint {step}: the parts "
                                  f"of the other processes are missing ({', '.join(missing)})")
        if Path(new) != Path(old):
            shutil.copytree(part_path(old, step, 1).parent, part_path(new, step, 1).parent, dirs_exist_ok=True)

    def _follow(self) -> None:
        """Process i > 0 of a multi-host run: wait for process 0's run directory, checkpoint
        settings and resume step; on resume restore the learner state from process 0's
        checkpoint (the replicated learner) and this process's actors and counters from its part."""
        from tianji_jax import checkpoint as ckpt
        from tianji_jax.checkpoint.io import load_process_part
        from tianji_jax.runtime.layouts import distributed as dist

        info = json.loads(dist.kv_get(self._kv + "/announce", _WAIT_S, "process 0 to open the run directory"))
        if "error" in info:
            raise ValueError(f"process 0 could not open the run: {info['error']}")
        self.ckpt_cfg = CheckpointConfig(**info["checkpoint"])
        if not info["run_dir"]:
            return  # process 0 writes no run directory: no checkpoints
        self.parts_dir, step = Path(info["run_dir"]), info["step"]
        if step is None:
            return
        reader = ckpt.RunCheckpointer(self.parts_dir, read_only=True)
        try:
            meta = reader.read_meta(step)
            self._check(meta)
            restored = reader.restore(self._template(meta), step=step, meta=meta)
        finally:
            reader.close()
        own = self._part_of(restored.state)  # this process's actors (and replay shards), not process 0's
        own, part = load_process_part(self.parts_dir, step, self.process, own)
        state = restored.state.replace(**own) if own is not None else restored.state
        self.restored = ckpt.Restored(state=state,
                                      meta={**restored.meta, "async_counters": part["async_counters"]},
                                      rows=restored.rows, step=restored.step)
        self.rows = list(restored.rows)
        self.last_saved = restored.step
        self.wall_offset = float(self.rows[-1]["wall_time_s"]) if self.rows else 0.0

    def _part_of(self, state: Any) -> dict | None:
        """What process i > 0 keeps of a train state in its part of a multi-host checkpoint cut:
        ``{"actor": ...}`` (None for host actors, which keep no state), and for a replay algorithm
        whose checkpoints include the replay also ``{"replay": ...}`` (this process's replay shards)."""
        part = {"actor": state.actor} if state.actor is not None else {}
        if self.replay and self.ckpt_cfg.checkpoint_replay:
            part["replay"] = state.replay
        return part or None

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
        """The restored checkpoint is the run's last: it had ended, or stopped early at a
        ``stop_at_return`` that this config's also stops at (a resume may raise or clear it, and
        then the run goes on from that checkpoint)."""
        meta = self.restored.meta if self.restored is not None else {}
        if not meta.get("finished", False):
            return False
        if not meta.get("stopped_early", False) or self.restored.step >= self.config.env_steps:
            return True
        target = self.config.stop_at_return
        last = float(self.rows[-1].get("eval_return_mean", math.nan)) if self.rows else math.nan
        return target is not None and last >= target

    def log(self, row: dict[str, float]) -> None:
        """Keep ``row`` and write it to the sink."""
        self.rows.append(row)
        if self.sink is not None:
            with phase("log"):
                self.sink.write(row)

    def maybe_save(self, state: Any, env_steps: int, extra: dict, *, finished: bool) -> None:
        """Checkpoint ``state`` at ``env_steps`` if the interval says so or the run is ``finished``.

        Multi-host: process i > 0 writes its part of the cut (its actors, ``extra``'s counters)
        into process 0's directory (:func:`~tianji_jax.checkpoint.io.save_process_part`) and
        reports it in the job's key-value store; process 0 waits for every report before it
        writes the checkpoint, so a complete checkpoint always has every part."""
        if self.last_saved == env_steps or (self.ckptr is None and self.parts_dir is None):
            return
        every = self.ckpt_cfg.checkpoint_every_env_steps
        due = every is None or self.last_saved is None or env_steps // every > self.last_saved // every
        if not (due or finished):
            return
        if self.process > 0:
            from tianji_jax.checkpoint.io import save_process_part
            from tianji_jax.runtime.layouts import distributed as dist

            part = {k: extra[k] for k in ("async_counters", "stacked_actors", "has_actor") if k in extra}
            with phase("checkpoint"):
                save_process_part(self.parts_dir, env_steps, self.process, self._part_of(state), part)
            dist.kv_set(f"{self._kv}/part/{env_steps}/{self.process}", "written")
            self.last_saved = env_steps
            return
        if self.num_processes > 1:
            from tianji_jax.runtime.layouts import distributed as dist

            with phase("checkpoint"):
                for i in range(1, self.num_processes):
                    key = f"{self._kv}/part/{env_steps}/{i}"
                    dist.kv_get(key, _WAIT_S, f"process {i} to write its part of checkpoint {env_steps}")
                    dist.kv_delete(key)
        include_replay = self.replay and self.ckpt_cfg.checkpoint_replay
        meta = {"algo": self.algo, "config": self.config_dict, "packages": self.packages, "env_steps": int(env_steps),
                "rows": self.rows, "includes_replay": include_replay, "resumable": self.resumable,
                "finished": bool(finished), "runtime": getattr(self.config, "runtime", "anakin"),
                "checkpoint": self.ckpt_cfg.to_dict(), **extra}
        if self.num_processes > 1:
            meta["process_parts"] = self.num_processes - 1
        exclude = (".replay",) if self.replay and not include_replay else ()
        last = self.rows[-1] if self.rows else {}
        with phase("checkpoint"):
            self.ckptr.save(env_steps, state, meta, eval_return=float(last.get("eval_return_mean", math.nan)),
                            exclude_prefixes=exclude)
        self.last_saved = env_steps
        self._prune_parts()

    def _prune_parts(self) -> None:
        if self.num_processes > 1 and self.ckptr is not None:
            from tianji_jax.checkpoint.io import prune_process_parts

            prune_process_parts(self.ckptr.run_dir)

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
                self._prune_parts()
        finally:
            if self.sink is not None:
                self.sink.close()

    def result(self, state: Any, stopped: bool) -> TrainResult:
        """The :class:`~tianji_jax.run.results.TrainResult` of the run: ``state``, the rows kept so far as
        its ``curve``, ``stopped`` as ``stopped_early``."""
        curve = {c: np.asarray([r.get(c, math.nan) for r in self.rows], np.float64) for c in METRIC_COLUMNS}
        return TrainResult(config=self.config, state=state, curve=curve, run_dir=self.run_dir, stopped_early=stopped,
                           already_finished=self.finished)


def state_template(config: Any, has_actor: bool = True, stacked_actors: int = 0) -> Any:
    """An abstract (``jax.eval_shape``) train state of ``config``; ``stacked_actors > 0``: the
    ``actor`` field holds that many actor states stacked on a leading axis (async runs with
    several actors)."""
    from tianji_jax.algos.registry import algorithm_for

    key = jax.random.PRNGKey(config.seed)
    if algorithm_for(config).data_path == "replay":
        from tianji_jax.runtime.anakin import ReplayTrainState

        from tianji_jax.runtime.layouts.replay_sharded import init_sharded_replay

        trainer = make_train(one_device(config))  # the shapes; a data-parallel run's load on one device
        agent = trainer.agent
        shards, procs = config.num_learner_devices, getattr(config, "num_processes", 1)
        groups = config.num_learner_groups  # a checkpoint of a group run holds one group's replay
        # sharded by env (async): a multi-host checkpoint (and each process's part) holds one process's shards
        init_replay = ((lambda: init_sharded_replay(agent, shards, total_shards=shards * procs))
                       if shards > 1 or procs > 1
                       else (lambda: agent.init_replay(config.num_actors, capacity=config.buffer_capacity // groups)))
        if not has_actor or config.host_stepped:  # host actors keep no device actor state
            return ReplayTrainState(None, *jax.eval_shape(
                lambda k: (agent.init_learner(agent.split_init_key(k)[1]), init_replay()), key))
        state = jax.eval_shape(trainer.init, key)
        if shards > 1 or groups > 1 or procs > 1:
            state = state.replace(replay=jax.eval_shape(init_replay))
    else:
        trainer = make_train(one_device(config))  # the shapes; a data-parallel run's load on one device
        if not has_actor or config.host_stepped:
            agent = trainer.agent
            learner = jax.eval_shape(lambda k: agent.init_learner(agent.split_init_key(k)[1]), key)
            if config.host_stepped and (config.normalize_observations or config.scale_rewards):
                from tianji_jax.runtime.actors.host_normalize import SharedStatistics  # the run's statistics

                return PPOTrainState(jax.eval_shape(
                    lambda: SharedStatistics(config.env_spec.observation_space.shape).state()), learner)
            return PPOTrainState(None, learner)
        state = jax.eval_shape(trainer.init, key)
    if stacked_actors:
        state = state.replace(actor=jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((stacked_actors, *x.shape), x.dtype), state.actor))
    return state


def stack_actors(actors: list) -> Any:
    """The ``actor`` field of an async checkpoint: the state of a single actor, or several
    stacked on a leading ``(num_actors,)`` axis (None for host actors)."""
    if actors[0] is None:
        return None
    return actors[0] if len(actors) == 1 else jax.tree.map(lambda *xs: jax.numpy.stack(xs), *actors)


def unstack_actors(actor: Any, stacked: int) -> list:
    """Inverse of :func:`stack_actors` for ``num_actors`` actors (``stacked`` from the checkpoint's meta)."""
    if not stacked:
        return [actor]
    return [jax.tree.map(lambda x, i=i: x[i], actor) for i in range(stacked)]
