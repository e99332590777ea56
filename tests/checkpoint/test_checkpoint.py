"""Checkpoints and resume (issue 5): exact resume of Anakin PPO and DQN (params, optimizer state,
counters, RNG keys, normalisation statistics, replay buffer, metrics rows), a process killed while
saving, partial (temporary) checkpoint directories, retention of the latest + best, incompatible
configs, directories that are not checkpoints or are corrupt; resume of async-runtime runs
(``sync`` PPO bit for bit in a fresh process, DQN's replay/counters/epsilon, host envs)."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.checkpoint.core import CheckpointError, ConfigMismatchError
from tianji_jax.checkpoint.io import RunCheckpointer

pytestmark = pytest.mark.timeout(300)

# 8 updates of 4 x 32 = 128 env steps, a chunk (and a checkpoint) every 2 updates = 256 env steps.
PPO = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 8,
           eval_every_env_steps=4 * 32 * 2, eval_episodes=2, normalize_observations=True, scale_rewards=True)
CHUNK_STEPS = 256
# 40 iterations of 8 env steps, chunks of 10 iterations; learning starts inside the first chunk.
DQN = dict(num_envs=4, num_steps=2, buffer_capacity=512, batch_size=16, learning_starts=48, replay_ratio=0.25,
           n_step=3, target_update_period=4, total_env_steps=8 * 40, eval_every_env_steps=8 * 10,
           eval_episodes=2, hidden_sizes=(16,), prioritized=True)
TIMING = ("wall_time_s", "sps")


class Interrupt(Exception):
    """Raised from the callback to interrupt a run after a given number of chunks."""


def interrupt_after(n: int):
    seen = []

    def callback(row):
        seen.append(row)
        if len(seen) == n:
            raise Interrupt

    return callback


def assert_trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    assert ta == tb
    for (path, x), (_, y) in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, jax.tree_util.keystr(path)
        assert np.array_equal(x, y), f"{jax.tree_util.keystr(path)} differs"


def assert_curves_equal(a, b):
    for col in tj.METRIC_COLUMNS:
        if col not in TIMING:
            np.testing.assert_array_equal(a[col], b[col], err_msg=col)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def ppo_full(tmp_path_factory):
    """The uninterrupted PPO run (4 chunks)."""
    return tj.train(tj.PPOConfig(**PPO), run_dir=tmp_path_factory.mktemp("ppo") / "full", progress=False)


# ---- exact resume ---------------------------------------------------------------------------------
def test_ppo_exact_resume(tmp_path, ppo_full):
    config = tj.PPOConfig(**PPO)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(2))
    assert len(read_csv(run_dir / "metrics.csv")) == 2
    loaded = tj.load(run_dir)
    assert loaded.step == 2 * CHUNK_STEPS and int(loaded.state.learner.version) == 4
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    # params, optimizer state (its count positions the lr schedule), keys, env states, statistics, counters
    assert_trees_equal(ppo_full.state, resumed.state)
    assert_curves_equal(ppo_full.curve, resumed.curve)
    rows = read_csv(run_dir / "metrics.csv")
    assert [int(r["env_steps"]) for r in rows] == [256, 512, 768, 1024]  # appended, no duplicate rows
    times = [float(r["wall_time_s"]) for r in rows]
    assert times == sorted(times)  # wall time continues from the checkpoint's
    assert tj.load(run_dir).meta["finished"] is True


def test_a_run_stopped_at_stop_at_return_goes_on_when_resumed_with_a_higher_one(tmp_path, ppo_full):
    """stop_at_return may change on resume: raised (or cleared), the stopped run continues from its
    last checkpoint and equals the run that never stopped; kept, it has nothing to do."""
    run_dir = tmp_path / "run"
    stopped = tj.train(tj.PPOConfig(**{**PPO, "stop_at_return": -1.0}), run_dir=run_dir, progress=False)
    assert stopped.stopped_early and list(stopped.curve["env_steps"]) == [CHUNK_STEPS]
    again = tj.train(tj.PPOConfig(**{**PPO, "stop_at_return": -1.0}), run_dir=run_dir, progress=False, resume=True)
    assert again.already_finished and again.stopped_early
    resumed = tj.train(tj.PPOConfig(**PPO), run_dir=run_dir, progress=False, resume=True)
    assert not resumed.already_finished and not resumed.stopped_early
    assert_trees_equal(ppo_full.state, resumed.state)
    assert_curves_equal(ppo_full.curve, resumed.curve)


def test_normalisation_statistics_restored_and_frozen_by_evaluation(ppo_full):
    loaded = tj.load(ppo_full.run_dir)
    assert_trees_equal(loaded.state.actor.obs_rms, ppo_full.state.actor.obs_rms)
    assert_trees_equal(loaded.state.actor.reward_scaler, ppo_full.state.actor.reward_scaler)
    before = jax.tree.map(np.array, loaded.obs_rms)
    assert float(np.asarray(before.count)) > 1  # statistics were actually collected
    ev = tj.evaluate(loaded.config, loaded.state, num_episodes=3, seed=5)
    assert ev["returns"].shape == (3,)
    assert_trees_equal(before, loaded.obs_rms)
    # the restored policy evaluates exactly as the in-memory one
    ev_mem = tj.evaluate(ppo_full.config, ppo_full.state, num_episodes=3, seed=5)
    np.testing.assert_array_equal(ev["returns"], ev_mem["returns"])


def test_resume_of_a_finished_run_returns_its_state(ppo_full):
    again = tj.train(tj.PPOConfig(**PPO), run_dir=ppo_full.run_dir, progress=False, resume=True)
    assert_trees_equal(ppo_full.state, again.state)
    assert_curves_equal(ppo_full.curve, again.curve)


@pytest.fixture(scope="module")
def dqn_full(tmp_path_factory):
    """The uninterrupted Anakin DQN run (4 chunks)."""
    return tj.train(tj.DQNConfig(**DQN), run_dir=tmp_path_factory.mktemp("dqn") / "full", progress=False)


def test_dqn_exact_resume_with_replay_and_epsilon(tmp_path, dqn_full):
    config = tj.DQNConfig(**DQN)
    full = dqn_full
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(2))
    loaded = tj.load(run_dir)
    assert loaded.meta["includes_replay"] is True
    assert int(loaded.state.actor.env_steps) == loaded.step == 160
    assert int(loaded.state.replay.size) > 0
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    assert_trees_equal(full.state, resumed.state)  # online + target params, opt state, replay, keys, counters
    assert_curves_equal(full.curve, resumed.curve)
    # epsilon continues from the schedule's value at 160 env steps, not from epsilon_start
    eps = resumed.curve["epsilon"]
    assert eps[2] < eps[1] < config.epsilon_start


def test_dqn_without_replay_loads_but_does_not_resume(tmp_path):
    config = tj.DQNConfig(**{**DQN, "total_env_steps": 8 * 20})
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(1),
                 checkpoint=tj.CheckpointConfig(checkpoint_replay=False))
    loaded = tj.load(run_dir)
    assert loaded.meta["includes_replay"] is False
    assert int(loaded.state.replay.size) == 0  # not saved: an empty buffer
    assert jax.tree.leaves(loaded.params)
    with pytest.raises(ValueError, match="replay"):
        tj.train(config, run_dir=run_dir, progress=False, resume=True)


# ---- faults ---------------------------------------------------------------------------------------
_KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import tianji_jax as tj
    config = tj.PPOConfig(**{config!r})
    seen = []
    def callback(row):
        seen.append(row)
        if len(seen) == 3:  # the save of chunk 3 has just been started (asynchronously): kill now
            os.kill(os.getpid(), signal.SIGKILL)
    tj.train(config, run_dir=sys.argv[1], progress=False, callback=callback)
""")


def test_sigkill_while_saving_resumes_from_last_complete_checkpoint(tmp_path, ppo_full):
    run_dir = tmp_path / "killed"
    script = tmp_path / "kill.py"
    script.write_text(_KILL_SCRIPT.format(config=PPO))
    proc = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stderr[-2000:]
    steps = RunCheckpointer(run_dir, read_only=True).steps()
    # at most one checkpoint interval is lost: chunk 3's save may or may not have completed
    assert steps[-1] in (2 * CHUNK_STEPS, 3 * CHUNK_STEPS), steps
    # resumed in this (fresh) process: same result as the uninterrupted run
    resumed = tj.train(tj.PPOConfig(**PPO), run_dir=run_dir, progress=False, resume=True)
    assert_trees_equal(ppo_full.state, resumed.state)
    assert_curves_equal(ppo_full.curve, resumed.curve)
    assert [int(r["env_steps"]) for r in read_csv(run_dir / "metrics.csv")] == [256, 512, 768, 1024]


def test_partial_checkpoint_directory_is_ignored(tmp_path, ppo_full):
    run_dir = tmp_path / "run"
    shutil.copytree(ppo_full.run_dir, run_dir)
    latest = RunCheckpointer(run_dir, read_only=True).latest_step()
    # what a process killed mid-save leaves: orbax's temporary directory for a newer step, half written
    partial = run_dir / "checkpoints" / f"{latest + CHUNK_STEPS}.orbax-checkpoint-tmp-1234567890"
    shutil.copytree(run_dir / "checkpoints" / str(latest), partial)
    for f in partial.rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert RunCheckpointer(run_dir, read_only=True).latest_step() == latest
    loaded = tj.load(run_dir)
    assert loaded.step == latest
    assert_trees_equal(loaded.state, ppo_full.state)


def test_not_a_checkpoint_and_corrupt_raise_clear_errors(tmp_path, ppo_full):
    with pytest.raises(CheckpointError, match="does not exist"):
        tj.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        tj.load(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="not a run directory"):  # as tj.load, not FileNotFoundError
        tj.train(run_dir=tmp_path / "empty", resume=True, progress=False)
    with pytest.raises(CheckpointError, match="is a file, not a run directory"):
        tj.load(ppo_full.run_dir / "config.json")
    no_ckpt = tmp_path / "no_ckpt"
    no_ckpt.mkdir()
    shutil.copy(ppo_full.run_dir / "config.json", no_ckpt / "config.json")
    with pytest.raises(CheckpointError, match="no checkpoints"):
        tj.load(no_ckpt)
    (no_ckpt / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        tj.load(no_ckpt)
    with pytest.raises(CheckpointError, match="no checkpoint at step 5"):
        tj.load(ppo_full.run_dir, step=5)
    # corrupt: the array files of the latest checkpoint are damaged
    corrupt = tmp_path / "corrupt"
    shutil.copytree(ppo_full.run_dir, corrupt)
    latest = RunCheckpointer(corrupt, read_only=True).latest_step()
    state_dir = corrupt / "checkpoints" / str(latest) / "state"
    for f in state_dir.rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt or unreadable"):
        tj.load(corrupt, step=latest)
    assert tj.load(corrupt).step < latest  # without a step: the newest intact one
    meta_file = corrupt / "checkpoints" / str(latest) / "meta" / "metadata"
    if meta_file.exists():
        meta_file.write_text("{not json")
        with pytest.raises(CheckpointError, match="corrupt or unreadable"):
            tj.load(corrupt, step=latest)
    with pytest.raises(CheckpointError):
        tj.train(tj.PPOConfig(**PPO), run_dir=tmp_path / "empty", resume=True, progress=False)


def test_incompatible_config_names_the_fields(ppo_full, tmp_path):
    with pytest.raises(ConfigMismatchError) as err:
        tj.train(tj.PPOConfig(**{**PPO, "gamma": 0.9, "num_envs": 8}), run_dir=ppo_full.run_dir, resume=True,
                 progress=False)
    assert "gamma: checkpoint 0.99, given 0.9" in str(err.value)
    assert "num_envs: checkpoint 4, given 8" in str(err.value)
    with pytest.raises(ConfigMismatchError, match="'ppo' run"):
        tj.train(tj.DQNConfig(**DQN), run_dir=ppo_full.run_dir, resume=True, progress=False)
    # stop_at_return may change; the finished run then just returns
    tj.train(tj.PPOConfig(**{**PPO, "stop_at_return": 1e9}), run_dir=ppo_full.run_dir, resume=True, progress=False)
    with pytest.raises(ValueError, match="run_dir"):
        tj.train(tj.PPOConfig(**PPO), resume=True)
    with pytest.raises(FileExistsError):
        tj.train(tj.PPOConfig(**PPO), run_dir=ppo_full.run_dir, progress=False)
    a_file = Path(ppo_full.run_dir) / "metrics.csv"
    with pytest.raises(NotADirectoryError, match=r"run_dir='.*metrics.csv' is a file"):
        tj.train(tj.PPOConfig(**PPO), run_dir=a_file, progress=False)


def test_package_version_mismatch_is_named():
    from tianji_jax.checkpoint.core import check_compatible

    saved = {"jax": "0.1.0", "jaxlib": "0.10.2", "flax": "0.12.8", "optax": "0.2.8", "gymnax": "1.0.1"}
    now = {**saved, "jax": "0.10.2"}
    with pytest.raises(ConfigMismatchError, match="jax: checkpoint 0.1.0, installed 0.10.2"):
        check_compatible({"a": 1}, {"a": 1}, saved, now)
    check_compatible({"a": 1}, {"a": 1}, saved, saved)


# ---- retention and intervals ----------------------------------------------------------------------
def test_keeps_latest_and_best(tmp_path):
    config = tj.PPOConfig(**{**PPO, "total_env_steps": 4 * 32 * 12, "eval_every_env_steps": 4 * 32})
    result = tj.train(config, run_dir=tmp_path / "run", progress=False,
                      checkpoint=tj.CheckpointConfig(keep_checkpoints=1, keep_best_checkpoints=1))
    steps = RunCheckpointer(tmp_path / "run", read_only=True).steps()
    env_steps = result.curve["env_steps"].astype(int)
    ev = result.curve["eval_return_mean"]
    best = int(env_steps[np.flatnonzero(ev == ev.max())[-1]])
    assert steps[-1] == config.env_steps  # the latest is never deleted for the best
    assert set(steps) == {best, config.env_steps}


def test_a_resumed_run_keeps_the_best_checkpoint_of_the_interrupted_one(tmp_path):
    """The best checkpoint saved before an interruption survives the resumed run's saves (its
    eval return is stored with it and read back when the directory is reopened)."""
    state = {"w": np.zeros(3, np.float32)}
    first = RunCheckpointer(tmp_path, keep_checkpoints=2, keep_best_checkpoints=1, async_save=False)
    for step, ret in ((1000, 50.0), (2000, 10.0), (3000, 20.0)):
        first.save(step, state, {"rows": []}, eval_return=ret)
    first.close()
    resumed = RunCheckpointer(tmp_path, keep_checkpoints=2, keep_best_checkpoints=1, async_save=False)
    resumed.save(4000, state, {"rows": []}, eval_return=30.0)
    resumed.close()
    assert RunCheckpointer(tmp_path, read_only=True).steps() == [1000, 3000, 4000]


def test_checkpoint_interval_and_sync_saving(tmp_path):
    config = tj.PPOConfig(**{**PPO, "eval_every_env_steps": 4 * 32, "eval_episodes": 0})  # 8 chunks of 128
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=tmp_path / "run", progress=False, callback=interrupt_after(3),
                 checkpoint=tj.CheckpointConfig(checkpoint_every_env_steps=300, keep_checkpoints=10,
                                                keep_best_checkpoints=0, async_checkpointing=False))
    assert RunCheckpointer(tmp_path / "run", read_only=True).steps() == [128, 384]
    tj.train(config, run_dir=tmp_path / "run", progress=False, resume=True)  # keeps the run's own settings
    # first chunk saved, then the first chunk reaching each multiple of 300, and the final one
    assert RunCheckpointer(tmp_path / "run", read_only=True).steps() == [128, 384, 640, 1024]


@pytest.mark.parametrize("changes, field", [
    (dict(checkpoint_every_env_steps=0), "checkpoint_every_env_steps"),
    (dict(keep_checkpoints=0), "keep_checkpoints"),
    (dict(keep_best_checkpoints=-1), "keep_best_checkpoints"),
    (dict(checkpoint_replay=1), "checkpoint_replay"),
])
def test_checkpoint_config_validation(changes, field):
    with pytest.raises((ValueError, TypeError), match=field):
        tj.CheckpointConfig(**changes)


# ---- async runtime ---------------------------------------------------------------------------------
# columns that depend on wall-clock timing or thread interleaving (rates, waits, per-phase seconds)
ASYNC_TIMING = TIMING + ("production_sps", "consumed_sps", "actor_wait_frac", "learner_wait_frac", "queue_depth",
                         "rollout_s", "inference_s", "env_step_s", "h2d_s", "update_s")

_RESUME_SCRIPT = textwrap.dedent("""
    import sys
    import tianji_jax as tj
    tj.train(run_dir=sys.argv[1], progress=False, resume=True)  # config read from the run directory
""")


def resume_in_fresh_process(tmp_path, run_dir, script=_RESUME_SCRIPT):
    path = tmp_path / "resume.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path), str(run_dir)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _straight_and_interrupted(config, tmp_path):
    """``(full result, run_dir, cut)``: ``config`` trained straight into ``tmp_path/full``, and
    interrupted after 2 chunks in ``tmp_path/run`` (``cut``: its checkpoint, loaded)."""
    full = tj.train(config, run_dir=tmp_path / "full", progress=False)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(2))
    return full, run_dir, tj.load(run_dir)


def test_async_sync_ppo_exact_resume_in_a_fresh_process(tmp_path):
    config = tj.PPOConfig(**{**PPO, "runtime": "async", "schedule": "sync"})
    full, run_dir, cut = _straight_and_interrupted(config, tmp_path)
    assert cut.meta["resumable"] is True and cut.step == 2 * CHUNK_STEPS
    assert int(cut.state.learner.version) == 4 and cut.meta["async_counters"]["taken"] == 2 * CHUNK_STEPS
    proc = resume_in_fresh_process(tmp_path, run_dir)
    assert "resuming the async run at policy version 4" in proc.stderr
    a, b = tj.load(tmp_path / "full"), tj.load(run_dir)
    assert b.step == config.env_steps and int(b.state.learner.version) == config.num_updates
    # learner params, optimizer state, learner key, version; actor env states, observations, key,
    # observation / reward statistics: bit for bit
    assert_trees_equal(a.state, b.state)
    assert_trees_equal(full.state, b.state)
    assert a.meta["async_counters"] == b.meta["async_counters"]  # env steps consumed, samples, drops
    rows_a, rows_b = read_csv(tmp_path / "full" / "metrics.csv"), read_csv(run_dir / "metrics.csv")
    assert [int(r["env_steps"]) for r in rows_b] == [256, 512, 768, 1024]
    for ra, rb in zip(rows_a, rows_b):  # losses, returns, evaluation, lag, limiter columns
        assert {k: v for k, v in ra.items() if k not in ASYNC_TIMING} == \
               {k: v for k, v in rb.items() if k not in ASYNC_TIMING}
    assert math.isfinite(tj.evaluate(b.config, b.state, num_episodes=2, seed=0).mean)


_DQN_RESUME_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    import tianji_jax as tj
    from tianji_jax.runtime.async_replay import AsyncReplay
    from tianji_jax.training import _async_restore
    run_dir = sys.argv[1]
    cut = tj.load(run_dir)
    dqn = AsyncReplay(cut.config, restore=_async_restore(cut))  # restore without running: check what it holds
    for got, want in [(dqn.learner_state, cut.state.learner), (dqn.replay_state, cut.state.replay),
                      (dqn._actor_states[0], cut.state.actor)]:
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert np.array_equal(np.asarray(x), np.asarray(y)) and x.dtype == y.dtype
    c, buf = cut.meta["async_counters"], dqn.runner.buffer
    assert (buf.inserted, buf.produced, buf.limiter.sampled) == (c["taken"], c["taken"] + c["dropped_stale"],
                                                                 c["sampled"])
    assert dqn.runner.store.version == int(cut.state.learner.version)
    (_, _, _, stats), _ = dqn.runner.actors[0](dqn.learner_state.params, dqn.runner.store.version)[0]
    print("EPSILON", float(stats["epsilon"]), float(dqn.agent.epsilon(buf.produced)), buf.produced)
    tj.train(run_dir=run_dir, progress=False, resume=True)
""")


def test_async_sync_dqn_exact_resume_in_a_fresh_process_with_replay_and_epsilon(tmp_path, dqn_full):
    config = tj.DQNConfig(**{**DQN, "runtime": "async", "schedule": "sync"})
    full, run_dir, cut = _straight_and_interrupted(config, tmp_path)
    assert cut.meta["includes_replay"] is True and cut.meta["resumable"] is True
    assert int(cut.state.learner.version) == 2 * config.iterations_per_chunk and int(cut.state.replay.size) > 0
    assert cut.step == cut.meta["async_counters"]["taken"] > config.learning_starts
    proc = resume_in_fresh_process(tmp_path, run_dir, _DQN_RESUME_SCRIPT)
    eps, schedule, produced = proc.stdout.split("EPSILON")[1].split()[:3]
    # the first chunk after the restore explores with the schedule's epsilon at the restored env steps
    assert float(eps) == float(schedule) < config.epsilon_start and int(produced) == cut.step
    a, b = tj.load(tmp_path / "full"), tj.load(run_dir)
    assert int(b.state.learner.version) == config.learning_iterations
    # online + target params, optimizer state, learner and actor keys, replay contents and
    # priorities, n-step window, env states, counters: bit for bit
    assert_trees_equal(a.state, b.state)
    assert_trees_equal(full.state, b.state)
    # schedule 'sync' acts chunk k with the params published after chunk k-1: Anakin's bits
    assert_trees_equal(dqn_full.state, b.state)
    assert a.meta["async_counters"] == b.meta["async_counters"]  # inserts, samples, drops, epsilon
    rows_a, rows_b = read_csv(tmp_path / "full" / "metrics.csv"), read_csv(run_dir / "metrics.csv")
    assert [r["update"] for r in rows_a] == [r["update"] for r in rows_b] == ["10", "20", "30", "34"]
    for ra, rb in zip(rows_a, rows_b):
        assert {k: v for k, v in ra.items() if k not in ASYNC_TIMING} == \
               {k: v for k, v in rb.items() if k not in ASYNC_TIMING}


def test_async_relaxed_two_actor_run_resumes_from_its_cut(tmp_path):
    """relaxed with several actors: every actor's state is saved (stacked); rollouts in flight at
    the checkpoint are counted and acted again; the resumed run completes with continuing counters."""
    config = tj.PPOConfig(**{**PPO, "runtime": "async", "schedule": "relaxed", "num_actors": 2, "eval_episodes": 0})
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(2))
    cut = tj.load(run_dir)
    counters = cut.meta["async_counters"]
    assert cut.meta["stacked_actors"] == 2 and counters["taken"] == cut.step == 2 * CHUNK_STEPS
    assert counters["in_flight"] >= 0 and counters["dropped_stale"] % config.batch_size == 0
    assert cut.state.actor.obs.shape == (config.num_envs, 4)  # load() gives actor 0 for evaluation
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    assert int(resumed.state.learner.version) == config.num_updates
    assert [int(r["env_steps"]) for r in read_csv(run_dir / "metrics.csv")] == [256, 512, 768, 1024]
    assert np.all(resumed.curve["policy_lag_max"] <= config.policy_lag_bound)
    assert np.all(np.diff(resumed.curve["dropped_stale"]) >= 0)  # cumulative across the resume
    final = tj.load(run_dir)
    assert final.meta["async_counters"]["taken"] == config.env_steps


def test_async_host_env_run_resumes_and_continues(tmp_path):
    pytest.importorskip("envpool")
    config = tj.PPOConfig(num_envs=4, num_steps=16, num_minibatches=1, update_epochs=1, total_env_steps=4 * 16 * 4,
                          eval_every_env_steps=4 * 16, eval_episodes=0, env="envpool:CartPole-v1",
                          runtime="async", schedule="sync")
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=interrupt_after(2))
    assert tj.load(run_dir).meta["has_actor"] is False
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    assert int(resumed.state.learner.version) == config.num_updates and resumed.state.actor is None
    assert [int(r["env_steps"]) for r in read_csv(run_dir / "metrics.csv")] == [64, 128, 192, 256]
    assert list(resumed.curve["update"]) == [1, 2, 3, 4]
    from tianji_jax.runtime.async_on_policy import resume_seed

    assert resume_seed(config.seed, 128) not in (config.seed, resume_seed(config.seed, 192))


def test_config_from_dict_round_trip(ppo_full):
    assert tj.load_config(ppo_full.run_dir) == tj.PPOConfig(**PPO)
    from tianji_jax.config import config_from_dict

    with pytest.raises(ValueError, match="algo"):
        config_from_dict({"algo": "a3c"})  # not registered
    with pytest.raises(ValueError, match="not fields"):
        config_from_dict({"algo": "ppo", "nonsense": 1})
    with pytest.raises(ValueError, match="environment object"):
        config_from_dict({"algo": "ppo", "env": "object:foo.Bar"})
