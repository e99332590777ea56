"""Learning tests: fixed seeds, fixed step budgets, thresholds set before the runs."""

import numpy as np
import pandas as pd
import pytest

import tianji_jax as tj

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


class _Solved(Exception):
    """Raised from the callback at the first row whose training return reaches 475: the claim is
    "475 within the budget", and the rows after the first hit cannot change it (time saved)."""


def _train_until_solved(config, run_dir):
    def stop_when_solved(row):
        if row["episode_return_mean"] >= 475:
            raise _Solved

    try:
        tj.train(config, run_dir=run_dir, progress=False, callback=stop_when_solved)
    except _Solved:
        pass


def test_ppo_default_config_solves_gymnax_cartpole(tmp_path):
    config = tj.PPOConfig(seed=0)  # the default job: gymnax CartPole-v1, 500k env steps
    assert config.env_steps <= 500_000
    tj.train(config, run_dir=tmp_path, progress=False)  # the whole budget: evaluation must reach 475 too
    df = pd.read_csv(tmp_path / "metrics.csv")
    hits = df[df["episode_return_mean"] >= 475]
    print(df[["env_steps", "episode_return_mean", "eval_return_mean"]].to_string())
    assert len(hits) > 0, "training episode_return_mean never reached 475"
    assert hits["env_steps"].iloc[0] <= 500_000
    assert (df["eval_return_mean"] >= 475).any() and df["env_steps"].max() <= 500_000


def test_ppo_solves_gymnax_pendulum_within_2m_steps():
    budget = 1_000_000
    config = tj.PPOConfig(env="gymnax:Pendulum-v1", seed=0, total_env_steps=budget, num_envs=8, num_steps=256,
                          learning_rate=3e-4, update_epochs=10, num_minibatches=32, ent_coef=0.0,
                          normalize_observations=True, scale_rewards=True, eval_every_env_steps=50_000,
                          stop_at_return=-300.0)
    result = tj.train(config, progress=False)
    curve = result.curve
    print(np.c_[curve["env_steps"], curve["eval_return_mean"]])
    assert result.stopped_early and curve["eval_return_mean"][-1] >= -300.0
    assert curve["env_steps"][-1] <= budget


@pytest.mark.parametrize("schedule", ["relaxed", "one_step"])
def test_async_ppo_solves_gymnax_cartpole(tmp_path, schedule):
    budget = 500_000
    config = tj.PPOConfig(seed=0, runtime="async", schedule=schedule, total_env_steps=budget)
    _train_until_solved(config, tmp_path)
    df = pd.read_csv(tmp_path / "metrics.csv")
    print(df[["env_steps", "episode_return_mean", "eval_return_mean", "policy_lag_max", "dropped_stale"]].to_string())
    hits = df[df["episode_return_mean"] >= 475]
    assert len(hits) > 0 and hits["env_steps"].iloc[0] <= budget
    assert (df["policy_lag_max"] <= config.policy_lag_bound).all()


def test_async_ppo_solves_envpool_cartpole(tmp_path):
    """The Sebulba path: envpool on the host, policy on the actor device, relaxed schedule."""
    budget = 500_000
    config = tj.PPOConfig(env="envpool:CartPole-v1", seed=0, runtime="async", total_env_steps=budget)
    _train_until_solved(config, tmp_path)
    df = pd.read_csv(tmp_path / "metrics.csv")
    print(df[["env_steps", "episode_return_mean", "eval_return_mean", "policy_lag_max", "dropped_partial"]].to_string())
    hits = df[df["episode_return_mean"] >= 475]
    assert len(hits) > 0 and hits["env_steps"].iloc[0] <= budget
    assert (df["policy_lag_max"] <= config.policy_lag_bound).all()
