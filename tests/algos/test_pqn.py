"""PQN (Gallici et al. 2024) as a registered algorithm: added through the on-policy agent protocol
alone (config, math and agent in ``tianji_jax/algos/pqn/``, one registry line), so Anakin, the async
runtime, evaluation, checkpoints and resume, the CLI and the capability table are the generic
ones. Its math is tested in ``test_pqn_math.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import tianji_jax as tj
from resume_check import assert_same_leaves, full_and_resumed
from tianji_jax.algos import registry

SMALL = dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2, eval_episodes=2,
             total_env_steps=4 * 64, eval_every_env_steps=128, seed=0)


def test_registered_with_its_agent_and_generic_runtime():
    algo = registry.get_algorithm("pqn")
    assert algo.data_path == "on_policy" and "pqn" in tj.algorithm_names()
    assert algo.train == "tianji_jax.run.host_on_policy:train_on_policy"  # the generic ones, not PQN's own
    assert algo.host_actor == "tianji_jax.runtime.actors.host_actor:on_policy_host_actor"
    text = tj.PQNConfig().describe()
    assert text.startswith("PQN on CartPole-v1") and "LayerNorm" in text and "lambda=0.95" in text


@pytest.mark.parametrize("kwargs, match", [
    (dict(env="gymnax:Pendulum-v1"), r"env: PQN needs a Discrete action space .*Box"),
    (dict(q_lambda=1.5), r"q_lambda must be in \[0.0, 1.0\], got 1.5"),
    (dict(epsilon_start=0.1, epsilon_finish=0.2), r"epsilon_finish must be in \[0.0, 0.1\], got 0.2"),
    (dict(epsilon_anneal_fraction=-0.1), r"epsilon_anneal_fraction must be in \[0.0, 1.0\]"),
    (dict(reward_scale=0.0), r"reward_scale must be > 0.0, got 0.0"),
    (dict(layer_norm="yes"), r"layer_norm must be a bool"),
    (dict(num_minibatches=3), r"num_minibatches=3 must divide num_envs \* num_steps"),
    (dict(env="envpool:CartPole-v1"), r"runtime='anakin': env 'envpool:CartPole-v1' runs on the host"),
])
def test_bad_configs_are_refused_in_one_line(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match) as info:
        tj.PQNConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_the_network_has_layer_norm_and_the_rollout_explores():
    config = tj.PQNConfig(**SMALL)
    trainer = tj.make_train(config, updates_per_chunk=1)
    state = trainer.init(jax.random.PRNGKey(0))
    names = {"/".join(str(getattr(k, "key", k)) for k in path) for path, _ in
             jax.tree_util.tree_flatten_with_path(state.params)[0]}
    assert any("LayerNorm" in n for n in names)
    agent = trainer.agent
    assert float(agent.epsilon(0)) == pytest.approx(1.0)
    last = config.epsilon_anneal_steps // config.global_batch_size + 1
    assert float(agent.epsilon(last)) == pytest.approx(config.epsilon_finish)
    _, traj = jax.jit(agent.rollout)(state.learner.params, jax.numpy.int32(0), state.actor)
    # epsilon 1: uniform random actions, behaviour log-prob log(1/2) everywhere
    np.testing.assert_allclose(np.asarray(traj["log_prob"]), np.log(0.5), rtol=1e-6)
    assert 0.3 < float(np.mean(np.asarray(traj["action"]))) < 0.7


def test_async_sync_equals_anakin_and_anakin_resumes_exactly(tmp_path):
    config = tj.PQNConfig(**SMALL)
    anakin = tj.train(config, progress=False)
    sync = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), anakin.params, sync.params)
    assert int(sync.state.update_count) == config.num_updates and sync.curve["policy_lag_max"].max() == 0
    np.testing.assert_array_equal(anakin.curve["td_loss"], sync.curve["td_loss"])
    # exact resume: interrupted after the first chunk, resumed, equal to the uninterrupted run
    full, resumed = full_and_resumed(config, tmp_path)
    assert_same_leaves(full.state, resumed.state)
    np.testing.assert_array_equal(full.curve["td_loss"], resumed.curve["td_loss"])
    assert np.all(np.isfinite(full.curve["td_loss"])) and np.all(np.isfinite(full.curve["epsilon"]))
    assert json.loads((tmp_path / "full" / "config.json").read_text())["algo"] == "pqn"
    loaded = tj.load(tmp_path / "full")
    assert isinstance(loaded.config, tj.PQNConfig)
    ev = tj.evaluate(loaded.config, loaded.state, num_episodes=3, seed=1)
    assert ev["returns"].shape == (3,)


def test_cli_trains_and_evaluates_pqn(tmp_path):
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "tianji_jax.cli.commands"]
    proc = subprocess.run([*cli, "train", "--algo", "pqn", "--num-envs", "4", "--num-steps", "16",
                           "--num-minibatches", "2", "--total-env-steps", "256", "--eval-every-env-steps", "128",
                           "--eval-episodes", "1", "--q-lambda", "0.9", "--run-dir", str(run), "--progress", "False"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run / "config.json").read_text())["q_lambda"] == 0.9
    proc = subprocess.run([*cli, "eval", str(run), "--episodes", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    helptext = subprocess.run([*cli, "train", "--algo", "pqn", "--help"], capture_output=True, text=True, timeout=120)
    assert "--q-lambda" in helptext.stdout and "--epsilon-anneal-fraction" in helptext.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pqn_solves_gymnax_cartpole_in_anakin():
    """Budget: 500k env steps (the paper's CartPole budget); about 3 min on 2 CPU cores."""
    config = tj.PQNConfig(seed=0, total_env_steps=500_000, eval_every_env_steps=50_000, stop_at_return=475.0)
    result = tj.train(config, progress=False)
    print(np.c_[result.curve["env_steps"], result.curve["eval_return_mean"]])
    assert result.stopped_early and result.curve["eval_return_mean"][-1] >= 475.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pqn_solves_envpool_cartpole_async_relaxed():
    """The Sebulba path with the relaxed schedule: envpool on the host, the policy on the actor
    device, lag bounded. Budget: 500k env steps."""
    config = tj.PQNConfig(env="envpool:CartPole-v1", seed=0, runtime="async", schedule="relaxed",
                          total_env_steps=500_000, eval_every_env_steps=50_000, stop_at_return=475.0)
    result = tj.train(config, progress=False)
    c = result.curve
    print(np.c_[c["env_steps"], c["eval_return_mean"], c["policy_lag_max"]])
    assert result.stopped_early and c["eval_return_mean"][-1] >= 475.0
    assert np.all(c["policy_lag_max"] <= config.policy_lag_bound)
