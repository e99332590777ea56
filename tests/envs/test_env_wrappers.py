"""Env wrappers (tianji_jax.envs.wrappers) and the ``|`` id syntax: each wrapper against
hand-computed outputs on tiny deterministic envs, through GymnaxVecEnv under jit (auto-reset,
final_obs, terminated/truncated, episode statistics); id resolution, round trip through
config.json's dict, refused ids; PPO training end to end on masked CartPole."""

from __future__ import annotations

import dataclasses
import json

import gymnax.environments.spaces as gspaces
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment

import tianji_jax
from tianji_jax.config import config_from_dict
from tianji_jax.envs import Box, Discrete, GymnaxVecEnv, resolve_env
from tianji_jax.envs.wrappers import ClipAction, FrameStack, FrameStackState, ObservationMask, apply_wrappers

pytestmark = pytest.mark.timeout(300)


# ---- tiny hand-checkable envs --------------------------------------------------------------------
@struct.dataclass
class TickState(environment.EnvState):
    count: jax.Array
    time: jax.Array


@struct.dataclass
class TickParams(environment.EnvParams):
    max_steps_in_episode: int = 4


class TickEnv(environment.Environment[TickState, TickParams]):
    """Actions 0, 1, 2 add to ``count``; action 2 terminates; time limit 4 steps.

    Observation ``[count + 10, time + 1]`` float32: the reset observation is ``[10, 1]``, never
    the zero fill of a frame stack, and every step of an episode is distinguishable.
    """

    @property
    def default_params(self) -> TickParams:
        return TickParams()

    def step_env(self, key, state, action, params):
        new = TickState(count=state.count + action, time=state.time + 1)
        return self.get_obs(new), new, action.astype(jnp.float32), action == 2, {}

    def reset_env(self, key, params):
        state = TickState(count=jnp.int32(0), time=jnp.int32(0))
        return self.get_obs(state), state

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.count + 10, state.time + 1]).astype(jnp.float32)

    def action_space(self, params=None):
        return gspaces.Discrete(3)

    def observation_space(self, params):
        return gspaces.Box(jnp.array([10.0, 1.0]), jnp.array([30.0, 5.0]), (2,), jnp.float32)


class Tick4Env(TickEnv):
    """Observation ``[count + 10, time + 1, count + 100, -time]`` with per-component bounds."""

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.count + 10, state.time + 1, state.count + 100, -state.time]).astype(jnp.float32)

    def observation_space(self, params):
        return gspaces.Box(jnp.array([10.0, 1.0, 100.0, -4.0]), jnp.array([30.0, 5.0, 120.0, 0.0]), (4,),
                           jnp.float32)


class TickImageEnv(TickEnv):
    """The TickEnv observation as a ``(1, 2)`` image."""

    def get_obs(self, state, params=None, key=None):
        return super().get_obs(state)[None, :]

    def observation_space(self, params):
        return gspaces.Box(0.0, 30.0, (1, 2), jnp.float32)


@struct.dataclass
class EchoState(environment.EnvState):
    last: jax.Array
    time: jax.Array


class EchoEnv(environment.Environment[EchoState, TickParams]):
    """Continuous action in Box([-1, 2]^2); the observation is the action executed, the reward
    its sum; time limit 4."""

    @property
    def default_params(self) -> TickParams:
        return TickParams()

    def step_env(self, key, state, action, params):
        new = EchoState(last=action.astype(jnp.float32), time=state.time + 1)
        return new.last, new, jnp.sum(new.last), jnp.bool_(False), {}

    def reset_env(self, key, params):
        state = EchoState(last=jnp.zeros(2, jnp.float32), time=jnp.int32(0))
        return state.last, state

    def action_space(self, params=None):
        return gspaces.Box(-1.0, 2.0, (2,), jnp.float32)

    def observation_space(self, params):
        return gspaces.Box(-1.0, 2.0, (2,), jnp.float32)


def _rollout(env, actions, seed: int = 0):
    """Reset ``len(actions[0])`` envs and step through ``actions`` (T, N, ...) in one jitted scan.
    Returns ``(reset_obs, stacked Timestep, final VecEnvState)``."""
    actions = jnp.asarray(actions)
    venv = env if isinstance(env, GymnaxVecEnv) else GymnaxVecEnv(resolve_env(env), actions.shape[1])

    @jax.jit
    def run(key, actions):
        state, obs = venv.reset(key)

        def body(carry, action):
            state, key = carry
            key, sub = jax.random.split(key)
            state, ts = venv.step(sub, state, action)
            return (state, key), ts

        (state, _), ts = jax.lax.scan(body, (state, key), actions)
        return obs, ts, state

    return jax.device_get(run(jax.random.PRNGKey(seed), actions))


# ---- ObservationMask -----------------------------------------------------------------------------
def test_mask_picks_exactly_those_components():
    env = ObservationMask(Tick4Env(), (2, 0))
    spec = resolve_env(env)
    assert spec.name == "Tick4Env|mask=2,0"
    assert spec.observation_space == Box((2,), np.float32, np.array([100.0, 10.0]), np.array([120.0, 30.0]))
    # env 0: 1, 2 (terminates at t=2, count 3); env 1: 0 until the 4-step limit
    reset_obs, ts, _ = _rollout(env, np.array([[1, 0], [2, 0], [1, 0], [1, 0]], np.int32))
    np.testing.assert_array_equal(reset_obs, [[100, 10], [100, 10]])
    np.testing.assert_array_equal(ts.obs[:, 0], [[101, 11], [100, 10], [101, 11], [102, 12]])
    np.testing.assert_array_equal(ts.final_obs[:, 0], [[101, 11], [103, 13], [101, 11], [102, 12]])
    np.testing.assert_array_equal(ts.obs[:, 1], [[100, 10]] * 4)
    np.testing.assert_array_equal(ts.terminated[:, 0], [False, True, False, False])
    np.testing.assert_array_equal(ts.truncated[:, 1], [False, False, False, True])
    np.testing.assert_array_equal(ts.episode_return[:, 0], [0, 3, 0, 0])
    np.testing.assert_array_equal(ts.episode_length[:, 1], [0, 0, 0, 4])


def test_mask_matches_the_unmasked_cartpole_columns():
    full, masked = resolve_env("gymnax:CartPole-v1"), resolve_env("gymnax:CartPole-v1|mask=0,2")
    actions = np.tile(np.array([[0, 1, 1]], np.int32), (30, 1))
    a_obs, a_ts, _ = _rollout(GymnaxVecEnv(full, 3), actions)
    b_obs, b_ts, _ = _rollout(GymnaxVecEnv(masked, 3), actions)
    np.testing.assert_array_equal(b_obs, a_obs[:, [0, 2]])
    np.testing.assert_array_equal(b_ts.obs, a_ts.obs[..., [0, 2]])
    np.testing.assert_array_equal(b_ts.final_obs, a_ts.final_obs[..., [0, 2]])
    np.testing.assert_array_equal(b_ts.reward, a_ts.reward)
    np.testing.assert_array_equal(b_ts.terminated, a_ts.terminated)
    assert a_ts.terminated.any()  # the test covers an auto-reset
    assert masked.env.num_actions == 2


@pytest.mark.parametrize("env, keep, pattern", [
    (Tick4Env(), (), r"keep=\(\).*\(4,\).*no indices.*0\.\.3"),
    (Tick4Env(), (1, 1), r"keep=\(1, 1\).*\(4,\).*duplicate.*0\.\.3"),
    (Tick4Env(), (0, 4), r"keep=\(0, 4\).*\(4,\).*out of range.*0\.\.3"),
    (Tick4Env(), (-1,), r"keep=\(-1,\).*out of range.*0\.\.3"),
    (Tick4Env(), (0.0,), r"keep=\(0\.0,\).*ints.*0\.\.3"),
    (TickImageEnv(), (0,), r"keep=\(0,\).*\(1, 2\).*not a 1-D Box"),
], ids=["empty", "duplicate", "too-high", "negative", "float", "image"])
def test_mask_refuses_bad_indices(env, keep, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        ObservationMask(env, keep)
    assert "\n" not in str(info.value)


# ---- FrameStack ----------------------------------------------------------------------------------
def test_frame_stack_vectors_across_episode_ends():
    """k = 3 on TickEnv, frames concatenated oldest first. Env 0 terminates at t=3 (actions 1, 1,
    2); env 1 is truncated at t=4. The new episode's stacks hold zeros and new-episode frames only,
    while final_obs stacks the old episode's last three observations."""
    env = FrameStack(TickEnv(), 3)
    spec = resolve_env(env)
    assert spec.name == "TickEnv|frame_stack=3" and spec.observation_shape == (6,)
    np.testing.assert_array_equal(spec.observation_space.low, [0, 0, 0, 0, 10, 1])  # widened to the 0 fill
    np.testing.assert_array_equal(spec.observation_space.high, [30, 5] * 3)
    actions = np.array([[1, 0], [1, 0], [2, 0], [1, 0], [1, 0]], np.int32)
    reset_obs, ts, state = _rollout(env, actions)
    np.testing.assert_array_equal(reset_obs, [[0, 0, 0, 0, 10, 1]] * 2)
    np.testing.assert_array_equal(ts.obs[:, 0], [
        [0, 0, 10, 1, 11, 2],
        [10, 1, 11, 2, 12, 3],
        [0, 0, 0, 0, 10, 1],  # terminated: the reset observation and zeros, nothing of episode 1
        [0, 0, 10, 1, 11, 2],
        [10, 1, 11, 2, 12, 3],
    ])
    np.testing.assert_array_equal(ts.final_obs[2, 0], [11, 2, 12, 3, 14, 4])
    np.testing.assert_array_equal(ts.obs[:, 1], [
        [0, 0, 10, 1, 10, 2],
        [10, 1, 10, 2, 10, 3],
        [10, 2, 10, 3, 10, 4],
        [0, 0, 0, 0, 10, 1],  # truncated
        [0, 0, 10, 1, 10, 2],
    ])
    np.testing.assert_array_equal(ts.final_obs[3, 1], [10, 3, 10, 4, 10, 5])
    done = ts.terminated | ts.truncated
    np.testing.assert_array_equal(ts.obs[~done], ts.final_obs[~done])
    np.testing.assert_array_equal(ts.terminated[:, 0], [False, False, True, False, False])
    np.testing.assert_array_equal(ts.truncated[:, 1], [False, False, False, True, False])
    np.testing.assert_array_equal(ts.episode_return[2], [4, 0])
    np.testing.assert_array_equal(ts.episode_length[:, 1], [0, 0, 0, 4, 0])
    assert isinstance(state.env_state, FrameStackState)
    np.testing.assert_array_equal(state.env_state.frames[0], [[10, 1], [11, 2], [12, 3]])


def test_frame_stack_images_gain_a_trailing_axis():
    env = FrameStack(TickImageEnv(), 3)
    assert resolve_env(env).observation_shape == (1, 2, 3)
    vec = FrameStack(TickEnv(), 3)
    actions = np.array([[1], [1], [2], [1]], np.int32)
    img_reset, img, _ = _rollout(env, actions)
    vec_reset, ref, _ = _rollout(vec, actions)
    assert img.obs.shape == (4, 1, 1, 2, 3) and img_reset.shape == (1, 1, 2, 3)
    # frame j of the image stack is frame j of the vector stack
    np.testing.assert_array_equal(np.moveaxis(img.obs, -1, -3).reshape(4, 1, 6), ref.obs)
    np.testing.assert_array_equal(np.moveaxis(img.final_obs, -1, -3).reshape(4, 1, 6), ref.final_obs)
    np.testing.assert_array_equal(img.obs[2, 0, 0], [[0, 0, 10], [0, 0, 1]])  # after the end: newest last


def test_frame_stack_minatar_shape_and_resolve():
    spec = resolve_env("gymnax:Breakout-MinAtar|frame_stack=4")
    assert spec.name == "Breakout-MinAtar|frame_stack=4"
    assert spec.observation_shape == (10, 10, 16)   # frames folded into the channel axis, newest last
    assert spec.max_episode_steps == 1000
    state, obs = jax.jit(GymnaxVecEnv(spec, 2).reset)(jax.random.PRNGKey(0))
    assert obs.shape == (2, 10, 10, 16)
    assert not np.asarray(obs[..., :12]).any() and np.asarray(obs[..., 12:]).any()
    from tianji_jax.nets.networks import choose_torso

    assert choose_torso(spec.observation_shape) == "small_cnn"   # read as channels-last


@pytest.mark.parametrize("k", [0, -1, True, 2.0])
def test_frame_stack_refuses_bad_num_frames(k):
    with pytest.raises(ValueError, match=r"num_frames=.*integer >= 1"):
        FrameStack(TickEnv(), k)


# ---- ClipAction ----------------------------------------------------------------------------------
def test_clip_action_clips_to_the_box():
    env = ClipAction(EchoEnv())
    assert resolve_env(env).action_space == Box((2,), np.float32, np.full(2, -1.0), np.full(2, 2.0))
    actions = np.array([[[-5.0, 5.0]], [[0.5, 1.5]], [[2.5, -1.5]]], np.float32)
    _, ts, _ = _rollout(env, actions)
    np.testing.assert_array_equal(ts.obs[:, 0], [[-1.0, 2.0], [0.5, 1.5], [2.0, -1.0]])
    np.testing.assert_array_equal(ts.reward[:, 0], [1.0, 2.0, 1.0])
    assert ts.obs.dtype == np.float32
    _, raw, _ = _rollout(EchoEnv(), actions)  # without the wrapper the env sees the raw action
    np.testing.assert_array_equal(raw.obs[0, 0], [-5.0, 5.0])


def test_clip_action_pendulum_matches_the_bound():
    clipped = resolve_env("gymnax:Pendulum-v1|clip_action")
    assert clipped.name == "Pendulum-v1|clip_action"
    big = np.full((5, 2, 1), 10.0, np.float32)
    _, a, _ = _rollout(GymnaxVecEnv(clipped, 2), big)
    _, b, _ = _rollout(GymnaxVecEnv(resolve_env("gymnax:Pendulum-v1"), 2), np.full((5, 2, 1), 2.0, np.float32))
    np.testing.assert_allclose(a.obs, b.obs)
    np.testing.assert_allclose(a.reward, b.reward)


def test_clip_action_refuses_discrete():
    with pytest.raises(ValueError, match="ClipAction: action space Discrete is not a Box"):
        ClipAction(TickEnv())


# ---- the id syntax -------------------------------------------------------------------------------
def test_id_syntax_resolves_wrapped_specs():
    spec = resolve_env("gymnax:CartPole-v1|mask=0,2")
    assert spec.observation_shape == (2,)
    assert spec.name == "CartPole-v1|mask=0,2" and spec.backend == "gymnax"
    assert spec.action_space == Discrete(2)
    assert spec.max_episode_steps == 500
    full = resolve_env("gymnax:CartPole-v1").observation_space
    np.testing.assert_array_equal(spec.observation_space.high, full.high[[0, 2]])
    # several, left to right (innermost first), whitespace ignored, canonical name
    composed = resolve_env("CartPole-v1 | mask = 2, 0 | frame_stack=4")
    assert composed.observation_shape == (8,)
    assert composed.name == "CartPole-v1|mask=2,0|frame_stack=4"
    assert isinstance(composed.env, FrameStack) and isinstance(composed.env.env, ObservationMask)
    assert resolve_env("gymnax:CartPole-v1|frame_stack=2|mask=0,5").observation_shape == (2,)


def test_apply_wrappers_returns_canonical_suffix():
    env, suffix = apply_wrappers(TickEnv(), [" mask=1 ", "frame_stack=02"])
    assert suffix == "|mask=1|frame_stack=2" and env.name == "TickEnv|mask=1|frame_stack=2"


@pytest.mark.parametrize("env, pattern", [
    ("gymnax:CartPole-v1|foo=1", r"unknown wrapper 'foo'.*allowed wrappers: \['mask', 'frame_stack', 'clip_action'\]"),
    ("gymnax:CartPole-v1|", r"unknown wrapper ''"),
    ("gymnax:CartPole-v1|mask", r"wrapper 'mask' got no value; allowed: comma-separated"),
    ("gymnax:CartPole-v1|mask=a,b", r"wrapper 'mask' got value 'a,b'; allowed: comma-separated"),
    ("gymnax:CartPole-v1|mask=0,7", r"wrapper 'mask=0,7'.*keep=\(0, 7\).*\(4,\).*0\.\.3"),
    ("gymnax:CartPole-v1|mask=1,1", r"wrapper 'mask=1,1'.*duplicate"),
    ("gymnax:Breakout-MinAtar|mask=0", r"wrapper 'mask=0'.*\(10, 10, 4\).*not a 1-D Box"),
    ("gymnax:CartPole-v1|frame_stack=x", r"wrapper 'frame_stack' got value 'x'; allowed: an integer >= 1"),
    ("gymnax:CartPole-v1|frame_stack=0", r"wrapper 'frame_stack=0'.*num_frames=0; allowed: an integer >= 1"),
    ("gymnax:CartPole-v1|clip_action=1", r"wrapper 'clip_action' got value '1'; allowed: no value"),
    ("gymnax:CartPole-v1|clip_action", r"wrapper 'clip_action'.*Discrete is not a Box"),
    ("gymnax:CartPol-v1|mask=0", r"unknown gymnax env id 'CartPol-v1'"),
    ("envpool:CartPole-v1|clip_action", r"ClipAction: action space Discrete\(2\) is not a Box"),
    ("gymnasium:CartPole-v1|mask=0,9", r"keep=\(0, 9\) for observation shape \(4,\).*0\.\.3"),
    ("envpool:CartPole-v1|frame_stack=0", r"num_frames=0.*allowed: an integer >= 1"),
    ("envpool:Breakout-v5|frame_stack=2", r"envpool already stacks its frames"),
    ("envpool:CartPole-v1|frame_stack=two", r"wrapper 'frame_stack' got value 'two'; allowed: an integer >= 1"),
])
def test_bad_ids_refused_in_one_line(env, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        resolve_env(env)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"env={env!r}")


def test_config_round_trip_keeps_the_wrapped_env():
    config = tianji_jax.PPOConfig(env="CartPole-v1|mask=0,2", total_env_steps=2048, num_envs=4, num_steps=32)
    assert config.env == "gymnax:CartPole-v1|mask=0,2"
    data = json.loads(json.dumps({**config.to_dict(), "algo": "ppo"}))
    again = config_from_dict(data)
    assert again.env == config.env and again.env_spec.observation_shape == (2,)


# ---- time limits and training through the wrapper ------------------------------------------------
def test_masked_cartpole_is_truncated_at_500_steps():
    """Thresholds so wide the pole never falls: only the time limit, read through the wrapper's
    params, can end the episode -- at exactly 500 steps, truncated not terminated."""
    spec = resolve_env("gymnax:CartPole-v1|mask=0,2")
    assert spec.max_episode_steps == 500
    params = spec.env_params.replace(x_threshold=1e30, theta_threshold_radians=1e30)
    venv = GymnaxVecEnv(dataclasses.replace(spec, env_params=params), 2)
    _, ts, state = _rollout(venv, np.tile(np.array([[0, 1]], np.int32), (501, 1)))
    done = ts.terminated | ts.truncated
    assert not ts.terminated.any()
    assert not done[:499].any() and ts.truncated[499].all()
    np.testing.assert_array_equal(ts.episode_length[499], [500, 500])
    np.testing.assert_array_equal(ts.episode_return[499], [500.0, 500.0])
    assert ts.final_obs.shape == (501, 2, 2)
    assert not np.array_equal(ts.final_obs[499], ts.obs[499])  # final_obs is the pre-reset observation
    np.testing.assert_array_equal(state.episode_length, [1, 1])


def test_ppo_trains_on_masked_cartpole():
    config = tianji_jax.PPOConfig(env="gymnax:CartPole-v1|mask=0,2", total_env_steps=2048, num_envs=4,
                                  num_steps=32, eval_every_env_steps=1024, eval_episodes=2)
    assert config.env_spec.observation_shape == (2,)
    result = tianji_jax.train(config, progress=False)
    curve = result.curve
    np.testing.assert_array_equal(curve["env_steps"], [1024.0, 2048.0])
    assert np.all(np.isfinite(curve["eval_return_mean"]))
    assert np.all((curve["episode_length_mean"] >= 1) & (curve["episode_length_mean"] <= 500))
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(result.params))
