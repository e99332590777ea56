"""Async PPO on host env backends (envpool, gymnasium): config rules, the Sebulba actor, lag stamps."""

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.runtime.async_on_policy import AsyncOnPolicy
from tianji_jax.runtime.actors.host_actor import HostActor

pytestmark = pytest.mark.timeout(300)

SMALL = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 6,
             eval_every_env_steps=4 * 32 * 2, eval_episodes=2, runtime="async")


@pytest.mark.parametrize("kwargs, field", [
    (dict(env="envpool:CartPole-v1", runtime="anakin"), "runtime"),
    (dict(env="gymnasium:CartPole-v1", runtime="anakin"), "runtime"),
    (dict(env="gymnax:CartPole-v1", env_batch_size=2), "env_batch_size"),
    (dict(env="gymnasium:CartPole-v1", env_batch_size=2), "env_batch_size"),
    (dict(env="envpool:CartPole-v1", env_batch_size=5), "env_batch_size"),
    (dict(env="envpool:CartPole-v1", env_batch_size=0), "env_batch_size"),
    (dict(env="envpool:CartPol-v1"), "CartPole-v1"),
    (dict(env="gymnasium:NoSuchEnv-v0"), "gymnasium"),
])
def test_host_backend_config_errors_name_the_field(kwargs, field, compile_counter):
    tj.PPOConfig(**SMALL)  # reading gymnax spaces compiles a few eager ops once per process
    compile_counter.reset()
    with pytest.raises(ValueError, match=field):
        tj.PPOConfig(**{**SMALL, **kwargs})
    assert compile_counter.count == 0


def test_host_spec_reads_spaces_and_time_limit():
    spec = tj.PPOConfig(**SMALL, env="envpool:Pong-v5").env_spec
    assert spec.on_host and spec.observation_shape == (4, 84, 84) and spec.action_space.n == 6
    assert spec.max_episode_steps == 27000
    assert tj.PPOConfig(**SMALL, env="gymnasium:Acrobot-v1").env_spec.max_episode_steps == 500


@pytest.mark.parametrize("batch_size", [None, 2])
def test_host_actor_stamps_every_step_with_the_version_it_acted_with(batch_size):
    config = tj.PPOConfig(**SMALL, env="envpool:CartPole-v1", env_batch_size=batch_size)
    ppo = AsyncOnPolicy(config)
    try:
        actor: HostActor = ppo.host_actors[0]
        params = ppo.learner_state.params
        versions = [0, 0, 3, 7]
        for v in versions:
            traj, steps = actor(params, v)
            assert steps == config.batch_size
            stamps = np.asarray(traj["policy_version"])
            assert stamps.shape == (config.num_steps, config.num_envs) and (stamps == v).all()
            assert traj["obs"].devices() == {ppo.learner_device}
            done = np.asarray(traj["done"])
            obs, final = np.asarray(traj["obs"]), np.asarray(traj["final_obs"])
            # within a column, the successor of a step is the next step's obs unless the episode ended
            cont = ~done[:-1]
            assert np.allclose(final[:-1][cont], obs[1:][cont])
        # versions 0 -> 3 -> 7 changed twice: leftovers were dropped and counted, never inserted
        assert actor.chunker.transitions_in == (actor.chunker.transitions_out + actor.chunker.transitions_discarded
                                                + actor.chunker.resident)
    finally:
        ppo.close()


@pytest.mark.parametrize("env, schedule, batch", [("envpool:CartPole-v1", "sync", None),
                                                  ("envpool:CartPole-v1", "relaxed", 2),
                                                  ("gymnasium:CartPole-v1", "one_step", None)])
def test_async_ppo_runs_on_host_envs_within_the_lag_bound(tmp_path, env, schedule, batch):
    config = tj.PPOConfig(**SMALL, env=env, schedule=schedule, env_batch_size=batch)
    result = tj.train(config, run_dir=tmp_path, progress=False)
    c = result.curve
    assert c["env_steps"][-1] == config.env_steps
    assert np.all(c["policy_lag_max"] <= config.policy_lag_bound)
    assert np.all(np.isfinite(c["eval_return_mean"])) and np.all(c["eval_return_mean"] >= 8)  # CartPole >= 8
    assert np.all(c["dropped_partial"] >= 0) and (tmp_path / "final_params").is_dir()
    # per-phase timers: the rollout splits into policy inference and env stepping on host envs
    assert np.all(c["inference_s"] > 0) and np.all(c["env_step_s"] > 0)
    assert np.all(c["inference_s"] + c["env_step_s"] <= c["rollout_s"] * 1.01 + 1e-3)
    assert result.state.actor is None and result.state.obs_rms is None


def test_host_evaluate_is_deterministic_per_seed():
    config = tj.PPOConfig(**SMALL, env="envpool:CartPole-v1")
    result = tj.train(config, progress=False)
    a = tj.evaluate(config, result.state, num_episodes=3, seed=5)
    b = tj.evaluate(config, result.state, num_episodes=3, seed=5)
    np.testing.assert_array_equal(a["returns"], b["returns"])
    assert a["returns"].shape == (3,) and np.all(a["lengths"] >= 8)


def test_atari_gets_the_nature_cnn_uint8_trajectories_and_clean_evaluation_settings():
    config = tj.PPOConfig(env="envpool:Pong-v5", runtime="async", num_envs=2, num_steps=4, num_minibatches=1,
                          update_epochs=1, total_env_steps=8, eval_episodes=0)
    spec = config.env_spec
    assert spec.is_atari and not tj.PPOConfig(**SMALL, env="envpool:CartPole-v1").env_spec.is_atari
    ppo = AsyncOnPolicy(config)
    try:
        assert ppo.agent.network.torso == "nature_cnn"
        traj, _ = ppo.host_actors[0](ppo.learner_state.params, 0)
        assert traj["obs"].dtype == np.uint8 and traj["obs"].shape == (4, 2, 4, 84, 84)
        learner, metrics = ppo._learn(ppo.learner_state, traj)
        assert np.isfinite(float(metrics["value_loss"])) and int(learner.version) == 1
        train_cfg = ppo.host_actors[0].env._env.spec.config
        assert train_cfg.episodic_life and train_cfg.reward_clip
    finally:
        ppo.close()
    with spec.make_host_env(1, seed=0, evaluation=True) as env:
        assert not env._env.spec.config.episodic_life and not env._env.spec.config.reward_clip


def _collect(batch_size, chunks=3, n=4, t=16):
    """Chunks from envpool CartPole with actions a function of (env_id, step in episode) only."""
    from tianji_jax.envs.host import EnvpoolVecEnv
    from tianji_jax.runtime.actors.chunker import TrajectoryChunker

    env = EnvpoolVecEnv("CartPole-v1", n, batch_size=batch_size, seed=7, max_episode_steps=25)
    chunker = TrajectoryChunker.from_spaces(n, t, env.observation_space, env.action_space)
    elapsed = np.zeros(n, np.int64)
    out = []
    step = env.reset()
    while len(out) < chunks:
        ids = step.env_id
        elapsed[ids[~step.valid]] = 0  # a reset step starts a new episode
        action = ((ids + elapsed[ids]) % 2).astype(np.int32)
        chunker.record_action(ids, step.obs, action, np.zeros(len(ids)), np.zeros(len(ids)), 0)
        step = env.step(action, ids)
        elapsed[step.env_id[step.valid]] += 1
        chunker.record_step(step)
        while chunker.ready():
            out.append(chunker.pop())
    env.close()
    return out[:chunks]


def test_envpool_async_chunks_equal_sync_chunks_and_their_gae():
    from tianji_jax.algos.ppo import gae

    sync, asyn = _collect(None), _collect(2)
    for a, b in zip(sync, asyn):
        for k in ("obs", "action", "reward", "terminated", "truncated", "final_obs", "last_obs"):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        values = lambda c: c["obs"].sum(-1)  # noqa: E731 - any fixed function of the observation
        adv_a, _ = gae(a["reward"], values(a), a["last_obs"].sum(-1), a["final_obs"].sum(-1), a["terminated"],
                       a["truncated"], 0.99, 0.95)
        adv_b, _ = gae(b["reward"], values(b), b["last_obs"].sum(-1), b["final_obs"].sum(-1), b["terminated"],
                       b["truncated"], 0.99, 0.95)
        np.testing.assert_array_equal(np.asarray(adv_a), np.asarray(adv_b))
    assert any(c["done"].any() for c in sync)  # the chunks cross episode boundaries (25-step time limit)
