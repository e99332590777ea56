"""Anakin over several devices (``num_learner_devices = L > 1``): one run's envs sharded over the
devices, gradients averaged. Equal to the async ``sync`` schedule with ``L`` learner devices (the
same layout), to one device where the math is the same, and resumable exactly.

Tolerances: the sharded rollout is the one-device rollout partitioned by XLA (same random draws),
and the learn step is the async learner's ``shard_map``; what differs is how XLA blocks a matmul
over ``N / L`` rows instead of ``N``, so params agree to float32 rounding (measured: <= 3e-8 after
4 PPO updates, bit-identical for DQN). The bounds below are atol 1e-5 over a few updates.
"""

import json

import jax
import numpy as np
import pytest

import tianji_jax as tj
from resume_check import assert_same_leaves, full_and_resumed

pytestmark = pytest.mark.timeout(600)

ON_POLICY = dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2, total_env_steps=4 * 16 * 4,
                 eval_every_env_steps=4 * 16 * 2, eval_episodes=2)
REPLAY = dict(num_envs=4, num_steps=4, learning_starts=64, buffer_capacity=512, batch_size=16, replay_ratio=0.25,
              total_env_steps=512, eval_every_env_steps=256, eval_episodes=1)
CONFIGS = {
    "ppo": lambda: tj.PPOConfig(**ON_POLICY),
    "ppo_lstm": lambda: tj.PPOConfig(**ON_POLICY, recurrent="lstm", rnn_hidden_size=8),
    "pqn": lambda: tj.PQNConfig(**ON_POLICY),
    "dqn": lambda: tj.DQNConfig(**REPLAY, prioritized=True, dueling=True),
    "sac": lambda: tj.SACConfig(**{**REPLAY, "env": "gymnax:Pendulum-v1", "num_steps": 2, "batch_size": 32,
                                   "buffer_capacity": 1024}),
}


def _close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_anakin_on_two_devices_equals_async_sync_with_two_learner_devices(name):
    assert len(jax.devices()) == 2
    config = CONFIGS[name]().replace(num_learner_devices=2)
    anakin = tj.train(config, progress=False)
    sync = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
    _close(anakin.state.learner, sync.state.learner)
    # the envs really are split: every env-axis leaf of the actor state lives on both devices, half each
    obs = anakin.state.actor.obs
    assert len(obs.sharding.device_set) == 2 and obs.addressable_shards[0].data.shape[0] == config.num_envs // 2
    assert anakin.curve["eval_return_mean"][-1] == sync.curve["eval_return_mean"][-1]
    if name in ("dqn", "sac"):
        assert anakin.state.replay.size.shape == (2,)  # one replay shard per device
        np.testing.assert_array_equal(np.asarray(anakin.state.replay.size), np.asarray(sync.state.replay.size))


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalized"])
def test_anakin_on_two_devices_equals_one_device_where_the_math_is_the_same(normalize):
    """One minibatch per epoch: the averaged shard gradients are the full-batch gradient (advantage
    statistics are global), so two devices give one device's update; the observation statistics
    are reduced over every env of every device, as on one device."""
    config = tj.PPOConfig(**{**ON_POLICY, "num_minibatches": 1, "normalize_observations": normalize})
    one = tj.train(config, progress=False)
    two = tj.train(config.replace(num_learner_devices=2), progress=False)
    _close(one.params, two.params)
    _close(one.state.obs_rms, two.state.obs_rms)
    np.testing.assert_allclose(one.curve["episode_return_mean"], two.curve["episode_return_mean"], rtol=1e-6)


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_anakin_on_two_devices_resumes_exactly(tmp_path, name):
    config = CONFIGS[name]().replace(num_learner_devices=2)
    full, resumed = full_and_resumed(config, tmp_path)
    assert_same_leaves(full.state, resumed.state)
    assert json.loads((tmp_path / "full" / "config.json").read_text())["num_learner_devices"] == 2
    loaded = tj.load(tmp_path / "full")
    ev = tj.evaluate(loaded.config, loaded.state, num_episodes=2, seed=1)
    assert ev["returns"].shape == (2,)


def test_anakin_with_more_devices_than_exist_is_one_line_before_any_work(tmp_path):
    config = tj.PPOConfig(**{**ON_POLICY, "num_envs": 8}, num_learner_devices=4)
    with pytest.raises(ValueError, match=r"num_learner_devices=4: needs 4 devices, only 2 cpu device\(s\); "
                                         r"allowed 1\.\.2") as info:
        tj.train(config, run_dir=tmp_path / "run", progress=False)
    assert "\n" not in str(info.value) and not (tmp_path / "run").exists()


def test_sweeps_refuse_data_parallel_configs():
    with pytest.raises(ValueError, match=r"num_learner_devices=2: sweep vmaps its members on one device; "
                                         r"allowed: num_learner_devices=1"):
        tj.sweep(tj.PPOConfig(**ON_POLICY, num_learner_devices=2), {"learning_rate": [1e-3, 3e-4]})


def test_per_device_env_count_need_not_satisfy_the_run_config_rules():
    """The replay ratio must give whole updates per iteration for the run's num_envs (8 x 1 x
    0.125 = 1), not per device (4 x 0.125 = 0.5): the sharding probe is not a second config."""
    config = tj.DQNConfig(**{**REPLAY, "num_envs": 8, "replay_ratio": 0.125, "total_env_steps": 256},
                          num_learner_devices=2)
    result = tj.train(config, progress=False)
    assert int(result.state.actor.env_steps) == 256


def test_a_run_trained_on_two_devices_loads_and_evaluates_on_one(tmp_path):
    import subprocess
    import sys

    tj.train(CONFIGS["ppo"]().replace(num_learner_devices=2), run_dir=tmp_path / "run", progress=False)
    script = ("import jax; jax.config.update('jax_num_cpu_devices', 1); import tianji_jax as tj; "
              f"r = tj.load({str(tmp_path / 'run')!r}); assert len(jax.devices()) == 1; "
              "print('returns', tj.evaluate(r.config, r.state, num_episodes=2, seed=1)['returns'].shape)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "returns (2,)" in proc.stdout, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "tianji_jax.cli.commands", "eval", str(tmp_path / "run"), "--episodes", "2"],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
