"""Anakin mode: compiled chunks, vmap over seeds, no recompilation, the host loop."""

import math

import jax
import numpy as np
import pytest

import tianji_jax as tj

pytestmark = pytest.mark.timeout(300)

SMALL = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 6,
             eval_every_env_steps=4 * 32 * 2, eval_episodes=3)


def test_vmapped_seeds_equal_unbatched_runs_and_differ():
    config = tj.PPOConfig(**SMALL)
    trainer = tj.make_train(config, updates_per_chunk=3)
    keys = jax.vmap(jax.random.PRNGKey)(np.arange(3, dtype=np.uint32))
    states = jax.vmap(trainer.init)(keys)
    states, metrics = jax.jit(jax.vmap(trainer.chunk))(states)
    assert metrics["policy_loss"].shape == (3, 3)
    for i in range(3):
        single, _ = trainer(trainer.init(jax.random.PRNGKey(i)))
        jax.tree.map(lambda b, s: np.testing.assert_allclose(np.asarray(b)[i], np.asarray(s), atol=1e-5),
                     states.params, single.params)
        assert int(single.update_count) == 3
    leaves = jax.tree.leaves(states.params)
    assert any(not np.allclose(np.asarray(x)[0], np.asarray(x)[1]) for x in leaves)


def test_make_train_refuses_an_async_config():
    """make_train builds Anakin only: an async config is an error naming the field, not a silent Anakin trainer."""
    with pytest.raises(ValueError, match=r"make_train builds the Anakin runtime only; got runtime='async'"):
        tj.make_train(tj.PPOConfig(**SMALL, runtime="async"))
    with pytest.raises(ValueError, match="runtime='async'"):
        tj.make_train(tj.PPOConfig(**SMALL, runtime="async", schedule="sync"), updates_per_chunk=1)
    assert isinstance(tj.make_train(tj.PPOConfig(**SMALL)), tj.PPOAnakin)


def test_chunk_metrics_have_one_entry_per_update():
    config = tj.PPOConfig(**SMALL)
    trainer = tj.make_train(config, updates_per_chunk=2)
    state, metrics = trainer(trainer.init(jax.random.PRNGKey(0)))
    for k in ("episode_return_sum", "episode_length_sum", "episode_count", "policy_loss", "value_loss",
              "entropy", "approx_kl", "clip_fraction", "grad_norm"):
        assert metrics[k].shape == (2,), k
    # CartPole: reward 1 per step, so returns summed equal lengths summed over ended episodes
    np.testing.assert_allclose(metrics["episode_return_sum"], metrics["episode_length_sum"])
    assert int(metrics["episode_count"].sum()) > 0


def test_second_train_compiles_nothing(tmp_path, compile_counter):
    config = tj.PPOConfig(**{**SMALL, "total_env_steps": 4 * 32 * 5})  # 5 updates: chunks of 2 + a tail of 1
    tj.train(config, run_dir=tmp_path / "a", progress=False)
    compile_counter.reset()
    result = tj.train(config, run_dir=tmp_path / "b", progress=False)
    assert compile_counter.count == 0
    np.testing.assert_array_equal(result.curve["env_steps"], [256, 512, 640])
    other_seed = tj.train(config.replace(seed=7, stop_at_return=1e9), progress=False)  # same compiled code
    assert compile_counter.count == 0
    assert not np.array_equal(other_seed.curve["episode_return_mean"], result.curve["episode_return_mean"])


def test_the_shorter_last_chunk_is_the_same_compiled_program():
    """5 updates in chunks of 2: the tail of 1 runs the chunk with ``active=1`` (one compilation in
    all), its inactive update changes nothing, and the rows count only active updates."""
    config = tj.PPOConfig(**{**SMALL, "total_env_steps": 4 * 32 * 5, "seed": 3})
    trainer = tj.make_train(config)
    before = trainer.chunk._cache_size()
    result = tj.train(config, progress=False)
    assert trainer.chunk._cache_size() - before <= 1 and int(result.state.update_count) == 5
    state = trainer.init(jax.random.PRNGKey(0))
    one, m = trainer.chunk(state, np.int32(1))
    ref, m_ref = tj.make_train(config, updates_per_chunk=1).chunk(state)
    jax.tree.map(np.testing.assert_array_equal, one, ref)
    assert float(m["value_loss"][1]) == 0.0 and float(m["value_loss"][0]) == float(m_ref["value_loss"][0])


def test_same_seed_same_curve_and_params():
    config = tj.PPOConfig(**SMALL)
    a = tj.train(config, progress=False)
    b = tj.train(config, progress=False)
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    np.testing.assert_array_equal(a.curve["episode_return_mean"], b.curve["episode_return_mean"])
    c = tj.train(config.replace(seed=1), progress=False)
    assert not np.array_equal(a.curve["episode_return_mean"], c.curve["episode_return_mean"])


def test_train_curve_columns_and_early_stop():
    config = tj.PPOConfig(**SMALL)
    result = tj.train(config, progress=False)
    assert set(result.curve) == set(tj.METRIC_COLUMNS)
    assert result.curve["env_steps"][-1] == config.env_steps
    assert np.all(np.diff(result.curve["wall_time_s"]) > 0)
    assert np.all(np.isfinite(result.curve["eval_return_mean"]))
    stop = tj.train(config.replace(stop_at_return=-1.0), progress=False)  # any return >= -1 stops at once
    assert stop.stopped_early and len(stop.curve["env_steps"]) == 1


def test_evaluation_is_deterministic_given_seed_and_leaves_stats_alone():
    config = tj.PPOConfig(**{**SMALL, "normalize_observations": True})
    result = tj.train(config, progress=False)
    before = jax.tree.map(np.asarray, result.state.obs_rms)
    e1 = tj.evaluate(config, result.state, num_episodes=5, seed=3)
    e2 = tj.evaluate(config, result.state, num_episodes=5, seed=3)
    np.testing.assert_array_equal(e1["returns"], e2["returns"])
    assert e1["returns"].shape == (5,) and math.isfinite(e1.mean)
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, result.state.obs_rms))
    assert float(result.state.obs_rms.count) > 1.0  # statistics were actually collected in training
    with pytest.raises(ValueError, match="num_episodes"):
        tj.evaluate(config, result.state, num_episodes=0)


def test_continuous_actions_run_and_are_clipped_for_the_env():
    config = tj.PPOConfig(**{**SMALL, "env": "gymnax:Pendulum-v1", "normalize_observations": True,
                             "scale_rewards": True})
    trainer = tj.make_train(config, updates_per_chunk=1)
    assert trainer.agent.continuous
    clipped = np.asarray(trainer.agent.env_action(np.array([[-5.0], [0.5], [9.0]], np.float32)))
    np.testing.assert_array_equal(clipped, [[-2.0], [0.5], [2.0]])
    state, metrics = trainer(trainer.init(jax.random.PRNGKey(0)))
    assert np.all(np.isfinite(np.asarray(metrics["policy_loss"])))
    assert float(state.reward_scaler.rms.count) > 1.0


@pytest.mark.parametrize("recurrent", ["none", "lstm"])
def test_log_std_init_sets_the_gaussian_policys_initial_std(recurrent):
    """``log_std_init`` (SB3's): the initial params' log std is the value given (feed-forward and
    recurrent networks); a categorical policy refuses a non-zero value in one line."""
    config = tj.PPOConfig(**{**SMALL, "env": "gymnax:Pendulum-v1", "log_std_init": -2.0, "recurrent": recurrent})
    trainer = tj.make_train(config, updates_per_chunk=1)
    params = trainer.init(jax.random.PRNGKey(0)).learner.params
    found = [np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(params)[0] if "log_std" in str(k)]
    assert len(found) == 1 and np.all(found[0] == np.float32(-2.0))
    with pytest.raises(ValueError, match=r"log_std_init=-2.0 sets a Gaussian policy's initial log std.*allowed: 0.0"):
        tj.PPOConfig(env="gymnax:CartPole-v1", log_std_init=-2.0)
    with pytest.raises(ValueError, match=r"log_std_init must be"):
        tj.PPOConfig(env="gymnax:Pendulum-v1", log_std_init=5.0)
