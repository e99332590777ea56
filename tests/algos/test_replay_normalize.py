"""Observation normalisation on the replay data path (``normalize_observations`` of the DQN family
and SAC), as Stable-Baselines3's VecNormalize does it with a replay buffer: replay stores raw
observations, the statistics fold in every observation as it enters replay (so several actors
need no merge), actors act with the statistics published with the params, sampled batches are
normalised with the current ones, evaluation reads them frozen and resume restores them exactly.

Budgets (2-core CPU, shared compilation cache): about 2-3 min for the file; each run is a few
hundred env steps of 32-unit networks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianji_jax as tj
from resume_check import assert_same_leaves, full_and_resumed
from tianji_jax.algos.normalization import CLIP, RunningMeanStd
from tianji_jax.algos.replay_agent import ActingParams

SMALL = dict(num_envs=4, num_steps=2, learning_starts=64, buffer_capacity=1024, batch_size=32, replay_ratio=0.25,
             hidden_sizes=(32, 32), total_env_steps=400, eval_every_env_steps=200, eval_episodes=2, seed=0)
RANDOM_DQN = dict(epsilon_start=1.0, epsilon_end=1.0)  # actions never depend on the network
RTOL, ATOL = 2e-5, 1e-6  # float32: the running merge against NumPy's float64 one-pass statistics


def _numpy_stats(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(obs, np.float64).reshape(len(obs), -1)
    return x.mean(0), x.var(0)


def _assert_stats_of(rms: RunningMeanStd, obs: np.ndarray) -> None:
    """``rms`` is the running statistics of exactly the rows of ``obs`` (after the 1e-4 prior)."""
    mean, var = _numpy_stats(obs)
    assert float(rms.count) == pytest.approx(len(obs) + 1e-4, rel=1e-6)
    np.testing.assert_allclose(np.asarray(rms.mean).reshape(-1), mean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(rms.var).reshape(-1), var, rtol=RTOL, atol=ATOL)


def _stored_obs(replay) -> np.ndarray:
    """Every observation in a replay (one buffer, or the shards stacked on a leading axis)."""
    obs, size = np.asarray(replay.data.obs), np.asarray(replay.size)
    if size.ndim == 0:
        return obs[: int(size)]
    return np.concatenate([o[: int(s)] for o, s in zip(obs, size)])


def test_masked_update_is_the_merge_over_the_selected_rows():
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(3.0, 2.0, (50, 3)).astype(np.float32), rng.normal(-1.0, 0.5, (40, 3)).astype(np.float32)
    m1, m2 = rng.random(50) < 0.6, rng.random(40) < 0.3
    rms = RunningMeanStd.create((3,)).update_masked(jnp.asarray(x1), jnp.asarray(m1))
    rms = rms.update_masked(jnp.asarray(x2), jnp.asarray(m2))
    _assert_stats_of(rms, np.concatenate([x1[m1], x2[m2]]))
    same = rms.update_masked(jnp.asarray(x2), jnp.zeros(40, bool))  # nothing selected: unchanged
    assert_same_leaves(rms, same)


def test_anakin_folds_in_exactly_the_raw_observations_replay_holds():
    """Random actions, so the normalised run's env trajectory equals the plain run's: replay holds
    the same raw observations bit for bit, and the statistics are those of exactly them."""
    config = tj.DQNConfig(**SMALL, **RANDOM_DQN, normalize_observations=True)
    norm = tj.train(config, progress=False)
    plain = tj.train(config.replace(normalize_observations=False), progress=False)
    stored = _stored_obs(norm.state.replay)
    np.testing.assert_array_equal(stored, _stored_obs(plain.state.replay))
    assert len(stored) == 392  # 400 steps, the last n_step - 1 = 2 of each of the 4 envs still in the window
    _assert_stats_of(norm.state.learner.obs_rms, stored)
    assert plain.state.learner.obs_rms is None and plain.state.obs_rms is None


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_async_sync_equals_anakin_with_normalisation(algo):
    """The ``sync`` schedule reproduces Anakin bit for bit: the learner folds in each inserted
    chunk and republishes the statistics with the params, also before its first block (SAC's
    policy acts at ``learning_starts``, one iteration before it)."""
    cls = tj.DQNConfig if algo == "dqn" else tj.SACConfig
    config = cls(**SMALL, normalize_observations=True)
    anakin = tj.train(config, progress=False)
    sync = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
    assert_same_leaves(anakin.params, sync.params)
    assert_same_leaves(anakin.state.learner.obs_rms, sync.state.learner.obs_rms)
    assert anakin.curve["eval_return_mean"][-1] == sync.curve["eval_return_mean"][-1]


@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "gymnasium:CartPole-v1"], ids=["device", "host"])
def test_two_async_actors_share_the_learners_statistics(env):
    """Two actor threads (device actors, or host actors stepping gymnasium envs) feed one replay:
    the learner's statistics are those of every observation in it (nothing merged, nothing lost)."""
    config = tj.DQNConfig(**SMALL, runtime="async", num_actors=2, normalize_observations=True, env=env)
    result = tj.train(config, progress=False)
    stored = _stored_obs(result.state.replay)
    assert len(stored) >= 300  # the run's inserts less each env's n-step window (2 actors x 4 envs x 2 steps)
    _assert_stats_of(result.state.learner.obs_rms, stored)
    assert np.all(np.isfinite(result.curve["td_loss"]))


def test_learner_groups_share_one_set_of_statistics(monkeypatch):
    """Two learner groups, each with its own replay and actor: both groups' inserts fold into one
    set, which is then that of every observation in both replays."""
    from tianji_jax.runtime import async_replay

    runs = []
    init = async_replay.AsyncReplay.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(async_replay.AsyncReplay, "__init__", record)
    config = tj.DQNConfig(**{**SMALL, "learning_starts": 96}, runtime="async", num_actors=2, num_learner_groups=2,
                          normalize_observations=True)
    result = tj.train(config, progress=False)
    (runtime,) = runs
    stored = np.concatenate([_stored_obs(r) for r in runtime.replay_states])
    assert min(int(r.size) for r in runtime.replay_states) > 100
    _assert_stats_of(runtime.shared_obs_rms, stored)
    assert np.all(np.isfinite(result.curve["td_loss"]))


def test_data_parallel_learners_fold_in_every_shard():
    """Two data-parallel learners (replay sharded by env): the replicated statistics cover both shards."""
    config = tj.DQNConfig(**SMALL, **RANDOM_DQN, normalize_observations=True, num_learner_devices=2)
    result = tj.train(config, progress=False)
    stored = _stored_obs(result.state.replay)
    assert len(stored) == 392
    _assert_stats_of(result.state.learner.obs_rms, stored)


@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "envpool:CartPole-v1"], ids=["device", "host"])
def test_async_data_parallel_learners_fold_in_every_shard(env):
    """The async runtime with two data-parallel learners: its inserts arrive split by env over the
    learner devices ((L, T * N / L, ...)); the statistics are those of every observation in every
    shard (this layout once failed with a shape error at the first insert)."""
    config = tj.DQNConfig(**SMALL, runtime="async", normalize_observations=True, num_learner_devices=2, env=env)
    result = tj.train(config, progress=False)
    stored = _stored_obs(result.state.replay)
    assert len(stored) >= 300
    _assert_stats_of(result.state.learner.obs_rms, stored)


def test_acting_evaluation_and_sampling_read_the_statistics():
    config = tj.DQNConfig(**SMALL, normalize_observations=True)
    trainer = tj.make_train(config, 1)
    agent = trainer.agent
    learner = agent.init_learner(jax.random.PRNGKey(0))
    rng = np.random.default_rng(1)
    rms = RunningMeanStd(jnp.asarray([1.0, -2.0, 0.5, 3.0]), jnp.asarray([4.0, 0.25, 1.0, 9.0]), jnp.asarray(10.0))
    learner = learner.replace(obs_rms=rms)
    obs = jnp.asarray(rng.normal(0.0, 5.0, (64, 4)).astype(np.float32))
    by_hand = np.clip((np.asarray(obs) - np.asarray(rms.mean)) / np.sqrt(np.asarray(rms.var) + 1e-8), -CLIP, CLIP)
    acting = agent.acting_params(learner)
    assert isinstance(acting, ActingParams)
    np.testing.assert_allclose(np.asarray(agent.unpack(acting, obs)[1]), by_hand, rtol=1e-6, atol=1e-6)
    greedy = agent.greedy_action(learner.params, jnp.asarray(by_hand, jnp.float32))
    np.testing.assert_array_equal(np.asarray(agent.act_greedy(acting, obs)), np.asarray(greedy))
    key, eps = jax.random.PRNGKey(2), jnp.zeros(64, jnp.float32)
    np.testing.assert_array_equal(np.asarray(agent.host_act(acting, obs, key, eps)[0]), np.asarray(greedy))
    batch = agent.example_item.__class__(obs=obs, action=jnp.zeros(64, jnp.int32), reward=jnp.zeros(64),
                                         discount=jnp.ones(64), next_obs=obs + 1.0)
    seen = agent.normalize_batch(learner, batch)
    np.testing.assert_allclose(np.asarray(seen.obs), by_hand, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(seen.next_obs), np.asarray(rms.normalize(obs + 1.0)), rtol=0, atol=0)
    plain = agent.init_learner(jax.random.PRNGKey(0)).replace(obs_rms=None)  # no normalisation: untouched
    assert agent.acting_params(plain) is plain.params and agent.normalize_batch(plain, batch) is batch


def test_resume_restores_the_statistics_and_evaluation_leaves_them(tmp_path):
    config = tj.DQNConfig(**SMALL, normalize_observations=True)
    full, resumed = full_and_resumed(config, tmp_path)
    assert_same_leaves(full.state, resumed.state)  # obs_rms included, bit for bit
    loaded = tj.load(tmp_path / "full")
    assert_same_leaves(loaded.state.learner.obs_rms, full.state.learner.obs_rms)
    before = jax.tree.map(np.array, loaded.state.learner.obs_rms)
    first = tj.evaluate(loaded.config, loaded.state, num_episodes=2, seed=3)
    again = tj.evaluate(loaded.config, loaded.state, num_episodes=2, seed=3)
    np.testing.assert_array_equal(first["returns"], again["returns"])
    assert_same_leaves(before, loaded.state.learner.obs_rms)  # evaluation reads them, never updates


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(normalize_observations=1), TypeError, r"normalize_observations must be a bool"),
])
def test_bad_normalisation_configs_are_refused_in_one_line(kwargs, exc, match):
    with pytest.raises(exc, match=match) as info:
        tj.DQNConfig(**{**SMALL, **kwargs})
    assert "\n" not in str(info.value)


_PROCESS_WORKER = """
import sys, numpy as np
pid, port, out, env = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
import jax
jax.config.update("jax_num_cpu_devices", 2)
from tianji_jax.runtime.layouts import distributed as dist
dist.initialize(f"127.0.0.1:{port}", 2, pid, heartbeat_timeout_s=10)
import tianji_jax as tj
from tianji_jax.runtime.actors.host_normalize import MeanStd, SharedStatistics
rows, exchanged = [], []
of_rows, exchange = MeanStd.of_rows.__func__, SharedStatistics.exchange
def record_rows(cls, x, mask):
    rows.append(np.asarray(x, np.float64)[np.asarray(mask, bool)])
    return of_rows(cls, x, mask)
def record_exchange(self):  # inserts and blocks run in the learner thread: nothing arrives in between
    exchanged.append(sum(len(r) for r in rows))
    exchange(self)
MeanStd.of_rows, SharedStatistics.exchange = classmethod(record_rows), record_exchange
cfg = tj.DQNConfig(env=env, runtime="async", schedule="relaxed", num_actors=2, num_envs=4, num_steps=4,
                   learning_starts=256, batch_size=32, buffer_capacity=2048, replay_ratio=0.125,
                   total_env_steps=1024, eval_episodes=2, eval_every_env_steps=1024, normalize_observations=True,
                   seed=5, num_processes=2, process_id=pid, coordinator=f"127.0.0.1:{port}")
result = tj.train(cfg, progress=False, tensorboard=False)
rms = result.state.learner.obs_rms
np.savez(out, rows=np.concatenate(rows), exchanged=np.asarray(exchanged), mean=np.asarray(rms.mean),
         var=np.asarray(rms.var), count=np.asarray(rms.count))
print("worker done", file=sys.stderr, flush=True)
"""


@pytest.mark.slow  # two jax.distributed processes: about 60 s on 2 cores
@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", ["envpool:CartPole-v1", "gymnax:CartPole-v1"])
def test_two_processes_exchange_the_replay_statistics_at_every_block(tmp_path, env):
    """Two learner processes (``num_processes=2``), each with two actors under ``relaxed``: each folds
    the observations entering its replay into a pending delta; every learner block first merges every
    process's delta in process order, so both learners hold the same statistics, those of every
    observation either process had inserted by the last block (NumPy reference, float32 tolerance)."""
    import os
    import socket
    import subprocess
    import sys

    pytest.importorskip("envpool")
    script = tmp_path / "worker.py"
    script.write_text(_PROCESS_WORKER)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env_vars = {k: v for k, v in os.environ.items() if k != "TIANJI_DISTRIBUTED_CHILD"}
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(tmp_path / f"p{i}.npz"), env],
                              cwd=tmp_path, env=env_vars, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errs]
    out = [dict(np.load(tmp_path / f"p{i}.npz")) for i in range(2)]
    for key in ("mean", "var", "count"):
        np.testing.assert_array_equal(out[0][key], out[1][key])  # the same statistics on both learners
    assert len(out[0]["exchanged"]) == len(out[1]["exchanged"]) > 1  # one exchange per block, in lockstep
    seen = np.concatenate([o["rows"][:o["exchanged"][-1]] for o in out])
    assert float(out[0]["count"]) == pytest.approx(len(seen) + 1e-4)
    mean = seen.mean(axis=0) * len(seen) / (len(seen) + 1e-4)  # the prior (mean 0, var 1, count 1e-4) merged in
    np.testing.assert_allclose(out[0]["mean"], mean, rtol=1e-5, atol=1e-6)
    m2 = 1e-4 + seen.var(axis=0) * len(seen) + seen.mean(axis=0) ** 2 * 1e-4 * len(seen) / (len(seen) + 1e-4)
    np.testing.assert_allclose(out[0]["var"], m2 / (len(seen) + 1e-4), rtol=1e-5)


def test_the_atari_frame_replay_is_refused():
    pytest.importorskip("envpool")
    with pytest.raises(ValueError, match=r"normalize_observations=True is not supported with env 'envpool:Pong-v5'"
                                         r": its replay stores each uint8 frame once") as info:
        tj.DQNConfig(env="envpool:Pong-v5", runtime="async", normalize_observations=True)
    assert "\n" not in str(info.value)


def test_describe_lists_the_env_layer():
    """``describe()`` names the id's wrappers and the statistics the config keeps, for every data path."""
    sac = tj.SACConfig(env="gymnax:Pendulum-v1|clip_action", normalize_observations=True).describe()
    assert ("env layer: wrappers clip_action (from the env id); observation normalisation by running mean/std, "
            "clipped to [-10, 10] (observations raw in replay") in sac
    ppo = tj.PPOConfig(env="gymnax:Pendulum-v1", normalize_observations=True, scale_rewards=True).describe()
    assert "stored normalised); reward scaling by the running std of the discounted return" in ppo
    assert "env layer" not in tj.DQNConfig().describe() and "env layer" not in tj.PPOConfig().describe()


def test_an_action_mask_passes_through_normalisation_raw():
    """On a masked env (Jumanji's Maze: the mask is the observation's last 4 entries) normalisation
    leaves the mask raw, so no masked action is ever taken by PPO (sampled, greedy) or DQN (random,
    greedy) acting on normalised observations. The statistics are chosen to push every entry to
    the clip bound: a normalised mask would forbid every action (then all are allowed), and the
    walks would take forbidden ones. Budget ~60 s (four compiled walks of 32 envs x 40 steps)."""
    pytest.importorskip("jumanji")
    from test_suites import MAZE, _walk
    from tianji_jax.runtime.anakin import make_agent

    x = jnp.asarray([[3.0, -1.0, 0.0, 1.0]])
    far = RunningMeanStd(jnp.full((4,), 50.0), jnp.full((4,), 0.01), jnp.asarray(10.0))
    np.testing.assert_array_equal(np.asarray(far.normalize(x, raw_tail=2)), [[-CLIP, -CLIP, 0.0, 1.0]])
    ppo = make_agent(tj.PPOConfig(env=MAZE, num_envs=32, normalize_observations=True))
    size = ppo.spec.observation_shape[0]
    rms = RunningMeanStd(jnp.full((size,), 50.0), jnp.full((size,), 0.01), jnp.asarray(10.0))
    params = ppo.init_learner(jax.random.key(0)).params
    _walk(ppo.spec, 32, 40, lambda k, obs: ppo.policy(params, rms.normalize(obs, ppo.mask_size), k, jnp.int32(0))[1])
    _walk(ppo.spec, 32, 40, lambda k, obs: ppo.greedy(params, rms.normalize(obs, ppo.mask_size)))
    dqn = make_agent(tj.DQNConfig(env=MAZE, num_envs=32, replay_ratio=0.125, normalize_observations=True))
    learner = dqn.init_learner(jax.random.key(0)).replace(obs_rms=rms)
    acting = dqn.acting_params(learner)
    ones = jnp.ones((32,), jnp.float32)
    _walk(dqn.spec, 32, 40, lambda k, obs: dqn.host_act(acting, obs, k, ones)[0])  # epsilon 1: random
    _walk(dqn.spec, 32, 40, lambda k, obs: dqn.act_greedy(acting, obs))
    batch = dqn.example_item.__class__(obs=jnp.ones((2, size)), action=jnp.zeros(2, jnp.int32),
                                       reward=jnp.zeros(2), discount=jnp.ones(2), next_obs=jnp.zeros((2, size)))
    seen = dqn.normalize_batch(learner, batch)  # the learner keeps the mask raw too
    np.testing.assert_array_equal(np.asarray(seen.obs)[:, -4:], 1.0)
    np.testing.assert_array_equal(np.asarray(seen.next_obs)[:, -4:], 0.0)
    assert np.all(np.asarray(seen.obs)[:, :-4] == -CLIP)
