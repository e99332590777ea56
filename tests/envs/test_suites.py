"""The JAX env suites (craftax:, jumanji:, xminigrid:) as device envs, and action masks.

* the suite adapter's auto-reset, final observation and terminated/truncated split against a
  hand-written env;
* masks: the helpers, and over real rollouts on a masked Jumanji task no forbidden action is ever
  taken by PPO's sampled or greedy policy, PQN's epsilon-greedy (random and greedy) or the DQN
  family's (random, greedy, double-Q/bootstrap maximum over the next state's stored mask);
* each suite trains a few updates with PPO and with DQN through the CLI (budgets per test: the
  suites' programs take 10-60 s to compile on a 2-core CPU).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.algos.registry import agent_class_for
from tianji_jax.cli.commands import main
from tianji_jax.envs.gymnax_env import GymnaxVecEnv
from tianji_jax.envs.suites import MASKED, SuiteEnv, action_mask, masked, random_allowed

MAZE = "jumanji:Maze-v0"  # Discrete(4) with an action mask (walls forbid moves)


def make_agent(config):
    return agent_class_for(config)(config)


# ---- the adapter ----------------------------------------------------------------------------------
def _counter_env(limit: int) -> SuiteEnv:
    """obs = [count]; the action is added to the count; terminated when the count reaches 5; the
    suite itself truncates at count 3 when the action was 2."""

    def reset(key):
        return jnp.zeros((), jnp.int32), jnp.zeros((1,), jnp.float32)

    def step(key, count, action):
        count = count + action
        return count, count.astype(jnp.float32)[None], jnp.float32(1.0), count >= 5, (count == 3) & (action == 2)

    return SuiteEnv("Counter", reset, step, num_actions=3, time_limit=limit)


def test_adapter_auto_resets_with_the_true_final_observation_and_splits_the_ends():
    env = _counter_env(limit=4)
    obs, state = env.reset(jax.random.key(0))
    seen = []
    for action in (1, 2, 2, 0, 0, 0, 0):  # counts 1, 3 (suite truncation), 2, 2, 2, 2 (the limit: 4th step), 0
        obs, state, reward, term, trunc, info = env.step(jax.random.key(1), state, jnp.int32(action))
        seen.append((float(info["final_observation"][0]), float(obs[0]), bool(term), bool(trunc)))
    assert seen == [(1, 1, False, False), (3, 0, False, True), (2, 2, False, False), (2, 2, False, False),
                    (2, 2, False, False), (2, 0, False, True), (0, 0, False, False)]
    env = _counter_env(limit=2)
    obs, state = env.reset(jax.random.key(0))
    _, state, _, term, trunc, info = env.step(jax.random.key(1), state, jnp.int32(2))
    _, state, _, term, trunc, info = env.step(jax.random.key(1), state, jnp.int32(2))  # count 4: limit
    assert (bool(term), bool(trunc), float(info["final_observation"][0])) == (False, True, 4.0)
    env = _counter_env(limit=2)
    obs, state = env.reset(jax.random.key(0))
    _, state, _, _, _, _ = env.step(jax.random.key(1), state, jnp.int32(3))
    _, state, _, term, trunc, _ = env.step(jax.random.key(1), state, jnp.int32(2))  # count 5 at the limit
    assert (bool(term), bool(trunc)) == (True, False)  # termination wins


def test_mask_helpers_by_hand():
    obs = jnp.array([[7.0, 1.0, 0.0, 1.0], [7.0, 0.0, 0.0, 0.0]])  # 3 actions; row 2 allows none
    assert action_mask(obs, 0) is None
    np.testing.assert_array_equal(action_mask(obs, 3), [[True, False, True], [True, True, True]])
    q = jnp.array([[1.0, 9.0, 2.0], [1.0, 9.0, 2.0]])
    np.testing.assert_array_equal(masked(q, obs, 3), [[1.0, MASKED, 2.0], [1.0, 9.0, 2.0]])
    draws = jax.vmap(lambda k: random_allowed(k, obs, 3, 3))(jax.random.split(jax.random.key(0), 400))
    assert set(np.unique(draws[:, 0])) == {0, 2} and set(np.unique(draws[:, 1])) == {0, 1, 2}
    from tianji_jax.algos.pqn.math import epsilon_greedy

    actions, logp = epsilon_greedy(jax.random.key(1), masked(q, obs, 3), jnp.float32(1.0), action_mask(obs, 3))
    np.testing.assert_allclose(logp, np.log([1 / 2, 1 / 3]), rtol=1e-6)


def test_a_suite_spec_names_its_mask_and_refuses_what_would_break_it():
    """(observation normalisation keeps the mask raw: tests/algos/test_replay_normalize.py)"""
    spec = tj.PPOConfig(env=MAZE).env_spec
    assert spec.action_mask_size == 4 and spec.action_space == tj.envs.Discrete(4)
    with pytest.raises(ValueError, match="wrappers on an env with an action mask"):
        tj.PPOConfig(env=MAZE + "|frame_stack=2")
    with pytest.raises(ValueError, match=r"unknown or unsupported jumanji id 'Nope-v0'; allowed: \['Game2048-v1'"):
        tj.PPOConfig(env="jumanji:Nope-v0")
    with pytest.raises(ValueError, match=r"unknown or unsupported xminigrid id 'XLand-MiniGrid-R1-9x9' \(XLand-\* ids "
                                         r"sample rulesets from benchmarks that are downloaded"):
        tj.PPOConfig(env="xminigrid:XLand-MiniGrid-R1-9x9")  # needs a downloaded benchmark


# ---- no masked action is ever taken -----------------------------------------------------------------
def _walk(spec, num_envs: int, steps: int, act) -> int:
    """Step ``num_envs`` envs ``steps`` times with ``act(key, obs) -> actions``; assert every action
    is allowed by the mask of the observation it was chosen for; returns how many were checked."""
    env = GymnaxVecEnv(spec, num_envs)

    @jax.jit
    def run(key):
        state, obs = env.reset(key)

        def body(carry, k):
            state, obs = carry
            k_act, k_env = jax.random.split(k)
            action = act(k_act, obs)
            ok = jnp.take_along_axis(action_mask(obs, spec.action_mask_size), action[:, None], axis=-1)[:, 0]
            state, ts = env.step(k_env, state, action)
            return (state, ts.obs), (ok, ts.final_obs)

        return jax.lax.scan(body, (state, obs), jax.random.split(key, steps))[1]

    ok, final_obs = run(jax.random.key(3))
    assert bool(jnp.all(ok)), f"{int(jnp.sum(~ok))} forbidden actions of {ok.size}"
    forbids = ~np.asarray(action_mask(final_obs, spec.action_mask_size))
    assert forbids.any()  # the walk met states with forbidden moves (else the check proves nothing)
    return int(ok.size)


def test_ppo_and_pqn_never_take_a_masked_action():
    """Budget ~60 s (four compiled walks of 32 envs x 40 steps on Maze)."""
    ppo = make_agent(tj.PPOConfig(env=MAZE, num_envs=32))
    params = ppo.init_learner(jax.random.key(0)).params
    _walk(ppo.spec, 32, 40, lambda k, obs: ppo.policy(params, obs, k, jnp.int32(0))[1])
    _walk(ppo.spec, 32, 40, lambda k, obs: ppo.greedy(params, obs))
    pqn = make_agent(tj.PQNConfig(env=MAZE, num_envs=32))
    qparams = pqn.init_learner(jax.random.key(0)).params
    _walk(pqn.spec, 32, 40, lambda k, obs: pqn.policy(qparams, obs, k, jnp.int32(0))[0])  # epsilon 1: random
    _walk(pqn.spec, 32, 40, lambda k, obs: pqn.greedy(qparams, obs))


@pytest.mark.parametrize("variant", [{}, {"distributional": "c51"}, {"distributional": "qr", "double_q": False}],
                         ids=["dqn", "c51", "qr"])
def test_dqn_family_never_takes_a_masked_action_and_bootstraps_over_allowed_ones(variant):
    """Budget ~30 s each: random (epsilon 1) and greedy walks, and the bootstrap target computed from
    a stored next observation uses the maximum over its allowed actions only."""
    dqn = make_agent(tj.DQNConfig(env=MAZE, **variant))
    params = dqn.init_learner(jax.random.key(0)).params
    keys = lambda k: tuple(jax.random.split(k, dqn.NUM_ACT_KEYS))
    _walk(dqn.spec, 32, 40, lambda k, obs: dqn.explore(params, obs, keys(k), jnp.float32(1.0)))
    _walk(dqn.spec, 32, 40, lambda k, obs: dqn.explore(params, obs, keys(k), jnp.float32(0.0)))
    # the bootstrap: next observations whose masks forbid the unmasked argmax
    env = GymnaxVecEnv(dqn.spec, 32)
    _, obs = env.reset(jax.random.key(5))
    raw = dqn.network.apply(params, obs)
    q_raw = raw if dqn.config.distributional == "none" else tj.algos.dqn.distributional.expected_q(
        raw, dqn.config.distributional, dqn.support)
    mask = np.asarray(action_mask(obs, 4))
    q_masked = dqn.apply(params, obs)
    np.testing.assert_allclose(np.max(q_masked, -1), np.max(np.where(mask, q_raw, -np.inf), -1), rtol=1e-6)
    assert (np.argmax(q_raw, -1) != np.argmax(q_masked, -1)).any() or mask.all()


# ---- each suite trains through the CLI ------------------------------------------------------------
def _cli(tmp_path, algo: str, env: str, **fields) -> dict:
    run_dir = tmp_path / f"{algo}-{env.replace(':', '_')}"
    argv = ["train", "--algo", algo, "--env", env, "--run-dir", str(run_dir), "--progress", "False"]
    for k, v in fields.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) >= 2
    return json.loads((run_dir / "config.json").read_text())


PPO_SMALL = dict(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=256,
                 eval_every_env_steps=256, eval_episodes=1)
DQN_SMALL = dict(num_envs=10, num_steps=2, learning_starts=100, buffer_capacity=512, batch_size=32,
                 total_env_steps=400, eval_every_env_steps=200, eval_episodes=1)


@pytest.mark.slow
@pytest.mark.parametrize("env", ["jumanji:Maze-v0", "xminigrid:MiniGrid-Empty-6x6",
                                 "craftax:Craftax-Classic-Symbolic-v1"])
def test_each_suite_trains_with_ppo_and_dqn_through_the_cli(tmp_path, env):
    """Budget: jumanji/xminigrid ~60 s, craftax ~4 min (its world generation compiles for ~40 s per
    program on a 2-core CPU). A few updates each, evaluation included."""
    cheap = {"eval_episodes": 0} if env.startswith("craftax:") else {}  # its evaluation compiles for minutes
    assert _cli(tmp_path, "ppo", env, **{**PPO_SMALL, **cheap})["env"] == env
    assert _cli(tmp_path, "dqn", env, **{**DQN_SMALL, **cheap})["env"] == env
