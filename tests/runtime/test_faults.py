"""Faults injected on purpose while a checkpoint is being written: a full disk (a patched writer)
and the learner process killed with SIGKILL. Each: one clear line for the user, the last complete
checkpoint survives, and a resume from it finishes the run with every env step counted once."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tianji_jax as tj

_SCRIPT = textwrap.dedent("""
    import errno, sys, time
    import tianji_jax as tj
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jh
    mode, run_dir, fail_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    orig, calls = jh.JsonCheckpointHandler._save_fn, [0]
    async def patched(self, x, directory):  # the writer of each checkpoint's metadata file
        if "metrics" in str(directory):  # orbax's own metrics file (the best-N ranking): not counted
            return await orig(self, x, directory)
        calls[0] += 1
        if calls[0] == fail_at and mode.startswith("full"):
            raise OSError(errno.ENOSPC, "No space left on device", str(directory))
        if calls[0] == fail_at and mode == "slow":
            print("SAVING", flush=True)
            time.sleep(600)
        return await orig(self, x, directory)
    jh.JsonCheckpointHandler._save_fn = patched
    config = tj.PPOConfig(env="gymnax:CartPole-v1", total_env_steps=20480, num_envs=4,
                          eval_every_env_steps=4096, eval_episodes=1)
    tj.train(config, run_dir=run_dir, progress=False,
             checkpoint=tj.CheckpointConfig(async_checkpointing=mode != "full-sync"))
""")


def _run(tmp_path: Path, *args: str, **kw) -> subprocess.Popen:
    script = tmp_path / "inject.py"
    script.write_text(_SCRIPT)
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _resume_and_check(run_dir: Path) -> None:
    """Resume in this process; the finished run's rows cover every update exactly once."""
    result = tj.train(tj.PPOConfig(env="gymnax:CartPole-v1", total_env_steps=20480, num_envs=4,
                                   eval_every_env_steps=4096, eval_episodes=1),
                      run_dir=run_dir, resume=True, progress=False)
    with open(run_dir / "metrics.csv") as f:
        steps = [int(r["env_steps"]) for r in csv.DictReader(f)]
    assert steps == [4096, 8192, 12288, 16384, 20480], steps
    assert int(result.state.learner.version) * 512 == 20480


@pytest.mark.parametrize("mode", ["full-async", "full-sync"])
def test_disk_full_during_a_save_stops_with_one_line_and_resumes(tmp_path, mode):
    """Budget: about 25 s (two short runs). The third checkpoint's write fails with ENOSPC."""
    run_dir = tmp_path / "run"
    proc = _run(tmp_path, mode, str(run_dir), "3")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("tianji_jax.checkpoint.core.CheckpointSaveError: checkpoint at env step 12288 could not be "
                           "written: OSError: [Errno 28] No space left on device"), err[-2000:]
    assert f"last complete checkpoint: {run_dir.resolve() / 'checkpoints' / '8192'}" in last
    # orbax's writer threads print nothing of their own: the only traceback is the one of the raise
    assert err.count("Traceback") == 1 and "ERROR:absl" not in err, err[-3000:]
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == ["4096", "8192"]
    _resume_and_check(run_dir)


def test_learner_killed_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    """Budget: about 25 s. SIGKILL while the third checkpoint is being written (its writer is held)."""
    run_dir = tmp_path / "run"
    proc = _run(tmp_path, "slow", str(run_dir), "3")
    deadline = time.monotonic() + 240
    line = ""
    while "SAVING" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
    assert "SAVING" in line, proc.stderr.read()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "4096" in names and "8192" in names and "12288" not in names, names  # 12288 only as a tmp dir
    _resume_and_check(run_dir)


# ---- faults in the async runtime's threads -------------------------------------------------------
# For each fault: (a) what the caller sees (the exception, its message and the note naming the
# thread), (b) what survives (threads stopped, learner state and params consistent), (c) the
# counter identity in env steps: nothing produced is lost uncounted and nothing is consumed twice.
#   on-policy (TrajectoryQueue): produced == consumed + dropped_stale + resident + lost
#   replay (ReplayIngress):      produced == inserted + dropped_stale + resident + lost,
#                                and in the replay state num_inserted == size + evicted
# ``lost`` is rollouts lost to a dead remote actor (``lost_chunks``): 0 with actor threads.
# ``produced`` counts what an actor ``put`` into the buffer (after ``act`` returned); a rollout that
# raises before it acts takes no env steps, so the identities below are exact, not bounds.

import traceback as _traceback

import jax
import numpy as np

from tianji_jax.runtime.tianji.async_runtime import StallError
from tianji_jax.runtime.tianji.param_store import ParamStore

_ASYNC_PPO = dict(env="gymnax:CartPole-v1", runtime="async", num_envs=4, num_steps=32, num_minibatches=2,
                  update_epochs=2, eval_episodes=0, eval_every_env_steps=4 * 32 * 2)


class InjectedFault(Exception):
    """The fault a test injects (its own type: nothing else in the library raises it)."""


def _crash_on_call(act, n: int, label: str):
    """``act`` that raises InjectedFault on its ``n``-th call, before acting (no env step taken)."""
    calls = [0]

    def wrapped(params, version):
        calls[0] += 1
        if calls[0] == n:
            raise InjectedFault(f"injected {label} failure on rollout {n}")
        return act(params, version)
    return wrapped, calls


def _user_lines(exc: BaseException) -> list[str]:
    """What a user reads last: the exception line and its notes (format_exception_only)."""
    return "".join(_traceback.format_exception_only(exc)).strip().splitlines()


@pytest.mark.timeout(120)
def test_ppo_actor_thread_crash_reaches_the_caller_and_every_env_step_is_counted(capsys):
    """Budget: about 10 s. Two relaxed actors; actor 1 raises on its 3rd rollout."""
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

    config = tj.PPOConfig(**_ASYNC_PPO, schedule="relaxed", num_actors=2, total_env_steps=4 * 32 * 40)
    ppo = AsyncOnPolicy(config)
    runner = ppo.runner
    runner.actors[1], calls = _crash_on_call(runner.actors[1], 3, "actor 1")
    t0 = time.monotonic()
    with pytest.raises(InjectedFault) as info:
        runner.run(lambda *a: False)
    assert time.monotonic() - t0 < 60
    # (a) what the user sees: the original exception, one line, and a note naming the thread
    lines = _user_lines(info.value)
    assert len(lines) == 2 and lines[1] == "raised in tianji thread 'actor-1'"
    assert lines[0].endswith("InjectedFault: injected actor 1 failure on rollout 3")  # module-qualified name
    assert any(tb.name == "wrapped" for tb in info.traceback)  # the original frame is kept
    assert "Traceback" not in capsys.readouterr().err  # the thread printed nothing of its own
    # (b) what survives: every thread stopped; the learner stopped early at a consistent version
    assert not any(t.is_alive() for t in runner._threads)
    assert calls[0] == 3 and len(runner.actor_logs[1]) == 2
    version = runner.store.version
    assert 0 <= version < config.updates_per_group
    assert int(ppo.learner_state.version) == version  # every update consumed was published
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(ppo.learner_state.params))
    # (c) the counters: produced == consumed + dropped + resident + lost, each item counted once
    buf = runner.buffer
    assert ppo.lost_chunks == 0
    assert buf.produced == config.batch_size * sum(len(log) for log in runner.actor_logs)
    assert buf.consumed == config.batch_size * version  # one item per update, none consumed twice
    assert buf.produced == buf.consumed + buf.dropped_stale + buf.resident + ppo.lost_chunks * config.batch_size
    assert buf.limiter.inserted == buf.produced - buf.dropped_stale and buf.limiter.sampled == buf.consumed


@pytest.mark.timeout(120)
def test_dqn_actor_thread_crash_reaches_the_caller_and_every_env_step_is_counted(capsys):
    """Budget: about 10 s. Two relaxed actors into replay; actor 1 raises on its 8th chunk (late enough
    for the 64-slot replay ring to have wrapped, so eviction is part of the identity)."""
    from tianji_jax.runtime.async_replay import AsyncReplay

    config = tj.DQNConfig(env="gymnax:CartPole-v1", runtime="async", num_actors=2, num_envs=4, num_steps=4,
                          learning_starts=48, buffer_capacity=64, batch_size=16, replay_ratio=0.25,
                          total_env_steps=20_000, eval_episodes=0, eval_every_env_steps=4_000)
    dqn = AsyncReplay(config)
    runner = dqn.runner
    first_chunks: list = []  # each actor's first chunk (its n-step window starts empty); held, so ids stay unique
    taken: list = []  # every chunk the learner inserted into replay, in order (held, as above)

    def tag_first(act):
        def tagged(params, version):
            out = act(params, version)
            if not seen[0]:
                first_chunks.append(out[0])
            seen[0] += 1
            return out
        seen = [0]
        return tagged

    runner.actors[:] = [tag_first(a) for a in runner.actors]
    runner.actors[1], calls = _crash_on_call(runner.actors[1], 8, "actor 1")
    insert = runner.insert

    def recording_insert(chunks, *group):  # (chunks) or (chunks, group): as the runner calls it
        taken.extend(chunk.data for chunk in chunks)
        insert(chunks, *group)
    runner.insert = recording_insert
    t0 = time.monotonic()
    with pytest.raises(InjectedFault) as info:
        runner.run(lambda *a: False)
    assert time.monotonic() - t0 < 60
    # (a) the original exception, one line and the note naming the thread
    lines = _user_lines(info.value)
    assert len(lines) == 2 and lines[1] == "raised in tianji thread 'actor-1'"
    assert lines[0].endswith("InjectedFault: injected actor 1 failure on rollout 8")
    assert "Traceback" not in capsys.readouterr().err
    # (b) threads stopped, learner state consistent with the published version
    assert not any(t.is_alive() for t in runner._threads)
    assert calls[0] == 8 and len(runner.actor_logs[1]) == 7
    version = runner.store.version
    assert 0 < version < config.learning_iterations
    ls = jax.device_get(dqn.learner_state)
    assert int(ls.version) == version and int(ls.gradient_steps) == version * config.updates_per_step
    # (c) ingress: produced == inserted + dropped + resident + lost; no chunk inserted twice
    buf, c = runner.buffer, config.iteration_env_steps
    assert dqn.lost_chunks == 0
    assert buf.produced == c * sum(len(log) for log in runner.actor_logs)
    assert len({id(d) for d in taken}) == len(taken) and buf.inserted == c * len(taken)
    assert buf.produced == buf.inserted + buf.dropped_stale + buf.resident + dqn.lost_chunks * c
    # replay: every inserted env step becomes one n-step transition, except the first n - 1 steps
    # of each actor's stream (its window starts empty): exact, not just num_inserted <= inserted
    rs = jax.device_get(dqn.replay_state)
    lag = (config.n_step - 1) * config.num_envs
    firsts = sum(any(d is f for f in first_chunks) for d in taken)  # actors whose first chunk got in
    assert int(rs.num_inserted) == buf.inserted - lag * firsts
    evicted = max(0, int(rs.num_inserted) - config.buffer_capacity)
    assert int(rs.num_inserted) == int(rs.size) + evicted
    assert evicted > 0  # the capacity was small enough for the ring to wrap


class DroppingStore(ParamStore):
    """Fault: every publication after version ``last`` is lost (records when the first was)."""

    def __init__(self, params, last: int):
        super().__init__(params)
        self.last, self.first_lost_at = last, None

    def publish(self, params, version):
        if version <= self.last:
            return super().publish(params, version)
        if self.first_lost_at is None:
            self.first_lost_at = time.monotonic()


@pytest.mark.timeout(120)
def test_ppo_params_lost_past_the_stall_timeout_stop_the_run_naming_the_actor_and_versions():
    """Budget: about 10 s (a 1-update warm-up, k = 2 updates, a 2.25 s stall). ``sync``: the actor
    waits for params k + 1, which never arrive."""
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

    # 2.25 s: the learner notices its own stall only at 0.5 s poll steps after it took its last
    # item (2.5 s), so the actor, which waits exactly stall_timeout_s, is the one that reports
    stall, k = 2.25, 2
    config = tj.PPOConfig(**_ASYNC_PPO, schedule="sync", total_env_steps=4 * 32 * 8, stall_timeout_s=stall)
    # warm-up: one update compiles the rollout and the update (cached by compile_key, which ignores
    # stall_timeout_s), so the measured run is quick (the actor's wait for version 1 would have
    # the compile allowance anyway: async_runtime.COMPILE_ALLOWANCE_S)
    warm = AsyncOnPolicy(config.replace(stall_timeout_s=60.0))
    init = warm.learner_state.params  # version 0, the same as any new AsyncOnPolicy of this config
    warm.runner.run(lambda *a: True)
    store = DroppingStore(init, last=k)
    ppo = AsyncOnPolicy(config, store=store)
    runner = ppo.runner
    assert runner.store is store
    wait_started: dict[int, float] = {}  # when the actor began waiting for each version
    wait_params = runner._wait_params

    def timed_wait(actor_id, min_version, have):
        wait_started.setdefault(min_version, time.monotonic())
        return wait_params(actor_id, min_version, have)

    runner._wait_params = timed_wait
    with pytest.raises(StallError) as info:
        runner.run(lambda *a: False)
    waited = time.monotonic() - wait_started[k + 1]  # the actor's own wait, whatever the update took
    # (a) one line naming the waiting actor, the version it waits for and the last ones it saw
    assert _user_lines(info.value) == [
        f"tianji_jax.runtime.tianji.async_runtime.StallError: actor 0 received no params of version >= {k + 1} for "
        f"{stall:g} s; last published version {k}, last seen by this actor {k}", "raised in tianji thread 'actor-0'"]
    assert store.first_lost_at is not None  # publication k + 1 was lost
    assert stall <= waited < stall + 15.0  # bounded: stall_timeout_s of waiting, then the error (not a hang)
    # (b) threads stopped; the learner ran one update past the last publication that arrived
    assert not any(t.is_alive() for t in runner._threads)
    assert store.version == k and int(ppo.learner_state.version) == k + 1
    assert runner.actor_logs[0] == list(range(k + 1))  # sync: rollout r acted with params r
    # (c) produced == consumed + dropped + resident + lost; the actor's last rollout was consumed once
    buf = runner.buffer
    assert ppo.lost_chunks == 0
    assert buf.produced == (k + 1) * config.batch_size == buf.consumed
    assert buf.dropped_stale == 0 and buf.resident == 0
    assert buf.produced == buf.consumed + buf.dropped_stale + buf.resident + ppo.lost_chunks * config.batch_size
