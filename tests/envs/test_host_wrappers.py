"""Host env wrappers (tianji_jax.envs.host_wrappers): the device wrappers' semantics on host vector
envs, checked against hand-computed output on a scripted env, then through resolve_env and a short
async PPO run on envpool with evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from tianji_jax.envs.host_common import HostStep
from tianji_jax.envs.host_wrappers import HostClipAction, HostFrameStack, HostObservationMask, wrapped_spaces
from tianji_jax.envs.registry import resolve_env
from tianji_jax.envs.spaces import Box, Discrete


class Scripted:
    """Two envs; env e's observation at its t-th step of an episode is [10e + t, -t, 100]; env 0's
    episodes end after 2 steps (then one reset step, next-step auto-reset as envpool), env 1 never
    ends. Records the actions it was given."""

    num_envs = 2
    observation_space = Box((3,), np.float32, np.full(3, -np.inf), np.full(3, np.inf))
    action_space = Box((1,), np.float32, np.array([-2.0]), np.array([2.0]))

    def __init__(self):
        self.t = np.zeros(2, int)
        self.resetting = np.zeros(2, bool)
        self.actions = []
        self.closed = False

    def _obs(self, e):
        return np.array([10 * e + self.t[e], -self.t[e], 100], np.float32)

    def _batch(self, ids, valid, done):
        obs = np.stack([self._obs(e) for e in ids])
        z = np.zeros(len(ids), np.float32)
        return HostStep(np.asarray(ids, np.int32), obs, z, np.asarray(done), np.zeros(len(ids), bool), obs.copy(),
                        np.asarray(valid), z, np.zeros(len(ids), np.int32))

    def reset(self):
        self.t[:] = 0
        return self._batch([0, 1], [False, False], [False, False])

    def step(self, actions, env_id=None):
        self.actions.append(np.asarray(actions).copy())
        valid, done = [], []
        for e in (0, 1):
            if self.resetting[e]:
                self.t[e], self.resetting[e] = 0, False
                valid.append(False), done.append(False)
                continue
            self.t[e] += 1
            end = e == 0 and self.t[e] == 2
            self.resetting[e] = end
            valid.append(True), done.append(end)
        return self._batch([0, 1], valid, done)

    def close(self):
        self.closed = True


def test_mask_keeps_the_components_of_obs_and_final_obs():
    env = HostObservationMask(Scripted(), (2, 0))
    out = env.reset()
    np.testing.assert_array_equal(out.obs, [[100, 0], [100, 10]])
    out = env.step(np.zeros((2, 1), np.float32))
    np.testing.assert_array_equal(out.obs, [[100, 1], [100, 11]])
    np.testing.assert_array_equal(out.final_obs, out.obs)
    assert env.observation_space.shape == (2,) and env.num_envs == 2  # read through


def test_frame_stack_across_resets_by_hand():
    """k = 3 on 1-D observations: (3 * 3,) concatenations, oldest first, zeros before an episode's
    first observation; env 0's done step stacks its final observation, the reset row after it
    starts a new stack."""
    env = HostFrameStack(Scripted(), 3)
    z = [0, 0, 0]
    o = lambda e, t: [10 * e + t, -t, 100]  # noqa: E731
    out = env.reset()
    np.testing.assert_array_equal(out.obs, [z + z + o(0, 0), z + z + o(1, 0)])
    out = env.step(np.zeros((2, 1)))  # t = 1
    np.testing.assert_array_equal(out.obs, [z + o(0, 0) + o(0, 1), z + o(1, 0) + o(1, 1)])
    out = env.step(np.zeros((2, 1)))  # t = 2: env 0's episode ends (its final observation is o(0, 2))
    assert out.done.tolist() == [True, False]
    np.testing.assert_array_equal(out.obs[0], o(0, 0) + o(0, 1) + o(0, 2))
    np.testing.assert_array_equal(out.final_obs[0], o(0, 0) + o(0, 1) + o(0, 2))
    np.testing.assert_array_equal(out.obs[1], o(1, 0) + o(1, 1) + o(1, 2))
    out = env.step(np.zeros((2, 1)))  # env 0: the reset row (a new episode), env 1: t = 3
    assert out.valid.tolist() == [False, True]
    np.testing.assert_array_equal(out.obs[0], z + z + o(0, 0))
    np.testing.assert_array_equal(out.obs[1], o(1, 1) + o(1, 2) + o(1, 3))
    out = env.step(np.zeros((2, 1)))
    np.testing.assert_array_equal(out.obs[0], z + o(0, 0) + o(0, 1))
    space = env.observation_space
    assert space.shape == (9,) and space.low[0] == -np.inf and space.high[8] == np.inf


def test_frame_stack_of_images_folds_into_channels():
    inner = Box((2, 2, 1), np.uint8, np.zeros((2, 2, 1)), np.full((2, 2, 1), 255.0))
    space = wrapped_spaces(inner, Discrete(2), [("frame_stack", 4)])[0]
    assert space.shape == (2, 2, 4) and space.dtype == np.uint8


def test_clip_action_clips_to_the_box_and_keeps_the_dtype():
    inner = Scripted()
    env = HostClipAction(inner)
    env.reset()
    env.step(np.array([[5.0], [-0.5]], np.float32))
    np.testing.assert_array_equal(inner.actions[-1], [[2.0], [-0.5]])
    assert inner.actions[-1].dtype == np.float32
    with env:
        pass
    assert inner.closed


def test_resolve_env_gives_the_wrapped_spaces_and_canonical_name():
    spec = resolve_env("envpool:CartPole-v1| mask=0,2 |frame_stack=02")
    assert spec.name == "CartPole-v1|mask=0,2|frame_stack=2" and spec.observation_space.shape == (4,)
    env = spec.make_host_env(3, seed=0)
    try:
        out = env.reset()
        assert out.obs.shape == (3, 4) and np.all(out.obs[:, :2] == 0)  # the older slot zero after a reset
        out = env.step(np.zeros(3, np.int32))
        assert out.obs.shape == (3, 4)
    finally:
        env.close()
    pend = resolve_env("gymnasium:Pendulum-v1|clip_action|latency_ms=1")
    assert pend.name == "Pendulum-v1|clip_action|latency_ms=1" and pend.host_wrappers == (("clip_action", None),)


@pytest.mark.timeout(300)
def test_async_ppo_trains_and_evaluates_on_a_wrapped_host_env():
    """Budget ~20 s: a few updates with envpool CartPole-v1 masked to (x, theta) and 4 stacked frames
    (the velocities have to be inferred), evaluation on envs with the same wrappers."""
    import tianji_jax as tj

    config = tj.PPOConfig(env="envpool:CartPole-v1|mask=0,2|frame_stack=4", runtime="async", num_envs=4,
                          num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 4,
                          eval_every_env_steps=4 * 32 * 2, eval_episodes=2)
    result = tj.train(config, progress=False)
    assert np.all(np.isfinite(result.curve["eval_return_mean"]))
    assert jax_leading_input_size(result.params) == 8  # the torso reads the stacked (4 x 2,) observation


def jax_leading_input_size(params) -> int:
    import jax

    kernels = [x for path, x in jax.tree_util.tree_leaves_with_path(params) if x.ndim == 2]
    return int(min(k.shape[0] for k in kernels))
