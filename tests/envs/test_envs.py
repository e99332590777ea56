"""The env layer: spaces, resolution, GymnaxVecEnv auto-reset, terminated/truncated, episode
statistics and action checks, all under jit; plus training on a user's own gymnax env object."""

from __future__ import annotations

from typing import Any

import gymnax.environments.spaces as gspaces
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment

import tianji_jax
from tianji_jax import PPOConfig
from tianji_jax.envs import Box, Discrete, GymnaxVecEnv, Timestep, VecEnvState, resolve_env

pytestmark = pytest.mark.timeout(300)


# ---- a tiny hand-checkable gymnax env ------------------------------------------------------------
@struct.dataclass
class CounterState(environment.EnvState):
    count: jax.Array
    time: jax.Array


@struct.dataclass
class CounterParams(environment.EnvParams):
    max_steps_in_episode: int = 5


class CounterEnv(environment.Environment[CounterState, CounterParams]):
    """Actions 0, 1, 2. Reward = action; ``count`` sums the actions; action 2 terminates.

    Observation ``[count, time]`` (float32), so the reset observation is ``[0, 0]`` and the true
    last observation of an episode is distinguishable from it. The time limit is 5 steps.
    """

    @property
    def default_params(self) -> CounterParams:
        return CounterParams()

    def step_env(self, key, state, action, params):
        new = CounterState(count=state.count + action, time=state.time + 1)
        reward = action.astype(jnp.float32)
        terminated = action == 2
        return self.get_obs(new), new, reward, terminated, {}

    def reset_env(self, key, params):
        state = CounterState(count=jnp.int32(0), time=jnp.int32(0))
        return self.get_obs(state), state

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.count, state.time]).astype(jnp.float32)

    def action_space(self, params=None):
        return gspaces.Discrete(3)

    def observation_space(self, params):
        return gspaces.Box(0.0, 100.0, (2,), jnp.float32)


class IntRewardShape1Env(CounterEnv):
    """Returns an int32 reward shaped (1,) instead of a float scalar."""

    def step_env(self, key, state, action, params):
        obs, new, reward, terminated, info = super().step_env(key, state, action, params)
        return obs, new, jnp.reshape(action, (1,)).astype(jnp.int32), terminated, info


class TwoRewardsEnv(CounterEnv):
    """Returns two rewards per step: not one number per env."""

    def step_env(self, key, state, action, params):
        obs, new, reward, terminated, info = super().step_env(key, state, action, params)
        return obs, new, jnp.stack([reward, reward]), terminated, info


def _vec(env: Any, num_envs: int) -> GymnaxVecEnv:
    return GymnaxVecEnv(resolve_env(env), num_envs)


def _rollout(venv: GymnaxVecEnv, actions: np.ndarray, seed: int = 0):
    """Reset, then step through ``actions`` (T, N, ...) in one jitted scan. Returns
    ``(reset_obs, stacked Timestep, final VecEnvState)``."""

    @jax.jit
    def run(key, actions):
        state, obs = venv.reset(key)

        def body(carry, inp):
            state, key = carry
            key, sub = jax.random.split(key)
            state, ts = venv.step(sub, state, inp)
            return (state, key), ts

        (state, _), ts = jax.lax.scan(body, (state, key), actions)
        return obs, ts, state

    return jax.device_get(run(jax.random.PRNGKey(seed), jnp.asarray(actions)))


# ---- spaces and resolution -----------------------------------------------------------------------
def test_cartpole_spaces():
    spec = resolve_env("gymnax:CartPole-v1")
    assert spec.backend == "gymnax" and spec.name == "CartPole-v1"
    assert spec.action_space == Discrete(2)
    assert isinstance(spec.observation_space, Box)
    assert spec.observation_space.shape == (4,)
    assert np.dtype(spec.observation_space.dtype) == np.float32
    assert spec.observation_shape == (4,)
    assert spec.action_kind == "discrete"
    assert spec.max_episode_steps == 500
    venv = GymnaxVecEnv(spec, 3)
    assert venv.action_space == Discrete(2) and venv.observation_space == spec.observation_space
    assert venv.num_envs == 3


def test_pendulum_spaces():
    spec = resolve_env("gymnax:Pendulum-v1")
    box = spec.action_space
    assert isinstance(box, Box)
    assert box.shape == (1,)
    np.testing.assert_array_equal(box.low, [-2.0])
    np.testing.assert_array_equal(box.high, [2.0])
    assert repr(box) == "Box((1,), float32, [-2, 2])"
    assert spec.observation_space.shape == (3,)
    assert spec.action_kind == "continuous"


def test_bare_id_resolves_like_gymnax_prefix():
    a, b = resolve_env("CartPole-v1"), resolve_env("gymnax:CartPole-v1")
    assert (a.backend, a.name, a.action_space, a.observation_space) == (
        b.backend, b.name, b.action_space, b.observation_space)


def test_user_env_object_resolves():
    env = CounterEnv()
    spec = resolve_env(env)
    assert spec.env is env
    assert spec.name == "CounterEnv"
    assert spec.action_space == Discrete(3)
    assert spec.observation_space == Box((2,), np.float32, np.zeros(2), np.full(2, 100.0))
    assert spec.max_episode_steps == 5


def test_box_equality_and_hash():
    a = Box((2,), np.float32, np.zeros(2), np.ones(2))
    assert a == Box((2,), np.float32, np.zeros(2), np.ones(2))
    assert a != Box((2,), np.float32, np.zeros(2), np.full(2, 2.0))
    assert a != Box((2,), np.float64, np.zeros(2), np.ones(2))
    assert a != Discrete(2)
    assert hash(a) == hash(Box((2,), np.float32, np.zeros(2), np.ones(2)))
    assert Discrete(2) != Discrete(3)


@pytest.mark.parametrize("env, pattern", [
    ("gymnax:CartPol-v1", "CartPole-v1"),
    ("foo:CartPole-v1", "unknown backend 'foo'"),
    (object(), "not a gymnax-style"),
])
def test_resolve_env_errors(env, pattern):
    with pytest.raises(ValueError, match=pattern):
        resolve_env(env)


def test_num_envs_must_be_positive():
    with pytest.raises(ValueError, match="num_envs"):
        GymnaxVecEnv(resolve_env(CounterEnv()), 0)


# ---- stepping: shapes and dtypes -----------------------------------------------------------------
def test_cartpole_step_shapes_under_jit():
    venv = _vec("gymnax:CartPole-v1", 4)
    reset = jax.jit(venv.reset)
    step = jax.jit(venv.step)
    state, obs = reset(jax.random.PRNGKey(0))
    assert isinstance(state, VecEnvState)
    assert obs.shape == (4, 4)
    state, ts = step(jax.random.PRNGKey(1), state, jnp.array([0, 1, 0, 1], jnp.int32))
    assert isinstance(ts, Timestep)
    assert ts.obs.shape == ts.final_obs.shape == (4, 4)
    for name, dtype in (("reward", jnp.float32), ("terminated", jnp.bool_), ("truncated", jnp.bool_),
                        ("episode_return", jnp.float32), ("episode_length", jnp.int32)):
        value = getattr(ts, name)
        assert value.shape == (4,), name
        assert value.dtype == dtype, (name, value.dtype)
    assert state.episode_return.shape == (4,) and state.episode_length.dtype == jnp.int32
    np.testing.assert_array_equal(ts.reward, np.ones(4, np.float32))
    np.testing.assert_array_equal(state.episode_length, np.ones(4, np.int32))


def test_pendulum_step_under_jit():
    venv = _vec("gymnax:Pendulum-v1", 3)
    state, obs = jax.jit(venv.reset)(jax.random.PRNGKey(0))
    assert obs.shape == (3, 3)
    state, ts = jax.jit(venv.step)(jax.random.PRNGKey(1), state, jnp.zeros((3, 1), jnp.float32))
    assert ts.reward.shape == (3,) and ts.reward.dtype == jnp.float32
    assert np.all(np.asarray(ts.reward) <= 0.0)  # Pendulum's reward is a negative cost
    assert not np.any(np.asarray(ts.done))


def test_reward_shaped_1_and_int_becomes_n_float32():
    venv = _vec(IntRewardShape1Env(), 3)
    _, ts, _ = _rollout(venv, np.array([[0, 1, 2], [1, 1, 1]], np.int32))
    assert ts.reward.shape == (2, 3)  # (T, N)
    assert ts.reward.dtype == np.float32
    np.testing.assert_array_equal(ts.reward, [[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    assert ts.episode_return.dtype == np.float32
    np.testing.assert_array_equal(ts.episode_return[0], [0.0, 0.0, 2.0])


def test_reward_with_more_than_one_number_per_env_raises():
    venv = _vec(TwoRewardsEnv(), 2)
    state, _ = venv.reset(jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="reward"):
        jax.jit(venv.step)(jax.random.PRNGKey(1), state, jnp.zeros((2,), jnp.int32))


# ---- auto-reset, terminated vs truncated, episode statistics -------------------------------------
def test_truncation_at_time_limit():
    """Env 0 plays action 1 until the 5-step time limit cuts it; env 1 plays 0."""
    venv = _vec(CounterEnv(), 2)
    actions = np.array([[1, 0]] * 6, np.int32)
    reset_obs, ts, state = _rollout(venv, actions)
    np.testing.assert_array_equal(reset_obs, [[0, 0], [0, 0]])

    # steps 1..4: nothing ends, obs == final_obs, no episode statistics
    for t in range(4):
        assert not ts.terminated[t].any() and not ts.truncated[t].any()
        np.testing.assert_array_equal(ts.obs[t], ts.final_obs[t])
        np.testing.assert_array_equal(ts.obs[t, 0], [t + 1, t + 1])
        np.testing.assert_array_equal(ts.episode_return[t], [0.0, 0.0])
        np.testing.assert_array_equal(ts.episode_length[t], [0, 0])

    # step 5: the time limit truncates both, without terminating them
    np.testing.assert_array_equal(ts.truncated[4], [True, True])
    np.testing.assert_array_equal(ts.terminated[4], [False, False])
    np.testing.assert_array_equal(np.asarray(ts.terminated[4] | ts.truncated[4]), [True, True])
    # final_obs is the true last observation, obs the reset observation
    np.testing.assert_array_equal(ts.final_obs[4], [[5, 5], [0, 5]])
    np.testing.assert_array_equal(ts.obs[4], [[0, 0], [0, 0]])
    np.testing.assert_array_equal(ts.reward[4], [1.0, 0.0])
    np.testing.assert_array_equal(ts.episode_return[4], [5.0, 0.0])
    np.testing.assert_array_equal(ts.episode_length[4], [5, 5])

    # step 6: first step of the new episode
    assert not ts.truncated[5].any() and not ts.terminated[5].any()
    np.testing.assert_array_equal(ts.obs[5], [[1, 1], [0, 1]])
    np.testing.assert_array_equal(ts.episode_return[5], [0.0, 0.0])
    np.testing.assert_array_equal(state.episode_return, [1.0, 0.0])
    np.testing.assert_array_equal(state.episode_length, [1, 1])


def test_termination_and_exact_episode_statistics():
    """Hand-computed returns and lengths; the accumulators restart at 0 after every end, including
    a time-limit cut (a truncation starts a fresh sum)."""
    venv = _vec(CounterEnv(), 3)
    # env 0: truncated at t=5 with return 1+1+0+1+1 = 4, then 1+1+1+1+1 = 5 truncated again at t=10
    # env 1: terminated at t=3 (action 2) with return 0+1+2 = 3, length 3; then 2 at t=4: return 2, len 1
    # env 2: both limits at once at t=5 (action 2 on the last allowed step): return 0+0+0+0+2 = 2
    actions = np.array([
        [1, 0, 0], [1, 1, 0], [0, 2, 0], [1, 2, 0], [1, 1, 2],
        [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1],
    ], np.int32)
    reset_obs, ts, state = _rollout(venv, actions)
    done = ts.terminated | ts.truncated

    expected_term = np.zeros((10, 3), bool)
    expected_term[2, 1] = expected_term[3, 1] = expected_term[4, 2] = True
    expected_trunc = np.zeros((10, 3), bool)
    expected_trunc[4, 0] = expected_trunc[9, 0] = True
    expected_trunc[4, 2] = expected_trunc[9, 2] = True  # env 2 hits its time limit again at t=10
    # env 1: episode 3 starts at t=5 and is cut at t=9 (5 steps: t=5..9)
    expected_trunc[8, 1] = True
    np.testing.assert_array_equal(ts.terminated, expected_term)
    np.testing.assert_array_equal(ts.truncated, expected_trunc)

    expected_ret = np.zeros((10, 3), np.float32)
    expected_len = np.zeros((10, 3), np.int32)
    expected_ret[4, 0], expected_len[4, 0] = 4.0, 5
    expected_ret[9, 0], expected_len[9, 0] = 5.0, 5  # not 9: the sum restarted after the cut
    expected_ret[2, 1], expected_len[2, 1] = 3.0, 3
    expected_ret[3, 1], expected_len[3, 1] = 2.0, 1
    expected_ret[8, 1], expected_len[8, 1] = 1.0 + 1 + 1 + 1 + 1, 5
    expected_ret[4, 2], expected_len[4, 2] = 2.0, 5
    expected_ret[9, 2], expected_len[9, 2] = 5.0, 5
    np.testing.assert_array_equal(ts.episode_return, expected_ret)
    np.testing.assert_array_equal(ts.episode_length, expected_len)
    # statistics are reported only where an episode ended
    assert np.all(ts.episode_length[~done] == 0) and np.all(ts.episode_return[~done] == 0)

    # where an episode ended, obs is the reset obs and final_obs the true last obs
    np.testing.assert_array_equal(ts.obs[done], np.zeros((int(done.sum()), 2)))
    np.testing.assert_array_equal(ts.final_obs[2, 1], [3, 3])
    np.testing.assert_array_equal(ts.final_obs[3, 1], [2, 1])
    np.testing.assert_array_equal(ts.final_obs[4, 2], [2, 5])
    np.testing.assert_array_equal(ts.final_obs[9, 0], [5, 5])
    np.testing.assert_array_equal(ts.obs[~done], ts.final_obs[~done])

    # after t=10: env 0 and 2 just ended, env 1 is one step into a new episode
    np.testing.assert_array_equal(state.episode_return, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(state.episode_length, [0, 1, 0])


def test_step_by_step_jit_matches_scan():
    """The same trajectory stepping with a jitted step from Python, one call per step."""
    venv = _vec(CounterEnv(), 2)
    step = jax.jit(venv.step)
    state, obs = jax.jit(venv.reset)(jax.random.PRNGKey(0))
    returns = []
    for t in range(6):
        state, ts = step(jax.random.PRNGKey(t), state, jnp.array([1, 2 if t == 1 else 0], jnp.int32))
        returns.append(np.asarray(ts.episode_return))
    np.testing.assert_array_equal(np.stack(returns)[:, 0], [0, 0, 0, 0, 5, 0])
    np.testing.assert_array_equal(np.stack(returns)[:, 1], [0, 2, 0, 0, 0, 0])
    np.testing.assert_array_equal(state.episode_length, [1, 4])


# ---- action checks -------------------------------------------------------------------------------
@pytest.mark.parametrize("action", [
    np.zeros((4,), np.float32),  # float action for Discrete
    np.zeros((5,), np.int32),  # N + 1
    np.zeros((3,), np.int32),  # N - 1
    np.zeros((4, 1), np.int32),  # (N, 1)
    np.zeros((), np.int32),  # scalar
    np.zeros((4,), bool),  # bool is not an integer action
], ids=["float", "N+1", "N-1", "Nx1", "scalar", "bool"])
def test_bad_discrete_action_raises(action):
    venv = _vec("gymnax:CartPole-v1", 4)
    state, _ = venv.reset(jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="action") as info:
        jax.jit(venv.step)(jax.random.PRNGKey(1), state, jnp.asarray(action))
    assert "(4,)" in str(info.value)  # says what was expected


@pytest.mark.parametrize("action", [
    np.zeros((3,), np.float32),  # missing action dim
    np.zeros((3, 2), np.float32),  # wrong action dim
    np.zeros((4, 1), np.float32),  # N + 1
    np.zeros((3, 1), np.int32),  # int action for Box
], ids=["N", "Nx2", "N+1", "int"])
def test_bad_box_action_raises(action):
    venv = _vec("gymnax:Pendulum-v1", 3)
    state, _ = venv.reset(jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="action") as info:
        jax.jit(venv.step)(jax.random.PRNGKey(1), state, jnp.asarray(action))
    assert "(3, 1)" in str(info.value)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
def test_good_discrete_action_dtypes_accepted(dtype):
    venv = _vec("gymnax:CartPole-v1", 2)
    state, _ = venv.reset(jax.random.PRNGKey(0))
    _, ts = jax.jit(venv.step)(jax.random.PRNGKey(1), state, jnp.ones((2,), dtype))
    assert ts.reward.shape == (2,)


# ---- training on a user's own env object ---------------------------------------------------------
def test_train_on_user_env_object():
    config = PPOConfig(env=CounterEnv(), total_env_steps=64, num_envs=4, num_steps=8, num_minibatches=2,
                       update_epochs=1, eval_every_env_steps=32, eval_episodes=2)
    assert config.env_spec.name == "CounterEnv"
    result = tianji_jax.train(config, progress=False)
    curve = result.curve
    np.testing.assert_array_equal(curve["env_steps"], [32.0, 64.0])
    assert np.all(np.isfinite(curve["env_steps"]))
    assert np.all(np.isfinite(curve["eval_return_mean"]))
    # every CounterEnv episode lasts 1..5 steps, and 32 env steps per chunk must end some
    assert np.all(curve["episodes"] > 0)
    assert np.all((curve["episode_length_mean"] >= 1) & (curve["episode_length_mean"] <= 5))
    # returns are sums of actions in {0,1,2} over at most 5 steps
    assert np.all((curve["episode_return_mean"] >= 0) & (curve["episode_return_mean"] <= 10))
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(result.params))
