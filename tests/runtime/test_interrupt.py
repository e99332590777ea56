"""Ctrl-C (SIGINT) during `tianji train`: a one-line message, exit status 130, no hang, no traceback,
the rows written so far kept; async actor and learner threads are stopped."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("runtime", ["anakin", "async"])
def test_sigint_stops_training_cleanly(tmp_path, runtime):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tianji_jax.cli.commands", "train", "--runtime", runtime, "--total-env-steps", "50000000",
           "--num-envs", "4", "--num-steps", "32", "--eval-every-env-steps", "1024", "--eval-episodes", "1",
           "--run-dir", str(run_dir), "--progress", "False", "--tensorboard", "False"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 150
        metrics = run_dir / "metrics.csv"
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # header + 2 rows
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
        # threads stop within 5 s; the rest is interpreter teardown (and a checkpoint write in
        # flight): stopped, not hung (a loaded 2-core machine stretches the teardown)
        assert elapsed < 45, f"took {elapsed:.1f} s to stop after SIGINT"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    # our one-line message, and no traceback runs through tianji_jax. (orbax may log one from its own
    # save threads when the signal lands while it finalises a checkpoint, before or after our line;
    # its commit stays atomic and a resume skips an unfinished checkpoint)
    assert "tianji train: interrupted" in err, err[-3000:]
    assert f"continue the run with: tianji train --resume {run_dir}" in err, err[-3000:]  # Anakin and async
    assert "tianji_jax/" not in err, err[-3000:]
    assert len(metrics.read_text().splitlines()) >= 3


# ---- Ctrl-C before the first checkpoint --------------------------------------------------------------
TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1",
        "--total-env-steps", "128", "--eval-every-env-steps", "128", "--eval-episodes", "0",
        "--progress", "False", "--tensorboard", "False"]


def test_ctrl_c_before_the_first_checkpoint_says_so_and_the_same_command_runs_again(tmp_path, monkeypatch, capsys):
    """No false advice: nothing to resume is said as such, and the directory (config files, a
    header-only metrics.csv, an empty checkpoints/) is taken again by the same command."""
    import tianji_jax.run.host_loop
    from tianji_jax.cli.commands import main

    def interrupted(*_args, **_kwargs):  # Ctrl-C during the first compiled chunk
        raise KeyboardInterrupt

    run_dir = tmp_path / "run"
    argv = ["train", "--run-dir", str(run_dir), *TINY]
    monkeypatch.setattr(tianji_jax.run.host_loop, "run_anakin", interrupted)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "tianji train: interrupted" in err and "before the first checkpoint" in err, err
    assert "nothing to resume" in err and "run the same command again" in err, err
    assert "--resume" not in err, err
    assert (run_dir / "config.json").exists() and len((run_dir / "metrics.csv").read_text().splitlines()) == 1
    monkeypatch.undo()
    assert main(argv) == 0, capsys.readouterr().err
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 2  # header + 1 row
    assert main(argv) == 2  # now it holds a run: refused as before
    assert "already holds a run" in capsys.readouterr().err


def test_a_directory_with_rows_or_checkpoints_is_still_refused(tmp_path):
    import tianji_jax as tj
    from tianji_jax.run.run_status import check_new_run_dir, interrupt_message

    config = tj.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, total_env_steps=256)
    header = ",".join(tj.METRIC_COLUMNS) + "\n"
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "metrics.csv").write_text(header + "128" + "," * (len(tj.METRIC_COLUMNS) - 1) + "\n")
    ckpt = tmp_path / "ckpt"
    (ckpt / "checkpoints" / "128").mkdir(parents=True)
    (ckpt / "metrics.csv").write_text(header)
    plotted = tmp_path / "plotted"  # a run with what came after it: its plot, a resume's provenance
    (plotted / "checkpoints" / "128").mkdir(parents=True)
    (plotted / "plot.png").write_bytes(b"")
    (plotted / "provenance_resume_128.json").write_text("{}")
    for d in (rows, ckpt, plotted):
        with pytest.raises(FileExistsError, match="already holds a run"):
            tj.train(config, run_dir=d, progress=False)
        with pytest.raises(FileExistsError, match="already holds a run"):
            tj.train(config, run_dir=d, progress=False, profile=True)
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "metrics.csv").write_text(header)
    check_new_run_dir(empty)  # reusable: no rows, no checkpoint
    check_new_run_dir(tmp_path / "new")
    # rows but no complete checkpoint (one interrupted while being written): not resumable, not reusable
    (rows / "checkpoints" / "128.orbax-checkpoint-tmp-1").mkdir(parents=True)
    msg = interrupt_message(rows)
    assert "cannot be resumed" in msg and "new directory" in msg and "--resume" not in msg
    assert f"tianji train --resume {ckpt})" in interrupt_message(ckpt)
    # a run that cannot be resumed (learner groups, no replay in its checkpoints) says what it really kept and why
    from tianji_jax.run.run_status import resume_hint

    groups = tj.PPOConfig(runtime="async", num_learner_groups=2, num_actors=2, num_envs=4, num_steps=16,
                          total_env_steps=4096)
    msg = interrupt_message(rows, *resume_hint(groups))
    assert "keeps 1 metrics row(s);" in msg and "checkpoint" not in msg.split(";")[0]
    assert msg.endswith("it cannot be resumed: runs with learner groups cannot be resumed yet")
    assert "nothing yet (no metrics row, no checkpoint)" in interrupt_message(empty, *resume_hint(groups))
    no_replay = resume_hint(tj.DQNConfig(), tj.CheckpointConfig(checkpoint_replay=False))
    assert "checkpoint_replay=False" in interrupt_message(ckpt, *no_replay)
    # a multi-host run: the resume needs every process's launch flags
    multi = tj.DQNConfig(runtime="async", num_processes=2, coordinator="127.0.0.1:1234")
    assert (f"tianji train --resume {ckpt} --num-processes 2 --process-id I --coordinator HOST:PORT (on every "
            "process I of the job))") in interrupt_message(ckpt, *resume_hint(multi))


def test_a_directory_of_the_users_own_files_is_never_overwritten(tmp_path):
    import tianji_jax as tj

    from tianji_jax.run.run_status import check_new_run_dir

    own = tmp_path / "proj"
    own.mkdir()
    (own / "config.json").write_text('{"my_project_setting": 1}')
    with pytest.raises(FileExistsError, match=r"tianji_jax did not write \(it holds \['config.json'\]\)"):
        check_new_run_dir(own)
    (own / "config.json").unlink()
    (own / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"\['notes.txt'\]"):
        check_new_run_dir(own)
    with pytest.raises(FileExistsError):
        tj.train(tj.PPOConfig(total_env_steps=1024), run_dir=own, progress=False)
    assert (own / "notes.txt").read_text() == "mine" and sorted(p.name for p in own.iterdir()) == ["notes.txt"]
    with pytest.raises(ValueError, match="empty string"):
        tj.train(tj.PPOConfig(total_env_steps=1024), run_dir="", progress=False)


def test_a_swallowed_ctrl_c_still_stops_the_run_at_the_next_row():
    """A SIGINT whose KeyboardInterrupt is lost (raised inside a garbage-collection callback, which
    Python reports as "ignored") still stops ``tianji train``: the latch's per-row check raises it.
    The previous SIGINT handler comes back afterwards."""
    import tianji_jax as tj
    from tianji_jax.run.run_status import SigintLatch

    previous = signal.getsignal(signal.SIGINT)
    rows = []
    with SigintLatch() as latch:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # lost, as in a gc callback
        with pytest.raises(KeyboardInterrupt):
            tj.train(tj.PPOConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=256,
                                  eval_episodes=0), progress=False,
                     callback=lambda row: (rows.append(row), latch.check(row)))
    assert len(rows) == 1 and signal.getsignal(signal.SIGINT) is previous


def test_ctrl_c_inside_a_gc_callback_is_latched_without_an_ignored_traceback():
    """A SIGINT landing in a garbage-collection callback (as in JAX's ``_xla_gc_callback``) does not
    raise there -- Python would print it as "Exception ignored" with a traceback through the handler
    and drop it -- but sets the latch, whose check raises; elsewhere the handler raises at once."""
    import gc
    import sys

    from tianji_jax.run.run_status import SigintLatch

    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    fired = []

    def callback(phase, info):
        if phase == "start" and not fired:
            fired.append(phase)
            signal.raise_signal(signal.SIGINT)

    try:
        with SigintLatch() as latch:
            gc.callbacks.append(callback)
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(callback)
            assert fired and latch.hit.is_set() and not unraisable, [u.exc_value for u in unraisable]
            with pytest.raises(KeyboardInterrupt):
                latch.check()
            with pytest.raises(KeyboardInterrupt):  # outside a callback: at once
                signal.raise_signal(signal.SIGINT)
    finally:
        sys.unraisablehook = hook
