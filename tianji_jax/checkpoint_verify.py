"""Integrity of checkpoints: per-leaf checksums, one-line reasons for unreadable ones, and resuming
from the newest intact checkpoint of a run.

* Checksums (:func:`leaf_checksums`): each saved leaf is viewed as unsigned 32-bit words (floats
  bitcast, 1- and 2-byte types widened, 8-byte types split in two words, bools as 0/1), each
  word ``w_i`` passed through a bijective bit mixer ``m``, and reduced on its own device to
  ``sum_i (2 i + 1) * m(w_i) mod 2**32``. The weights are odd and ``m`` is a bijection, so any
  change of one word (a flipped bit, a zeroed or garbled value) changes the sum; the reduction is
  exact integer arithmetic, hence the same on every backend and in every reduction order. It
  costs one fused pass over the state, cheap next to writing it, even for a replay buffer of
  several GB. :class:`~tianji_jax.checkpoint.RunCheckpointer` stores them in each leaf's record
  of ``meta["leaves"]`` at save time and verifies them after a restore (checkpoints written before
  checksums existed are restored unverified).
* Unreadable checkpoints: orbax's restore gathers its array reads in an event loop that it closes
  as soon as one read fails; the reads still in flight then complete into the closed loop, and
  tensorstore reports each as an unraisable ``RuntimeError: Event loop is closed`` (and each
  abandoned read coroutine as an ignored exception when collected). :func:`quiet_abandoned_reads`
  drops exactly these reports; :func:`one_line` reduces orbax's error (which embeds the whole
  TensorStore spec) to the first line of its root cause.
* Resume (:func:`restore_for_resume`): the newest checkpoint that restores and verifies is used;
  each newer one is reported as ``checkpoint <step> skipped: <reason>``. Resuming from an older
  step than the newest continues in a new run directory, ``<run_dir>-from-<step>`` (``-2``, ``-3``,
  ... when taken), which receives the run's config and provenance files, its TensorBoard events
  and the restored checkpoint, so it is a complete run directory of its own; the original
  directory is only read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["leaf_checksums", "one_line", "quiet_abandoned_reads", "restore_newest_intact", "restore_for_resume",
           "continuation_dir", "continued_in", "warn"]


def _checksum_supported(dtype: Any) -> bool:
    dt = np.dtype(dtype)
    return dt == np.bool_ or jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(dt, jnp.floating)


def _words(x: jax.Array) -> jax.Array:
    """``x`` as a flat vector of uint32 words."""
    size = np.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_:
        u = x.astype(jnp.uint32)
    elif size >= 4:  # 8-byte types become (..., 2) words
        u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    else:
        u = jax.lax.bitcast_convert_type(x, jnp.uint16 if size == 2 else jnp.uint8).astype(jnp.uint32)
    return u.reshape(-1)


def _mix(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 that spreads every bit over the word
    (so words with many zero low bits, like 1.0 or 0.5, do not make changes cancel mod 2**32)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _weighted_sum(x: jax.Array) -> jax.Array:
    u = _mix(_words(x))
    weights = jax.lax.iota(jnp.uint32, u.shape[0]) * jnp.uint32(2) + jnp.uint32(1)
    return jnp.sum(weights * u, dtype=jnp.uint32)


_sums = jax.jit(lambda xs: [_weighted_sum(x) for x in xs])


def leaf_checksums(arrays: dict[str, Any]) -> dict[str, int]:
    """The checksum (an int in ``[0, 2**32)``, see the module docstring) of each array of ``arrays``.

    Computed with one jitted call per device set (a learner's and an actor's leaves may live on
    different devices), on those devices. Leaves of other dtypes (complex, ...), empty ones and
    arrays this process cannot address in full are left out of the result.
    """
    groups: dict[Any, list[str]] = {}
    for key, x in arrays.items():
        if not _checksum_supported(x.dtype) or np.size(x) == 0:
            continue
        if isinstance(x, jax.Array):
            if not x.is_fully_addressable:
                continue
            devices = frozenset(x.sharding.device_set)
        else:
            devices = None
        groups.setdefault(devices, []).append(key)
    started = [(keys, _sums([arrays[k] for k in keys])) for keys in groups.values()]
    out = {}
    for keys, sums in started:
        out.update({k: int(v) for k, v in zip(keys, jax.device_get(sums))})
    return out


_SPEC_DUMP = re.compile(r"\s*See full TensorStore details:.*", re.S)
_SOURCE_LOCATIONS = re.compile(r"\s*\[source locations=.*?\]")


def one_line(err: BaseException, limit: int = 400) -> str:
    """``err`` as one line: the first line of the root of its cause chain, as ``Type: message``,
    without TensorStore spec dumps or source locations, cut to ``limit`` characters."""
    root, seen = err, 0
    while seen < 20:
        nxt = root.__cause__ or (None if root.__suppress_context__ else root.__context__)
        if nxt is None:
            break
        root, seen = nxt, seen + 1
    text = _SOURCE_LOCATIONS.sub("", _SPEC_DUMP.sub("", str(root))).strip()
    text = " ".join(text.splitlines()[0].split()) if text else ""
    text = f"{type(root).__name__}: {text}" if text else type(root).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _abandoned_read_noise(unraisable: Any) -> bool:
    """An unraisable report of a read abandoned by a failed orbax restore (see the module docstring)."""
    exc, obj = unraisable.exc_value, unraisable.object
    if obj is None and isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return True
    code = getattr(obj, "cr_code", None)  # a coroutine of orbax's restore, closed when collected
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


@contextlib.contextmanager
def quiet_abandoned_reads() -> Iterator[None]:
    """Around an orbax restore: drop the unraisable reports of the reads it abandons when it fails
    (all other reports go to the previous ``sys.unraisablehook``). Those reads complete later, in
    tensorstore's threads, so after a failure the filter stays installed; after a success it is removed."""
    previous = sys.unraisablehook
    if getattr(previous, "_tianji_quiet", False):  # already filtering (an earlier failure)
        yield
        return

    def hook(unraisable: Any) -> None:
        if not _abandoned_read_noise(unraisable):
            previous(unraisable)

    hook._tianji_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok and sys.unraisablehook is hook:
            sys.unraisablehook = previous


def warn(message: str) -> None:
    """Print one line to stderr (a skipped checkpoint, a continuation directory)."""
    print(message, file=sys.stderr, flush=True)


def restore_newest_intact(ckptr: Any, template_for: Callable[[dict], Any], *,
                          check: Callable[[dict], None] | None = None, step: int | None = None,
                          report: Callable[[str], None] = warn) -> tuple[Any, dict[int, str]]:
    """Restore the newest checkpoint of ``ckptr`` that is intact (readable, verified checksums).

    Args:
        ckptr: a :class:`~tianji_jax.checkpoint.RunCheckpointer`.
        template_for: the train-state template for a checkpoint's metadata.
        check: called with the metadata before the restore; what it raises propagates (a
            checkpoint the caller cannot use is not a corrupt one).
        step: restore exactly this step (no fallback).
        report: receives ``checkpoint <step> skipped: <reason>`` for each corrupt checkpoint skipped.

    Returns:
        ``(restored, skipped)``: the :class:`~tianji_jax.checkpoint.Restored` and ``{step: reason}``
        of the newer checkpoints skipped.

    Raises:
        tianji_jax.checkpoint.CheckpointError: ``step`` is missing or corrupt, or no checkpoint is
            intact (one line naming each step and its reason).
    """
    from tianji_jax.checkpoint import CheckpointError, CorruptCheckpointError

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
        tianji_jax.checkpoint.CheckpointError: ``run_dir`` holds no intact checkpoint.
        Whatever ``check`` raises for the metadata of a checkpoint.
    """
    from tianji_jax.checkpoint import RunCheckpointer

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
