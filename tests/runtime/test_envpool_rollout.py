"""The compiled envpool rollout (policy + envpool's XLA step in one jitted loop) against the Python loop.

Budget: about 30 s on 2 CPU cores (the Breakout case compiles a Nature-CNN policy twice).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.runtime.anakin import make_agent
from tianji_jax.runtime.actors.chunker import TrajectoryChunker
from tianji_jax.runtime.actors.host_actor import HostActor, host_policy


def _actor(cfg, compiled: bool) -> tuple[HostActor, object]:
    parts = make_agent(cfg)
    params = parts.init_learner(jax.random.PRNGKey(0)).params
    policy = host_policy(parts)
    if not compiled:  # the same policy without its traceable function: the Python loop
        policy = (lambda f: (lambda *a: f(*a)))(policy)
    actor = HostActor(cfg, policy, 0, jax.random.PRNGKey(1), jax.devices()[0], lambda traj: traj,
                      lambda name, t0: None)
    return actor, params


@pytest.mark.parametrize("env, num_envs, num_steps, versions", [
    ("envpool:CartPole-v1", 4, 16, (0, 0, 1, 1, 1, 2, 5, 5)),  # short episodes; version changes drop leftovers
    ("envpool:Pendulum-v1", 3, 8, (0, 1, 1)),  # Box actions (float32)
    ("envpool:Breakout-v5", 2, 48, (0, 0, 0, 1, 1, 1)),  # lives: terminated per life, statistics per game
])
def test_compiled_rollout_equals_the_python_loop(env, num_envs, num_steps, versions):
    cfg = tj.PPOConfig(env=env, num_envs=num_envs, num_steps=num_steps, runtime="async", num_minibatches=2,
                       total_env_steps=num_envs * num_steps * 100)
    runs = []
    for compiled in (True, False):
        actor, params = _actor(cfg, compiled)
        assert (actor.compiled_reason is None) == compiled, actor.compiled_reason
        trajs = [actor(params, v)[0] for v in versions]
        c = actor.chunker
        runs.append((trajs, (actor.env_steps, c.transitions_discarded, c.actions_discarded, c.transitions_in,
                             c.transitions_out)))
        actor.close()
    (fast, fast_counts), (slow, slow_counts) = runs
    assert fast_counts == slow_counts
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            if np.issubdtype(a[k].dtype, np.floating):
                np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-5, err_msg=k)  # float32 policy outputs
            else:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    if env != "envpool:Pendulum-v1":  # the cases meant to cross episode boundaries do
        assert sum(int((t["episode_length"] > 0).sum()) for t in fast) >= 2
        assert sum(int(t["done"].sum()) for t in fast) >= 2


def _stream(chunker: TrajectoryChunker, block: dict, version: int) -> None:
    """``block`` fed to ``chunker`` the Python loop's way: record_action then record_step per row."""
    from tianji_jax.envs.host import HostStep

    ids = np.arange(chunker.num_envs, dtype=np.int32)
    for j in range(block["valid"].shape[0]):
        chunker.record_action(ids, block["obs"][j], block["action"][j], block["log_prob"][j], block["value"][j],
                              version)
        chunker.record_step(HostStep(env_id=ids, obs=block["final_obs"][j], reward=block["reward"][j],
                                     terminated=block["terminated"][j], truncated=block["truncated"][j],
                                     final_obs=block["final_obs"][j], valid=block["valid"][j],
                                     episode_return=block["episode_return"][j],
                                     episode_length=block["episode_length"][j]))


def test_record_block_equals_rows_recorded_one_by_one():
    rng = np.random.default_rng(0)
    n, t = 3, 4
    a, b = (TrajectoryChunker(n, t, (2,), initial_capacity=t) for _ in range(2))  # small ring: it must grow
    for version, s in ((0, 5), (0, 7), (1, 3)):
        block = {"obs": rng.normal(size=(s, n, 2)).astype(np.float32),
                 "action": rng.integers(0, 3, (s, n)).astype(np.int32),
                 "log_prob": rng.normal(size=(s, n)).astype(np.float32),
                 "value": rng.normal(size=(s, n)).astype(np.float32),
                 "reward": rng.normal(size=(s, n)).astype(np.float32),
                 "terminated": rng.random((s, n)) < 0.2, "truncated": rng.random((s, n)) < 0.1,
                 "final_obs": rng.normal(size=(s, n, 2)).astype(np.float32),
                 "episode_return": rng.normal(size=(s, n)).astype(np.float32),
                 "episode_length": rng.integers(0, 9, (s, n)).astype(np.int32),
                 "valid": rng.random((s, n)) < 0.7}
        assert a.record_block(block, version) == int(block["valid"].sum())
        _stream(b, block, version)
        for attr in ("actions_recorded", "actions_discarded", "transitions_in", "capacity"):
            assert getattr(a, attr) == getattr(b, attr), attr
        np.testing.assert_array_equal(a.counts, b.counts)
        while a.ready():
            pa, pb = a.pop(), b.pop()
            for k in pa:
                np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    with pytest.raises(ValueError, match="record_block: obs must be shape"):
        a.record_block({**block, "obs": block["obs"][:, :2]}, 0)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(env="envpool:CartPole-v1", env_batch_size=2), "async mode"),
    (dict(env="envpool:CartPole-v1|latency_ms=1"), "not a bare EnvpoolVecEnv"),
    (dict(env="envpool:CartPole-v1", normalize_observations=True), "host normalisation"),
    (dict(env="envpool:HalfCheetah-v4"), "float64 actions"),
    (dict(env="gymnasium:CartPole-v1"), "not a bare EnvpoolVecEnv"),
])
def test_ineligible_actors_say_why_and_step_from_python(kwargs, reason):
    cfg = tj.PPOConfig(**{"num_envs": 4, "num_steps": 8, "runtime": "async", "num_minibatches": 2,
                          "total_env_steps": 3200, **kwargs})
    actor, _ = _actor(cfg, compiled=True)
    try:
        assert reason in actor.compiled_reason
    finally:
        actor.close()


def test_compiled_replay_actor_equals_the_python_loop(monkeypatch):
    """DQN's host actor (epsilon-greedy, n-step windows across chunks, version changes) gives the same
    replay items, versions and statistics compiled as from the Python loop."""
    from tianji_jax.algos.registry import agent_class_for
    from tianji_jax.runtime.actors.replay_host import ReplayHostActor, replay_host_actor

    cfg = tj.DQNConfig(env="envpool:CartPole-v1", runtime="async", num_envs=4, num_steps=10, learning_starts=200,
                       buffer_capacity=1000, total_env_steps=2000, epsilon_decay_fraction=0.2)
    parts = agent_class_for(cfg)(cfg)
    params = parts.acting_params(parts.init_learner(jax.random.PRNGKey(0)))
    runs = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(ReplayHostActor, "_traceable_act", lambda self: None)
        steps = [0]
        actor = replay_host_actor(cfg, 0, jax.devices()[0], seed=3, timer=lambda name, t0: None,
                                  run_env_steps=lambda: steps[0])
        assert (actor.compiled_reason is None) == compiled, actor.compiled_reason
        outs = []
        for version in (0, 0, 1, 1, 2, 2, 2, 2, 2, 2):  # epsilon decays from 1 over 400 steps: greedy steps too
            out, n = actor(params, version)
            steps[0] += n
            outs.append(jax.device_get(out))
        actor.close()
        runs.append(outs)
    fast, slow = (jax.tree.leaves(r) for r in runs)
    assert len(fast) == len(slow) > 0
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
