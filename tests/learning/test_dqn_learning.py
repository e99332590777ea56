"""DQN learning test: the default DQNConfig (Double DQN, 3-step targets; CleanRL/PureJaxRL CartPole
settings otherwise) on gymnax CartPole-v1, seed 0, must reach a greedy evaluation return of 475
(mean of 10 episodes; the cap is 500) within 500k env steps. Threshold and budget were fixed before
the run, as the usual bar for CartPole-v1 (its gymnasium reward_threshold)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tianji_jax as tj

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

THRESHOLD = 475.0
BUDGET = 500_000


def test_dqn_default_config_solves_cartpole(tmp_path):
    config = tj.DQNConfig(env="gymnax:CartPole-v1", seed=0, total_env_steps=BUDGET, stop_at_return=THRESHOLD)
    assert config.replace(stop_at_return=None) == tj.DQNConfig()  # the defaults, nothing tuned here
    start = time.perf_counter()
    result = tj.train(config, run_dir=tmp_path / "run", progress=False)
    wall = time.perf_counter() - start
    curve = result.curve
    reached = np.flatnonzero(curve["eval_return_mean"] >= THRESHOLD)
    print(f"DQN CartPole-v1 seed 0: eval returns {np.round(curve['eval_return_mean'], 1).tolist()} at env steps "
          f"{curve['env_steps'].astype(int).tolist()}; {wall:.1f} s")
    assert reached.size > 0, f"eval_return_mean never reached {THRESHOLD} within {BUDGET} env steps"
    assert curve["env_steps"][reached[0]] <= BUDGET
    assert result.stopped_early
    # the replay ratio held once learning started, and the losses stayed finite
    learning = curve["env_steps"] > config.learning_starts + config.eval_every_env_steps
    np.testing.assert_allclose(curve["replay_ratio_observed"][learning], config.replay_ratio)
    assert np.all(np.isfinite(curve["td_loss"][learning]))


def test_async_dqn_solves_cartpole(tmp_path):
    """The async runtime: one actor thread feeding the learner's replay through the rate limiter.
    Rollouts of 8 steps per env (80 env steps per chunk, 8 updates per block: the same replay
    ratio as the default) so that thread hand-offs are not per env step; same threshold and budget."""
    config = tj.DQNConfig(env="gymnax:CartPole-v1", seed=0, total_env_steps=BUDGET, stop_at_return=THRESHOLD,
                          runtime="async", num_steps=8)
    result = tj.train(config, run_dir=tmp_path / "run", progress=False)
    curve = result.curve
    reached = np.flatnonzero(curve["eval_return_mean"] >= THRESHOLD)
    print(f"async DQN: eval returns {np.round(curve['eval_return_mean'], 1).tolist()} at env steps "
          f"{curve['env_steps'].astype(int).tolist()}; replay ratio {curve['replay_ratio_observed'].round(4).tolist()}")
    assert reached.size > 0 and curve["env_steps"][reached[0]] <= BUDGET
    assert np.all(curve["dropped_stale"] >= 0) and np.all(np.isfinite(curve["td_loss"]))
