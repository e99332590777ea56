"""Checkpoints of whole train states in ``RUN_DIR/checkpoints/`` (orbax ``CheckpointManager``).

A checkpoint is one orbax step directory named by the env steps taken, holding two items:

* ``state``: every leaf of the train state pytree (params, target params, optimizer state, PRNG
  keys of actor and learner, env states and current observations, observation / reward
  statistics, counters, policy version, the n-step window, and for DQN optionally the replay
  buffer with its counters), saved as a flat dict ``{"leaf_00000": array, ...}`` in the leaf order
  of ``jax.tree_util``; the leaves' paths, shapes and dtypes are recorded in ``meta`` and checked
  on restore, so a checkpoint never silently lands in a different structure. A leaf of size zero
  (DQN's n-step window with ``n_step=1``, say) is not written (orbax refuses empty arrays): its
  record says ``"empty": true`` and the restore rebuilds it from its shape and dtype. Each written
  leaf's record holds its ``checksum`` (:mod:`tianji_jax.checkpoint.verify`), verified on restore,
  so corrupt array data raises instead of restoring silently wrong values; and every file of the
  step directory is covered by its file digests (``tianji_file_digests.json``,
  :mod:`tianji_jax.checkpoint.digests`), checked on every read, so a changed
  byte anywhere -- the metadata included -- makes the checkpoint corrupt;
* ``meta`` (JSON): format version (``format``), the ``tianji_jax_version`` that wrote it (format
  1 checkpoints written before it existed have only ``packages["tianji-jax"]``), algorithm, the
  config (``to_dict()``), package versions, env steps, updates done, the ``leaves`` records, the
  ``metrics.csv`` rows written so far (a resumed run rewrites ``metrics.csv`` from them and
  appends), whether the replay buffer is included
  (``includes_replay``), whether the run can be resumed from it (``resumable``) and whether the
  run had finished (``finished``); async runs add ``async_counters`` (buffer and rate-limiter
  counters of the cut, ``in_flight`` env steps it leaves out, DQN's epsilon), ``has_actor``
  (False for host-env actors, whose env state is not saved; their ``state.actor`` is None, or,
  for an on-policy run that normalises, the run's observation/return statistics as a
  :class:`~tianji_jax.runtime.actors.host_normalize.HostNormStats`) and ``stacked_actors`` (the number of
  actor states stacked on a leading axis of ``state.actor`` when there are several, else 0).

Saving is asynchronous: :meth:`RunCheckpointer.save` returns once the arrays are copied to the
host (so a donated train state can be reused at once) and orbax writes in a background thread.
orbax writes a step into ``<step>.orbax-checkpoint-tmp-<time>`` and renames it when complete, so a
process killed while saving leaves only a temporary directory, which is never listed as a step:
a resume continues from the last complete checkpoint. Retention keeps the latest
``keep_checkpoints`` plus the best ``keep_best_checkpoints`` by ``eval_return_mean``
(orbax ``AnyPreservationPolicy(LatestN, BestN)``), so the best ones never push out the latest.

Format policy (``docs/checkpoint_format.md``): a checkpoint of a format newer than
:data:`FORMAT_VERSION` is refused in one line naming both versions; an older one is brought to the
current format by the functions of :data:`MIGRATIONS`, one version at a time, or refused in one
line naming both versions when a step has none. A saved config without a field that was added
later compares equal to that field's default (:func:`check_compatible`); a train-state leaf that
the checkpoint lacks is filled as a rule of :data:`ALLOWED_MISSING_LEAVES` says, or refused.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from tianji_jax.checkpoint.verify import one_line

__all__ = ["CheckpointError", "CorruptCheckpointError", "CheckpointFormatError", "ConfigMismatchError",
           "flatten_state", "unflatten_state", "check_compatible", "migrate_meta",
           "MissingLeaf", "fill_from_template", "FORMAT_VERSION", "MIGRATIONS", "ALLOWED_MISSING_LEAVES",
           "VERSION_CHECKED_PACKAGES", "RESUME_FREE_FIELDS"]

FORMAT_VERSION = 1
"""Version of the checkpoint layout written into ``meta["format"]``: the meta keys a reader needs,
the leaf records and the train states' leaf paths, shapes and dtypes. Every change of these bumps
it, adds the :data:`MIGRATIONS` entry from the previous version (and, for a new leaf, a rule of
:data:`ALLOWED_MISSING_LEAVES`) and a line below; see ``docs/checkpoint_format.md``.

* 1: the layout of the module docstring (tianji_jax 0.1.0; ``tests/fixtures/runs_v1``).
"""

MIGRATIONS: dict[int, Callable[[dict], dict]] = {}
"""Migrations of checkpoint metadata, ``{from_version: function}``: ``MIGRATIONS[v](meta)`` takes
the metadata of a checkpoint of format ``v`` and returns it as format ``v + 1`` would have written
it, with ``meta["format"] == v + 1`` (:func:`migrate_meta` applies them in order, on a copy, up to
:data:`FORMAT_VERSION`). Each function has a docstring saying what changed in that version.

A migration works on the metadata only: it may rename, drop, reorder or add leaf records (every
saved record keeps the ``"key"`` of its array, set before the first migration runs), add records
``{"path", "shape", "dtype", "saved": False}`` for leaves the old version did not have (restored
from the template, i.e. zeros for an abstract one), and add, rename or drop meta keys and config
fields. Format 1 is the first versioned format: there is nothing to migrate yet.
"""


def fill_from_template(leaf: Any) -> Any:
    """The fill of a missing leaf by default: the template's value (an abstract template, as resume
    and :func:`tianji_jax.load` pass, gives zeros of the leaf's shape and dtype)."""
    return leaf


@dataclass(frozen=True)
class MissingLeaf:
    """A train-state leaf that checkpoints written before it existed lack, and how to fill it.

    Attributes:
        pattern: regular expression matched in full against the leaf's path
            (``jax.tree_util.keystr``, e.g. ``r"[.]learner[.]nonfinite_count"``).
        since_format: the :data:`FORMAT_VERSION` that added the leaf: only checkpoints written in
            an older format may lack it (a checkpoint of this format or newer without it is refused).
        reason: why it may be missing and why the fill is right (shown when a restore fills it).
        fill: ``template leaf -> array``: the value restored (default :func:`fill_from_template`).
    """

    pattern: str
    since_format: int
    reason: str
    fill: Callable[[Any], Any] = fill_from_template

    def matches(self, path: str, written_format: int | None = None) -> bool:
        """``path`` is a leaf this rule fills in a checkpoint written in ``written_format`` (None:
        any format)."""
        return ((written_format is None or written_format < self.since_format)
                and re.fullmatch(self.pattern, path) is not None)


ALLOWED_MISSING_LEAVES: tuple[MissingLeaf, ...] = ()
"""The train-state leaves a checkpoint may lack, each with the format that added it, its fill and
the reason (:class:`MissingLeaf`): a change that adds a leaf to a train state bumps
:data:`FORMAT_VERSION` and adds a rule here with ``since_format`` the new version (or its
migration adds the leaf's record). A lacking leaf matched by no rule is refused, as is a
checkpoint leaf the train state does not have (unless a migration drops its record). None so far."""

VERSION_CHECKED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "gymnax")
"""Packages whose version must match between a run and its resume (they decide the bits computed)."""

RESUME_FREE_FIELDS = frozenset({"stop_at_return", "stall_timeout_s", "process_id", "coordinator",
                                "heartbeat_timeout_s", "record_schedule"})
"""Config fields that may differ between a run and its resume (they do not change what is computed;
a multi-host job may be relaunched on other hosts, with other process ids; a recording run is
resumed without recording).
A field absent from the checkpoint's config (added after it was written) is not one of these: it
compares equal to its default (:func:`check_compatible`)."""

_NO_EVAL = -3.0e38  # ranking value of a checkpoint without an evaluation (BestN needs a number)


class CheckpointError(ValueError):
    """A directory that is not a run with checkpoints, or a checkpoint that cannot be read."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose files cannot be read or whose data fails its checksums (truncated,
    garbled, bit-flipped). ``step`` is its env steps, ``reason`` one line saying what failed; a
    resume falls back to an older checkpoint on this error."""

    def __init__(self, directory: Path, step: int, reason: str):
        super().__init__(f"checkpoint {directory / str(step)} is corrupt or unreadable: {reason}")
        self.step, self.reason = int(step), reason


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written (a full disk, a lost mount, ...): the run stops; the
    message names the step that failed, the cause in one line and the last complete checkpoint."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint of a format this version cannot read: newer than :data:`FORMAT_VERSION`, or
    older with no migration (:data:`MIGRATIONS`) to it; the message is one line naming both
    versions and the tianji_jax version that wrote the checkpoint."""


class ConfigMismatchError(ValueError):
    """Resuming with a config (or packages) incompatible with the checkpoint's; the message names
    every differing field as ``field: checkpoint <a>, given <b>``."""


@contextlib.contextmanager
def _quiet():
    """Silence orbax's absl warnings (read-only directory notices and the like) and Python warnings."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _leaf_paths(tree: Any) -> list[tuple[str, Any]]:
    return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def flatten_state(state: Any, *, exclude_prefixes: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[dict]]:
    """A train state as a flat dict of arrays plus the description of its leaves.

    Args:
        state: any pytree of arrays (a train state).
        exclude_prefixes: leaf paths (``jax.tree_util.keystr``, e.g. ``".replay"``) starting with one
            of these are left out.

    Returns:
        ``(arrays, leaves)``: ``arrays`` maps ``"leaf_%05d"`` (index in tree order) to each kept leaf;
        ``leaves`` lists ``{"path", "shape", "dtype", "saved"}`` for every leaf, plus
        ``"empty": True`` for a leaf of size zero, which is never kept (nothing to write; its
        shape and dtype rebuild it exactly).
    """
    arrays: dict[str, Any] = {}
    leaves = []
    for i, (path, x) in enumerate(_leaf_paths(state)):
        empty = int(np.prod(np.shape(x), dtype=np.int64)) == 0
        saved = not empty and not any(path.startswith(p) for p in exclude_prefixes)
        leaves.append({"path": path, "shape": list(np.shape(x)), "dtype": str(np.dtype(x.dtype)), "saved": saved,
                       **({"empty": True} if empty else {})})
        if saved:
            arrays[f"leaf_{i:05d}"] = x
    return arrays, leaves


def _array_key(i: int, rec: dict) -> str:
    """The key of a saved leaf's array in the checkpoint: its record's ``"key"`` (set by
    :func:`migrate_meta` before migrations that may move records), else its position."""
    return rec.get("key", f"leaf_{i:05d}")


def _stored_records(meta: dict) -> dict[str, dict]:
    """``{array key: leaf record}`` of every array the checkpoint holds: the records as written
    (kept by :func:`migrate_meta` in ``meta["stored_leaves"]``, so an array whose record a
    migration dropped is still read, as orbax restores a whole item), else the saved records."""
    recs = meta.get("stored_leaves", meta["leaves"])
    return {_array_key(i, rec): rec for i, rec in enumerate(recs) if rec["saved"]}


def _names(paths: list[str], limit: int = 6) -> str:
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _unflatten(template: Any, arrays: dict[str, Any], leaves: list[dict],
               allowed_missing: tuple[MissingLeaf, ...] | None,
               written_format: int | None = None) -> tuple[Any, dict[str, str]]:
    """:func:`unflatten_state` plus ``{path: reason}`` of the leaves filled by a rule."""
    rules = [r for r in (ALLOWED_MISSING_LEAVES if allowed_missing is None else allowed_missing)
             if written_format is None or written_format < r.since_format]
    flat, treedef = jax.tree_util.tree_flatten(template)
    paths = _leaf_paths(template)
    records = {rec["path"]: (i, rec) for i, rec in enumerate(leaves)}
    if len(records) != len(leaves):
        twice = sorted({rec["path"] for rec in leaves if sum(r["path"] == rec["path"] for r in leaves) > 1})
        raise CheckpointError(f"checkpoint records leaves more than once: {_names(twice)}")
    expected = {path for path, _ in paths}
    extra = [rec["path"] for rec in leaves if rec["path"] not in expected]
    missing = [path for path, _ in paths if path not in records]
    unfilled = [path for path in missing if not any(r.matches(path) for r in rules)]
    if extra or unfilled:
        parts = ([f"only in the checkpoint: {_names(extra)}"] if extra else []) + (
            [f"only in the train state: {_names(unfilled)} (no rule of ALLOWED_MISSING_LEAVES fills it"
             + (f" in format {written_format}" if written_format is not None else "") + ")"] if unfilled else [])
        raise CheckpointError(f"checkpoint holds {len(leaves)} state leaves, this config's train state has "
                              f"{len(paths)}: written by a different algorithm, network or version; "
                              + "; ".join(parts))
    out, filled = [], {}
    for j, (path, x) in enumerate(paths):
        if path not in records:
            rule = next(r for r in rules if r.matches(path))
            out.append(rule.fill(x))
            filled[path] = rule.reason
            continue
        i, rec = records[path]
        if tuple(rec["shape"]) != tuple(np.shape(x)) or rec["dtype"] != str(np.dtype(x.dtype)):
            raise CheckpointError(f"checkpoint leaf {i} is {rec['path']} {tuple(rec['shape'])} {rec['dtype']}, the "
                                  f"train state expects {path} {tuple(np.shape(x))} {np.dtype(x.dtype)}")
        if rec.get("empty"):
            out.append(np.zeros(tuple(rec["shape"]), np.dtype(rec["dtype"])))
        else:
            out.append(arrays[_array_key(i, rec)] if rec["saved"] else flat[j])
    return jax.tree_util.tree_unflatten(treedef, out), filled


def unflatten_state(template: Any, arrays: dict[str, Any], leaves: list[dict], *,
                    allowed_missing: tuple[MissingLeaf, ...] | None = None, written_format: int | None = None) -> Any:
    """Inverse of :func:`flatten_state`: put ``arrays`` into ``template``'s structure; empty leaves
    are rebuilt from their records, other leaves that were not saved keep the template's value.

    Records are matched to the template's leaves by path (a saved record's array is
    ``arrays[record["key"]]``, else ``arrays["leaf_%05d" % position]``). A template leaf without a
    record is filled by the first rule of ``allowed_missing`` (default
    :data:`ALLOWED_MISSING_LEAVES`) that matches its path, among the rules whose ``since_format``
    is newer than ``written_format``, the format the checkpoint was written in (None: all rules).

    Raises:
        CheckpointError: the checkpoint's leaves differ from the template's: a record whose path the
            template lacks, a template leaf without a record that no rule fills, or a shape or
            dtype that differs.
    """
    return _unflatten(template, arrays, leaves, allowed_missing, written_format)[0]


def _writer(meta: dict) -> str:
    """The tianji_jax version that wrote ``meta`` (``"an unknown version"`` when not recorded)."""
    packages = meta.get("packages") if isinstance(meta.get("packages"), dict) else {}
    version = meta.get("tianji_jax_version") or packages.get("tianji-jax")
    return f"tianji_jax {version}" if version else "an unknown version of tianji_jax"


def migrate_meta(meta: dict, where: str = "checkpoint") -> dict:
    """``meta`` (a checkpoint's metadata) in the current format, :data:`FORMAT_VERSION`.

    Current metadata is returned as it is; older metadata is copied, its saved leaf records get
    their array ``"key"`` and are kept as written in ``"stored_leaves"``, then
    ``MIGRATIONS[v]`` runs for ``v = meta["format"], ..., FORMAT_VERSION - 1``; the result records
    ``"migrated_from"``, the format written.

    Args:
        meta: the metadata, with an int ``"format"`` and ``"leaves"``.
        where: what the messages name (the checkpoint's directory).

    Raises:
        CheckpointFormatError: one line naming both versions: the format is newer than
            :data:`FORMAT_VERSION`, or an older version has no migration, or a migration failed.
    """
    written = meta["format"]
    if written == FORMAT_VERSION:
        return meta
    by = _writer(meta)
    if written > FORMAT_VERSION:
        raise CheckpointFormatError(f"{where}: checkpoint format {written} (written by {by}) is newer than this "
                                    f"version's {FORMAT_VERSION}; upgrade tianji_jax")
    meta = copy.deepcopy(meta)
    for i, rec in enumerate(meta["leaves"]):
        if rec.get("saved"):
            rec.setdefault("key", f"leaf_{i:05d}")
    meta["stored_leaves"] = copy.deepcopy(meta["leaves"])
    for version in range(written, FORMAT_VERSION):
        step = MIGRATIONS.get(version)
        if step is None:
            raise CheckpointFormatError(
                f"{where}: checkpoint format {written} (written by {by}) cannot be read by this version, whose "
                f"format is {FORMAT_VERSION}: no migration from format {version} to {version + 1}; load it with "
                "the version that wrote it")
        try:
            meta = step(meta)
        except Exception as err:  # noqa: BLE001 - a migration is arbitrary code; report it in one line
            raise CheckpointFormatError(f"{where}: checkpoint format {written} (written by {by}) could not be "
                                        f"migrated to this version's format {FORMAT_VERSION}: the migration from "
                                        f"format {version} failed: {one_line(err)}") from None
        if not isinstance(meta, dict) or meta.get("format") != version + 1:
            got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise CheckpointFormatError(f"{where}: checkpoint format {written} (written by {by}) could not be "
                                        f"migrated to this version's format {FORMAT_VERSION}: the migration from "
                                        f"format {version} returned format {got!r}, not {version + 1}")
    meta["migrated_from"] = written
    return meta


def _defaults_for(saved_config: dict, algo: Any) -> dict:
    """The value of every field of ``algo``'s config class for a config saved as ``saved_config``:
    the saved config rebuilt by this version (so a field it lacks gets its default, resolved as
    ``__post_init__`` resolves it for that config), or, when it cannot be rebuilt (a field since
    removed, an environment object, ...), the class's defaults; ``{}`` for an unknown ``algo``."""
    from tianji_jax.algos.config_file import config_from_dict
    from tianji_jax.algos.dqn.config import DQNConfig
    from tianji_jax.algos.ppo.config import PPOConfig

    if not isinstance(algo, str):
        return {}
    try:  # the algorithm registry, where there is one (it knows algorithms registered by other packages)
        from tianji_jax.algos.registry import get_algorithm

        cls = get_algorithm(algo).config_cls
    except (ImportError, ValueError, KeyError):
        cls = {"ppo": PPOConfig, "dqn": DQNConfig}.get(algo)
    if cls is None:
        return {}
    with contextlib.suppress(Exception):  # noqa: BLE001 - any failure: fall back to the class defaults
        return config_from_dict({**saved_config, "algo": algo}).to_dict()
    try:
        return cls().to_dict()
    except Exception:  # noqa: BLE001 - a class whose defaults do not validate alone has none to offer
        return {}


def check_compatible(saved_config: dict, config_dict: dict, saved_packages: dict | None = None,
                     packages: dict | None = None) -> None:
    """Raise if a run saved with ``saved_config`` cannot be resumed bit-exactly with ``config_dict``.

    A field that ``config_dict`` has and ``saved_config`` lacks (a field added after the checkpoint
    was written) compares as its default: the value this version gives it for the saved config
    (the algorithm's config class, ``PPOConfig`` or ``DQNConfig``, from ``config_dict["algo"]``).
    A field only the checkpoint has (since removed) is a difference.

    Args:
        saved_config: ``to_dict()`` of the checkpoint's config plus ``"algo"``.
        config_dict: the same for the config given to the resume.
        saved_packages / packages: ``{name: version}`` of the run and of this process; only
            :data:`VERSION_CHECKED_PACKAGES` are compared (skipped when either is None).

    Raises:
        ConfigMismatchError: naming every differing field (all but :data:`RESUME_FREE_FIELDS`)
            and package.
    """
    diffs = []
    added = sorted(k for k in set(config_dict) - set(saved_config) if k not in RESUME_FREE_FIELDS)
    defaults = _defaults_for(saved_config, config_dict.get("algo", saved_config.get("algo"))) if added else {}
    for k in sorted(set(saved_config) | set(config_dict)):
        if k in RESUME_FREE_FIELDS:
            continue
        b = config_dict.get(k, "<absent>")
        if k in saved_config:
            a = saved_config[k]
            if a != b:
                diffs.append(f"{k}: checkpoint {a!r}, given {b!r}")
        elif k not in defaults:
            diffs.append(f"{k}: checkpoint <absent>, given {b!r}")
        elif defaults[k] != b:
            diffs.append(f"{k}: checkpoint <absent: the default, {defaults[k]!r}>, given {b!r}")
    if diffs:
        why = ("; total_env_steps sets the run's schedules (learning-rate annealing, exploration decay, the "
               "number of updates), so a run cannot be extended by resuming it: train a new run with the "
               "larger budget" if any(d.startswith("total_env_steps:") for d in diffs) else "")
        raise ConfigMismatchError("cannot resume: the config differs from the checkpoint's in "
                                  + "; ".join(diffs) + f" (fields that may differ: {sorted(RESUME_FREE_FIELDS)})" + why)
    if saved_packages is not None and packages is not None:
        pdiffs = [f"{p}: checkpoint {saved_packages.get(p)}, installed {packages.get(p)}"
                  for p in VERSION_CHECKED_PACKAGES if saved_packages.get(p) != packages.get(p)]
        if pdiffs:
            raise ConfigMismatchError("cannot resume exactly: package versions differ: " + "; ".join(pdiffs)
                                      + " (pass check_versions=False to resume anyway, without bit-exactness)")


def _rows_to_json(rows: list[dict]) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]


def _rows_from_json(rows: list[dict]) -> list[dict]:
    return [{k: (math.nan if v is None else v) for k, v in r.items()} for r in rows]


def read_json(path: Path) -> dict:
    """A JSON file as a dict (for ``config.json`` / ``provenance.json``).

    Raises:
        CheckpointError: missing or invalid file.
    """
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent} is not a run directory: no {path.name}") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from None

