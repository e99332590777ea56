"""The checkpoint-format policy (``docs/checkpoint_format.md``): run directories written by an older
version (``tests/fixtures/runs_v1/``, written by commit 5830279 with checkpoint format 1) load and
resume; a newer format, or an older one without a migration, is refused in one line naming both
versions; migrations (``checkpoint.MIGRATIONS``) run in order; a saved config without a field added
since compares equal to its default; a leaf a checkpoint lacks is filled only by a rule of
``checkpoint.ALLOWED_MISSING_LEAVES``; and the train state's leaf paths, shapes and dtypes of four
default configs equal the snapshot ``tests/fixtures/leaf_paths.json`` (written by commit 5830279).

The fixtures are never regenerated (``tests/fixtures/generate_runs_v1.py`` says how they were made).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.checkpoint import core as ckpt
from tianji_jax.checkpoint.core import (CheckpointError, CheckpointFormatError, ConfigMismatchError, MissingLeaf,
                                   check_compatible, unflatten_state)

pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = {"ppo_cartpole": (2048, 4096), "dqn_cartpole": (2000, 4000)}  # fixture -> (its checkpoint, its budget)
TIMING = ("wall_time_s", "sps")


def state_template(config):
    """The abstract train state that checkpoints of ``config`` are restored into."""
    try:
        from tianji_jax.run.run_files import state_template as template
    except ImportError:  # before training.py was split into modules
        from tianji_jax.training import _state_template as template
    return template(config)


def leaf_records(tree) -> list[list]:
    """``[path, shape, dtype]`` of each leaf, in tree order (as ``meta["leaves"]`` records them)."""
    return [[jax.tree_util.keystr(p), list(x.shape), str(np.dtype(x.dtype))]
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def copy_fixture(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "runs_v1" / name, tmp_path / name))


def meta_file(run_dir: Path) -> Path:
    """The metadata file of the run's only checkpoint (read without orbax: the fixtures stay untouched)."""
    (step,) = [p for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    return step / "meta" / "metadata"


def edit_meta(run_dir: Path, **changes) -> dict:
    path = meta_file(run_dir)
    meta = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(meta))
    return meta


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def same_cell(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a or "nan"), float(b or "nan")
    except ValueError:
        return False
    return x == y or (math.isnan(x) and math.isnan(y))


def assert_trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    assert ta == tb
    for (path, x), (_, y) in zip(la, lb):
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)


# ---- (1) the current code resumes the old run directories to their end ------------------------------------
@pytest.mark.parametrize("name", sorted(RUNS))
def test_old_run_directory_resumes_to_its_end(tmp_path, name):
    saved_at, budget = RUNS[name]
    run_dir = copy_fixture(name, tmp_path)
    old_meta = json.loads(meta_file(run_dir).read_text())
    assert old_meta["format"] == 1 and old_meta["step"] == saved_at and not old_meta["finished"]
    assert "max_nonfinite_updates" not in old_meta["config"]  # written before the field existed
    old_rows = read_csv(run_dir / "metrics.csv")
    config = tj.load_config(run_dir)  # from the fixture's config.json
    # package upgrades are not a format change (they may change the bits, which check_versions guards)
    result = tj.train(config, run_dir=run_dir, progress=False, resume=True, check_versions=False)
    assert not result.already_finished and result.run_dir == run_dir  # no fallback to a continuation
    assert list(result.curve["env_steps"]) == [saved_at, budget]
    rows = read_csv(run_dir / "metrics.csv")
    assert [int(r["env_steps"]) for r in rows] == [saved_at, budget]
    for col, value in old_rows[0].items():  # the fixture's row is kept as written, the new one follows
        assert same_cell(rows[0][col], value), col
    assert float(rows[1]["wall_time_s"]) >= float(rows[0]["wall_time_s"])
    assert all(math.isfinite(float(rows[1][c])) for c in ("episode_return_mean", "eval_return_mean"))
    new = tj.load(run_dir)
    assert new.step == budget and new.meta["finished"] is True
    assert new.meta["format"] == ckpt.FORMAT_VERSION and new.meta["tianji_jax_version"] == tj.__version__
    assert new.meta["config"]["max_nonfinite_updates"] == config.max_nonfinite_updates
    assert not (FIXTURES / "runs_v1" / name / "checkpoints" / str(budget)).exists()  # the fixture is untouched


# ---- (2) load and evaluate ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(RUNS))
def test_old_run_directory_loads_and_evaluates(tmp_path, name):
    run_dir = copy_fixture(name, tmp_path)
    loaded = tj.load(run_dir)
    assert loaded.step == RUNS[name][0] and loaded.meta["format"] == 1 and "migrated_from" not in loaded.meta
    assert [r["env_steps"] for r in loaded.rows] == [RUNS[name][0]]
    assert leaf_records(loaded.state) == [[r["path"], r["shape"], r["dtype"]] for r in loaded.meta["leaves"]]
    ev = tj.evaluate(loaded.config, loaded.state, num_episodes=2, seed=1)
    assert ev["returns"].shape == (2,) and np.all(np.isfinite(ev["returns"]))


# ---- (3) formats this version cannot read ---------------------------------------------------------------
def test_newer_format_is_refused_in_one_line_naming_both_versions(tmp_path, capsys):
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    newer = ckpt.FORMAT_VERSION + 1
    edit_meta(run_dir, format=newer, tianji_jax_version="9.9.9")
    want = (f"checkpoint format {newer} (written by tianji_jax 9.9.9) is newer than this version's "
            f"{ckpt.FORMAT_VERSION}; upgrade tianji_jax")
    with pytest.raises(CheckpointFormatError) as err:
        tj.load(run_dir)
    assert want in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CheckpointFormatError, match="is newer than this version's"):
        tj.train(run_dir=run_dir, progress=False, resume=True)
    assert "skipped" not in capsys.readouterr().err  # refused, not taken for a corrupt checkpoint
    assert not list(tmp_path.glob("*-from-*"))
    # without tianji_jax_version (format 1 did not write it): the version from meta["packages"]
    edit_meta(run_dir, tianji_jax_version=None)
    with pytest.raises(CheckpointFormatError, match=r"format \d+ \(written by tianji_jax 0\.1\.0\) is newer"):
        tj.load(run_dir)


def test_older_format_without_a_migration_is_refused_in_one_line(tmp_path):
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    edit_meta(run_dir, format=0)
    with pytest.raises(CheckpointFormatError) as err:
        tj.load(run_dir)
    msg = str(err.value)
    assert "\n" not in msg and "checkpoint format 0 (written by tianji_jax 0.1.0)" in msg
    assert f"whose format is {ckpt.FORMAT_VERSION}: no migration from format 0 to 1" in msg


def test_metadata_without_a_format_is_not_tianji(tmp_path):
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    edit_meta(run_dir, format="1")
    with pytest.raises(CheckpointError, match="has no tianji metadata"):
        tj.load(run_dir)


# ---- (4) migrations ------------------------------------------------------------------------------------
def reverse_leaf_records(meta: dict) -> dict:
    """Synthetic format 2: the leaf records in reverse order, the env steps under a new key."""
    env_steps = meta.pop("env_steps")
    return {**meta, "format": 2, "leaves": meta["leaves"][::-1], "env_steps_v2": env_steps}


def test_older_format_passes_through_its_registered_migration(tmp_path, monkeypatch):
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    want = tj.load(run_dir)
    seen = []

    def v2_to_v3(meta: dict) -> dict:
        """Synthetic format 3: adds a counter."""
        seen.append(meta["format"])
        return {**meta, "format": 3, "v3_counter": 0}

    monkeypatch.setattr(ckpt, "FORMAT_VERSION", 3)
    monkeypatch.setattr(ckpt, "MIGRATIONS", {1: reverse_leaf_records, 2: v2_to_v3})
    got = tj.load(run_dir)
    assert seen == [2]
    assert got.meta["format"] == 3 and got.meta["migrated_from"] == 1 and got.meta["v3_counter"] == 0
    assert got.meta["env_steps_v2"] == 2048 and "env_steps" not in got.meta
    assert_trees_equal(got.state, want.state)  # records found by path and array key, not position
    # the migrated run resumes, and its new checkpoint is written in the current (synthetic) format
    result = tj.train(run_dir=run_dir, progress=False, resume=True, check_versions=False)
    assert list(result.curve["env_steps"]) == [2048, 4096]
    assert tj.load(run_dir).meta["format"] == 3 and "migrated_from" not in tj.load(run_dir).meta


def test_a_missing_migration_or_a_failing_one_is_one_line(tmp_path, monkeypatch):
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    monkeypatch.setattr(ckpt, "FORMAT_VERSION", 3)
    monkeypatch.setattr(ckpt, "MIGRATIONS", {1: reverse_leaf_records})
    with pytest.raises(CheckpointFormatError, match="format 1 .* whose format is 3: no migration from format 2 to 3"):
        tj.load(run_dir)

    def broken(meta: dict) -> dict:
        raise KeyError("no_such_key")

    monkeypatch.setattr(ckpt, "MIGRATIONS", {1: reverse_leaf_records, 2: broken})
    with pytest.raises(CheckpointFormatError, match="migration from format 2 failed: KeyError") as err:
        tj.load(run_dir)
    assert "\n" not in str(err.value)
    monkeypatch.setattr(ckpt, "MIGRATIONS", {1: reverse_leaf_records, 2: lambda meta: meta})
    with pytest.raises(CheckpointFormatError, match="returned format 2, not 3"):
        tj.load(run_dir)


def test_a_missing_leaf_is_filled_only_by_a_rule(tmp_path, monkeypatch, capsys):
    """A version whose checkpoints lack ``.learner.version`` (a migration drops its record, as if it
    had never been written): refused without a rule; with one, the rule's fill restores it."""
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    want = tj.load(run_dir)

    def drop_version(meta: dict) -> dict:
        """Synthetic format 2: the record of ``.learner.version`` is gone."""
        return {**meta, "format": 2, "leaves": [r for r in meta["leaves"] if r["path"] != ".learner.version"]}

    monkeypatch.setattr(ckpt, "FORMAT_VERSION", 2)
    monkeypatch.setattr(ckpt, "MIGRATIONS", {1: drop_version})
    with pytest.raises(CheckpointError, match=r"only in the train state: \.learner\.version \(no rule of "
                                              r"ALLOWED_MISSING_LEAVES fills it in format 1\)"):
        tj.load(run_dir)
    # a rule for a leaf that format 1 already had does not apply to a format 1 checkpoint
    monkeypatch.setattr(ckpt, "ALLOWED_MISSING_LEAVES", (MissingLeaf(r"[.]learner[.]version", 1, "test"),))
    with pytest.raises(CheckpointError, match=r"only in the train state: \.learner\.version"):
        tj.load(run_dir)
    rule = MissingLeaf(r"[.]learner[.]version", 2, "test: counted from 7", fill=lambda x: np.full(x.shape, 7, x.dtype))
    monkeypatch.setattr(ckpt, "ALLOWED_MISSING_LEAVES", (rule,))
    got = tj.load(run_dir)
    assert int(got.state.learner.version) == 7 and got.meta["filled_leaves"] == [".learner.version"]
    assert "leaf .learner.version is not in it; filled as ALLOWED_MISSING_LEAVES says (test: counted from 7)" in (
        capsys.readouterr().err)
    assert_trees_equal(got.state.learner.params, want.state.learner.params)
    # the default fill: the template's value (zeros for an abstract template)
    monkeypatch.setattr(ckpt, "ALLOWED_MISSING_LEAVES", (MissingLeaf(r"[.]learner[.]version", 2, "test"),))
    assert int(tj.load(run_dir).state.learner.version) == 0


def test_unflatten_matches_records_by_path_and_refuses_unknown_leaves():
    tree = {"a": np.arange(3, dtype=np.float32), "b": np.int32(4)}
    template = {**jax.eval_shape(lambda: tree), "c": jax.ShapeDtypeStruct((2,), np.float32)}
    leaves = [{"path": "['b']", "shape": [], "dtype": "int32", "saved": True, "key": "x1"},
              {"path": "['a']", "shape": [3], "dtype": "float32", "saved": True, "key": "x0"}]
    arrays = {"x0": tree["a"], "x1": tree["b"]}
    with pytest.raises(CheckpointError, match=r"only in the train state: \['c'\]"):
        unflatten_state(template, arrays, leaves)
    rule = MissingLeaf(r"\['c'\]", 3, "new", fill=lambda x: np.ones(x.shape, x.dtype))
    out = unflatten_state(template, arrays, leaves, allowed_missing=(rule,), written_format=2)
    assert np.array_equal(out["a"], tree["a"]) and int(out["b"]) == 4 and np.array_equal(out["c"], np.ones(2))
    with pytest.raises(CheckpointError, match=r"only in the train state: \['c'\]"):  # format 3 has it
        unflatten_state(template, arrays, leaves, allowed_missing=(rule,), written_format=3)
    extra = [*leaves, {"path": "['d']", "shape": [], "dtype": "int32", "saved": False}]
    with pytest.raises(CheckpointError, match=r"only in the checkpoint: \['d'\]"):
        unflatten_state(template, arrays, extra, allowed_missing=(MissingLeaf(".*", 9, "any"),))
    with pytest.raises(CheckpointError, match=r"more than once: \['a'\]"):
        unflatten_state(template, arrays, [*leaves, leaves[1]], allowed_missing=(rule,))
    shaped = [{**leaves[0], "shape": [2]}, leaves[1]]
    with pytest.raises(CheckpointError, match=r"checkpoint leaf 0 is \['b'\] \(2,\) int32, the train state "
                                              r"expects \['b'\] \(\) int32"):
        unflatten_state(template, arrays, shaped, allowed_missing=(rule,))


# ---- (5) config fields added since a checkpoint was written ----------------------------------------------------
@pytest.mark.parametrize("cls,algo", [(tj.PPOConfig, "ppo"), (tj.DQNConfig, "dqn")])
def test_a_saved_config_without_a_field_compares_equal_to_its_default(cls, algo):
    given = {**cls().to_dict(), "algo": algo}
    saved = {k: v for k, v in given.items() if k != "max_nonfinite_updates"}
    check_compatible(saved, given)  # absent: the default, 5
    check_compatible(saved, given, {"jax": jax.__version__}, {"jax": jax.__version__})
    with pytest.raises(ConfigMismatchError,
                       match=r"max_nonfinite_updates: checkpoint <absent: the default, 5>, given 7") as err:
        check_compatible(saved, {**given, "max_nonfinite_updates": 7})
    assert "learning_rate" not in str(err.value)
    with pytest.raises(ConfigMismatchError, match=r"learning_rate: checkpoint 0.5, given"):
        check_compatible({**saved, "learning_rate": 0.5}, given)  # present and different: refused as ever
    assert "cannot be extended" not in str(err.value)
    with pytest.raises(ConfigMismatchError, match=r"total_env_steps: checkpoint 1000, given .*so a run cannot be "
                                                  r"extended by resuming it: train a new run"):
        check_compatible({**saved, "total_env_steps": 1000}, given)  # the budget sets the schedules
    with pytest.raises(ConfigMismatchError, match=r"removed_field: checkpoint 1, given '<absent>'"):
        check_compatible({**saved, "removed_field": 1}, given)  # only in the checkpoint: refused
    assert "max_nonfinite_updates" not in ckpt.RESUME_FREE_FIELDS


def test_resuming_an_old_run_with_a_non_default_new_field_is_refused(tmp_path):
    run_dir = copy_fixture("ppo_cartpole", tmp_path)
    config = dataclasses.replace(tj.load_config(run_dir), max_nonfinite_updates=7)
    with pytest.raises(ConfigMismatchError, match=r"max_nonfinite_updates: checkpoint <absent: the default, 5>, "
                                                  r"given 7"):
        tj.train(config, run_dir=run_dir, progress=False, resume=True, check_versions=False)
    assert [int(r["env_steps"]) for r in read_csv(run_dir / "metrics.csv")] == [2048]


# ---- (6) the train state's structure -------------------------------------------------------------------------
def check_snapshot() -> None:
    """Raise unless this code's train states of the snapshot's configs match ``leaf_paths.json``
    (see :func:`test_train_state_leaf_paths_equal_the_snapshot`)."""
    snap = json.loads((FIXTURES / "leaf_paths.json").read_text())
    assert sorted(snap["states"]) == ["dqn_anakin", "dqn_async_sync", "ppo_anakin", "ppo_async_sync"]
    for name, kwargs in snap["configs"].items():
        kwargs = dict(kwargs)
        algo = kwargs.pop("algo")
        config = (tj.PPOConfig if algo == "ppo" else tj.DQNConfig)(**kwargs)
        template = state_template(config)
        got, want = leaf_records(template), snap["states"][name]
        if ckpt.FORMAT_VERSION == 1 and not ckpt.ALLOWED_MISSING_LEAVES:
            assert got == want, (f"{name}: leaves only in the snapshot {[r for r in want if r not in got]}, "
                                 f"only in this code's train state {[r for r in got if r not in want]}")
            continue
        meta = ckpt.migrate_meta({"format": 1, "algo": algo, "config": {**config.to_dict(), "algo": algo},
                                  "leaves": [{"path": p, "shape": sh, "dtype": dt, "saved": False}
                                             for p, sh, dt in want]})
        ckpt.unflatten_state(template, {}, meta["leaves"], written_format=1)  # raises naming the differences


def test_train_state_leaf_paths_equal_the_snapshot():
    """The leaf paths, shapes and dtypes of the train states of four default configs, as commit
    5830279 computed them (``leaf_paths.json``, format 1), are those of this code's train states:
    equal while nothing is declared, else equal up to the declared changes (``MIGRATIONS`` applied
    to format-1 records, leaves filled by ``ALLOWED_MISSING_LEAVES``), exactly as a restore matches
    them. A change of the train state fails here until it is declared (``docs/checkpoint_format.md``);
    the snapshot stays as it is."""
    check_snapshot()


def test_snapshot_check_accepts_declared_changes_only(monkeypatch):
    """A synthetic format 2 whose checkpoints, unlike format 1's, hold ``.learner.version``: the
    snapshot (format 1) lacks it, which only a rule of ``ALLOWED_MISSING_LEAVES`` may excuse."""
    def drop_version(meta: dict) -> dict:
        """Synthetic format 2: format 1 had no ``.learner.version``."""
        return {**meta, "format": 2, "leaves": [r for r in meta["leaves"] if r["path"] != ".learner.version"]}

    monkeypatch.setattr(ckpt, "FORMAT_VERSION", 2)
    monkeypatch.setattr(ckpt, "MIGRATIONS", {1: drop_version})
    with pytest.raises(CheckpointError, match=r"only in the train state: \.learner\.version"):
        check_snapshot()
    monkeypatch.setattr(ckpt, "ALLOWED_MISSING_LEAVES", (MissingLeaf(r"[.]learner[.]version", 2, "test"),))
    check_snapshot()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixture_leaves_equal_the_current_train_state(name):
    meta = json.loads(meta_file(FIXTURES / "runs_v1" / name).read_text())
    config = tj.load_config(FIXTURES / "runs_v1" / name)
    assert [[r["path"], r["shape"], r["dtype"]] for r in meta["leaves"]] == leaf_records(state_template(config))
