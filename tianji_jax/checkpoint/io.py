"""The run checkpointer: :class:`RunCheckpointer` writes and reads the orbax checkpoints of one run
directory (``RUN_DIR/checkpoints/<env_steps>/``); what a checkpoint holds, the format policy and
the compatibility checks are :mod:`tianji_jax.checkpoint.core`'s (which re-exports this module's names).
Multi-host runs add each other process's part of a checkpoint cut
(``RUN_DIR/process_parts/<env_steps>/process_<i>.npz``: :func:`save_process_part`).

The format constants (``FORMAT_VERSION``, ``MIGRATIONS``, ``ALLOWED_MISSING_LEAVES``) are read from
:mod:`tianji_jax.checkpoint.core` at call time, so a test or a migration that replaces them there is seen here.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tianji_jax.checkpoint import core as fmt
from tianji_jax.checkpoint.core import (_NO_EVAL, CheckpointError, CheckpointSaveError, CorruptCheckpointError,
                                        _array_key, _leaf_paths, _quiet, _rows_from_json, _rows_to_json,
                                        _stored_records, _unflatten, flatten_state, migrate_meta)
from tianji_jax.checkpoint.digests import DigestWriter, check_file_digests
from tianji_jax.checkpoint.verify import host_leaf_checksums, leaf_checksums, one_line, quiet_abandoned_reads, warn

__all__ = ["RunCheckpointer", "Restored", "part_path", "save_process_part", "load_process_part",
           "prune_process_parts"]


def _collect_quietly() -> None:
    """Collect garbage with warnings ignored: orbax's write coroutines abandoned by a failed save
    warn when collected ('coroutine ... was never awaited'), and at interpreter exit, where no
    filter applies any more, as 'sys:1: RuntimeWarning'; the failure is reported once, by
    :class:`~tianji_jax.checkpoint.core.CheckpointSaveError`. Registered with ``atexit`` after a failure."""
    import gc
    import sys

    for name in ("last_type", "last_value", "last_traceback", "last_exc"):  # the uncaught error's frames
        if hasattr(sys, name):  # hold those coroutines; nothing reads them after the traceback printed
            setattr(sys, name, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc.collect()


@dataclass
class Restored:
    """A restored checkpoint: ``state`` (the train state pytree, arrays on the default device),
    ``meta`` (the JSON metadata, see the module docstring), ``rows`` (``metrics.csv`` rows up to
    this checkpoint, NaN for empty cells) and ``step`` (env steps)."""

    state: Any
    meta: dict
    rows: list[dict]
    step: int


def single_process_options(ocp: Any) -> dict:
    """The keyword arguments of an orbax checkpointer (``ocp``: the ``orbax.checkpoint`` module)
    with which only the calling process writes: in multi-host runs (jax.distributed) process 0
    owns the run directory, so orbax must not wait for the others at its barriers; ``{}`` in a
    single-process run."""
    import jax

    if jax.process_count() == 1:
        return {}
    me = jax.process_index()
    return {"multiprocessing_options": ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})}


class RunCheckpointer:
    """The checkpoints of one run directory: ``RUN_DIR/checkpoints/<env_steps>/``.

    Args:
        run_dir: the run directory.
        keep_checkpoints: latest checkpoints kept (>= 1).
        keep_best_checkpoints: best-by-``eval_return_mean`` checkpoints also kept (>= 0).
        async_save: write in a background thread.
        read_only: open existing checkpoints only (no directory is created, nothing deleted).

    Raises:
        CheckpointError: ``read_only`` and ``run_dir/checkpoints`` does not exist or holds no
            complete checkpoint.
    """

    def __init__(self, run_dir: str | Path, *, keep_checkpoints: int = 2, keep_best_checkpoints: int = 1,
                 async_save: bool = True, read_only: bool = False):
        import orbax.checkpoint as ocp
        from orbax.checkpoint import checkpoint_managers as cm

        self.run_dir = Path(run_dir)
        self.directory = (self.run_dir / "checkpoints").resolve()
        if read_only:
            if not self.run_dir.is_dir():
                raise CheckpointError(f"{str(run_dir)!r} does not exist")
            if not self.directory.is_dir():
                raise CheckpointError(f"{str(run_dir)!r} holds no checkpoints (no checkpoints/ directory); "
                                      "is it a run directory written by tianji train?")
        policies = [cm.LatestN(n=keep_checkpoints)]
        if keep_best_checkpoints:
            policies.append(cm.BestN(get_metric_fn=lambda m: m["eval_return_mean"], n=keep_best_checkpoints,
                                     keep_checkpoints_without_metrics=False))
        multi = single_process_options(ocp)
        if multi and not read_only:  # orbax cannot create the root itself with active_processes set
            self.directory.mkdir(parents=True, exist_ok=True)
        with _quiet():
            # best_fn makes orbax write each checkpoint's metrics to disk and read them back when a
            # resumed run reopens the directory; without it the best-N policy saw no metrics for the
            # checkpoints of the interrupted process and deleted the best one at the next save
            best = dict(best_fn=lambda m: m["eval_return_mean"], best_mode="max") if keep_best_checkpoints else {}
            # a reader lists the steps without reading their metrics (lightweight_initialize): it
            # reads each checkpoint only after checking its file digests (a corrupt metrics file
            # made the listing raise json's error)
            options = ocp.CheckpointManagerOptions(
                preservation_policy=cm.AnyPreservationPolicy(policies), enable_async_checkpointing=async_save,
                **best,
                create=not read_only and not multi, read_only=read_only, cleanup_tmp_directories=not read_only,
                lightweight_initialize=read_only, **multi)
            self._ocp = ocp
            try:
                self._manager = ocp.CheckpointManager(self.directory, options=options)
            except Exception as err:  # noqa: BLE001 - orbax reads every step's metrics file here
                raise CheckpointError(f"cannot open the checkpoints in {self.directory}: {one_line(err)}") from None
        self._async = async_save
        self._started: list[int] = []  # steps whose save was started
        self._digests = DigestWriter(self.directory)  # each one's file digests, once it is complete
        self._failed = False  # a save failed
        self._absl_level: int | None = None  # absl's level before the first save (restored by a clean close)
        if read_only and not self.steps():
            raise CheckpointError(f"{str(run_dir)!r} holds no complete checkpoint in checkpoints/ "
                                  f"(found: {sorted(p.name for p in self.directory.iterdir())})")

    def steps(self) -> list[int]:
        """Env steps of the complete checkpoints, ascending (temporary, unfinished ones excluded)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's env steps, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: Any, meta: dict, *, eval_return: float = math.nan,
             exclude_prefixes: tuple[str, ...] = ()) -> None:
        """Start saving ``state`` as checkpoint ``step`` (env steps); returns once the arrays are
        on the host, the files are written in the background.

        Args:
            step: env steps taken (the step directory's name).
            state: the train state pytree (unbatched).
            meta: JSON-friendly metadata (``rows`` may hold NaN).
            eval_return: ranking value for the best-N retention (NaN: never counted among the best).
            exclude_prefixes: leaf paths left out (e.g. ``(".replay",)``).
        """
        arrays, leaves = flatten_state(state, exclude_prefixes=exclude_prefixes)
        sums = leaf_checksums(arrays)  # before orbax copies the arrays (the state may be donated next)
        for i, rec in enumerate(leaves):
            if f"leaf_{i:05d}" in sums:
                rec["checksum"] = sums[f"leaf_{i:05d}"]
        meta = {**meta, "format": fmt.FORMAT_VERSION, "tianji_jax_version": _package_version(), "step": int(step),
                "leaves": leaves, "rows": _rows_to_json(meta.get("rows", []))}
        ocp = self._ocp
        rank = _NO_EVAL if eval_return is None or not math.isfinite(eval_return) else float(eval_return)
        self._silence_background()
        with self._save_errors(step):  # also reports a failure of the previous, asynchronous save
            self._settle_digests()  # the previous save's, before this one's retention may delete it
            self._manager.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(arrays),
                                                                  meta=ocp.args.JsonSave(meta)),
                               metrics={"eval_return_mean": rank}, force=True)
            self._started.append(int(step))
            self._digests.started(int(step), complete=not self._async)

    def _settle_digests(self) -> None:
        """Wait for the pending saves, then write the file digests each complete one lacks
        (:class:`~tianji_jax.checkpoint.digests.DigestWriter`); raises what orbax or the writing
        raises (callers turn it into :class:`CheckpointSaveError`)."""
        if self._digests.pending:
            self._manager.wait_until_finished()
            self._digests.settle()

    def _silence_background(self) -> None:
        """orbax's writer threads log every failure with a traceback (absl ERROR), some long after
        the call that started them; a failed save is reported once, by :class:`CheckpointSaveError`."""
        logger = logging.getLogger("absl")
        if self._absl_level is None:
            self._absl_level = logger.level
        logger.setLevel(logging.CRITICAL)

    @contextlib.contextmanager
    def _save_errors(self, step: int | None):
        """Turn any exception of orbax's writing into one :class:`CheckpointSaveError` line."""
        try:
            with quiet_abandoned_reads():
                yield
        except Exception as err:  # noqa: BLE001 - orbax/tensorstore/OS raise many types
            if not self._failed:
                atexit.register(_collect_quietly)
            self._failed = True  # orbax's threads may still log it at exit: keep them silenced
            failed = [st for st in self._started if st not in set(self.steps())] or ([step] if step is not None else [])
            done = self.steps()
            last = str(self.directory / str(done[-1])) if done else "none"
            raise CheckpointSaveError(
                f"checkpoint at env step {failed[-1] if failed else '?'} could not be written: {one_line(err)}; "
                f"training stopped; last complete checkpoint: {last}") from None

    def _check_files(self, step: int, select: Any) -> None:
        """Check the files of checkpoint ``step`` that ``select`` picks against its file digests
        (:func:`~tianji_jax.checkpoint.digests.check_file_digests`; a checkpoint without them is
        not checked).

        Raises:
            CorruptCheckpointError: a file is missing, truncated or changed, or the digests are."""
        try:
            check_file_digests(self.directory / str(step), select)
        except ValueError as err:
            raise CorruptCheckpointError(self.directory, step, f"files: {err}") from None
        except OSError as err:
            raise CorruptCheckpointError(self.directory, step, f"files: {one_line(err)}") from None

    def read_meta(self, step: int | None = None) -> dict:
        """The metadata of checkpoint ``step`` (default: the latest), in the current format
        (:func:`migrate_meta`: an older format is migrated). Every file of the checkpoint but its
        array data (``state/``, checked by :meth:`restore`) is checked against its file digests
        first (:func:`~tianji_jax.checkpoint.digests.check_file_digests`).

        Raises:
            CheckpointError: no such step, or metadata that is not tianji_jax's.
            CorruptCheckpointError: its metadata cannot be read, or a file fails its digest.
            CheckpointFormatError: a format newer than :data:`~tianji_jax.checkpoint.core.FORMAT_VERSION`, or an older one
                without a migration (one line naming both versions).
        """
        step = self._pick(step)
        self._check_files(step, lambda rel: not rel.startswith("state/"))  # the array files: by restore
        try:
            with _quiet():
                out = self._manager.restore(step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore()))
            meta = out.meta
        except Exception as err:  # noqa: BLE001 - orbax raises many types; report one clear error
            raise CorruptCheckpointError(self.directory, step, f"metadata: {one_line(err)}") from None
        if not isinstance(meta, dict):  # the metadata file is missing or emptied
            raise CorruptCheckpointError(self.directory, step,
                                         f"metadata: none could be read (got {type(meta).__name__})")
        fmt = meta.get("format")
        if not isinstance(fmt, int) or isinstance(fmt, bool) or not isinstance(meta.get("leaves"), list):
            raise CheckpointError(f"checkpoint {self.directory / str(step)} has no tianji metadata (a format "
                                  "version and leaf records); not written by tianji_jax")
        return migrate_meta(meta, f"checkpoint {self.directory / str(step)}")

    def restore(self, template: Any, step: int | None = None, meta: dict | None = None) -> Restored:
        """Restore checkpoint ``step`` (default: the latest) into ``template``'s structure.

        Args:
            template: a train state (or its ``jax.eval_shape``) of the same config; leaves that the
                checkpoint did not save (e.g. the replay buffer) are taken from it (zeros for an
                abstract leaf), and so are leaves it lacks that :data:`~tianji_jax.checkpoint.core.ALLOWED_MISSING_LEAVES`
                fills (each reported in one line on stderr, listed in ``meta["filled_leaves"]``).
            step: env steps of the checkpoint.
            meta: its metadata if already read (by :meth:`read_meta`).

        Each leaf is checked against its checksum after the restore, then every file of the
        checkpoint against its file digests. Each leaf comes back with the dtype and the weak
        type of ``template``'s (a weakly typed leaf of a fresh state, such as an env's step
        counter made from a Python int, is weakly typed again), so the restored state hits the
        jit caches that a fresh one filled.

        Raises:
            CheckpointError: missing step, an unreadable format, or leaves that do not match
                ``template``.
            CorruptCheckpointError: (a CheckpointError) a file fails its digest, orbax cannot read
                the data, or a leaf fails its checksum.
        """
        step = self._pick(step)
        meta = meta if meta is not None else self.read_meta(step)
        stored = _stored_records(meta)
        # read into host arrays (a numpy target of the right shape and dtype, a broadcast scalar that
        # takes no memory), checked there, then placed as a fresh state's arrays are (_placed)
        abstract = {key: np.broadcast_to(np.zeros((), np.dtype(rec["dtype"])), tuple(rec["shape"]))
                    for key, rec in stored.items()}
        try:
            with _quiet(), quiet_abandoned_reads():
                out = self._manager.restore(step, args=self._ocp.args.Composite(
                    state=self._ocp.args.StandardRestore(abstract)))
            arrays = dict(out.state)
        except Exception as err:  # noqa: BLE001
            reason = f"array data: {one_line(err)}"
            keys = [k for k in dict.fromkeys(re.findall(r"leaf_\d{5}", reason)) if k in stored]
            if keys:  # name the leaves of the state
                reason += " (" + ", ".join(f"{k} is {stored[k]['path']}" for k in keys) + ")"
            raise CorruptCheckpointError(self.directory, step, reason) from None
        self._verify(step, arrays, stored)
        # then every byte of every file, also those the restore did not read or could not check
        # (after orbax and the checksums, whose errors name the leaf; the metadata's files again,
        # as ``meta`` may come from elsewhere than read_meta)
        self._check_files(step, None)
        weak = {p for p, x in _leaf_paths(template) if _is_weak(x)}
        paths = {_array_key(i, rec): rec["path"] for i, rec in enumerate(meta["leaves"]) if rec.get("saved")}
        arrays = {key: _placed(x, paths.get(key) in weak) for key, x in arrays.items()}
        written = meta.get("migrated_from", meta.get("format"))
        state, filled = _unflatten(template, arrays, meta["leaves"], None, written)
        for path, why in filled.items():
            warn(f"checkpoint {self.directory / str(step)}: leaf {path} is not in it; filled as "
                 f"ALLOWED_MISSING_LEAVES says ({why})")
        if filled:
            meta = {**meta, "filled_leaves": sorted(filled)}
        state = jax.tree.map(lambda x, t: x if isinstance(x, jax.Array) else _placed(_host_value(x), _is_weak(t)),
                             state, template)
        return Restored(state=state, meta=meta, rows=_rows_from_json(meta.get("rows", [])), step=int(step))

    def _verify(self, step: int, arrays: dict[str, Any], stored: dict[str, dict]) -> None:
        """Compare the restored host arrays' checksums with the recorded ones (``stored``: records by
        array key; records without one, from checkpoints written before checksums, are not checked)."""
        keyed = {key: rec for key, rec in stored.items() if "checksum" in rec}
        sums = host_leaf_checksums({k: arrays[k] for k in keyed if k in arrays})
        for key, rec in keyed.items():
            if key in sums and sums[key] != rec["checksum"]:
                raise CorruptCheckpointError(self.directory, step,
                                             f"leaf {rec['path']} ({key}) fails its checksum (recorded "
                                             f"{rec['checksum']:08x}, read {sums[key]:08x}): its data is corrupt")

    def _pick(self, step: int | None) -> int:
        steps = self.steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"no complete checkpoint in {self.directory}")
            return steps[-1]
        if step not in steps:
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; available: {steps}")
        return int(step)

    def wait(self) -> None:
        """Block until every started save is written, with its file digests.

        Raises:
            CheckpointSaveError: a save failed.
        """
        with self._save_errors(None):
            self._manager.wait_until_finished()
            self._settle_digests()

    def close(self) -> None:
        """Finish pending saves (and their file digests) and release the manager.

        Raises:
            CheckpointSaveError: a pending save failed (the manager is released all the same).
        """
        try:
            with _quiet(), self._save_errors(None):
                self._manager.wait_until_finished()
                self._settle_digests()
        finally:
            self._digests.stop()  # a failed save never completes: its watcher stops waiting
            with _quiet(), contextlib.suppress(Exception):
                self._manager.close()
        if self._absl_level is not None and not self._failed:  # clean close: orbax's threads are done, its logs may show again
            logging.getLogger("absl").setLevel(self._absl_level)


def _is_weak(x: Any) -> bool:
    """``x`` (an array or a ``jax.ShapeDtypeStruct``) is weakly typed."""
    return bool(getattr(x, "weak_type", False))


def _weakly_typed(x: jax.Array) -> jax.Array:
    """``x`` (an array this process just made: restored, or zeros) marked weakly typed, its data
    untouched and nothing compiled. A fresh train state holds weakly typed leaves where it was
    built from Python scalars (an env's ``time = 0``); orbax and ``device_put`` give strongly
    typed arrays, and jit's cache keys tell the two apart, so a restored state compiled the train
    chunk, the evaluator and the checksums again. No public function changes an array's weak type
    without compiling a conversion; this sets the abstract value exactly as JAX's own unpickling
    of arrays does (``jax._src.array._reconstruct_array``). Should a JAX version refuse it, ``x``
    stays strongly typed: only a recompilation, the values are the same."""
    if not x.weak_type:
        with contextlib.suppress(AttributeError, TypeError):
            x.aval = x.aval.update(weak_type=True)
    return x


def _host_value(x: Any) -> np.ndarray:
    """A leaf that is not a device array as a host array: an abstract one (not saved) as zeros."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return np.zeros(x.shape, x.dtype)
    return np.asarray(x)


def _placed(x: np.ndarray, weak: bool) -> jax.Array:
    """Host array ``x`` on this process's default device, uncommitted, weakly typed if ``weak``:
    the placement and abstract value a fresh train state's leaf has (it comes out of a jitted
    ``init`` called without a device), so the restored state hits the same jit caches (jit keys
    committed arrays by their device, weakly typed ones apart from strong ones)."""
    out = jax.device_put(np.asarray(x))
    return _weakly_typed(out) if weak else out


def part_path(run_dir: str | Path, step: int, process: int) -> Path:
    """Where process ``process`` (> 0) of a multi-host run keeps its part of checkpoint ``step``:
    ``RUN_DIR/process_parts/<step>/process_<process>.npz``."""
    return Path(run_dir) / "process_parts" / str(int(step)) / f"process_{int(process)}.npz"


def _digest(arrays: list[np.ndarray], info: str) -> str:
    import hashlib

    h = hashlib.sha256(info.encode())
    for a in arrays:
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def save_process_part(run_dir: str | Path, step: int, process: int, actor: Any, info: dict) -> Path:
    """Write process ``process``'s part of multi-host checkpoint ``step`` (:func:`part_path`): its
    actors' state ``actor`` (a pytree of arrays, or None for host actors) and ``info`` (JSON: the
    cut's counters of its own queue, its actor layout), with a sha256 over both, written to a
    temporary file, flushed to disk and renamed: the file exists only complete."""
    import json
    import os

    path = part_path(run_dir, step, process)
    path.parent.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(actor))] if actor is not None else []
    text = json.dumps(info, sort_keys=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, info=np.asarray(text), digest=np.asarray(_digest(leaves, text)),
                 **{f"leaf_{i:05d}": a for i, a in enumerate(leaves)})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_process_part(run_dir: str | Path, step: int, process: int, template: Any) -> tuple[Any, dict]:
    """``(actor, info)`` of :func:`save_process_part`, the actor state in ``template``'s structure
    (None: host actors, no state) on this process's default device, uncommitted, each leaf
    weakly typed where ``template``'s is (as a fresh state's leaves are).

    Raises:
        CheckpointError: the part is missing (that process never finished writing it).
        CorruptCheckpointError: it cannot be read, fails its sha256, or does not match ``template``.
    """
    import json

    path = part_path(run_dir, step, process)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: process {process}'s part of checkpoint {step} of this "
                              "multi-host run (the run directory must be on a filesystem every process sees)")
    directory = Path(run_dir) / "process_parts"
    try:
        with np.load(path) as z:
            text, digest = str(z["info"]), str(z["digest"])
            leaves = [z[k] for k in sorted(k for k in z.files if k.startswith("leaf_"))]
    except Exception as err:  # noqa: BLE001 - numpy/zipfile raise many types
        raise CorruptCheckpointError(directory, step, f"{path.name}: {one_line(err)}") from None
    if _digest(leaves, text) != digest:
        raise CorruptCheckpointError(directory, step, f"{path.name} fails its sha256: its data is corrupt")
    if template is None:
        return None, json.loads(text)
    flat, treedef = jax.tree.flatten(template)
    if [(tuple(x.shape), np.dtype(x.dtype)) for x in flat] != [(a.shape, a.dtype) for a in leaves]:
        raise CorruptCheckpointError(directory, step, f"{path.name} does not hold this config's actor states")
    return jax.tree.unflatten(treedef, [_placed(a, _is_weak(t)) for a, t in zip(leaves, flat)]), json.loads(text)


def prune_process_parts(run_dir: str | Path) -> None:
    """Delete the parts of steps older than the newest complete checkpoint in ``RUN_DIR/checkpoints``
    (a directory named by its step; orbax renames a checkpoint there once it is complete) and not
    among them: those of checkpoints the retention policy removed. Newer ones (a save in
    progress) stay."""
    import shutil

    root, ckpts = Path(run_dir) / "process_parts", Path(run_dir) / "checkpoints"
    keep = [int(d.name) for d in ckpts.iterdir() if d.name.isdigit() and d.is_dir()] if ckpts.is_dir() else []
    if not keep or not root.is_dir():
        return
    for d in root.iterdir():
        if d.name.isdigit() and int(d.name) < max(keep) and int(d.name) not in keep:
            shutil.rmtree(d, ignore_errors=True)


def _package_version() -> str:
    """The installed tianji_jax's version (the distribution's metadata; ``"unknown"`` when the
    package runs from a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tianji_jax")
    except PackageNotFoundError:
        return "unknown"
