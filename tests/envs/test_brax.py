"""Brax physics envs (``brax:<name>`` ids) as device envs.

* the adapter against brax itself: auto-reset with brax's true final observation, truncation at the
  time limit, brax's ``done`` as a termination kept apart from truncation, spaces and names;
* a truncated brax step's GAE target bootstraps from V(final observation), not V(reset observation);
* PPO trains a few updates in Anakin and on async device actors, with episode statistics; SAC a few
  updates in Anakin;
* one-line refusals: brax missing (names the extra), unknown name, unknown backend or modifier.

Every test uses the ``positional`` pipeline on ``inverted_pendulum`` (4 observations, 1 action),
the smallest env; still, each compiled program holding a brax step takes 20-30 s to compile on a
shared 2-core CPU, so the adapter tests share one program (:func:`walk`) and the file has four such
programs in all (the walk, PPO's and SAC's Anakin chunks, the async actor's and learner's), about 3-4
minutes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax")

import tianji_jax as tj  # noqa: E402
from tianji_jax.envs import brax_env  # noqa: E402
from tianji_jax.envs.registry import resolve_env  # noqa: E402

PENDULUM = "brax:inverted_pendulum|backend=positional"


LIMIT = brax_env.DEFAULT_EPISODE_LENGTH  # 1000; tests start episodes near it instead of stepping 1000 times
T = 12  # steps per walk


@pytest.fixture(scope="module")
def walk():
    """One compiled program for the adapter tests: ``walk(key, actions (T, 1), start_steps)`` resets
    the adapter with ``key``, sets its episode step count to ``start_steps`` (so the 1000-step limit
    is reached in a few steps), then steps the adapter and, alongside, brax's own env from the same
    state (never reset) ``T`` times; also brax's reset observation for the reset key the adapter
    draws inside each step, and the first observation (``obs0``)."""
    env = resolve_env(PENDULUM).env

    @jax.jit
    def run(key, actions, start_steps):
        obs0, state = env.reset(key)
        state = state.replace(steps=start_steps)
        keys = jax.random.split(jax.random.fold_in(key, 1), T)

        def body(carry, xs):
            state, inner = carry
            k, a = xs
            obs, state, reward, term, trunc, info = env.step(k, state, a)
            inner = env.brax_env.step(inner, a)
            fresh = env.brax_env.reset(jax.random.split(k)[1]).obs
            return (state, inner), dict(obs=obs, reward=reward, term=term, trunc=trunc,
                                        final=info["final_observation"], steps=state.steps, brax_obs=inner.obs,
                                        brax_reward=inner.reward, brax_done=inner.done, fresh=fresh)

        return {**jax.lax.scan(body, (state, state.inner), (keys, actions))[1], "obs0": obs0}

    return lambda key, action, start: jax.tree.map(np.asarray, run(
        jax.random.key(key), jnp.full((T, 1), action, jnp.float32), jnp.int32(start)))


def test_spec_spaces_and_name():
    """Budget ~5 s (builds four envs, tracing each reset once)."""
    spec = resolve_env(PENDULUM + "|clip_action")
    assert spec.backend == "brax" and spec.name == "inverted_pendulum|backend=positional|clip_action"
    assert spec.action_space == tj.envs.Box((1,), np.float32, np.full(1, -1.0), np.full(1, 1.0))
    assert spec.action_kind == "continuous" and spec.observation_space.shape == (4,)
    assert spec.observation_space.dtype == np.float32 and spec.max_episode_steps == LIMIT == 1000
    same = resolve_env("brax:inverted_pendulum|episode_length=7|backend=positional")  # any order, canonical name
    assert same.name == "inverted_pendulum|backend=positional|episode_length=7" and same.max_episode_steps == 7
    assert resolve_env("brax:hopper|backend=spring").env.brax_env.backend == "spring"
    assert resolve_env("brax:reacher").env.brax_env.backend == brax_env.DEFAULT_BACKEND == "generalized"


def test_auto_reset_carries_brax_true_final_observation_and_truncates_at_the_limit(walk):
    """Budget ~25 s (compiles the module's walk). A small push keeps the pole up; the episode starts 4
    steps before the 1000-step limit: steps 1-3 are brax's own, step 4 is a truncation whose final
    observation is brax's 4th observation and whose next observation is brax's reset observation
    for the adapter's reset key; the new episode then runs on from there."""
    w = walk(0, 0.05, LIMIT - 4)
    np.testing.assert_array_equal(w["final"][:4], w["brax_obs"][:4])  # the true successor, reset or not
    np.testing.assert_array_equal(w["reward"][:4], w["brax_reward"][:4])
    assert not w["brax_done"][:4].any() and not w["term"].any()
    np.testing.assert_array_equal(w["trunc"], np.arange(T) == 3)
    np.testing.assert_array_equal(w["steps"][:5], [LIMIT - 3, LIMIT - 2, LIMIT - 1, 0, 1])
    np.testing.assert_array_equal(w["obs"][:3], w["brax_obs"][:3])
    np.testing.assert_array_equal(w["obs"][3], w["fresh"][3])  # reset: brax's observation of a new episode
    assert not np.allclose(w["obs"][3], w["final"][3])


def test_a_fall_is_a_termination_apart_from_truncation(walk):
    """Budget ~5 s (reuses the compiled walk). A full push (+1: brax's 3 N) tips the pole past
    brax's 0.2 rad within a few steps: ``terminated`` (brax's ``done``), not ``truncated``, with
    brax's final observation and a reset; with the time limit reached on that very step,
    termination still wins."""
    w = walk(1, 1.0, 0)
    ended = np.flatnonzero(w["term"] | w["trunc"])
    assert ended.size, "the pole never fell"
    fall = int(ended[0])
    assert fall >= 1 and w["term"][fall] and not w["trunc"].any()
    assert w["brax_done"][fall] == 1.0 and not w["brax_done"][:fall].any() and abs(w["brax_obs"][fall][1]) > 0.2
    np.testing.assert_array_equal(w["final"][: fall + 1], w["brax_obs"][: fall + 1])
    np.testing.assert_array_equal(w["obs"][fall], w["fresh"][fall])
    assert w["steps"][fall] == 0
    at = walk(1, 1.0, LIMIT - fall - 1)  # the limit falls on the step of the fall
    assert at["term"][fall] and not at["trunc"][: fall + 1].any()



def test_truncation_bootstraps_from_the_true_final_observation(walk):
    """Budget ~5 s (reuses the compiled walk). On a brax transition with ``truncated=1`` the library's
    GAE advantage is the hand-computed ``r + gamma * V(final_obs) - V(obs)`` (the trace is cut
    there): V of the observation the episode ended in, not of the next episode's reset observation
    that follows it; any fixed V shows it (a linear one here)."""
    w = walk(0, 0.05, LIMIT - 4)  # truncated on step index 3, alive
    value = lambda obs: obs @ np.array([0.5, -2.0, 1.5, 3.0], np.float32)  # noqa: E731
    before = np.concatenate([w["obs0"][None], w["obs"][:-1]])  # the observation each step acted on
    gamma, lam = 0.99, 0.95
    adv, _ = tj.algos.ppo.gae(w["reward"], value(before), value(w["obs"][-1]), value(w["final"]), w["term"],
                              w["trunc"], gamma, lam)
    t = 3
    assert w["trunc"][t] and not w["term"][t]
    want = w["reward"][t] + gamma * value(w["final"][t]) - value(before[t])
    wrong = w["reward"][t] + gamma * value(w["obs"][t]) - value(before[t])  # V(reset observation)
    np.testing.assert_allclose(np.asarray(adv)[t], want, rtol=1e-5, atol=1e-6)
    assert abs(want - wrong) > 1e-3


# ---- learning ---------------------------------------------------------------------------------------
PPO_SMALL = dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=4 * 16 * 3,
                 eval_episodes=0, seed=0)


@pytest.mark.parametrize("runtime", ["anakin", "async"])
def test_ppo_trains_on_brax_with_episode_statistics(runtime):
    """Budget ~60 s each on a loaded 2-core CPU (Anakin: its fused chunk, ~30 s to compile; async:
    device actor and learner programs). Three
    PPO updates with a Gaussian policy on 25-step episodes: finite losses, and episode returns and
    lengths reported from the episodes that ended (falls and truncations)."""
    config = tj.PPOConfig(env=PENDULUM + "|episode_length=25", runtime=runtime, **PPO_SMALL)
    assert config.env_spec.action_kind == "continuous"
    assert "env options backend=positional, episode_length=25;" in config.describe()  # brax's, not wrappers
    assert "wrappers" not in config.describe()
    curve = tj.train(config, progress=False).curve
    assert curve["env_steps"][-1] == 4 * 16 * 3
    for key in ("value_loss", "policy_loss", "grad_norm", "episode_return_mean", "episode_length_mean"):
        assert np.all(np.isfinite(curve[key])), (key, curve[key])
    assert np.all((curve["episode_length_mean"] >= 1) & (curve["episode_length_mean"] <= 25))
    assert np.all(curve["episode_return_mean"] > 0)  # inverted_pendulum pays 1 per step alive


def test_sac_trains_on_brax_in_anakin():
    """Budget ~60 s on a loaded 2-core CPU (one fused chunk holding a brax step, ~30 s to compile).
    SAC, the replay algorithm for Box actions, through the same env layer: 4 envs x 25-step episodes,
    learning from env step 64 on; finite TD and policy losses, a temperature that moved from its
    initial value, episode statistics from the falls and truncations, actions inside the Box."""
    config = tj.SACConfig(env=PENDULUM + "|episode_length=25", num_envs=4, num_steps=2, learning_starts=64,
                          buffer_capacity=1024, batch_size=32, replay_ratio=0.25, hidden_sizes=(32, 32),
                          total_env_steps=320, eval_every_env_steps=160, eval_episodes=0, seed=0)
    result = tj.train(config, progress=False)
    curve = result.curve
    assert curve["env_steps"][-1] == 320
    learned = curve["env_steps"] > 64
    for key in ("td_loss", "policy_loss", "alpha", "episode_return_mean", "episode_length_mean"):
        assert np.all(np.isfinite(curve[key][learned])), (key, curve[key])
    assert float(np.exp(result.params["log_alpha"])) != pytest.approx(config.init_alpha)
    assert np.all(curve["episode_return_mean"][learned] > 0)


# ---- refusals ---------------------------------------------------------------------------------------
def test_one_line_refusals(monkeypatch):
    """Budget ~5 s (two brax envs built for the Discrete-only algorithms' refusals)."""
    def refused(env, match):
        with pytest.raises(ValueError, match=match) as err:
            resolve_env(env)
        assert "\n" not in str(err.value)

    refused("brax:antt", r"env='brax:antt': unknown brax env 'antt'; allowed: \['ant', 'halfcheetah'")
    refused("brax:swimmer", r"brax env 'swimmer' is not supported: .*jnp.clip\(a_min=")
    refused("brax:ant|backend=warp", r"modifier 'backend' got value 'warp'; allowed: one of \['generalized'")
    refused("brax:ant|episode_length=0", r"modifier 'episode_length' got value '0'; allowed: an integer >= 1")
    refused("brax:ant|backend=spring|backend=spring", "modifier 'backend' given twice")
    refused("brax:ant|frame_stak=2", "unknown wrapper 'frame_stak'")
    refused("brax:ant|episodelength=5", r"unknown wrapper 'episodelength' \(in 'episodelength=5'\); allowed brax "
            r"modifiers: \['backend', 'episode_length'\]; allowed wrappers: \['mask', 'frame_stack', 'clip_action'\]$")
    with pytest.raises(ValueError, match="needs a Discrete action space|Discrete envs"):
        tj.PQNConfig(env=PENDULUM)
    with pytest.raises(ValueError, match="Discrete"):
        tj.DQNConfig(env=PENDULUM)
    find_spec = brax_env.importlib.util.find_spec
    monkeypatch.setattr(brax_env.importlib.util, "find_spec", lambda name, *a: None if name == "brax"
                        else find_spec(name, *a))
    refused("brax:ant", r"^env='brax:ant': brax is not installed; install it with pip install \"tianji-jax\[brax\]\"$")
