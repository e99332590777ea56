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
    assert last.startswith("tianji_jax.checkpoint.CheckpointSaveError: checkpoint at env step 12288 could not be "
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
