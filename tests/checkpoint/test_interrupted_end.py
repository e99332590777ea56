"""A run interrupted at any point of its end (the final metrics row, the final checkpoint, the
final params) leaves a directory that ``--resume`` completes, never one that claims to be done:
each point is a fault injected into a child process, which dies there with ``os._exit`` (as a
second Ctrl-C or a kill would: no clean-up runs), and the resumed run's final params equal those
of the run that was never interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import tianji_jax as tj

# 8 updates of 4 x 32 env steps, a metrics row and a checkpoint every 2 updates (256 env steps).
CONFIG = dict(env="gymnax:CartPole-v1", num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2,
              total_env_steps=4 * 32 * 8, eval_every_env_steps=4 * 32 * 2, eval_episodes=0, seed=7)
FINAL_STEP = 4 * 32 * 8

# The child: trains CONFIG into RUN_DIR and dies at POINT. Hooks wrap the library's own functions
# (and orbax's commit of a temporary directory, the rename that makes a save complete).
CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import tianji_jax as tj
    from tianji_jax.run import host_loop, run_files
    from orbax.checkpoint._src.path import atomicity

    config, run_dir, point, final = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])

    def die():
        sys.stderr.flush()
        os._exit(130)

    if point == "before_final_checkpoint":  # the last row is in metrics.csv, its checkpoint not started
        save = run_files.RunFiles.maybe_save
        def maybe_save(self, state, env_steps, extra, *, finished):
            if finished:
                die()
            return save(self, state, env_steps, extra, finished=finished)
        run_files.RunFiles.maybe_save = maybe_save
    if point in ("during_final_checkpoint", "during_final_params"):  # written, not yet committed
        target = str(final) if point == "during_final_checkpoint" else "final_params"
        commit = atomicity.AtomicRenameTemporaryPath.finalize
        async def finalize(self):
            if Path(str(self.get_final())).name == target:
                die()
            return await commit(self)
        atomicity.AtomicRenameTemporaryPath.finalize = finalize
    if point == "before_final_params":
        host_loop.save_params = lambda path, params: die()
    tj.train(tj.PPOConfig(**config), run_dir=run_dir, progress=False)
    if point != "after_final_params":
        raise SystemExit("the fault at " + point + " was never reached")
""")

POINTS = ("before_final_checkpoint", "during_final_checkpoint", "before_final_params", "during_final_params",
          "after_final_params")


def _params(run_dir: Path) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tj.load_params(run_dir))]


@pytest.mark.timeout(600)
def test_an_interrupted_end_of_a_run_is_completed_by_resume(tmp_path):
    """Budget: about 90 s (one run in this process, five children at once, five resumes and one
    through the CLI)."""
    full = tmp_path / "full"
    tj.train(tj.PPOConfig(**CONFIG), run_dir=full, progress=False)
    expected = _params(full)

    children = {p: subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(CONFIG), str(tmp_path / p), p,
                                     str(FINAL_STEP)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for p in POINTS}
    for point, child in children.items():
        out, err = child.communicate(timeout=400)
        assert child.returncode == (0 if point == "after_final_params" else 130), (point, err[-3000:])
    # a folder without its commit marker (orbax's metadata file lost after the rename)
    marker = tmp_path / "no_commit_marker"
    tj.train(tj.PPOConfig(**CONFIG), run_dir=marker, progress=False)
    (marker / "final_params" / "_CHECKPOINT_METADATA").unlink()

    checkpoints = {p: sorted(int(d.name) for d in (tmp_path / p / "checkpoints").iterdir() if d.name.isdigit())
                   for p in POINTS}
    assert checkpoints["before_final_checkpoint"][-1] < FINAL_STEP  # the faults struck where they say
    assert any(".orbax-checkpoint-tmp" in d.name for d in (tmp_path / "during_final_checkpoint" / "checkpoints").iterdir())
    assert not (tmp_path / "during_final_params" / "final_params").exists()
    assert any(d.name.startswith("final_params.orbax-checkpoint-tmp") for d in (tmp_path / "during_final_params").iterdir())

    for run in [tmp_path / p for p in POINTS[:-1]] + [marker]:
        # nothing claims to be done: the params are refused in one line that names the fix
        with pytest.raises(FileNotFoundError, match=rf"final params are (missing|incomplete).*tianji train --resume {run}$"):
            tj.load_params(run)
    for point in POINTS[:-1]:
        if point == "during_final_params":
            continue  # resumed through the CLI below
        resumed = tj.train(tj.PPOConfig(**CONFIG), run_dir=tmp_path / point, progress=False, resume=True)
        assert resumed.already_finished == point.endswith("final_params"), point
        assert all(np.array_equal(a, b) for a, b in zip(_params(tmp_path / point), expected)), point
    resumed = tj.train(tj.PPOConfig(**CONFIG), run_dir=marker, progress=False, resume=True)
    assert resumed.already_finished
    assert all(np.array_equal(a, b) for a, b in zip(_params(marker), expected))

    run = tmp_path / "during_final_params"
    cli = subprocess.run([sys.executable, "-m", "tianji_jax.cli.commands", "train", "--resume", str(run)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert cli.returncode == 0, cli.stderr[-3000:]
    said = [ln for ln in cli.stderr.splitlines() if "final params were missing or incomplete" in ln]
    assert said == [f"tianji_jax.train: the run had finished but its final params were missing or incomplete "
                    f"(interrupted while they were written); wrote them from checkpoint {FINAL_STEP} to "
                    f"{run.resolve() / 'final_params'}"], cli.stderr[-3000:]
    assert all(np.array_equal(a, b) for a, b in zip(_params(run), expected))
    # done now: a second resume has nothing to do, and says nothing of final params
    again = tj.train(tj.PPOConfig(**CONFIG), run_dir=run, progress=False, resume=True)
    assert again.already_finished
    assert all(np.array_equal(a, b) for a, b in zip(_params(tmp_path / "after_final_params"), expected))
