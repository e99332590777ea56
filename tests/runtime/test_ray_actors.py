"""Remote actor nodes on Ray Core (docs/runtime.md, "Learner layouts"): a two-node ``ray.cluster_utils.Cluster`` on
127.0.0.1 whose head node (the learner, this process) offers no CPUs, so both remote actors run on
the second node. Every Ray wait has a timeout; the cluster is shut down and every child process this
module started is killed by its pid in the fixture's ``finally``."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import numpy as np
import pandas as pd
import psutil
import pytest

import tianji_jax as tj
from tianji_jax.config import PPOConfig

SMALL = dict(env="envpool:CartPole-v1", runtime="async", actor_backend="ray", num_actors=2, num_envs=4, num_steps=32,
             num_minibatches=2, update_epochs=1, eval_episodes=0)


@pytest.mark.parametrize("kwargs, match", [  # more bad values in test_config.py's table
    (dict(ray_address=""), "ray_address must be None, 'auto' or 'HOST:PORT'"),
    (dict(ray_max_restarts=1.5), "ray_max_restarts must be an int"),
])
def test_ray_fields_are_validated(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PPOConfig(**{**SMALL, **kwargs}, total_env_steps=4 * 32)


def test_missing_ray_says_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ImportError, match=r"tianji-jax\[ray\]"):
        PPOConfig(**SMALL, total_env_steps=4 * 32)


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    """``(cluster, head_node_id, actor_node_id)``: a head node without CPUs (the learner) and an
    actor node with 2 CPUs, both bound to 127.0.0.1, this process connected as the driver."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="tj-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    os.makedirs(os.path.join(temp, "ray"))
    # RAY_TMPDIR: the cluster writes its address file there, not in the machine-wide /tmp/ray
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": temp}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # for the node processes; this process read its constant at import:
    from ray._private import ray_constants

    cluster_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # else 127.0.0.1 is rewritten to the network address
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    c = None
    try:
        c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, node_ip_address="127.0.0.1",
                                                              include_dashboard=False,
                                                              temp_dir=os.path.join(temp, "ray")))
        actor_node = c.add_node(num_cpus=2, node_ip_address="127.0.0.1")
        ray.init(address=c.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        yield c, c.head_node.node_id, actor_node.node_id
    finally:
        ray.shutdown()
        if c is not None:
            c.shutdown()
        for p in me.children(recursive=True):
            if p.pid not in before:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        psutil.wait_procs([p for p in me.children(recursive=True) if p.pid not in before], timeout=10)
        shutil.rmtree(temp, ignore_errors=True)
        ray_constants.ENABLE_RAY_CLUSTER = cluster_flag
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_remote_actors_solve_cartpole(cluster, tmp_path):
    """Training episode_return_mean >= 475 within 500k env steps, every consumed sample within the
    lag bound, no chunk lost, both actors on the actor node. The run stops at its first row >= 475
    (the callback raises): the rows after the first hit cannot change the claim. Relaxed actors
    make the run nondeterministic: 475 was reached near 150k env steps in a trial run, and another
    ended 300k (the budget then) at 396 (38 s alone on 2 cores), hence the budget."""
    _, head_id, actor_id = cluster
    budget = 500_000
    config = PPOConfig(env="envpool:CartPole-v1", runtime="async", actor_backend="ray", num_actors=2, seed=0,
                       total_env_steps=budget, eval_episodes=0, eval_every_env_steps=16_384)
    placements: list[tuple[int, str]] = []

    class Solved(Exception):
        pass

    def callback(row: dict) -> None:
        if not placements:
            names = [n for n in ray.util.list_named_actors() if n.startswith("tianji-")]
            placements.extend(ray.get([ray.get_actor(n).info.remote() for n in names], timeout=60))
        if row["episode_return_mean"] >= 475:
            raise Solved

    with pytest.raises(Solved):  # a run that never reaches 475 ends without it and fails here
        tj.train(config, run_dir=tmp_path, progress=False, callback=callback)
    df = pd.read_csv(tmp_path / "metrics.csv")
    print(df[["env_steps", "episode_return_mean", "sps", "policy_lag_max", "lost_chunks", "h2d_s"]].to_string())
    hits = df[df["episode_return_mean"] >= 475]
    assert len(hits) > 0 and hits["env_steps"].iloc[0] <= budget
    assert (df["policy_lag_max"] <= config.policy_lag_bound).all()
    assert (df["lost_chunks"] == 0).all()
    assert len(placements) == 2 and {node for _, node in placements} == {actor_id} != {head_id}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("env, layout", [("gymnasium:CartPole-v1", {}), ("envpool:CartPole-v1", {"num_learner_devices": 2}),
                                         ("gymnasium:CartPole-v1", {"num_learner_groups": 2})])
def test_ray_cells_of_the_capability_table_run(cluster, env, layout):
    """The capability table's other Ray cells (gymnasium envs on remote actors; data-parallel
    learner devices or learner groups fed by remote actors): a few updates within the lag bound,
    nothing lost. Here and for PQN, DQN and SAC below, each learner layout runs once with the two
    host env backends alternating (a remote actor runs the same host-actor code on either)."""
    config = PPOConfig(env=env, runtime="async", actor_backend="ray", num_actors=2, num_envs=4, num_steps=32,
                       num_minibatches=2, update_epochs=1, eval_episodes=0, total_env_steps=4 * 2 * 128,
                       eval_every_env_steps=2 * 128, seed=0, **layout)
    result = tj.train(config, progress=False)
    c = result.curve
    assert c["env_steps"][-1] == config.env_steps
    assert np.all(c["policy_lag_max"] <= config.policy_lag_bound) and np.all(c["lost_chunks"] == 0)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_remote_actors_normalise_with_the_runs_merged_statistics(cluster, monkeypatch):
    """Host-env observation normalisation and reward scaling with two Ray actor processes: both
    actors' statistics reach the run's (merged in the driver as their trajectories arrive) and
    the train state holds them (tests/runtime/test_host_normalize.py checks the values with threads).
    Budget: 6 updates of 2 x 4 x 32 env steps."""
    from tianji_jax.runtime.actors.host_normalize import HostNormStats, SharedStatistics

    shared, init = [], SharedStatistics.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        shared.append(self)

    monkeypatch.setattr(SharedStatistics, "__init__", record)
    config = PPOConfig(**SMALL, normalize_observations=True, scale_rewards=True, total_env_steps=6 * 128, seed=0)
    result = tj.train(config, progress=False)
    assert result.curve["env_steps"][-1] == config.env_steps
    merged = shared[0].merged_steps
    assert set(merged) == {0, 1} and all(n >= 128 for n in merged.values()), merged
    stats = result.state.actor
    assert isinstance(stats, HostNormStats) and 6 * 128 <= float(stats.obs_rms.count) <= sum(merged.values()) + 1
    assert float(stats.return_rms.count) > 1 and np.all(np.isfinite(np.asarray(stats.obs_rms.var)))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("env, layout", [("envpool:CartPole-v1", {}), ("gymnasium:CartPole-v1", {"num_learner_devices": 2}),
                                         ("envpool:CartPole-v1", {"num_learner_groups": 2})])
def test_pqn_ray_cells_of_the_capability_table_run(cluster, env, layout):
    """PQN's Ray cells, through the generic on-policy host actor the registry gives it (PQN
    registers no factory of its own): a few updates within the lag bound, nothing lost, the
    params changed."""
    config = tj.PQNConfig(env=env, runtime="async", actor_backend="ray", num_actors=2, num_envs=4, num_steps=32,
                          num_minibatches=2, update_epochs=1, eval_episodes=0, total_env_steps=4 * 2 * 128,
                          eval_every_env_steps=2 * 128, seed=0, **layout)
    result = tj.train(config, progress=False)
    c = result.curve
    assert c["env_steps"][-1] == config.env_steps and np.all(np.isfinite(c["td_loss"]))
    assert np.all(c["policy_lag_max"] <= config.policy_lag_bound) and np.all(c["lost_chunks"] == 0)


DQN_SMALL = dict(runtime="async", actor_backend="ray", num_actors=2, num_envs=4, num_steps=8, batch_size=32,
                 learning_starts=200, buffer_capacity=2000, replay_ratio=1 / 32, eval_episodes=0, seed=0)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("env, layout", [("envpool:CartPole-v1", {}), ("gymnasium:CartPole-v1", {"num_learner_devices": 2}),
                                         ("envpool:CartPole-v1", {"num_learner_groups": 2})])
def test_dqn_ray_cells_of_the_capability_table_run(cluster, env, layout):
    """DQN's Ray cells: remote actors build their n-step transitions and feed the learner's replay
    ingress (sharded by env over two data-parallel learner devices, or one replay per learner
    group, actor i feeding group i % 2 with that group's params); every delivered env step is
    counted, nothing lost, the replay ratio held."""
    from tianji_jax.config import DQNConfig

    config = DQNConfig(env=env, **DQN_SMALL, total_env_steps=2000, eval_every_env_steps=500, **layout)
    result = tj.train(config, progress=False)
    c = result.curve
    assert np.all(c["lost_chunks"] == 0) and c["env_steps"][-1] >= 1500
    np.testing.assert_allclose(c["replay_ratio_observed"][-1], config.replay_ratio, rtol=0.25)
    assert np.all(np.isfinite(c["td_loss"]))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("env, layout", [("envpool:Pendulum-v1", {"normalize_observations": True}),
                                         ("gymnasium:Pendulum-v1", {"num_learner_devices": 2}),
                                         ("envpool:Pendulum-v1", {"num_learner_groups": 2})])
def test_sac_ray_cells_of_the_capability_table_run(cluster, env, layout):
    """SAC's Ray cells, through the generic replay host actor the registry gives it (SAC registers
    no factory of its own): remote actors sample the squashed Gaussian on CPU and feed continuous
    n-step transitions to the learner's replay; nothing lost, the replay ratio held. With
    observation normalisation the remote actors act with the statistics published with the params,
    and the learner's are those of every raw observation its replay holds."""
    config = tj.SACConfig(env=env, **{**DQN_SMALL, "replay_ratio": 1 / 8}, hidden_sizes=(32, 32),
                          total_env_steps=1200, eval_every_env_steps=400, **layout)
    result = tj.train(config, progress=False)
    c = result.curve
    assert np.all(c["lost_chunks"] == 0) and c["env_steps"][-1] >= 800
    np.testing.assert_allclose(c["replay_ratio_observed"][-1], config.replay_ratio, rtol=0.25)
    assert np.all(np.isfinite(c["td_loss"])) and np.all(np.isfinite(c["alpha"]))
    if config.normalize_observations:
        replay, rms = result.state.replay, result.state.learner.obs_rms
        obs = np.asarray(replay.data.obs, np.float64)[: int(replay.size)]
        assert float(rms.count) == pytest.approx(len(obs) + 1e-4) and len(obs) >= 800
        np.testing.assert_allclose(np.asarray(rms.mean), obs.mean(0), rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(rms.var), obs.var(0), rtol=2e-5, atol=1e-6)


_DEVICE_ENV_CASES = [  # every algorithm once on a device env, the learner layouts rotating over them
    ("ppo", "gymnax:CartPole-v1", {"normalize_observations": True}),
    ("pqn", "gymnax:CartPole-v1", {"num_learner_devices": 2}),
    ("dqn", "gymnax:CartPole-v1", {"num_learner_groups": 2}),
    ("sac", "gymnax:Pendulum-v1", {"normalize_observations": True, "num_learner_devices": 2}),
]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo, env, layout", _DEVICE_ENV_CASES, ids=[c[0] for c in _DEVICE_ENV_CASES])
def test_device_env_cells_on_ray_actors_run(cluster, algo, env, layout):
    """The capability table's Ray cells on device envs (gymnax ids): each remote actor steps its envs
    through GymnaxHostVecEnv (one jitted step of its envs on its CPU, the host backends' next-step
    auto-reset), so every algorithm's host actor runs them as it runs envpool; a few updates within the
    lag bound, nothing lost, finite losses, episodes counted. The learner layouts are the same code
    for every env backend once actors step on the host (their runs with envpool and gymnasium are above);
    here each runs once."""
    make = {"ppo": tj.PPOConfig, "pqn": tj.PQNConfig, "dqn": tj.DQNConfig, "sac": tj.SACConfig}[algo]
    common = dict(env=env, runtime="async", actor_backend="ray", num_actors=2, eval_episodes=0, seed=0, **layout)
    if algo in ("ppo", "pqn"):
        config = make(**common, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=1,
                                total_env_steps=4 * 2 * 128, eval_every_env_steps=2 * 128)
    else:
        small = {**{k: v for k, v in DQN_SMALL.items() if k not in common},
                 **({"hidden_sizes": (32, 32), "replay_ratio": 1 / 8} if algo == "sac" else {})}
        config = make(**common, **small, total_env_steps=1200, eval_every_env_steps=400)
    assert config.host_stepped
    result = tj.train(config, progress=False)
    c = result.curve
    assert np.all(c["lost_chunks"] == 0) and c["env_steps"][-1] >= 0.66 * config.env_steps
    if algo in ("ppo", "pqn"):  # (replay samples older items by design: its gate is at insert)
        assert np.all(c["policy_lag_max"] <= config.policy_lag_bound)
    loss = "td_loss" if algo != "ppo" else "value_loss"
    assert np.all(np.isfinite(c[loss]))
    assert algo == "sac" or np.nansum(c["episodes"]) > 0  # (Pendulum's 200-step episodes outlast each env's share)
    if config.normalize_observations and algo == "ppo":  # the run's shared host statistics
        assert float(result.state.actor.obs_rms.count) >= config.env_steps


@pytest.mark.timeout(240)
def test_remote_actors_on_a_masked_suite_env_keep_the_mask_raw(cluster, monkeypatch):
    """PPO with one Ray actor process on ``jumanji:Maze-v0`` (its action mask: the observation's last 4
    entries) and observation normalisation: every trajectory the driver receives stores the mask raw
    (0.0 / 1.0; the host statistics once normalised it too, and every action looked allowed) and every
    action is allowed by it (tests/algos/test_action_mask_paths.py covers the other paths). Budget: 2
    updates of 4 x 16 env steps; the actor process compiles Maze's step and the policy."""
    pytest.importorskip("jumanji")
    import jax

    from tianji_jax.envs.suites import action_mask
    from tianji_jax.runtime.actors.ray_actors import RayActorClient

    received, call = [], RayActorClient.__call__

    def record(self, params, version):
        out = call(self, params, version)
        if out is not None:
            received.append(jax.device_get({k: out[0][k] for k in ("obs", "final_obs", "action")}))
        return out

    monkeypatch.setattr(RayActorClient, "__call__", record)
    config = PPOConfig(**{**SMALL, "env": "jumanji:Maze-v0", "num_actors": 1, "num_steps": 16},
                       normalize_observations=True, total_env_steps=2 * 64, seed=0)
    size = config.env_spec.action_mask_size
    assert size == 4
    tj.train(config, progress=False)
    assert len(received) >= 2
    for traj in received:
        obs, action = np.asarray(traj["obs"]), np.asarray(traj["action"])
        assert set(np.unique(obs[..., -size:])) <= {0.0, 1.0}, np.unique(obs[..., -size:])[:8]
        assert set(np.unique(np.asarray(traj["final_obs"])[..., -size:])) <= {0.0, 1.0}
        assert not np.all(np.isin(obs[..., :-size], (0.0, 1.0)))  # the rest is normalised
        ok = np.take_along_axis(np.asarray(action_mask(obs, size)), action[..., None], -1)[..., 0]
        assert ok.all(), f"{int((~ok).sum())} forbidden actions of {ok.size}"


def _kill_during_rollout(client, after_chunks: int) -> list[int]:
    """Make ``client`` SIGKILL its actor process right after submitting the rollout that follows
    its ``after_chunks``-th chunk (the task is in flight). Returns the list the killed pid goes to."""
    killed: list[int] = []
    submit = client._submit

    def submit_then_kill(params_ref, version):
        task = submit(params_ref, version)
        if not killed and len(client.chunks) >= after_chunks:
            killed.append(client.chunks[-1].pid)
            os.kill(killed[0], signal.SIGKILL)
        return task

    client._submit = submit_then_kill
    return killed


@pytest.mark.timeout(240)
def test_killed_remote_actor_is_restarted_and_its_chunk_lost_once(cluster):
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

    config = PPOConfig(**SMALL, total_env_steps=4 * 32 * 5000, ray_max_restarts=2)
    ppo = AsyncOnPolicy(config)
    try:
        clients = ppo.remote.clients
        killed = _kill_during_rollout(clients[0], after_chunks=3)

        def restarted_actor_delivered(*_):  # stop once the restarted process has inserted 3 chunks
            return sum(m.incarnation == 1 for m in clients[0].chunks) >= 3

        done = ppo.runner.run(restarted_actor_delivered)
        assert 6 <= done < config.num_updates
        assert len(killed) == 1 and ppo.lost_chunks == 1 and clients[0].lost_chunks == 1
        assert clients[0].deaths == 1 and clients[1].deaths == 0 and clients[1].lost_chunks == 0
        metas = [m for c in clients for m in c.chunks]
        ids = [(m.actor_id, m.pid, m.seq) for m in metas]
        assert len(ids) == len(set(ids))  # no chunk delivered twice
        pids = [m.pid for m in clients[0].chunks]
        first_new = pids.index(next(p for p in pids if p != killed[0]))
        # restarted process: every chunk before the first new pid came from the killed one (3, or 4
        # when the chunk submitted just before the kill returned first, which load makes likely)
        assert first_new >= 3 and set(pids[:first_new]) == {killed[0]} and killed[0] not in pids[first_new:]
        assert clients[0].incarnation == 1 and all(m.incarnation == 1 for m in clients[0].chunks[first_new + 1:])
        # inserted == chunks the clients returned (the lost one never reached the queue)
        runner = ppo.runner
        assert [len(log) for log in runner.actor_logs] == [len(c.chunks) for c in clients]
        assert runner.buffer.produced == len(metas) * config.batch_size
        assert [m.version for m in clients[0].chunks] == runner.actor_logs[0]
        # one put per version, except around the restart: a request carrying an older version than
        # the newest put (the lost chunk's) puts that version again, then the newest again (seen: done
        # + 3); test_params_are_put_once_per_version_and_shared holds the strict bound without a kill
        assert len({m.version for m in metas}) <= ppo.remote.publisher.puts <= done + 3
    finally:
        ppo.close()


@pytest.mark.timeout(240)
def test_killed_remote_dqn_actor_loses_one_chunk_and_every_env_step_is_counted(cluster):
    """Replay data path, a remote actor SIGKILLed mid-rollout: its chunk is lost once (counted in
    ``lost_chunks``, never inserted), Ray restarts it, and the ingress counters close:
    ``produced == inserted + dropped_stale + resident`` with ``produced`` the env steps of every
    delivered chunk, and env steps acted == delivered + lost chunk x chunk size."""
    from tianji_jax.config import DQNConfig
    from tianji_jax.runtime.async_replay import AsyncReplay

    config = DQNConfig(env="envpool:CartPole-v1", **DQN_SMALL, total_env_steps=200_000, ray_max_restarts=2)
    dqn = AsyncReplay(config)
    try:
        clients = dqn.remote.clients
        killed = _kill_during_rollout(clients[0], after_chunks=3)
        done = dqn.runner.run(lambda *_: sum(m.incarnation == 1 for m in clients[0].chunks) >= 3)
        assert 0 < done < config.learning_iterations
        assert len(killed) == 1 and dqn.lost_chunks == 1 and clients[0].deaths == 1 and clients[1].lost_chunks == 0
        metas = [m for c in clients for m in c.chunks]
        assert len({(m.actor_id, m.pid, m.seq) for m in metas}) == len(metas)  # none delivered twice
        buf = dqn.runner.buffer
        assert buf.produced == sum(m.num_steps for m in metas) == len(metas) * config.iteration_env_steps
        assert buf.produced == buf.inserted + buf.dropped_stale + buf.resident
        # the replay holds no more items than the env steps inserted (n-step windows lag n - 1 steps)
        assert int(dqn.replay_state.num_inserted) <= buf.inserted
    finally:
        dqn.close()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_dqn_with_two_remote_actors_solves_cartpole(cluster):
    """Acceptance of the DQN Ray cell: two remote actors on the actor node (8 envpool CartPole-v1
    envs each) feed the learner's replay; the greedy policy's eval return (10 episodes after every
    row of 5k env steps) reaches 475 within 150k env steps, seed 0. Settings of
    ``test_dqn_host.test_async_dqn_learns_envpool_cartpole`` (SB3 rl-zoo-style CartPole DQN with
    Polyak targets, Double DQN, 3-step targets, replay ratio 0.25), split over two actors."""
    from tianji_jax.config import DQNConfig

    budget = 150_000
    from dqn_settings import CARTPOLE_FAST

    config = DQNConfig(env="envpool:CartPole-v1", runtime="async", actor_backend="ray", num_actors=2, seed=0,
                       total_env_steps=budget, num_envs=8, learning_starts=1000, buffer_capacity=50_000,
                       **CARTPOLE_FAST)
    result = tj.train(config, progress=False)
    c = result.curve
    print(f"DQN on 2 Ray actors: eval returns {np.round(c['eval_return_mean'], 1).tolist()} at env steps "
          f"{c['env_steps'].astype(int).tolist()}; lost chunks {int(c['lost_chunks'][-1])}")
    assert result.stopped_early and c["eval_return_mean"][-1] >= 475 and c["env_steps"][-1] <= budget
    assert np.all(c["lost_chunks"] == 0)


@pytest.mark.timeout(180)
def test_actor_dying_past_max_restarts_stops_the_run(cluster):
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy
    from tianji_jax.runtime.actors.ray_actors import RemoteActorError

    config = PPOConfig(**{**SMALL, "num_actors": 1}, total_env_steps=4 * 32 * 200, ray_max_restarts=0)
    ppo = AsyncOnPolicy(config)
    try:
        _kill_during_rollout(ppo.remote.clients[0], after_chunks=2)
        client = ppo.remote.clients[0]
        with pytest.raises(RemoteActorError, match="no longer restarts it .max_restarts=0"):
            ppo.runner.run(lambda *_: False)
        # 2 chunks delivered, or 3 when the rollout submitted just before the kill returned first
        # (seen under CI load); either way only delivered chunks were inserted, all from one process
        assert len(client.chunks) in (2, 3) and {m.pid for m in client.chunks} == {client.chunks[0].pid}
        assert ppo.runner.buffer.produced == len(client.chunks) * config.batch_size
    finally:
        ppo.close()


def test_params_are_put_once_per_version_and_shared(cluster):
    from tianji_jax.runtime.actors.ray_actors import ParamPublisher

    pub = ParamPublisher()
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    r0, r0_again = pub.ref(params, 0), pub.ref(params, 0)
    assert r0 == r0_again and pub.puts == 1  # the second actor asking for version 0 gets the same object
    r1 = pub.ref({"w": params["w"] + 1}, 1)
    assert r1 != r0 and pub.puts == 2
    # republished at the same version (a replay learner's fresh observation statistics): put again
    refreshed = {"w": params["w"] + 1}
    assert pub.ref(refreshed, 1) != r1 and pub.ref(refreshed, 1) == pub.ref(refreshed, 1) and pub.puts == 3
    np.testing.assert_array_equal(ray.get(r1, timeout=30)["w"], params["w"] + 1)
