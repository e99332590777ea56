"""The async TianJi runtime: schedules, lag contract, rate limiter, lifecycle, equivalence with Anakin."""

import threading
import time

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tianji_jax as tj
from tianji_jax.buffers.queues import TrajectoryItem, TrajectoryQueue
from tianji_jax.buffers.rate_limiter import RateLimiter
from tianji_jax.runtime.tianji.async_runtime import AsyncRunner, StallError
from tianji_jax.runtime.tianji.param_store import ParamStore

pytestmark = pytest.mark.timeout(300)

SMALL = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 6,
             eval_every_env_steps=4 * 32 * 2, eval_episodes=0)


# ---- fake actors / learner (sleeps instead of training) -----------------------------------------
def fake_runner(*, actor_sleeps, learner_sleep, num_updates, schedule="relaxed", lag=2, store=None,
                stall=20.0, queue_batches=2, admission=True):
    logs = [[] for _ in actor_sleeps]
    learner_lags = []

    def make_actor(i, d):
        def act(params, version):
            time.sleep(d() if callable(d) else d)
            logs[i].append(version)
            return {"actor": i, "version": version, "n": len(logs[i]) - 1}, 10
        return act

    def learn(item, version):
        time.sleep(learner_sleep() if callable(learner_sleep) else learner_sleep)
        # the learner's own lag computation, from the actor's own record of the version it used
        acted_with = logs[item.data["actor"]][item.data["n"]]
        learner_lags.append((version - item.version, version - acted_with))
        return {"v": version + 1}, {}

    runner = AsyncRunner(actors=[make_actor(i, d) for i, d in enumerate(actor_sleeps)], learn=learn,
                         initial_params={"v": 0}, num_updates=num_updates, item_steps=10, schedule=schedule,
                         max_policy_lag=lag, queue_batches=queue_batches, stall_timeout_s=stall, store=store,
                         admission=admission)
    return runner, logs, learner_lags


@pytest.mark.parametrize("schedule, overlapping", [("relaxed", True), ("sync", False)])
def test_relaxed_overlaps_acting_and_learning(schedule, overlapping):
    """Counted, not timed (a loaded machine stretches wall time, not the schedule): under
    ``relaxed`` the actor is inside ``act`` while most updates run; under ``sync`` never (it waits
    for the params the update is producing)."""
    d, n = 0.05, 20
    acting, overlaps = [0], []

    def act(params, version):
        acting[0] += 1
        time.sleep(d)
        acting[0] -= 1
        return {"version": version}, 10

    def learn(item, version):
        seen = acting[0] > 0
        time.sleep(d)
        overlaps.append(seen or acting[0] > 0)
        return {"v": version + 1}, {}

    runner = AsyncRunner(actors=[act], learn=learn, initial_params={"v": 0}, num_updates=n, item_steps=10,
                         schedule=schedule, max_policy_lag=0 if schedule == "sync" else 2, queue_batches=2,
                         stall_timeout_s=60.0)
    assert runner.run(lambda *a: False) == n
    if overlapping:
        assert sum(overlaps) >= n // 2, overlaps
    else:
        assert not any(overlaps), overlaps


def test_sync_schedule_is_lock_step_with_zero_lag():
    runner, logs, lags = fake_runner(actor_sleeps=[0.0], learner_sleep=0.0, num_updates=8, schedule="sync", lag=0)
    runner.run(lambda *a: False)
    assert [l for l, _ in lags] == [0] * 8 and logs[0][:8] == list(range(8))


def test_one_step_schedule_uses_previous_params():
    runner, logs, lags = fake_runner(actor_sleeps=[0.0], learner_sleep=0.01, num_updates=8, schedule="one_step",
                                     lag=1)
    runner.run(lambda *a: False)
    assert logs[0][:8] == [0, 0, 1, 2, 3, 4, 5, 6]  # rollout k+1 uses params k
    assert [l for l, _ in lags] == [0, 1, 1, 1, 1, 1, 1, 1]


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(k=st.sampled_from([0, 1, 2, 4]), seed=st.integers(0, 2**16), admission=st.booleans())
@example(k=0, seed=1, admission=False)
@example(k=0, seed=2, admission=True)
def test_lag_contract_with_a_straggler(k, seed, admission):
    rng = np.random.default_rng(seed)
    fast = lambda: float(rng.uniform(0.0, 0.004))  # noqa: E731
    slow = lambda: float(rng.uniform(0.02, 0.03))  # noqa: E731 - 5x+ slower than the rest
    runner, logs, lags = fake_runner(actor_sleeps=[fast, fast, slow], learner_sleep=fast, num_updates=40, lag=k,
                                     queue_batches=3, admission=admission)
    errors = []

    def check(version, metrics, item):
        err = runner.buffer.limiter.error
        if not (0 <= err <= runner.buffer.limiter.max_diff):
            errors.append(err)
        return False

    runner.run(check)
    assert lags and all(0 <= a <= k and a == b for a, b in lags)  # learner's lag == actor-log lag, <= K
    assert not errors
    buf = runner.buffer
    assert buf.produced == buf.consumed + buf.dropped_stale + buf.resident
    if k == 0 and admission:  # admission control serialises the actors at K=0: nothing they make is wasted
        assert buf.dropped_stale == 0
    if k == 0 and not admission:  # without it, the straggler's rollouts arrive stale and the gate drops them
        assert buf.dropped_stale > 0


def _queue(k, batches=4):
    return TrajectoryQueue(RateLimiter(spi=1.0, min_size=10, min_diff=0, max_diff=batches * 10, batch_items=10,
                                       chunk_items=10), k)


def test_gate_drops_stale_items_anywhere_in_the_queue_and_counts_them():
    q, stop = _queue(k=1), threading.Event()
    for version in (5, 3, 5, 4):  # a straggler (3) behind a fresh item: the head is not the only candidate
        assert q.put(TrajectoryItem(data=version, version=version, actor_id=0, num_steps=10), 1.0, stop)
    got = [q.get(5, 0.1, stop), q.get(5, 0.1, stop), q.get(5, 0.1, stop)]
    assert [it.data for it in got[:3]] == [5, 5, 4] and q.get(5, 0.05, stop) is None
    assert q.dropped_stale == 10 and q.limiter.dropped == 10 and q.limiter.error == 0
    assert q.produced == q.consumed + q.dropped_stale + q.resident


def test_admission_counts_resident_admitted_and_in_flight_items():
    q, stop = _queue(k=2), threading.Event()
    assert all(q.admit(10, 0.1, stop) for _ in range(3))  # 0, 1, 2 rollouts ahead: lag <= 2 when consumed
    assert not q.admit(10, 0.05, stop)  # a fourth would have 3 ahead
    for _ in range(3):
        q.put(TrajectoryItem(data=0, version=0, actor_id=0, num_steps=10), 0.0, stop, admitted=True)
    assert q.get(0, 0.1, stop).version == 0  # 1 in flight + 2 resident = 3 ahead
    assert not q.admit(10, 0.05, stop)
    assert q.get(1, 0.1, stop).version == 0  # previous update published; 1 in flight + 1 resident
    assert q.admit(10, 0.1, stop) and not q.admit(10, 0.05, stop)
    q.put(TrajectoryItem(data=0, version=2, actor_id=0, num_steps=10), 0.0, stop, admitted=True)
    with pytest.raises(RuntimeError, match="without a matching admit"):
        q.put(TrajectoryItem(data=0, version=2, actor_id=0, num_steps=10), 0.0, stop, admitted=True)


def test_rate_limiter_rejects_a_deadlocking_band():
    with pytest.raises(ValueError, match="band too narrow"):
        RateLimiter(spi=1.0, min_size=10, min_diff=0, max_diff=15, batch_items=10, chunk_items=10)
    with pytest.raises(ValueError, match="queue_batches"):
        tj.PPOConfig(**SMALL, runtime="async", queue_batches=1)


def test_stalled_learner_blocks_actors_which_resume():
    gate = threading.Event()

    def learner_sleep():
        gate.wait(60.0)
        return 0.0

    runner, logs, _ = fake_runner(actor_sleeps=[0.0], learner_sleep=learner_sleep, num_updates=5, queue_batches=2)
    thread = threading.Thread(target=lambda: runner.run(lambda *a: False))
    thread.start()
    deadline = time.monotonic() + 30  # a loaded machine only delays the moment the actor blocks
    while True:
        before = len(logs[0])
        time.sleep(0.5)
        if len(logs[0]) == before or time.monotonic() > deadline:
            break
    produced_while_stalled = len(logs[0])
    time.sleep(0.5)
    assert len(logs[0]) == produced_while_stalled <= 5  # blocked by the limiter, not spinning
    gate.set()
    thread.join(10)
    assert not thread.is_alive() and len(logs[0]) >= 5


class LosingStore(ParamStore):
    def publish(self, params, version):  # fault: publications never arrive
        pass


def test_lost_publishes_stop_the_run_with_versions_named():
    """The learner, fed once, then starved (the actor never gets version 1), reports the stall
    after ``stall_timeout_s`` (not before; the upper bound is 60 s above it, a hang guard, not a
    speed claim)."""
    runner, _, _ = fake_runner(actor_sleeps=[0.0], learner_sleep=0.0, num_updates=10, schedule="sync", lag=0,
                               store=LosingStore({"v": 0}), stall=2.0)
    t0 = time.perf_counter()
    with pytest.raises(StallError, match=r"version"):
        runner.run(lambda *a: False)
    assert 2.0 <= time.perf_counter() - t0 < 2.0 + 60


def test_a_first_update_slower_than_the_stall_timeout_is_compilation_not_a_stall():
    """The first update (XLA compiles it) may outlast stall_timeout_s (COMPILE_ALLOWANCE_S); a
    later one that does is a stall, reported by the waiting actor."""
    slow = iter([2.0, 0.0, 0.0])
    runner, logs, _ = fake_runner(actor_sleeps=[0.0], learner_sleep=lambda: next(slow, 0.0), num_updates=3,
                                  schedule="sync", lag=0, stall=1.0)
    assert runner.run(lambda *a: False) == 3 and logs[0][:3] == [0, 1, 2]
    late = iter([0.0, 2.5])
    runner, _, _ = fake_runner(actor_sleeps=[0.0], learner_sleep=lambda: next(late, 0.0), num_updates=3,
                               schedule="sync", lag=0, stall=1.0)
    with pytest.raises(StallError, match=r"actor 0 received no params of version >= 2 for 1 s"):
        runner.run(lambda *a: False)


def test_actor_exception_reaches_caller_with_traceback():
    def bad_actor(params, version):
        raise ZeroDivisionError("boom in actor")

    # the stall timeout (600 s) is far above the bound: an error that waited for it would fail
    runner = AsyncRunner(actors=[bad_actor], learn=lambda item, v: (None, {}), initial_params={}, num_updates=5,
                         item_steps=10, schedule="relaxed", max_policy_lag=1, stall_timeout_s=600)
    t0 = time.perf_counter()
    with pytest.raises(ZeroDivisionError, match="boom in actor") as info:
        runner.run(lambda *a: False)
    assert time.perf_counter() - t0 < 60
    assert any(tb.name == "bad_actor" for tb in info.traceback)  # the original frame is kept
    assert "tianji thread 'actor-0'" in str(getattr(info.value, "__notes__", ""))
    assert not any(t.is_alive() for t in runner._threads)


def test_early_stop_shuts_down_promptly_with_full_queue():
    """Actors blocked on a full queue and the learner all stop when the caller stops (run() joins
    them, raising if one is still alive after its join timeout). The stall timeout (600 s) is far
    above the bound (60 s, a hang guard under any load): a shutdown that waited for it would fail."""
    runner, _, _ = fake_runner(actor_sleeps=[0.0, 0.0], learner_sleep=0.05, num_updates=1000, stall=600.0)
    t0 = time.perf_counter()
    runner.run(lambda version, m, item: version >= 3)
    assert time.perf_counter() - t0 < 60 and not any(t.is_alive() for t in runner._threads)


# ---- PPO on the async runtime ---------------------------------------------------------------------
def test_async_sync_schedule_equals_anakin_and_is_reproducible():
    # two CPU devices here (conftest); on a one-accelerator machine actors and learner share it
    assert len(jax.devices()) == 2 or jax.default_backend() != "cpu"
    config = tj.PPOConfig(**{**SMALL, "total_env_steps": 4 * 32 * 3})
    anakin = tj.train(config, progress=False)
    a1 = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
    a2 = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5),
                 anakin.params, a1.params)
    jax.tree.map(np.testing.assert_array_equal, a1.params, a2.params)
    assert int(a1.state.update_count) == 3
    assert a1.curve["policy_lag_max"].max() == 0


def test_async_relaxed_telemetry_and_placement(capsys):
    config = tj.PPOConfig(**{**SMALL, "runtime": "async", "schedule": "relaxed", "max_policy_lag": 1})
    result = tj.train(config, progress=False)
    assert "placement: actors on" in capsys.readouterr().err
    c = result.curve
    assert np.all(c["policy_lag_max"] <= 1)
    assert np.all(c["production_sps"] > 0) and np.all(c["consumed_sps"] > 0)
    assert np.all(c["reuse"] == config.update_epochs)
    assert np.all((c["actor_wait_frac"] >= 0) & (c["learner_wait_frac"] >= 0))
    # a wait that straddles a snapshot is split over both rows: a share of wall time never exceeds 1
    assert np.all((c["actor_wait_frac"] <= 1 + 1e-9) & (c["learner_wait_frac"] <= 1 + 1e-9))
    assert np.all(np.isfinite(c["update_s"]))


def test_telemetry_counts_open_spans_up_to_the_read():
    import threading
    import time

    from tianji_jax.runtime.tianji.async_runtime import Telemetry

    tel = Telemetry()
    inside, release = threading.Event(), threading.Event()

    def wait():
        with tel.span("actor_wait_s"):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=wait)
    t0 = time.perf_counter()
    t.start()
    assert inside.wait(10)
    time.sleep(0.05)
    mid = time.perf_counter()
    first = tel.read(mid)["actor_wait_s"]
    assert 0.04 < first <= mid - t0  # the open span is counted up to the read, not at its end
    assert tel.actor_wait_s == 0.0
    release.set()
    t.join(10)
    end = time.perf_counter()
    total = tel.read(end)["actor_wait_s"]
    assert first < total <= end - t0 and tel.read(end + 100.0)["actor_wait_s"] == total  # closed: no more growth


def test_async_learner_state_lives_on_the_learner_device():
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

    if len(jax.devices()) < 2:
        pytest.skip("one device (an accelerator machine): actors and learner share it")
    ppo = AsyncOnPolicy(tj.PPOConfig(**{**SMALL, "runtime": "async"}))
    assert ppo.actor_device != ppo.learner_device
    for leaf in jax.tree.leaves(ppo.learner_state):
        assert leaf.devices() == {ppo.learner_device}
    for leaf in jax.tree.leaves(ppo._actor_states[0]):
        assert leaf.devices() == {ppo.actor_device}


def test_async_relaxed_with_vtrace_trains_and_keeps_the_bound():
    config = tj.PPOConfig(**SMALL, runtime="async", schedule="relaxed", advantage_estimator="vtrace")
    result = tj.train(config, progress=False)
    c = result.curve
    assert c["env_steps"][-1] == config.env_steps and np.all(c["policy_lag_max"] <= 2)
    assert np.all(np.isfinite(c["value_loss"])) and np.all(np.isfinite(c["policy_loss"]))
