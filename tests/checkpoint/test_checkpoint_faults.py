"""Checkpoint faults: leaves of size zero (DQN with ``n_step=1``: an empty n-step window) are
checkpointed and restored; a truncated or bit-flipped newest checkpoint is detected (orbax's
error, or the per-leaf checksums when the data restores without one), reported in one line
without orbax's traceback spam, and a resume falls back to the newest intact checkpoint,
continuing in a new run directory while the original is left untouched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.checkpoint.core import CheckpointError, CorruptCheckpointError, flatten_state, unflatten_state
from tianji_jax.checkpoint.io import RunCheckpointer
from tianji_jax.checkpoint.digests import DIGESTS_FILE
from tianji_jax.checkpoint.verify import one_line, quiet_abandoned_reads
from tianji_jax.checkpoint.fallback import continuation_dir, continued_in
from test_checkpoint import Interrupt, assert_trees_equal, interrupt_after  # the interrupted-run helpers

pytestmark = pytest.mark.timeout(300)

# 8 updates of 4 x 32 = 128 env steps, a chunk (and a checkpoint) every 2 updates = 256 env steps.
PPO = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 8,
           eval_every_env_steps=4 * 32 * 2, eval_episodes=2, normalize_observations=True, scale_rewards=True)
# 20 iterations of 8 env steps in 2 chunks; n_step=1 leaves the n-step window empty (size zero).
DQN1 = dict(num_envs=4, num_steps=2, buffer_capacity=512, batch_size=16, learning_starts=48, replay_ratio=0.25,
            n_step=1, target_update_period=4, total_env_steps=8 * 20, eval_every_env_steps=8 * 10,
            eval_episodes=2, hidden_sizes=(16,))


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under ``directory`` with its size and modification time (files: and content)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(directory))] = ((st.st_size, st.st_mtime_ns, p.read_bytes()) if p.is_file()
                                              else ("dir", st.st_mtime_ns))
    return out


def largest_data_file(run_dir: Path, step: int) -> Path:
    files = [f for f in (run_dir / "checkpoints" / str(step) / "state").rglob("*")
             if f.is_file() and f.parent.name == "d"]
    return max(files, key=lambda f: f.stat().st_size)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def ppo_full(tmp_path_factory):
    """The uninterrupted PPO run (4 chunks)."""
    return tj.train(tj.PPOConfig(**PPO), run_dir=tmp_path_factory.mktemp("ppo") / "full", progress=False)


@pytest.fixture(scope="module")
def ppo_cut(tmp_path_factory):
    """The same run interrupted after 3 chunks: checkpoints at 512 and 768 env steps (the newest)."""
    run_dir = tmp_path_factory.mktemp("ppo_cut") / "run"
    with pytest.raises(Interrupt):
        tj.train(tj.PPOConfig(**PPO), run_dir=run_dir, progress=False, callback=interrupt_after(3))
    assert RunCheckpointer(run_dir, read_only=True).steps()[-2:] == [512, 768]
    return run_dir


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- leaves of size zero --------------------------------------------------------------------------
def test_flatten_and_unflatten_rebuild_zero_size_leaves(tmp_path):
    tree = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "window": jnp.zeros((0, 4, 4), jnp.float32),
            "flags": jnp.zeros((0,), bool), "count": jnp.int32(7), "ids": jnp.zeros((3, 0), jnp.uint8)}
    arrays, leaves = flatten_state(tree)
    by_path = {rec["path"]: rec for rec in leaves}
    for path in ("['window']", "['flags']", "['ids']"):
        assert by_path[path]["empty"] is True and by_path[path]["saved"] is False
    assert len(arrays) == 2 and all(np.size(x) > 0 for x in arrays.values())  # nothing empty goes to orbax
    back = unflatten_state(jax.eval_shape(lambda: tree), arrays, leaves)
    assert_trees_equal(back, tree)
    # and through orbax: save, restore (synchronously and asynchronously written)
    for async_save in (False, True):
        ckptr = RunCheckpointer(tmp_path / f"run{async_save}", async_save=async_save)
        ckptr.save(10, tree, {"rows": []})
        ckptr.close()
        reader = RunCheckpointer(tmp_path / f"run{async_save}", read_only=True)
        assert_trees_equal(reader.restore(jax.eval_shape(lambda: tree)).state, tree)
        reader.close()


def test_dqn_n_step_1_checkpoints_and_resumes_exactly(tmp_path):
    config = tj.DQNConfig(**DQN1)
    full = tj.train(config, run_dir=tmp_path / "full", progress=False)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(1))
    loaded = tj.load(run_dir)
    empty = [rec["path"] for rec in loaded.meta["leaves"] if rec.get("empty")]
    assert empty and all(".actor.history" in p for p in empty)  # the n-step window
    assert loaded.step == 80 and int(loaded.state.replay.size) > 0
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    assert_trees_equal(full.state, resumed.state)


def test_async_dqn_n_step_1_checkpoints_and_resumes(tmp_path):
    config = tj.DQNConfig(**{**DQN1, "runtime": "async", "schedule": "sync", "eval_episodes": 0})
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(1))
    cut = tj.load(run_dir)
    assert cut.meta["resumable"] is True and any(rec.get("empty") for rec in cut.meta["leaves"])
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    assert int(resumed.state.learner.version) == config.learning_iterations
    assert tj.load(run_dir).step == config.env_steps


# ---- corrupt checkpoints ---------------------------------------------------------------------------
_RESUME_SCRIPT = textwrap.dedent("""
    import sys
    import tianji_jax as tj
    result = tj.train(run_dir=sys.argv[1], progress=False, resume=True)
    print("RUN_DIR", result.run_dir)
""")


def test_truncated_newest_checkpoint_resume_falls_back_in_one_line(tmp_path, ppo_cut, ppo_full):
    """In a fresh process (no pytest hooks): one line per skipped checkpoint, no orbax traceback
    spam (``Event loop is closed``), and the run continues from the intact one in a new directory."""
    run_dir = copy_run(ppo_cut, tmp_path / "run")
    truncate(largest_data_file(run_dir, 768))
    before = snapshot(run_dir)
    script = tmp_path / "resume.py"
    script.write_text(_RESUME_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    assert "Event loop is closed" not in err and "Traceback" not in err and "TensorStore({" not in err, err[-3000:]
    lines = err.splitlines()
    skipped = [i for i, line in enumerate(lines) if "skipped" in line]
    assert len(skipped) == 2, err  # the skip and the continuation
    assert lines[skipped[0]].startswith("checkpoint 768 skipped: ")
    assert lines[skipped[1]].startswith("resuming from checkpoint 512, the newest intact one")
    new_dir = Path(proc.stdout.split("RUN_DIR")[1].split()[0])
    assert new_dir == run_dir.with_name("run-from-512") and str(new_dir) in lines[skipped[1]]
    assert snapshot(run_dir) == before  # the original run directory is left as it was
    final = tj.load(new_dir)
    assert final.step == 1024 and final.meta["finished"] is True
    assert_trees_equal(final.state, ppo_full.state)  # continued from 512: the uninterrupted run's bits


def test_bit_flip_is_caught_by_the_checksum_and_resume_continues_in_a_new_directory(tmp_path, ppo_cut, ppo_full,
                                                                                      capsys):
    run_dir = copy_run(ppo_cut, tmp_path / "run")
    flip_middle_byte(largest_data_file(run_dir, 768))
    with pytest.raises(CorruptCheckpointError, match="fails its checksum") as err:  # orbax restores it silently
        tj.load(run_dir, step=768)
    assert err.value.step == 768 and "\n" not in str(err.value)
    before = snapshot(run_dir)
    resumed = tj.train(run_dir=run_dir, progress=False, resume=True)
    stderr = capsys.readouterr().err
    assert f"checkpoint 768 skipped: {err.value.reason}" in stderr.splitlines()
    new_dir = run_dir.with_name("run-from-512")
    assert resumed.run_dir == new_dir and snapshot(run_dir) == before
    # the new directory is a complete run: config, provenance, metrics from the start, its checkpoints
    assert {"config.json", "provenance.json", "metrics.csv", "resumed_from.json"} <= {p.name for p in new_dir.iterdir()}
    origin = json.loads((new_dir / "resumed_from.json").read_text())
    assert origin["step"] == 512 and origin["skipped"] == {"768": err.value.reason}
    rows = (new_dir / "metrics.csv").read_text().splitlines()[1:]
    assert [int(float(r.split(",")[0])) for r in rows] == [256, 512, 768, 1024]
    assert 1024 in RunCheckpointer(new_dir, read_only=True).steps()
    assert_trees_equal(resumed.state, ppo_full.state)
    assert_trees_equal(tj.load(new_dir).state, ppo_full.state)
    assert continuation_dir(run_dir, 512) == run_dir.with_name("run-from-512-2")  # the next one is free


def test_load_falls_back_unless_a_step_is_given_and_none_intact_is_one_line(tmp_path, ppo_cut, capsys):
    run_dir = copy_run(ppo_cut, tmp_path / "run")
    truncate(largest_data_file(run_dir, 768))
    loaded = tj.load(run_dir)
    assert loaded.step == 512
    warned = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert len(warned) == 1 and warned[0].startswith("checkpoint 768 skipped: ") and "OUT_OF_RANGE" in warned[0]
    with pytest.raises(CorruptCheckpointError, match="768 is corrupt or unreadable"):
        tj.load(run_dir, step=768)
    for step in RunCheckpointer(run_dir, read_only=True).steps():
        truncate(largest_data_file(run_dir, step))
    with pytest.raises(CheckpointError, match="no intact checkpoint") as err:
        tj.load(run_dir)
    assert "\n" not in str(err.value) and "768: " in str(err.value) and "512: " in str(err.value)
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        tj.train(run_dir=run_dir, progress=False, resume=True)
    assert not run_dir.with_name("run-from-512").exists()


def test_checkpoints_without_checksums_still_load(tmp_path, ppo_cut):
    """Checkpoints written before checksums existed restore unverified (they had no file digests
    either: with them, the edited metadata would fail its digest)."""
    run_dir = copy_run(ppo_cut, tmp_path / "run")
    (run_dir / "checkpoints" / "768" / DIGESTS_FILE).unlink()
    meta_file = run_dir / "checkpoints" / "768" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert all("checksum" in rec for rec in meta["leaves"] if rec["saved"])
    for rec in meta["leaves"]:
        rec.pop("checksum", None)
    meta_file.write_text(json.dumps(meta))
    assert tj.load(run_dir).step == 768


# ---- the pieces -------------------------------------------------------------------------------------
def test_one_line_keeps_the_root_cause_without_spec_dumps():
    try:
        try:
            raise ValueError('OUT_OF_RANGE: Error reading "leaf_00003/0.0" [source locations=\'a.cc:1\']\nmore')
        except ValueError as inner:
            raise Exception("Encountered error while reading array index: (). See full TensorStore details: "
                            "<bound method spec of TensorStore({\n  'base': {}\n})>.") from inner
    except Exception as err:  # noqa: BLE001
        assert one_line(err) == 'ValueError: OUT_OF_RANGE: Error reading "leaf_00003/0.0"'


def test_reads_abandoned_by_a_failed_restore_are_not_reported():
    """What orbax leaves behind: a tensorstore read awaited in an event loop that is closed before
    the read completes; completing it then reports ``RuntimeError: Event loop is closed``."""
    import asyncio

    import tensorstore as ts

    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(str(u.exc_value))
    try:
        promise, future = ts.Promise.new()
        with pytest.raises(RuntimeError, match="restore failed"), quiet_abandoned_reads():
            loop = asyncio.new_event_loop()

            async def read():
                await future

            async def fail():
                loop.create_task(read())
                await asyncio.sleep(0)
                raise RuntimeError("restore failed")

            try:
                loop.run_until_complete(fail())
            finally:
                loop.close()
        promise.set_result(1)  # the read completes into the closed loop
        sys.unraisablehook(SimpleNamespace(exc_value=ValueError("other"), object=None))  # others go through
        assert seen == ["other"]
    finally:
        sys.unraisablehook = previous


def test_continuation_dir_names(tmp_path):
    run = tmp_path / "run"
    assert continuation_dir(run, 512) == tmp_path / "run-from-512"
    (tmp_path / "run-from-512").mkdir()
    (tmp_path / "run-from-512-2").mkdir()
    assert continuation_dir(run, 512) == tmp_path / "run-from-512-3"
    assert os.path.basename(continuation_dir(run, 7)) == "run-from-7"
    # where a resume of `run` went on (tianji train names it after a Ctrl-C)
    started = time.time()
    assert continued_in(run, started) is None  # the directories above are no continuations of it
    (tmp_path / "run-from-512-2" / "resumed_from.json").write_text(json.dumps({"run_dir": str(run.resolve())}))
    assert continued_in(run, started) == tmp_path / "run-from-512-2"
    assert continued_in(tmp_path / "other", started) is None
