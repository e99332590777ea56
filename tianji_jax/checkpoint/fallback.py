"""Resuming from the newest intact checkpoint of a run.

Resume (:func:`restore_for_resume`): the newest checkpoint that restores and verifies is used;
each newer one is reported as ``checkpoint <step> skipped: <reason>``. Resuming from an older
step than the newest continues in a new run directory, ``<run_dir>-from-<step>`` (``-2``, ``-3``,
... when taken), which receives the run's config and provenance files, its TensorBoard events
and the restored checkpoint, so it is a complete run directory of its own; the original
directory is only read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from tianji_jax.checkpoint.core import CheckpointError, CorruptCheckpointError
from tianji_jax.checkpoint.io import RunCheckpointer
from tianji_jax.checkpoint.verify import warn

__all__ = ["restore_newest_intact", "restore_for_resume", "continuation_dir", "continued_in"]


def restore_newest_intact(ckptr: Any, template_for: Callable[[dict], Any], *,
                          check: Callable[[dict], None] | None = None, step: int | None = None,
                          report: Callable[[str], None] = warn) -> tuple[Any, dict[int, str]]:
    """Restore the newest checkpoint of ``ckptr`` that is intact (readable, verified checksums).

    Args:
        ckptr: a :class:`~tianji_jax.checkpoint.io.RunCheckpointer`.
        template_for: the train-state template for a checkpoint's metadata.
        check: called with the metadata before the restore; what it raises propagates (a
            checkpoint the caller cannot use is not a corrupt one).
        step: restore exactly this step (no fallback).
        report: receives ``checkpoint <step> skipped: <reason>`` for each corrupt checkpoint skipped.

    Returns:
        ``(restored, skipped)``: the :class:`~tianji_jax.checkpoint.io.Restored` and ``{step: reason}``
        of the newer checkpoints skipped.

    Raises:
        tianji_jax.checkpoint.core.CheckpointError: ``step`` is missing or corrupt, or no checkpoint is
            intact (one line naming each step and its reason).
    """
    steps = [step] if step is not None else sorted(ckptr.steps(), reverse=True)
    skipped: dict[int, str] = {}
    for s in steps:
        try:
            meta = ckptr.read_meta(s)
            if check is not None:
                check(meta)
            return ckptr.restore(template_for(meta), step=s, meta=meta), skipped
        except CorruptCheckpointError as err:
            if step is not None:
                raise
            skipped[s] = err.reason
            report(f"checkpoint {s} skipped: {err.reason}")
    raise CheckpointError(f"no intact checkpoint in {ckptr.directory}: "
                          + "; ".join(f"{s}: {why}" for s, why in skipped.items()))


def continuation_dir(run_dir: str | Path, step: int) -> Path:
    """The first free ``<run_dir>-from-<step>`` (then ``-2``, ``-3``, ...) next to ``run_dir``."""
    run_dir = Path(run_dir)
    base = run_dir.with_name(f"{run_dir.name}-from-{step}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def continued_in(run_dir: str | Path, since: float) -> Path | None:
    """The continuation directory of ``run_dir`` created at or after ``since`` (``time.time()``),
    the newest if several, or None: where a resume that fell back went (``tianji train`` names it
    after a Ctrl-C)."""
    run_dir = Path(run_dir)
    found = []
    for p in run_dir.parent.glob(f"{run_dir.name}-from-*"):
        try:
            origin = json.loads((p / "resumed_from.json").read_text())
            if Path(origin["run_dir"]) == run_dir.resolve() and p.stat().st_mtime >= since - 1:
                found.append((p.stat().st_mtime, p))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(found)[1] if found else None


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link a content-addressed orbax data file (``.../d/<hash>``: written once, never
    modified), copy anything else."""
    if Path(src).parent.name == "d":
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def _fork_run_dir(run_dir: Path, step: int, skipped: dict[int, str]) -> Path:
    """A new run directory continuing ``run_dir`` from checkpoint ``step`` (see the module docstring)."""
    new = continuation_dir(run_dir, step)
    new.mkdir(parents=True)
    for f in sorted(run_dir.iterdir()):
        if f.is_file() and f.suffix == ".json" and (f.name == "config.json" or f.name.startswith("provenance")):
            shutil.copy2(f, new / f.name)
    if (run_dir / "tensorboard").is_dir():  # the curve up to the checkpoint; later events are purged
        shutil.copytree(run_dir / "tensorboard", new / "tensorboard")
    shutil.copytree(run_dir / "checkpoints" / str(step), new / "checkpoints" / str(step), copy_function=_link_or_copy)
    origin = {"run_dir": str(run_dir.resolve()), "step": int(step), "skipped": {str(k): v for k, v in skipped.items()}}
    (new / "resumed_from.json").write_text(json.dumps(origin, indent=2) + "\n")
    return new


def restore_for_resume(run_dir: str | Path, template_for: Callable[[dict], Any],
                       check: Callable[[dict], None] | None = None) -> tuple[Any, Path]:
    """Restore the newest intact checkpoint of ``run_dir`` to resume the run.

    Corrupt newer checkpoints are skipped with a one-line report each on stderr. When the one
    restored is not the newest, the run continues in a new directory (:func:`continuation_dir`,
    filled as the module docstring says), announced in one line; ``run_dir`` is not modified.

    Returns:
        ``(restored, directory the run continues in)``.

    Raises:
        tianji_jax.checkpoint.core.CheckpointError: ``run_dir`` holds no intact checkpoint.
        Whatever ``check`` raises for the metadata of a checkpoint.
    """
    run_dir = Path(run_dir)
    reader = RunCheckpointer(run_dir, read_only=True)
    try:
        newest = reader.latest_step()
        restored, skipped = restore_newest_intact(reader, template_for, check=check)
    finally:
        reader.close()
    if restored.step == newest:
        return restored, run_dir
    new = _fork_run_dir(run_dir, restored.step, skipped)
    warn(f"resuming from checkpoint {restored.step}, the newest intact one (newer: {sorted(skipped)} skipped); "
         f"the run continues in {new} ({run_dir} is left as it is)")
    return restored, new
