"""The ``torso`` field: an explicit built-in torso for every algorithm, and a user's flax torso given
as an import path (or a callable from Python) that trains, checkpoints, resumes and evaluates;
a torso whose output cannot feed the heads is refused in one line before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.config import UntrustedCodeError

TESTS = Path(__file__).resolve().parents[1]  # tests/: custom_torsos
sys.path.insert(0, str(TESTS))
import custom_torsos  # noqa: E402

MINATAR = "gymnax:Breakout-MinAtar"
SMALL_PPO = dict(env=MINATAR, num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=256,
                 eval_every_env_steps=128, eval_episodes=1, seed=0)
SMALL = {
    "ppo": (tj.PPOConfig, SMALL_PPO),
    "pqn": (tj.PQNConfig, SMALL_PPO),
    "dqn": (tj.DQNConfig, dict(env=MINATAR, num_envs=4, num_steps=4, learning_starts=64, buffer_capacity=512,
                               batch_size=16, replay_ratio=0.0625, total_env_steps=256, eval_every_env_steps=128,
                               eval_episodes=1, seed=0)),
}


def _leaf_names(params) -> set[str]:
    return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_explicit_builtin_torso_and_describe(algo):
    cls, kw = SMALL[algo]
    auto = cls(**kw)
    assert "small CNN" in auto.describe() and "(auto)" in auto.describe()
    mlp = cls(**kw, torso="mlp")
    assert "MLP" in mlp.describe() and "small CNN" not in mlp.describe()
    with pytest.raises(ValueError, match=r"torso must be one of \('auto', 'mlp', 'nature_cnn', 'small_cnn'\)"):
        cls(**kw, torso="resnet")


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_user_torso_by_import_path_trains_and_uses_its_params(algo):
    cls, kw = SMALL[algo]
    config = cls(**kw, torso="custom_torsos:two_conv")
    assert "user torso custom_torsos:two_conv" in config.describe()
    result = tj.train(config, progress=False)
    names = _leaf_names(result.state.params)
    assert any("TwoConv" in n for n in names), names
    assert np.all(np.isfinite(result.curve["eval_return_mean"]))


def test_a_callable_is_accepted_and_stored_as_its_import_path(tmp_path):
    config = tj.PPOConfig(**{**SMALL_PPO, "env": "gymnax:CartPole-v1"}, torso=custom_torsos.wide)
    result = tj.train(config, run_dir=tmp_path / "run", progress=False)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["torso"] == "custom_torsos:wide"
    with pytest.raises(UntrustedCodeError, match=r"^torso='custom_torsos:wide' names code .*trust_code=True") as info:
        tj.load(tmp_path / "run")  # a run that names code loads only with the caller's consent
    assert "\n" not in str(info.value)
    loaded = tj.load(tmp_path / "run", trust_code=True)
    assert loaded.config.torso == "custom_torsos:wide"
    for x, y in zip(jax.tree.leaves(loaded.state.params), jax.tree.leaves(result.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("torso, match", [
    ("custom_torsos:unflattened", r"torso 'custom_torsos:unflattened' returned features of shape \(2, 10, 10, 4\)"),
    ("custom_torsos:NOT_A_FACTORY", r"torso='custom_torsos:NOT_A_FACTORY' names a int, not a factory"),
    ("custom_torsos:missing", r"torso='custom_torsos:missing': cannot import it"),
    ("no_such_module_xyz:f", r"torso='no_such_module_xyz:f': cannot import it"),
])
def test_unusable_torsos_are_refused_in_one_line_before_training(torso, match):
    with pytest.raises(ValueError, match=match) as info:
        tj.train(tj.PPOConfig(**SMALL_PPO, torso=torso), progress=False)
    assert "\n" not in str(info.value)


def test_cli_trains_resumes_and_evaluates_a_user_torso(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "tianji_jax.cli.commands"]
    base = ["--env", MINATAR, "--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2",
            "--update-epochs", "1", "--eval-every-env-steps", "128", "--eval-episodes", "1", "--progress", "False",
            "--torso", "custom_torsos:two_conv"]
    first = subprocess.run([*cli, "train", *base, "--total-env-steps", "256", "--run-dir", str(run)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    # a run that names code: refused in one line naming the flag, and the module is never imported
    probe = ("import sys, tianji_jax.cli.commands as c; code = c.main(sys.argv[1:]); "
             "print('imported' if 'custom_torsos' in sys.modules else 'not imported'); sys.exit(code)")
    for argv in (["train", "--resume", str(run)], ["eval", str(run)]):
        refused = subprocess.run([sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True,
                                 timeout=300)
        assert refused.returncode == 2 and refused.stdout.strip() == "not imported", (refused.stdout, refused.stderr)
        assert refused.stderr.count("\n") == 1 and "--trust-code" in refused.stderr, refused.stderr
        assert "torso='custom_torsos:two_conv' names code" in refused.stderr, refused.stderr
    for bad, said in ((["--trust-code"], "got nothing"), (["--trust-code", "yes"], "got 'yes'")):
        wrong = subprocess.run([*cli, "train", "--resume", str(run), *bad], env=env, capture_output=True, text=True,
                               timeout=300)
        assert wrong.returncode == 2 and "--trust-code takes a value here" in wrong.stderr and said in wrong.stderr, \
            wrong.stderr
    again = subprocess.run([*cli, "train", "--resume", str(run), "--trust-code", "True"], env=env,
                           capture_output=True, text=True, timeout=300)  # a fresh process rebuilds the torso
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr[-2000:]
    ev = subprocess.run([*cli, "eval", str(run), "--episodes", "2", "--trust-code"], env=env,
                        capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert json.loads((run / "config.json").read_text())["torso"] == "custom_torsos:two_conv"


def test_a_user_torso_resumes_exactly(tmp_path):
    config = tj.PPOConfig(**{**SMALL_PPO, "total_env_steps": 512}, torso="custom_torsos:two_conv")
    from resume_check import assert_same_leaves, full_and_resumed

    full, resumed = full_and_resumed(config, tmp_path)
    assert_same_leaves(full.state, resumed.state)


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
@pytest.mark.parametrize("torso, match", [
    ("small_cnn", r"torso='small_cnn' needs image observations .* got shape \(4,\); allowed here: 'auto', 'mlp'"),
    ("nature_cnn", r"torso='nature_cnn' needs channels-first image observations .* got shape \(4,\)"),
])
def test_a_builtin_torso_that_cannot_take_the_observation_is_a_config_error(algo, torso, match):
    cls, kw = SMALL[algo]
    with pytest.raises(ValueError, match=match) as info:
        cls(**{**kw, "env": "gymnax:CartPole-v1"}, torso=torso)
    assert "\n" not in str(info.value)


def test_layer_norm_applies_to_a_user_torsos_features():
    with_ln = tj.make_train(tj.PQNConfig(**SMALL_PPO, torso="custom_torsos:wide"), 1)
    without = tj.make_train(tj.PQNConfig(**SMALL_PPO, torso="custom_torsos:wide", layer_norm=False), 1)
    names = lambda t: _leaf_names(t.init(jax.random.PRNGKey(0)).params)  # noqa: E731
    assert any("LayerNorm" in n for n in names(with_ln)) and not any("LayerNorm" in n for n in names(without))


def test_a_torso_that_drops_the_batch_axis_is_refused():
    with pytest.raises(ValueError, match=r"torso 'custom_torsos:batch_drop' returned features of shape \(1, 32\)"):
        tj.train(tj.PPOConfig(**SMALL_PPO, torso="custom_torsos:batch_drop"), progress=False)
