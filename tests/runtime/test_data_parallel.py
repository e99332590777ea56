"""Data-parallel learners: the batch is sharded over a mesh, replicas stay identical, and the
update equals the single-device update where the math is the same."""

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

pytestmark = pytest.mark.timeout(300)

BASE = dict(num_envs=4, num_steps=16, total_env_steps=4 * 16 * 4, eval_every_env_steps=4 * 16 * 2, eval_episodes=0,
            runtime="async")


def _one_update(config):
    ppo = AsyncOnPolicy(config)
    state, traj = ppo._rollout(jax.device_put(ppo.learner_state.params, ppo.actor_device),
                               jax.numpy.asarray(0, jax.numpy.int32), ppo._actor_states[0])
    placed = ppo.to_learner(traj)
    new, metrics = ppo._learn(ppo.learner_state, placed)
    return ppo, placed, new, jax.device_get(metrics)


@pytest.mark.parametrize("network", [{}, {"recurrent": "lstm", "rnn_hidden_size": 8}], ids=["mlp", "lstm"])
def test_two_learners_equal_one_learner_on_the_full_batch(network):
    # one minibatch per epoch: the global gradient does not depend on how the batch is shuffled, so
    # averaging the two shards' gradients (with global advantage statistics) must give the same update
    # (a recurrent learner's shard is whole env columns with their initial carries)
    cfg = dict(BASE, update_epochs=3, num_minibatches=1, **network)
    _, _, one, m1 = _one_update(tj.PPOConfig(**cfg))
    ppo2, placed, two, m2 = _one_update(tj.PPOConfig(**cfg, num_learner_devices=2))
    assert len(ppo2.learner_devices) == 2 == len(jax.devices())
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for k in ("episode_return_sum", "episode_count", "policy_lag_max"):
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-6)
    for k in ("policy_loss", "value_loss", "entropy", "grad_norm"):
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-4, atol=1e-6)
    assert int(two.version) == 1


def test_batch_is_split_across_learner_devices_and_replicas_stay_bitwise_identical():
    ppo, placed, new, _ = _one_update(tj.PPOConfig(**BASE, update_epochs=2, num_minibatches=2,
                                                   num_learner_devices=2))
    shards = placed["obs"].addressable_shards
    assert {s.device for s in shards} == set(ppo.learner_devices)
    assert all(s.data.shape == (16, 2, 4) for s in shards)  # (T, N / 2, obs)
    assert {s.data.shape for s in placed["last_obs"].addressable_shards} == {(2, 4)}
    for leaf in jax.tree.leaves((new.params, new.opt_state)):
        datas = [np.asarray(s.data) for s in leaf.addressable_shards]
        assert len(datas) == 2 and np.array_equal(datas[0], datas[1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_learner_devices=3), "num_learner_devices=3 must divide num_envs=4"),
    (dict(num_learner_devices=2, num_learner_groups=2, num_actors=2), "num_learner_groups=2 is not supported with "
                                                                          "num_learner_devices=2"),
    (dict(num_learner_devices=0), "num_learner_devices"),
    (dict(num_learner_devices=2, num_minibatches=64), "num_minibatches=64"),
])
def test_bad_learner_device_counts_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tj.PPOConfig(**{**BASE, "num_minibatches": 2, **kwargs})


def test_more_learner_devices_than_exist_fails_before_any_thread(tmp_path):
    config = tj.PPOConfig(**{**BASE, "num_envs": 8, "num_minibatches": 1}, num_learner_devices=4)
    with pytest.raises(ValueError, match=r"num_learner_devices=4: needs 4 devices, only 2 cpu device"):
        tj.train(config, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # raised before the run directory was written (a retry works)


def test_train_with_two_learners(capsys):
    config = tj.PPOConfig(**{**BASE, "eval_episodes": 2}, update_epochs=2, num_minibatches=2, num_learner_devices=2)
    result = tj.train(config, progress=False)
    assert "2 data-parallel learners" in capsys.readouterr().err
    c = result.curve
    assert c["env_steps"][-1] == config.env_steps and np.all(c["policy_lag_max"] <= config.policy_lag_bound)
    assert np.all(np.isfinite(c["eval_return_mean"]))


@pytest.mark.parametrize("learners", [1, 2])
def test_trajectories_and_learner_state_live_on_the_learner_devices(learners):
    config = tj.PPOConfig(**BASE, update_epochs=1, num_minibatches=2, num_learner_devices=learners)
    ppo = AsyncOnPolicy(config)
    _, traj = ppo._rollout(jax.device_put(ppo.learner_state.params, ppo.actor_device),
                           jax.numpy.asarray(0, jax.numpy.int32), ppo._actor_states[0])
    placed = ppo.to_learner(traj)
    assert all(leaf.devices() == set(ppo.learner_devices) for leaf in jax.tree.leaves(placed))
    new, _ = ppo._learn(ppo.learner_state, placed)
    assert all(leaf.devices() == set(ppo.learner_devices) for leaf in jax.tree.leaves(new))
