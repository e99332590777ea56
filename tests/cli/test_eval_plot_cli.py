"""``tianji eval``, ``tianji plot``, ``tianji train --resume`` and the metric sinks (TensorBoard event
files with every metrics.csv column, the thread-safe sink, optional W&B)."""

from __future__ import annotations

import csv
import json
import math
import re
import threading

import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.cli.commands import main
from tianji_jax.run.logging import CSVLogger, MetricsSink, TensorBoardLogger
from tianji_jax.run.plotting import LAG_TITLE, RETURN_TITLE_STEPS, RETURN_TITLE_TIME, plot_runs, return_lines

pytestmark = pytest.mark.timeout(300)

SMALL = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2",
         "--total-env-steps", "512", "--eval-every-env-steps", "256", "--eval-episodes", "2",
         "--normalize-observations", "True", "--progress", "False"]


def _code(argv):
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--run-dir", str(run_dir), *SMALL]) == 0
    return run_dir


def _eval_json(capsys, argv):
    assert main(["eval", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# ---- eval -----------------------------------------------------------------------------------------
def test_eval_is_deterministic_per_seed(cli_run, capsys):
    a = _eval_json(capsys, [str(cli_run), "--episodes", "6", "--seed", "1"])
    b = _eval_json(capsys, [str(cli_run), "--episodes", "6", "--seed", "1"])
    c = _eval_json(capsys, [str(cli_run), "--episodes", "6", "--seed", "2"])
    assert a == b
    assert a["return_mean"] != c["return_mean"]  # CartPole's starts are random: another seed, other episodes
    assert a["step"] == 512 and a["episodes"] == 6 and math.isfinite(a["return_std"])
    # same numbers as the Python API on the loaded checkpoint (observation statistics restored)
    loaded = tj.load(cli_run)
    ev = tj.evaluate(loaded.config, loaded.state, num_episodes=6, seed=1)
    assert ev.mean == pytest.approx(a["return_mean"]) and ev.std == pytest.approx(a["return_std"])
    assert main(["eval", str(cli_run), "--episodes", "2"]) == 0
    assert "+-" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--episodes", "0"], "--episodes"),
    (["--seed", "-1"], "--seed"),
    (["--step", "7"], "no checkpoint at step 7"),
])
def test_eval_bad_arguments(cli_run, capsys, argv, message):
    assert _code(["eval", str(cli_run), *argv]) == 2
    assert message in capsys.readouterr().err


def test_eval_not_a_run_directory(tmp_path, capsys):
    assert _code(["eval", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert _code(["eval", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err


# ---- train --resume ---------------------------------------------------------------------------------
def test_cli_resume(cli_run, tmp_path, capsys):
    # a finished run: nothing left to do, same last row
    assert main(["train", "--resume", str(cli_run), "--progress", "False"]) == 0
    out, err = capsys.readouterr()
    ends = [ln for ln in (out + err).splitlines() if "nothing to do" in ln or "done:" in ln]
    assert ends == [ln for ln in err.splitlines() if ln.startswith("tianji_jax.train: nothing to do, the run had "
                                                                   "already finished: 512 env steps")], (out, err)
    assert len(ends) == 1  # one line, and it did not train
    # an option that changes the computation is refused, naming the field, before the run is described
    assert _code(["train", "--resume", str(cli_run), "--gamma", "0.5"]) == 2
    out, err = capsys.readouterr()
    assert "gamma: checkpoint 0.99, given 0.5" in err and err.count("\n") == 1, err
    assert out == "", out
    assert _code(["train", "--resume", str(cli_run), "--algo", "dqn"]) == 2
    assert "'ppo' run" in capsys.readouterr().err
    assert _code(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert _code(["train", "--resume", str(cli_run), "--run-dir", str(tmp_path / "other")]) == 2
    assert "differ" in capsys.readouterr().err


def test_resuming_a_finished_run_trains_nothing_and_says_so(cli_run, capsys):
    result = tj.train(run_dir=cli_run, resume=True, progress=False)
    assert result.already_finished and int(result.curve["env_steps"][-1]) == 512
    err = capsys.readouterr().err  # not a terminal here: the one summary line
    assert "tianji_jax.train: nothing to do, the run had already finished: 512 env steps" in err, err


def test_train_prints_a_summary_line_when_stderr_is_not_a_terminal(cli_run, tmp_path, capsys):
    config = tj.load_config(cli_run)  # compiled already by the fixture's run
    result = tj.train(config, run_dir=tmp_path / "run", progress=False, tensorboard=False)
    assert not result.already_finished
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("tianji_jax.train:")]
    assert len(lines) == 1, lines
    evals = result.curve["eval_return_mean"]
    assert lines[0].startswith("tianji_jax.train: done: 512 env steps in "), lines
    spent = int(result.curve["eval_env_steps"][-1])  # 2 evaluations of 2 episodes
    assert spent == int(np.sum(2 * result.curve["eval_return_mean"]))  # CartPole: return = length
    assert (f"eval return final {evals[-1]:.2f}, best {max(evals):.2f}; evaluation: {spent:,} env steps "
            f"({100 * spent / 512:.0f}% of training's); run dir {tmp_path / 'run'}") in lines[0], lines


def test_evaluate_names_a_config_that_does_not_match_the_state():
    """Shapes only (``jax.eval_shape`` states): the mismatch is found before anything is computed."""
    import jax

    ppo = tj.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, total_env_steps=256)
    dqn = tj.DQNConfig(num_envs=4, num_steps=2, buffer_capacity=512, batch_size=16, learning_starts=48,
                       replay_ratio=0.25, total_env_steps=160, eval_every_env_steps=80, hidden_sizes=(16,))
    cases = [(ppo, tj.make_train, dict(hidden_sizes=(32, 32)), r"hidden_sizes \(this config has hidden_sizes=\(32, 32\)"),
             (ppo, tj.make_train, dict(hidden_sizes=(64,)), "hidden_sizes"),
             (ppo, tj.make_train, dict(env="gymnax:Acrobot-v1"), "env=.*Acrobot"),
             (dqn, tj.make_dqn_train, dict(hidden_sizes=(8,)), "hidden_sizes"),
             (dqn, tj.make_dqn_train, dict(dueling=True), "dueling"),
             (dqn, tj.make_dqn_train, dict(env="gymnax:Acrobot-v1"), "env=.*Acrobot")]
    for config, make, change, field in cases:
        state = jax.eval_shape(make(config).init, jax.random.PRNGKey(0))
        with pytest.raises(ValueError, match="the state does not match the config") as info:
            tj.evaluate(config.replace(**change), state)
        msg = str(info.value)
        assert re.search(f"likely config field: .*{field}", msg), msg
        assert "params/" in msg and "tianji_jax.load(run_dir).config" in msg, msg
    # another data path's state: named as such, not blamed on a field
    ppo_state = jax.eval_shape(tj.make_train(ppo).init, jax.random.PRNGKey(0))
    dqn_state = jax.eval_shape(tj.make_dqn_train(dqn).init, jax.random.PRNGKey(0))
    for config, state, match in ((dqn, ppo_state, r"it is an on-policy algorithm's train state \(ppo, pqn\) and "
                                                  r"the config a DQNConfig \(a replay algorithm: dqn, sac\)"),
                                 (ppo, dqn_state, r"it is a replay algorithm's train state \(dqn, sac\) and the "
                                                  r"config a PPOConfig \(an on-policy algorithm: ppo, pqn\)")):
        with pytest.raises(ValueError, match=match) as info:
            tj.evaluate(config, state)
        assert "likely config field" not in str(info.value)


# ---- TensorBoard and the sink ------------------------------------------------------------------------
def _scalars(logdir):
    """``{tag: [(step, value), ...]}`` read straight from the event files (TFRecord framing:
    uint64 length, uint32 crc, payload, uint32 crc; payload an ``Event`` protobuf)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_tensorboard_has_every_filled_column(cli_run):
    with open(cli_run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    scalars = _scalars(cli_run / "tensorboard")
    filled = {c for c in tj.METRIC_COLUMNS if c != "env_steps" and all(r[c] != "" for r in rows)}
    assert filled and filled <= set(scalars)
    for c in filled:
        assert [s for s, _ in scalars[c]] == [int(r["env_steps"]) for r in rows], c
        np.testing.assert_allclose([v for _, v in scalars[c]], [float(r[c]) for r in rows], rtol=1e-6)


def test_sink_is_thread_safe(tmp_path):
    columns = ["env_steps", "a", "b"]
    sink = MetricsSink([CSVLogger(tmp_path / "m.csv", columns), TensorBoardLogger(tmp_path / "tb")])

    def writer(k):
        for i in range(50):
            sink.write({"env_steps": k * 1000 + i, "a": float(i), "b": math.nan})

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink.close()
    sink.close()  # idempotent
    with open(tmp_path / "m.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200 and all(r["b"] == "" for r in rows)
    assert sorted(int(r["env_steps"]) for r in rows) == sorted(k * 1000 + i for k in range(4) for i in range(50))
    with pytest.raises(RuntimeError):
        sink.write({"env_steps": 0})


def test_wandb_is_optional(tmp_path):
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install wandb"):
            tj.train(tj.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, total_env_steps=128),
                     run_dir=tmp_path / "w", wandb=True, progress=False)
    else:
        pytest.skip("wandb is installed; the missing-package path is not testable here")


# ---- plot ---------------------------------------------------------------------------------------------
def _fake_run(root, name, n=5, async_=False, seed=0):
    rng = np.random.default_rng(seed)
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"runtime": "async" if async_ else "anakin"}))
    cols = list(tj.METRIC_COLUMNS)
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for i in range(n):
            row = {"env_steps": (i + 1) * 100, "wall_time_s": 0.5 * (i + 1), "eval_return_mean": float(rng.normal()),
                   "episode_return_mean": float(rng.normal())}
            if async_:
                row.update(policy_lag_mean=float(rng.uniform(0, 2)), policy_lag_max=float(rng.integers(0, 3)),
                           production_sps=100.0)
            w.writerow(row)
    return d


@pytest.mark.parametrize("n_runs", [1, 3])
def test_plot_one_line_per_run(tmp_path, n_runs, capsys):
    runs = [_fake_run(tmp_path, f"r{i}", seed=i) for i in range(n_runs)]
    out = tmp_path / "fig" / "p.png"
    fig = plot_runs(runs, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(return_lines(fig, RETURN_TITLE_STEPS)) == n_runs
    assert len(return_lines(fig, RETURN_TITLE_TIME)) == n_runs
    assert LAG_TITLE not in [ax.get_title() for ax in fig.axes]  # no async run, no lag panel
    out2 = tmp_path / "cli.png"
    assert main(["plot", *map(str, runs), "--out", str(out2)]) == 0
    assert out2.exists() and f"wrote {out2}" in capsys.readouterr().out


def test_plot_of_a_run_without_rows_is_a_one_line_error(tmp_path, capsys):
    empty = _fake_run(tmp_path, "empty", n=0)  # metrics.csv with its header only
    full = _fake_run(tmp_path, "full")
    for runs in ([empty], [full, empty]):
        assert _code(["plot", *map(str, runs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tianji plot: error: nothing to plot") and str(empty) in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert not (runs[0] / "plot.png").exists()  # no blank figure written
    with pytest.raises(ValueError, match="has no rows yet"):
        plot_runs([empty], tmp_path / "x.png")


def test_plot_lag_histogram_for_async_runs(tmp_path):
    runs = [_fake_run(tmp_path, "sync"), _fake_run(tmp_path, "async", async_=True, seed=1)]
    fig = plot_runs(runs, tmp_path / "p.png")
    lag_ax = next(ax for ax in fig.axes if ax.get_title() == LAG_TITLE)
    assert len(lag_ax.patches) > 0  # histogram bars
    assert len(return_lines(fig)) == 2


def test_plot_real_run_and_bad_input(cli_run, tmp_path, capsys):
    fig = plot_runs([cli_run], tmp_path / "real.png")
    line = return_lines(fig)[0]
    assert list(line.get_xdata()) == [256.0, 512.0]
    assert _code(["plot", str(tmp_path / "nope")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert _code(["plot"]) == 2  # no run directory: one line, no traceback
    assert "give one or more run directories" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least one"):
        plot_runs([], tmp_path / "x.png")
    assert main(["plot", str(cli_run)]) == 0
    assert (cli_run / "plot.png").exists()


def test_train_reports_the_runs_average_rate_next_to_the_chunks(cli_run, tmp_path, capsys):
    """The progress bar shows the last chunk's ``sps`` and the run's average env steps/s over wall
    time (evaluation included); the summary line (the run's one end line, which ``tianji train``
    does not repeat) gives the same average: env_steps / wall_time_s of the last row, rounded."""
    import pandas as pd

    run_dir = tmp_path / "run"
    argv = [a if a != "False" or SMALL[i - 1] != "--progress" else "True" for i, a in enumerate(SMALL)]
    assert main(["train", "--run-dir", str(run_dir), *argv]) == 0  # compiled already by the fixture's run
    out, err = capsys.readouterr()
    last = pd.read_csv(run_dir / "metrics.csv").iloc[-1]
    average = last["env_steps"] / last["wall_time_s"]
    pattern = r"([\d,]+) env steps/s average \(wall, evaluation included\)"
    summary = re.search(r"^tianji_jax\.train: done: 512 env steps in [\d.]+ s, " + pattern + "; ", err, re.M)
    assert summary and "done:" not in out, (out, err)  # the one end line is the library's
    assert abs(int(summary.group(1).replace(",", "")) - average) <= 0.5 + 1e-6, (summary.group(0), average)
    bar = re.findall(r"chunk ([\d,]+) SPS, avg ([\d,]+) SPS \(wall, eval incl\.\)", err)
    assert bar, err
    chunk, avg = (int(x.replace(",", "")) for x in bar[-1])
    assert abs(chunk - last["sps"]) <= 0.5 + 1e-6 and abs(avg - average) <= 0.5 + 1e-6, (bar, last)
