"""Device envs behind the host env API (``GymnaxHostVecEnv``, what Ray actor processes step gymnax ids
with): the host backends' next-step auto-reset reproduced exactly, checked against CartPole's own
physics; episode statistics; refusals. Budget: a few seconds (one small compilation per env)."""

from __future__ import annotations

import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.envs.gymnax_host import GymnaxHostVecEnv

TAU = 0.02  # gymnax CartPole's Euler step: x' = x + TAU * x_dot, theta' = theta + TAU * theta_dot


def _spec(env: str = "gymnax:CartPole-v1"):
    return tj.PPOConfig(env=env, total_env_steps=1024).env_spec


def _follows(prev: np.ndarray, nxt: np.ndarray) -> bool:
    """``nxt`` is one CartPole step from ``prev`` (position and angle; float32 tolerance)."""
    return bool(np.allclose(nxt[[0, 2]], prev[[0, 2]] + TAU * prev[[1, 3]], rtol=0, atol=1e-5))


def test_next_step_auto_reset_follows_the_envs_physics():
    env = _spec().make_host_env(4, seed=3)
    assert isinstance(env, GymnaxHostVecEnv) and env.batch_size == 4 and not env.is_async
    step = env.reset()
    assert not step.valid.any()
    rng = np.random.default_rng(0)
    prev, seen_done, length = step.obs.copy(), 0, np.zeros(4, int)
    after_done = np.zeros(4, bool)
    for _ in range(150):
        step = env.step(rng.integers(0, 2, 4).astype(np.int32))
        for e in range(4):
            if after_done[e]:  # the reset step: not a transition, no reward, the new episode's first obs
                assert not step.valid[e] and step.reward[e] == 0 and not step.done[e]
                assert np.all(np.abs(step.obs[e]) <= 0.05)  # gymnax CartPole's reset range
                length[e] = 0
            else:  # a transition, the episode's final one included, continues the previous obs
                assert step.valid[e] and _follows(prev[e], step.obs[e])
                np.testing.assert_array_equal(step.final_obs[e], step.obs[e])
                length[e] += 1
                if step.done[e]:
                    seen_done += 1
                    assert step.episode_length[e] == length[e] and step.episode_return[e] == length[e]
                else:
                    assert step.episode_length[e] == 0
        after_done = step.done.copy()
        prev = step.obs.copy()
    assert seen_done >= 8  # random actions end CartPole episodes in ~20 steps


def test_env_ids_in_any_order_and_bad_input():
    env = _spec().make_host_env(3, seed=0)
    with pytest.raises(RuntimeError, match=r"reset\(\) first"):
        env.step(np.zeros(3, np.int32))
    env.reset()
    a = env.step(np.array([1, 0, 1], np.int32), env_id=np.array([2, 1, 0]))
    assert a.env_id.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"Discrete\(2\) indices must lie in \[0, 2\)"):
        env.step(np.array([0, 2, 1], np.int32))
    with pytest.raises(ValueError, match=r"env_id: expected"):
        env.step(np.zeros(3, np.int32), env_id=np.array([0, 0, 1]))
    env.close()
    with pytest.raises(RuntimeError, match="is closed"):
        env.reset()


def test_box_actions_and_a_multi_discrete_env_refused():
    env = _spec("gymnax:Pendulum-v1").make_host_env(2, seed=0)
    env.reset()
    step = env.step(np.zeros((2, 1), np.float32))
    assert step.valid.all() and step.obs.shape == (2, 3)
    pytest.importorskip("jumanji")
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match=r"actor_backend='ray' is not supported with env 'jumanji:RubiksCube-v0'.*"
                                         r"MultiDiscrete.*allowed: actor_backend='threads'") as info:
        tj.PPOConfig(env="jumanji:RubiksCube-v0", runtime="async", actor_backend="ray", total_env_steps=1024)
    assert "\n" not in str(info.value)
