"""Action masks on every path that normalises observations (``normalize_observations=True``): the
mask's entries (an env's last ``EnvSpec.action_mask_size`` observation entries, 1.0 allowed) reach
every policy raw, and no forbidden action is ever taken.

The paths, one test (or parametrized case) each:

* the rule itself (:func:`~tianji_jax.algos.normalization.normalize_observation`), as the device
  statistics, the host statistics and a host actor's normaliser apply it;
* host actors (the code an actor thread and a Ray actor process run: PPO's and PQN's on-policy host
  actor with host statistics, DQN's replay host actor acting with the learner's), stepping a device
  env through ``GymnaxHostVecEnv``; Ray actor processes end to end: tests/runtime/test_ray_actors.py;
* device rollouts (Anakin and the async runtime's device actor threads), replay acting and
  sampling (DQN on Anakin), evaluation (feed-forward, recurrent, and on a host env), and sweeps;
* a masked suite env given as an object (``env=<SuiteEnv>`` or a Jumanji env object) keeps its mask,
  and a wrapper object around a masked env is refused.

The env here is :func:`tiny_masked_env`: each step forbids one of 8 actions at random, so every mask
entry is 1.0 seven steps in eight; a normalised entry then reads below 0.5 whether it was 1.0 or 0.0,
every action looks forbidden, the mask helpers allow all of them, and a forbidden action (reward -1,
the only non-zero reward) comes about one step in eight, sampled or greedy. Budget: a few seconds per case (tiny envs and
networks; the Ray case is in tests/runtime/test_ray_actors.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.envs.host_common import HostStep
from tianji_jax.envs.suites import SuiteEnv

A = 8  # actions, and mask entries (the observation's last 8)


def tiny_masked_env(time_limit: int = 8) -> SuiteEnv:
    """obs = ``[100 + 10 u, mask (8)]``: ``u`` uniform noise and the mask forbidding one action ``f``,
    both drawn anew at every reset and step (so a policy blind to the mask picks ``f`` about one step
    in eight, whatever else it sees); reward -1 for the forbidden action, else 0; truncated after
    ``time_limit`` steps. An episode's return is minus its forbidden actions."""

    def draw(key):
        k_f, k_u = jax.random.split(key)
        f = jax.random.randint(k_f, (), 0, A)
        u = jax.random.uniform(k_u, (1,))
        return f, jnp.concatenate([100.0 + 10.0 * u, jnp.ones((A,)).at[f].set(0.0)])

    def step(key, f, action):
        new, obs = draw(key)
        return new, obs, jnp.where(action == f, -1.0, 0.0), jnp.bool_(False), jnp.bool_(False)

    return SuiteEnv("TinyMasked", draw, step, A, action_mask_size=A, time_limit=time_limit)


def allowed(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """Whether each ``action`` is allowed by the raw mask in ``obs``'s last ``A`` entries (a row that
    allows none allows all, as :func:`~tianji_jax.envs.suites.action_mask`)."""
    mask = np.asarray(obs)[..., -A:] > 0.5
    mask |= ~mask.any(-1, keepdims=True)
    return np.take_along_axis(mask, np.asarray(action)[..., None].astype(np.int64), -1)[..., 0]


ON_POLICY = dict(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, hidden_sizes=(16,),
                 normalize_observations=True)
CLIP_BOUND = 10.0 + 1e-6  # normalised entries lie within [-CLIP, CLIP]


# ---- the rule ---------------------------------------------------------------------------------------
def test_one_rule_normalises_all_but_the_mask_in_numpy_and_jax():
    from tianji_jax.algos.normalization import CLIP, RunningMeanStd, normalize_observation
    from tianji_jax.runtime.actors.host_normalize import HostNormalizer, MeanStd

    x = np.asarray([[3.0, -1.0, 0.0, 1.0], [200.0, 5.0, 1.0, 0.0]])
    mean, var = np.full(4, 50.0), np.full(4, 0.01)
    want = [[-CLIP, -CLIP, 0.0, 1.0], [CLIP, -CLIP, 1.0, 0.0]]
    np.testing.assert_array_equal(normalize_observation(x, mean, var, 2), want)  # numpy in, numpy out
    np.testing.assert_array_equal(np.asarray(normalize_observation(jnp.asarray(x), jnp.asarray(mean),
                                                                   jnp.asarray(var), 2)), want)
    device = RunningMeanStd(jnp.asarray(mean, jnp.float32), jnp.asarray(var, jnp.float32), jnp.asarray(10.0))
    host = MeanStd(mean, var, 10.0)
    np.testing.assert_array_equal(np.asarray(device.normalize(jnp.asarray(x), 2)), want)
    np.testing.assert_array_equal(host.normalize(x, 2), want)
    assert host.normalize(x, 2).dtype == np.float32
    with pytest.raises(ValueError, match=r"raw_tail=5: allowed 0 to 4"):
        normalize_observation(x, mean, var, 5)
    # a host actor's normaliser takes the count from the config's env spec
    config = tj.PPOConfig(env=tiny_masked_env(), runtime="async", actor_backend="ray", **ON_POLICY,
                          total_env_steps=4 * 8 * 2)
    norm = HostNormalizer.for_config(config)
    obs = np.concatenate([np.full((4, 1), 100.0) + np.arange(4)[:, None], np.eye(A)[:4]], 1).astype(np.float32)
    step = HostStep(env_id=np.arange(4, dtype=np.int32), obs=obs, reward=np.zeros(4, np.float32),
                    terminated=np.zeros(4, bool), truncated=np.zeros(4, bool), final_obs=obs, valid=np.ones(4, bool),
                    episode_return=np.zeros(4, np.float32), episode_length=np.zeros(4, np.int32))
    seen = norm(step)
    np.testing.assert_array_equal(seen.obs[:, -A:], obs[:, -A:])
    np.testing.assert_array_equal(seen.final_obs[:, -A:], obs[:, -A:])
    assert np.all(np.abs(seen.obs[:, 0]) < 2)  # the rest is normalised


# ---- host actors (actor threads and Ray actor processes run this code) ------------------------------
def _host_config(algo: str):
    common = dict(env=tiny_masked_env(), runtime="async", actor_backend="ray", normalize_observations=True)
    if algo == "dqn":
        return tj.DQNConfig(**common, num_envs=4, num_steps=8, batch_size=16, learning_starts=32, replay_ratio=1 / 8,
                            buffer_capacity=256, hidden_sizes=(16,), total_env_steps=512)
    make = tj.PPOConfig if algo == "ppo" else tj.PQNConfig
    return make(**{**ON_POLICY, **common}, total_env_steps=4 * 8 * 2)


@pytest.mark.parametrize("algo", ["ppo", "pqn", "dqn"])
def test_host_actor_acts_on_and_stores_the_raw_mask(algo):
    """The algorithm's host actor factory (what a Ray actor process builds; PPO and PQN keep host
    statistics, DQN acts with the learner's published ones) on the masked env: every observation the
    policy sees and the actor stores keeps its mask entries raw (the rest normalised, for PPO/PQN), and
    every action sent to the env is allowed by the raw mask of the observation it was chosen for."""
    from tianji_jax.algos.registry import agent_class_for, algorithm_for
    from tianji_jax.runtime.actors.host_normalize import SharedStatistics

    config = _host_config(algo)
    assert config.env_spec.action_mask_size == A
    actor = algorithm_for(config).host_actor_fn()(config, 0, jax.devices("cpu")[0], seed=0, timer=lambda n, t0: None)
    agent = agent_class_for(config)(config)
    learner = agent.init_learner(jax.random.key(0))
    sent, wrapped = [], []
    env_step, wrap = actor.env.step, actor._wrap
    raw = {}

    def record_step(action, env_id=None):
        ids = np.arange(len(action)) if env_id is None else np.asarray(env_id)
        sent.append(allowed(raw["obs"][ids], action))
        out = env_step(action, env_id)
        raw["obs"][out.env_id] = out.obs
        return out

    def record_wrap(step):
        if "obs" not in raw:
            raw["obs"] = np.array(step.obs)
        out = wrap(step)
        wrapped.append((np.array(step.obs), np.array(out.obs), np.array(step.final_obs), np.array(out.final_obs)))
        return out

    actor.env.step, actor._wrap = record_step, record_wrap
    if algo == "dqn":  # acts with the learner's statistics, far from every observation
        size = config.env_spec.observation_shape[0]
        learner = learner.replace(obs_rms=learner.obs_rms.replace(mean=jnp.full((size,), 50.0),
                                                                  var=jnp.full((size,), 0.01)))
        params, stats = agent.acting_params(learner), None
    else:
        stats = SharedStatistics(config.env_spec.observation_shape)
        params = (learner.params, stats.published())
    try:
        for version in range(3):
            chunk, _ = actor(params if stats is None else (learner.params, stats.published()), version)
            if stats is not None:
                stats.add(chunk.pop("norm_delta"), 0)
                obs, final = np.asarray(chunk["obs"]), np.asarray(chunk["final_obs"])
                assert set(np.unique(obs[..., -A:])) <= {0.0, 1.0} and set(np.unique(final[..., -A:])) <= {0.0, 1.0}
                assert np.all(allowed(obs, np.asarray(chunk["action"])))
                assert np.all(np.abs(obs[..., 0]) < CLIP_BOUND)  # the first entry is normalised (raw: >= 100)
            else:  # replay items: raw observations
                items = chunk[0][0]
                assert set(np.unique(np.asarray(items.obs)[..., -A:])) <= {0.0, 1.0}
    finally:
        actor.close()
    for raw_obs, seen, raw_final, seen_final in wrapped:
        np.testing.assert_array_equal(seen[:, -A:], raw_obs[:, -A:])
        np.testing.assert_array_equal(seen_final[:, -A:], raw_final[:, -A:])
    assert len(sent) >= 16 and all(ok.all() for ok in sent), f"{sum(int((~ok).sum()) for ok in sent)} forbidden"


def test_host_evaluation_acts_on_the_raw_mask():
    """:func:`~tianji_jax.runtime.actors.host_actor.make_host_evaluate` (evaluation on a host env) with
    statistics far from every observation: the greedy policy sees the mask raw."""
    from tianji_jax.runtime.actors.host_actor import make_host_evaluate
    from tianji_jax.runtime.actors.host_normalize import MeanStd

    config = tj.PPOConfig(env=tiny_masked_env(), runtime="async", actor_backend="ray", **ON_POLICY,
                          total_env_steps=4 * 8 * 2)
    seen = []

    def greedy(params, obs):
        seen.append(np.array(obs))
        return np.argmax(np.asarray(obs)[:, -A:], -1).astype(np.int32)  # an allowed action, read from the mask

    size = config.env_spec.observation_shape[0]
    far = MeanStd(np.full(size, 50.0), np.full(size, 0.01), 10.0).to_running()
    returns, lengths = make_host_evaluate(config, greedy, 3)(None, far, jax.random.PRNGKey(0))
    obs = np.concatenate(seen)
    assert set(np.unique(obs[:, -A:])) == {0.0, 1.0} and np.all(obs[:, 0] == 10.0)
    np.testing.assert_array_equal(returns, 0.0)
    np.testing.assert_array_equal(lengths, 8)


# ---- device paths -----------------------------------------------------------------------------------
def _no_forbidden(curve: dict, *columns: str) -> None:
    for name in columns:
        values = np.asarray(curve[name], np.float64)
        assert np.isfinite(values).any(), (name, values)
        np.testing.assert_array_equal(values[np.isfinite(values)], 0.0, err_msg=name)


_DEVICE_CASES = {
    "anakin_ppo": lambda env: tj.PPOConfig(env=env, **ON_POLICY, total_env_steps=4 * 8 * 6, eval_episodes=4,
                                           eval_every_env_steps=4 * 8 * 2),
    "async_threads_ppo": lambda env: tj.PPOConfig(env=env, **ON_POLICY, runtime="async", num_actors=1,
                                                  total_env_steps=4 * 8 * 6, eval_episodes=0,
                                                  eval_every_env_steps=4 * 8 * 2),
    "recurrent_ppo_eval": lambda env: tj.PPOConfig(env=env, **ON_POLICY, recurrent="gru", rnn_hidden_size=8,
                                                   total_env_steps=4 * 8 * 6, eval_episodes=4,
                                                   eval_every_env_steps=4 * 8 * 2),
    "anakin_dqn_replay": lambda env: tj.DQNConfig(env=env, num_envs=4, num_steps=8, batch_size=16, learning_starts=32,
                                                  replay_ratio=1 / 8,
                                                  buffer_capacity=256, hidden_sizes=(16,), normalize_observations=True,
                                                  total_env_steps=4 * 8 * 6, eval_episodes=4,
                                                  eval_every_env_steps=4 * 8 * 2),
}


@pytest.mark.parametrize("case", list(_DEVICE_CASES))
def test_device_paths_never_take_a_forbidden_action(case):
    """Device rollouts (Anakin; the async runtime's device actor threads), replay acting and sampling
    (DQN: raw observations in replay, normalised as sampled) and evaluation (feed-forward and
    recurrent), all with observation normalisation: every training and evaluation episode returns 0
    (no forbidden action; 6 rows of 32 env steps: the first rows' few samples can leave a normalised
    mask's signs right, the later ones' cannot). DQN: what the learner samples from its replay
    is normalised with the mask raw (the replay holds it raw)."""
    config = _DEVICE_CASES[case](tiny_masked_env())
    assert config.env_spec.action_mask_size == A
    result = tj.train(config, progress=False)
    _no_forbidden(result.curve, "episode_return_mean", *(["eval_return_mean"] if config.eval_episodes else []))
    if case == "anakin_dqn_replay":
        from tianji_jax.algos.registry import agent_class_for

        replay, learner = result.state.replay, result.state.learner
        items = jax.tree.map(lambda x: x[: int(replay.size)], replay.data)
        seen = agent_class_for(config)(config).normalize_batch(learner, items)
        for raw, norm in ((items.obs, seen.obs), (items.next_obs, seen.next_obs)):
            raw, norm = np.asarray(raw), np.asarray(norm)
            assert set(np.unique(raw[:, -A:])) == {0.0, 1.0}
            np.testing.assert_array_equal(norm[:, -A:], raw[:, -A:])
            assert np.all(np.abs(norm[:, 0]) < 5)  # the rest normalised (raw: 100 to 110)


def test_sweep_members_never_take_a_forbidden_action():
    """A vmapped sweep (two learning rates) trains and evaluates with the members' rollouts and
    evaluators: no member takes a forbidden action."""
    config = _DEVICE_CASES["anakin_ppo"](tiny_masked_env())
    result = tj.sweep(config, {"learning_rate": [1e-3, 3e-3]})
    _no_forbidden({f"{k}_{i}": v[i] for k, v in result.curves.items() if k.endswith("return_mean")
                   for i in range(2)}, "episode_return_mean_0", "episode_return_mean_1",
                  "eval_return_mean_0", "eval_return_mean_1")


# ---- a masked env given as an object ---------------------------------------------------------------
def test_a_masked_env_object_keeps_its_mask_or_is_refused():
    """``env=<SuiteEnv>`` carries its mask; a Jumanji env object goes through the jumanji adapter (the
    id path's: the same spaces and mask); a wrapper object around a masked env is refused."""
    from tianji_jax.envs.wrappers import FrameStack

    spec = tj.PPOConfig(env=tiny_masked_env()).env_spec
    assert spec.action_mask_size == A and spec.action_space == tj.envs.Discrete(A)
    jumanji = pytest.importorskip("jumanji")
    by_id = tj.PPOConfig(env="jumanji:Maze-v0").env_spec
    by_object = tj.PPOConfig(env=jumanji.make("Maze-v0")).env_spec
    assert by_object.action_mask_size == by_id.action_mask_size == 4
    assert by_object.observation_space == by_id.observation_space and by_object.action_space == by_id.action_space
    assert by_object.env_params.max_steps_in_episode == by_id.env_params.max_steps_in_episode
    with pytest.raises(ValueError, match=r"^env: a wrapper object around an env with an action mask"):
        tj.PPOConfig(env=FrameStack(tiny_masked_env(), 2))
    odd = tiny_masked_env()
    odd.action_mask_size = 3  # not the 8 actions
    with pytest.raises(ValueError, match=r"env='SuiteEnv': action_mask_size=3 with action space Discrete\(8\)"):
        tj.PPOConfig(env=odd)
