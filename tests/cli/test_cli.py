"""The ``tianji`` command: exit codes and messages for bad input, ``--help`` listing every config
field, flags reaching PPOConfig, and one end-to-end run writing a complete run directory."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

import tianji_jax
import tianji_jax.training
from tianji_jax import PPOConfig
from tianji_jax.cli.commands import main

pytestmark = pytest.mark.timeout(300)

FIELDS = [f.name for f in dataclasses.fields(PPOConfig)]


def _exit_code(argv: list[str]) -> int:
    """``main``'s exit status, whether returned or raised as SystemExit (tyro's parse errors and
    ``--help`` exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


@pytest.fixture
def no_training(monkeypatch):
    """Replace the training loop: records the config ``tianji train`` would run."""
    seen = []

    def fake_train(config, *, run_dir=None, progress=None, callback=None):
        seen.append({"config": config, "run_dir": run_dir, "progress": progress})
        curve = {c: np.array([float(config.env_steps)]) for c in tianji_jax.METRIC_COLUMNS}
        return tianji_jax.TrainResult(config=config, state=None, curve=curve, run_dir=run_dir)

    monkeypatch.setattr(tianji_jax.training, "train", fake_train)
    return seen


# ---- bad input: exit status 2 and a message naming the field -------------------------------------
@pytest.mark.parametrize("args, field", [
    (["--env", "CartPol-v1"], "CartPol-v1"),
    (["--env", "gymnax:CartPol-v1"], "CartPole-v1"),  # the closest id is suggested
    (["--env", "foo:CartPole-v1"], "backend"),
    (["--gamma", "1.5"], "gamma"),
    (["--gae-lambda", "-0.1"], "gae_lambda"),
    (["--learning-rate", "0"], "learning_rate"),
    (["--learning-rate", "nan"], "learning_rate"),
    (["--num-minibatches", "3"], "num_minibatches"),
    (["--num-envs", "0"], "num_envs"),
    (["--total-env-steps", "10"], "total_env_steps"),
    (["--seed", "-1"], "seed"),
    (["--hidden-sizes", "64", "0"], "hidden_sizes"),
    (["--clip-eps", "0"], "clip_eps"),
    (["--max-grad-norm", "-1"], "max_grad_norm"),
    (["--stop-at-return", "100", "--eval-episodes", "0"], "stop_at_return"),
])
def test_bad_config_exits_2_naming_field(args, field, capsys, no_training):
    code = main(["train", *args])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("tianji train: error: ")
    assert field in err
    assert "Traceback" not in err
    assert err.count("\n") == 1  # one line
    assert no_training == []  # nothing ran


@pytest.mark.parametrize("args, line", [
    (["--algo", "dqn", "--recurrent", "lstm"], "tianji train: error: --recurrent is not an option of --algo dqn (it "
     "is one of ppo, pqn): the replay data path stores and samples single transitions; a recurrent core needs "
     "sequence replay"),
    (["--algo", "sac", "--rnn-hidden-size=64"], "--rnn-hidden-size is not an option of --algo sac (it is one of "
                                                "ppo, pqn): the replay data path"),
    (["--algo", "sac", "--clip-eps", "0.1"], "tianji train: error: --clip-eps is not an option of --algo sac (it "
                                             "is one of ppo)\n"),
    (["--algo", "pqn", "--recurrent", "gru", "--burn-in-steps", "4"], "--burn-in-steps is not an option of --algo "
                                                                      "pqn (it is one of ppo): burn-in is built"),
    (["--recurrent", "lstm", "--burn-in-steps", "1.5"], "tianji train: error: --burn-in-steps: '1.5' is not an "
                                                        "integer; allowed: whole numbers such as 2 (or 2.0)\n"),
    (["--rnn-hidden-size=abc"], "tianji train: error: --rnn-hidden-size: 'abc' is not an integer; allowed: whole "
                                "numbers such as 2 (or 2.0)\n"),
    (["--num-learner-devices", "2.5"], "tianji train: error: --num-learner-devices: '2.5' is not an integer; "
                                       "allowed: whole numbers such as 2 (or 2.0)\n"),
])
def test_another_algorithms_option_or_a_non_integer_is_one_line(args, line, capsys, no_training):
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert line in err and err.count("\n") == 1 and no_training == []


def test_unknown_command_exits_2(capsys):
    assert main(["fit", "--gamma", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'fit'" in err
    assert "train" in err


def test_no_command_exits_2_with_usage(capsys):
    assert main([]) == 2
    out = capsys.readouterr()
    assert "usage: tianji" in out.out + out.err


def test_top_level_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "train" in capsys.readouterr().out


@pytest.mark.parametrize("args, flag", [
    (["--num-envs", "abc"], "--num-envs"),
    (["--activation", "gelu"], "--activation"),
    (["--no-such-flag", "1"], "--no-such-flag"),
])
def test_unparsable_flag_exits_2(args, flag, capsys, no_training):
    assert _exit_code(["train", *args]) == 2
    assert flag in capsys.readouterr().err
    assert no_training == []


# ---- --help ---------------------------------------------------------------------------------------
def test_train_help_shows_every_config_field(capsys):
    assert _exit_code(["train", "--help"]) in (0, None)  # tyro raises SystemExit(0)
    out = capsys.readouterr().out
    missing = [f for f in FIELDS if f"--{f.replace('_', '-')}" not in out]
    assert missing == []
    for flag in ("--run-dir", "--progress", "--algo", "--runtime"):
        assert flag in out


# ---- flags reach the config ------------------------------------------------------------------------
def test_flags_reach_config(tmp_path, capsys, no_training):
    code = main(["train", "--env", "gymnax:Pendulum-v1", "--seed", "7", "--total-env-steps", "2048",
                 "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "8", "--gamma", "0.9",
                 "--hidden-sizes", "32", "16", "--activation", "relu", "--anneal-lr", "False",
                 "--stop-at-return", "-200", "--run-dir", str(tmp_path / "run"), "--progress", "False"])
    assert code == 0
    (call,) = no_training
    config = call["config"]
    assert config == PPOConfig(env="gymnax:Pendulum-v1", seed=7, total_env_steps=2048, num_envs=4,
                               num_steps=32, num_minibatches=8, gamma=0.9, hidden_sizes=(32, 16),
                               activation="relu", anneal_lr=False, stop_at_return=-200.0)
    assert str(call["run_dir"]) == str(tmp_path / "run")
    assert call["progress"] is False
    out = capsys.readouterr().out
    assert config.describe() in out


def test_whole_float_values_of_int_flags_are_accepted(capsys, no_training):
    """``--total-env-steps 1e6`` is what users write: a whole float of an int option is its int
    (both ``--flag X`` and ``--flag=X``, PPO and DQN); ``1.5`` is still refused."""
    assert main(["train", "--total-env-steps", "1e6", "--eval-every-env-steps=2.5e4", "--num-envs", "8.0",
                 "--progress", "False"]) == 0
    assert no_training[-1]["config"] == PPOConfig(total_env_steps=1_000_000, eval_every_env_steps=25_000)
    assert main(["train", "--algo", "dqn", "--total-env-steps", "2e5", "--learning-starts", "1e4",
                 "--progress", "False"]) == 0
    assert no_training[-1]["config"] == tianji_jax.DQNConfig(total_env_steps=200_000, learning_starts=10_000)
    capsys.readouterr()
    assert _exit_code(["train", "--num-envs", "1.5"]) == 2
    assert "--num-envs" in capsys.readouterr().err
    assert len(no_training) == 2


def test_defaults_match_python_api(no_training):
    assert main(["train", "--progress", "False"]) == 0
    (call,) = no_training
    assert call["config"] == PPOConfig()
    assert call["run_dir"] is not None and "CartPole-v1" in str(call["run_dir"])


# ---- end to end -----------------------------------------------------------------------------------
def test_end_to_end_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tianji_jax.cli.commands", "train", "--env", "gymnax:CartPole-v1",
           "--total-env-steps", "4096", "--eval-every-env-steps", "2048", "--run-dir", str(run_dir),
           "--progress", "False"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one end line, the library's (stderr), none of the CLI's own
    ends = [ln for ln in proc.stderr.splitlines() + proc.stdout.splitlines() if "done: " in ln]
    assert len(ends) == 1 and ends[0].startswith("tianji_jax.train: done: 4096 env steps"), proc.stderr[-2000:]
    assert f"run directory: {run_dir}" in proc.stdout

    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "gymnax:CartPole-v1"
    assert config["total_env_steps"] == 4096
    assert config["derived"]["num_updates"] == 4  # 4096 // (8 envs * 128 steps)
    assert config["derived"]["batch_size"] == 1024
    assert config["derived"]["env_steps"] == 4096
    assert config["derived"]["updates_per_chunk"] == 2
    assert set(FIELDS) <= set(config)

    prov = json.loads((run_dir / "provenance.json").read_text())
    for key in ("packages", "command_line", "devices", "xla_flags"):
        assert key in prov, key
    assert prov["packages"]["jax"] == jax.__version__
    assert prov["packages"]["tianji-jax"] == tianji_jax.__version__
    assert "train" in prov["command_line"] and "--total-env-steps" in prov["command_line"]
    assert isinstance(prov["devices"], list) and len(prov["devices"]) >= 1
    assert isinstance(prov["xla_flags"], str)

    with open(run_dir / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames
        rows = list(reader)
    for col in ("env_steps", "wall_time_s", "episode_return_mean", "eval_return_mean"):
        assert col in columns, col
    assert len(rows) == 2
    assert [int(float(r["env_steps"])) for r in rows] == [2048, 4096]
    times = [float(r["wall_time_s"]) for r in rows]
    assert 0 < times[0] < times[1]
    for r in rows:
        assert math.isfinite(float(r["episode_return_mean"]))  # CartPole episodes end within 2048 steps
        ret = float(r["eval_return_mean"])
        assert 1 <= ret <= 500  # CartPole returns lie in [1, 500]

    params = tianji_jax.load_params(run_dir / "final_params")
    leaves = jax.tree_util.tree_leaves(params)
    assert leaves
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in leaves)
    shapes = {tuple(np.shape(leaf)) for leaf in leaves}
    assert (4, 64) in shapes  # first layer: CartPole obs (4,) -> 64 hidden units


def test_cpu_devices_follow_the_flags_whole_floats_and_a_resumed_run(tmp_path, monkeypatch):
    """The CLI sizes the CPU platform from --num-learner-devices x --num-learner-groups + 1 (also
    written 2.0), and on --resume from the run's config.json, so a resumed data-parallel run gets
    its learners off the actors' device again."""
    import json

    import jax

    from tianji_jax.cli import commands as cli

    asked: list = []
    monkeypatch.setattr(jax.config, "update", lambda name, value: asked.append((name, value)))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"num_learner_devices": 2, "num_learner_groups": 1}))
    for argv, want in [(["train", "--num-learner-devices", "2.0"], 3),
                       (["train", "--num-learner-groups=3"], 4),
                       (["train", "--resume", str(tmp_path)], 3),
                       (["train", "--resume", str(tmp_path), "--num-learner-devices", "1"], 2),
                       (["train", "--num-learner-devices", "two"], 2)]:
        asked.clear()
        cli._two_cpu_devices(argv)
        assert asked == [("jax_num_cpu_devices", want)], argv


def test_num_processes_for_an_algorithm_without_multi_host_learners_is_one_line(capsys, monkeypatch):
    """A registered algorithm whose config has no multi-host fields (every built-in one has them)."""
    import dataclasses

    from tianji_jax.algos import registry
    from tianji_jax.cli.commands import main

    @dataclasses.dataclass(frozen=True)
    class NoMultiHost:
        seed: int = 0

    real = registry.get_algorithm
    monkeypatch.setattr(registry, "get_algorithm", lambda name: (
        dataclasses.replace(real("dqn"), config=NoMultiHost) if name == "dqn" else real(name)))
    assert main(["train", "--algo", "dqn", "--num-processes", "2", "--coordinator", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tianji train: error: --num-processes: --algo dqn has no multi-host learners yet (the capability "
                   "table, docs/concepts/capabilities.md); allowed: leave --num-processes out (one process)"]


def test_num_processes_for_dqn_reaches_the_config_check(capsys):
    """DQN has multi-host learners on the async runtime: with the default runtime the config names it."""
    from tianji_jax.cli.commands import main

    assert main(["train", "--algo", "dqn", "--num-processes", "2", "--coordinator", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_processes=2 needs runtime='async'" in err[0], err


# ---- bad values of choice flags (Literal and bool fields): one line, not tyro's box ---------------
@pytest.mark.parametrize("args, line", [
    (["--algo", "dqn", "--distributional", "foo"], "--distributional: 'foo' is not one of 'none', 'c51', 'qr'"),
    (["--algo", "dqn", "--epsilon-schedule=exp"], "--epsilon-schedule: 'exp' is not one of 'linear', 'apex'"),
    (["--algo", "dqn", "--double_q", "maybe"], "--double-q: 'maybe' is not one of 'True', 'False'"),
    (["--algo", "sac", "--autotune", "maybe"], "--autotune: 'maybe' is not one of 'True', 'False'"),
    (["--algo", "pqn", "--activation", "gelu"], "--activation: 'gelu' is not one of 'tanh', 'relu'"),
    (["--algo", "pqn", "--layer-norm", "yes"], "--layer-norm: 'yes' is not one of 'True', 'False'"),
    (["--activation", "gelu"], "--activation: 'gelu' is not one of 'tanh', 'relu'"),
    (["--recurrent", "rnn"], "--recurrent: 'rnn' is not one of 'none', 'lstm', 'gru'"),
    (["--advantage-estimator", "td"], "--advantage-estimator: 'td' is not one of 'gae', 'vtrace'"),
    (["--normalize-observations", "true"], "--normalize-observations: 'true' is not one of 'True', 'False'"),
    (["--progress=1"], "--progress: '1' is not one of 'True', 'False'"),  # a run option
    (["--async-checkpointing", "no"], "--async-checkpointing: 'no' is not one of 'True', 'False'"),  # checkpoint
    (["--algo", "dqn", "--distributional"], "--distributional: no value given; allowed: one of 'none', 'c51', 'qr'"),
    (["--anneal-lr", "--gamma", "0.9"], "--anneal-lr: no value given; allowed: one of 'True', 'False'"),
])
def test_bad_choice_values_exit_2_in_one_line(args, line, capsys, no_training):
    assert _exit_code(["train", *args]) == 2
    err = capsys.readouterr().err
    assert err == f"tianji train: error: {line}\n"
    assert no_training == []


def test_good_choice_values_still_parse(tmp_path, capsys, no_training):
    assert main(["train", "--algo", "dqn", "--distributional", "qr", "--double_q=False", "--epsilon-schedule=apex",
                 "--progress", "False", "--run-dir", str(tmp_path / "dqn")]) == 0
    assert no_training[-1]["config"] == tianji_jax.DQNConfig(distributional="qr", double_q=False,
                                                            epsilon_schedule="apex")
    assert main(["train", "--algo", "sac", "--autotune", "False", "--progress=False",
                 "--run-dir", str(tmp_path / "sac")]) == 0
    assert no_training[-1]["config"].autotune is False
    assert len(no_training) == 2


def test_choice_flags_come_from_the_field_types():
    from tianji_jax.cli.commands import _args_type
    from tianji_jax.cli.argv import choice_flags

    dqn = choice_flags(_args_type("dqn"))
    assert dqn["--distributional"] == ("--distributional", "distributional", ("none", "c51", "qr"))
    assert dqn["--double_q"] == dqn["--double-q"] == ("--double-q", "double_q", ("True", "False"))
    assert "--progress" in dqn and "--async-checkpointing" in dqn  # run options and the checkpoint's fields
    assert "--gamma" not in dqn and "--env" not in dqn and "--num-envs" not in dqn  # not choices
    assert choice_flags(_args_type("sac"))["--autotune"][2] == ("True", "False")


def test_a_multi_host_resume_with_another_process_count_is_one_line(tmp_path, capsys, no_training):
    """Resuming a two-process run with --num-processes 1 names the run's process count (not the
    stored coordinator, which the user never typed)."""
    import json

    config = tianji_jax.DQNConfig(runtime="async", num_processes=2, coordinator="127.0.0.1:1234")
    (tmp_path / "config.json").write_text(json.dumps({**config.to_dict(), "algo": "dqn"}))
    assert main(["train", "--resume", str(tmp_path), "--num-processes", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (f"tianji train: error: --num-processes 1: the run in {str(tmp_path)!r} ran with num_processes=2; "
                   "a resume relaunches the same number of processes (allowed: --num-processes 2)\n")
    assert no_training == []


def test_the_summary_line_says_what_is_missing_instead_of_nan():
    """The run's one end line without evaluation: the last training return, or words where no
    training episode ended (never ``nan``)."""
    from types import SimpleNamespace

    from tianji_jax.run.run_status import summary_line

    nan = float("nan")

    def line(train):
        curve = {"env_steps": [512], "wall_time_s": [2.0], "episode_return_mean": [train], "eval_return_mean": [nan]}
        return summary_line(SimpleNamespace(curve=curve, run_dir=None, stopped_early=False))

    assert "no evaluation; training episode return 44.24; no run dir" in line(44.236)
    assert "no evaluation; no training episode ended; no run dir" in line(nan)
    assert "nan" not in line(nan)
