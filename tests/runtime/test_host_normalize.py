"""Observation normalisation and reward scaling with host envs (envpool/gymnasium) on the async
runtime: the numpy statistics and wrapper against hand-computed values, the run's merged
statistics against a NumPy reference over the observations two actors produced, checkpoints and
resume, frozen evaluation, and the layouts refused."""

from __future__ import annotations

import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.envs.host_common import HostStep
from tianji_jax.runtime.actors import host_actor as host_actor_mod
from tianji_jax.runtime.actors import host_normalize as hn
from tianji_jax.runtime.actors.host_normalize import HostNormalizer, HostNormStats, MeanStd, SharedStatistics

HOST = dict(env="envpool:CartPole-v1", runtime="async", num_envs=4, num_steps=16, eval_episodes=2,
            normalize_observations=True, scale_rewards=True, seed=3)


def _reference(samples: np.ndarray) -> MeanStd:
    """The prior (mean 0, var 1, count 1e-4) merged with the samples' own mean/variance, in NumPy."""
    n = len(samples)
    prior_n = 1e-4
    mean = samples.mean(axis=0)
    tot = prior_n + n
    m = mean * n / tot
    m2 = 1.0 * prior_n + samples.var(axis=0) * n + mean**2 * prior_n * n / tot
    return MeanStd(m, m2 / tot, tot)


def test_mean_std_merge_equals_statistics_of_the_concatenation():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (k, 3)) for k in (1, 7, 0, 40, 2)]
    stats, delta = MeanStd.prior((3,)), MeanStd.empty((3,))
    for b in batches:
        stats.update(b)
        delta.update(b)
    ref = _reference(np.concatenate(batches))
    np.testing.assert_allclose(stats.mean, ref.mean, rtol=1e-12)
    np.testing.assert_allclose(stats.var, ref.var, rtol=1e-12)
    assert stats.count == pytest.approx(ref.count)
    merged = MeanStd.prior((3,)).merge(delta)  # prior + one delta == folding in batch by batch
    np.testing.assert_allclose(merged.mean, stats.mean, rtol=1e-12)
    np.testing.assert_allclose(merged.var, stats.var, rtol=1e-12)
    np.testing.assert_allclose(MeanStd.empty((3,)).merge(stats).mean, stats.mean)


def _step(ids, obs, reward, term, trunc, valid) -> HostStep:
    obs = np.asarray(obs, np.float32)
    n = len(ids)
    return HostStep(env_id=np.asarray(ids, np.int32), obs=obs, reward=np.asarray(reward, np.float32),
                    terminated=np.asarray(term, bool), truncated=np.asarray(trunc, bool), final_obs=obs,
                    valid=np.asarray(valid, bool), episode_return=np.zeros(n, np.float32),
                    episode_length=np.zeros(n, np.int32))


def test_normalizer_matches_hand_computed_values():
    gamma = 0.5
    norm = HostNormalizer(2, (1,), gamma, normalize_observations=True, scale_rewards=True)
    first = norm(_step([0, 1], [[2.0], [4.0]], [0, 0], [0, 0], [0, 0], [0, 0]))  # reset rows: no return
    ref = _reference(np.array([[2.0], [4.0]]))
    np.testing.assert_allclose(norm.obs.mean, ref.mean, rtol=1e-12)
    np.testing.assert_allclose(first.obs, ((np.array([[2.0], [4.0]]) - ref.mean) / np.sqrt(ref.var + 1e-8)),
                               rtol=1e-6)
    assert first.final_obs is first.obs and first.obs.dtype == np.float32
    np.testing.assert_array_equal(first.reward, [0, 0])
    assert norm.ret.count == pytest.approx(1e-4)  # invalid rows fold in no return
    # env 1 only (async batch), reward 2, not done: R1 = 2
    second = norm(_step([1], [[6.0]], [2.0], [0], [0], [1]))
    ret_ref = _reference(np.array([2.0]))
    np.testing.assert_allclose(second.reward, np.clip([2.0 / np.sqrt(ret_ref.var + 1e-8)], -10, 10), rtol=1e-6)
    assert second.reward[0] == 10.0  # one sample: the return's variance is tiny, the reward clipped
    # both envs, rewards 1 and 3; env 1 terminates: R0 = 1, R1 = 0.5 * 2 + 3 = 4, then R1 -> 0
    third = norm(_step([0, 1], [[1.0], [1.0]], [1.0, 3.0], [0, 1], [0, 0], [1, 1]))
    ret_ref = _reference(np.array([2.0, 1.0, 4.0]))
    np.testing.assert_allclose(third.reward, np.clip(np.array([1.0, 3.0]) / np.sqrt(ret_ref.var + 1e-8), -10, 10),
                               rtol=1e-6)
    np.testing.assert_array_equal(norm.returns, [1.0, 0.0])
    obs_ref = _reference(np.array([[2.0], [4.0], [6.0], [1.0], [1.0]]))
    np.testing.assert_allclose(norm.obs.mean, obs_ref.mean, rtol=1e-12)
    np.testing.assert_allclose(third.obs, (np.array([[1.0], [1.0]]) - obs_ref.mean) / np.sqrt(obs_ref.var + 1e-8),
                               rtol=1e-6)
    # the delta holds everything since the start; sync continues from published + own delta
    delta = norm.take_delta()
    assert delta["obs"].count == 5 and delta["ret"].count == 3
    assert norm.take_delta()["obs"].count == 0
    published = {"obs": MeanStd(np.array([10.0]), np.array([4.0]), 100.0), "ret": MeanStd.prior(())}
    norm.sync(published)
    np.testing.assert_array_equal(norm.obs.mean, [10.0])
    assert norm(_step([0], [[12.0]], [0.0], [0], [0], [1])).obs[0, 0] == pytest.approx(
        (12.0 - (10.0 * 100 + 12.0) / 101) / np.sqrt(norm.obs.var[0] + 1e-8), rel=1e-6)
    assert published["obs"].count == 100.0  # the published statistics are never modified


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", [{}, {"num_learner_groups": 2}], ids=["one_learner", "learner_groups"])
def test_two_actors_act_with_the_merged_statistics_of_every_produced_observation(monkeypatch, layout):
    """Budget: one async run of 6 updates (2 actors x 4 envs x 16 steps), ~30 s. With two learner
    groups each group's learner thread publishes the one shared set of statistics with its params."""
    raw: dict[int, list[np.ndarray]] = {0: [], 1: []}
    published, received, shared = [], [], []
    wrap, pub, sync, init = (host_actor_mod.HostActor._wrap, SharedStatistics.published, HostNormalizer.sync,
                             SharedStatistics.__init__)

    def record_wrap(self, step):
        raw[self.actor_id].append(np.array(step.obs, np.float64))
        return wrap(self, step)

    def record_published(self):
        out = pub(self)
        published.append((dict(self.merged_steps), out))
        return out

    def record_sync(self, stats):
        received.append(stats)
        return sync(self, stats)

    def record_init(self, *a, **k):
        init(self, *a, **k)
        shared.append(self)

    monkeypatch.setattr(host_actor_mod.HostActor, "_wrap", record_wrap)
    monkeypatch.setattr(SharedStatistics, "published", record_published)
    monkeypatch.setattr(HostNormalizer, "sync", record_sync)
    monkeypatch.setattr(SharedStatistics, "__init__", record_init)
    config = tj.PPOConfig(**HOST, num_actors=2, schedule="relaxed", total_env_steps=6 * 4 * 16, **layout)
    result = tj.train(config, progress=False)

    def reference(merged: dict) -> MeanStd:
        obs = [np.concatenate(raw[a])[:merged.get(a, 0)] for a in (0, 1)]
        return _reference(np.concatenate(obs))

    assert len(published) >= 7 and received, (len(published), len(received))
    for merged, stats in published[1:]:  # each publication: every observation merged so far, in NumPy
        ref = reference(merged)
        np.testing.assert_allclose(stats["obs"].mean, ref.mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(stats["obs"].var, ref.var, rtol=1e-9)
        assert stats["obs"].count == pytest.approx(ref.count)
    ids = {id(s) for _, s in published}
    assert all(id(r) in ids for r in received)  # every actor continued from a published version
    final = shared[0]
    assert sum(final.merged_steps.values()) > 6 * 4 * 16 and set(final.merged_steps) == {0, 1}
    ref = reference(published[-1][0])  # the train state holds the statistics of the last publication
    saved = result.state.actor  # float32 in the train state: float32 tolerance
    assert isinstance(saved, HostNormStats)
    np.testing.assert_allclose(np.asarray(saved.obs_rms.mean), ref.mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(saved.obs_rms.var), ref.var, rtol=1e-5)


@pytest.mark.timeout(420)
def test_statistics_are_checkpointed_restored_exactly_and_frozen_in_evaluation(tmp_path):
    """Budget: a run stopped after 4 of 6 updates, its resume and two evaluations, ~60 s."""
    from tianji_jax.run import host_loop
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

    run_dir = tmp_path / "run"
    config = tj.PPOConfig(**HOST, total_env_steps=6 * 4 * 16, eval_every_env_steps=2 * 4 * 16)
    rows = []

    def stop_after_two(row):
        rows.append(row)
        if len(rows) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tj.train(config, run_dir=run_dir, progress=False, callback=stop_after_two)
    loaded = tj.load(run_dir)
    assert loaded.step == 4 * 4 * 16
    saved = loaded.state.actor
    assert isinstance(saved, HostNormStats) and float(saved.obs_rms.count) >= 4 * 4 * 16
    assert float(saved.return_rms.count) > 1
    # a resume starts from exactly the saved statistics
    wired = AsyncOnPolicy(config, restore=host_loop.async_restore(loaded))
    try:
        again = wired.host_norm.state()
        for x, y in zip(np.asarray(again.obs_rms.mean), np.asarray(saved.obs_rms.mean)):
            assert x == y
        assert np.asarray(again.return_rms.var) == np.asarray(saved.return_rms.var)
        assert float(again.obs_rms.count) == float(saved.obs_rms.count)
    finally:
        wired.close()
    resumed = tj.train(config, run_dir=run_dir, progress=False, resume=True)
    assert float(resumed.state.actor.obs_rms.count) > float(saved.obs_rms.count)
    # evaluation reads the statistics (frozen): two evaluations leave them as they were
    before = np.asarray(resumed.state.actor.obs_rms.mean).copy()
    r1 = tj.evaluate(config, resumed.state, num_episodes=2, seed=1)
    r2 = tj.evaluate(config, resumed.state, num_episodes=2, seed=1)
    np.testing.assert_array_equal(r1["returns"], r2["returns"])
    np.testing.assert_array_equal(np.asarray(resumed.state.actor.obs_rms.mean), before)


def test_host_evaluation_acts_on_normalised_observations():
    import jax

    config = tj.PPOConfig(**HOST, total_env_steps=4 * 16 * 2)
    seen = []

    def greedy(params, obs):
        seen.append(np.array(obs))
        return np.zeros(len(obs), np.int32)

    evaluate = host_actor_mod.make_host_evaluate(config, greedy, 2)
    far = MeanStd(np.full(4, 1000.0), np.ones(4), 10.0).to_running()  # every obs is far below this mean
    evaluate(None, far, jax.random.PRNGKey(0))
    assert seen and all(np.all(o == -10.0) for o in seen)


_PROCESS_WORKER = """
import sys, threading, numpy as np
pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.config.update("jax_num_cpu_devices", 2)
from tianji_jax.runtime.layouts import distributed as dist
dist.initialize(f"127.0.0.1:{port}", 2, pid, heartbeat_timeout_s=10)
import tianji_jax as tj
from tianji_jax.runtime.actors import host_actor as ha
from tianji_jax.runtime.actors.host_normalize import HostNormalizer, SharedStatistics
raw, exchanges, published, received, lock = {0: [], 1: []}, [], [], [], threading.Lock()
wrap, add, exchange, pub, sync = (ha.HostActor._wrap, SharedStatistics.add, SharedStatistics.exchange,
                                  SharedStatistics.published, HostNormalizer.sync)
def record_wrap(self, step):
    raw[self.actor_id].append(np.array(step.obs, np.float64))
    return wrap(self, step)
def record_add(self, delta, actor_id):
    with lock:
        add(self, delta, actor_id)
def record_exchange(self):
    with lock:  # no delta arrives between the snapshot and the exchange
        exchanges.append(dict(self.merged_steps))
        exchange(self)
def record_published(self):
    stats = pub(self)
    published.append(stats)
    return stats
def record_sync(self, stats):
    received.append(id(stats))
    return sync(self, stats)
ha.HostActor._wrap, SharedStatistics.add, SharedStatistics.exchange = record_wrap, record_add, record_exchange
SharedStatistics.published, HostNormalizer.sync = record_published, record_sync
cfg = tj.PPOConfig(env="envpool:CartPole-v1", runtime="async", num_envs=4, num_steps=16, num_actors=2,
                   schedule="relaxed", normalize_observations=True, scale_rewards=True, eval_episodes=2,
                   eval_every_env_steps=2 * 64 * 4, seed=3, total_env_steps=2 * 64 * 4, update_epochs=2,
                   num_minibatches=1, num_processes=2, process_id=pid, coordinator=f"127.0.0.1:{port}")
result = tj.train(cfg, progress=False, tensorboard=False)
last = published[-1]
ids = {id(s) for s in published}
np.savez(out, **{f"raw{a}": np.concatenate(raw[a]) for a in (0, 1)},
         steps=np.asarray([[e.get(a, 0) for a in (0, 1)] for e in exchanges]),
         obs_mean=last["obs"].mean, obs_var=last["obs"].var, obs_count=last["obs"].count,
         ret_mean=last["ret"].mean, ret_var=last["ret"].var, ret_count=last["ret"].count,
         saved_mean=np.asarray(result.state.actor.obs_rms.mean), saved_var=np.asarray(result.state.actor.obs_rms.var),
         received_published=np.asarray(all(r in ids for r in received) and len(received) > 0))
print("worker done", file=sys.stderr, flush=True)
"""


@pytest.mark.slow  # two jax.distributed processes, 4 updates each: about 60 s on 2 cores
@pytest.mark.timeout(300)
def test_two_processes_exchange_their_statistics_after_every_update(tmp_path):
    """Two learner processes (``num_processes=2``), each with two host actors under ``relaxed``: after
    every update each process merges every process's new statistics in process order, so both publish
    the same statistics bit for bit, and those are the NumPy statistics of every observation that
    either process's actors had produced by the last exchange; the actors act with published ones."""
    import os
    import socket
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(_PROCESS_WORKER)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "TIANJI_DISTRIBUTED_CHILD"}
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(tmp_path / f"p{i}.npz")],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errs]
    out = [dict(np.load(tmp_path / f"p{i}.npz")) for i in range(2)]
    for key in ("obs_mean", "obs_var", "obs_count", "ret_mean", "ret_var", "ret_count", "saved_mean"):
        np.testing.assert_array_equal(out[0][key], out[1][key])  # the same statistics on both processes
    assert not np.array_equal(out[0]["raw0"][:4], out[1]["raw0"][:4])  # each process its own envs
    assert out[0]["steps"].shape == out[1]["steps"].shape == (4, 2)  # one exchange per update
    # the last exchange merged, from each process, what its two actors had produced by then
    seen = [out[p][f"raw{a}"][:out[p]["steps"][-1, a]] for p in (0, 1) for a in (0, 1)]
    assert all(len(x) for x in seen)
    ref = _reference(np.concatenate(seen))
    np.testing.assert_allclose(out[0]["obs_mean"], ref.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out[0]["obs_var"], ref.var, rtol=1e-9)
    assert float(out[0]["obs_count"]) == pytest.approx(ref.count)
    np.testing.assert_allclose(out[0]["saved_mean"], ref.mean, rtol=1e-5, atol=1e-6)  # float32 in the train state
    assert all(bool(o["received_published"]) for o in out)

