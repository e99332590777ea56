"""The ``auto`` schedule (runtime/tianji/auto_schedule.py): its rule, its bounds under randomised actor and
learner timings (a property test through the real trajectory queue / replay ingress and the
learner's own lag computation, with fake compute), and runs through ``train``."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tianji_jax.runtime.tianji.async_runtime import AsyncRunner, RunnerHooks
from tianji_jax.runtime.tianji.auto_schedule import HIGH, LOW, AutoBalancer
from tianji_jax.runtime.tianji.replay_runner import ReplayRunner

pytestmark = pytest.mark.timeout(300)


def test_the_rule():
    decide = AutoBalancer.decide
    assert decide(HIGH * 2, HIGH * 2, False) == 1  # both sides waited: widen
    assert decide(HIGH * 2, LOW / 2, False) == -1  # the learner never waited, the actors did: narrow
    assert decide(0.0, 0.5, False) == 0  # only the learner waits: the actors are the bottleneck, nothing helps
    assert decide(HIGH * 2, HIGH * 2, True) == -1  # the gate dropped rollouts: narrow
    with pytest.raises(ValueError, match="ceiling >= 1"):
        AutoBalancer(0)


def _on_policy_run(num_actors, ceiling, actor_ms, learner_ms, seed, updates=40):
    rng = random.Random(seed)
    lags, windows = [], []

    def make_actor(i):
        def act(params, version):
            time.sleep(rng.uniform(0, actor_ms[i]) / 1000)
            return None, 8
        return act

    def learn(item, version):
        lags.append(version - item.version)  # the learner's own lag computation
        time.sleep(rng.uniform(0, learner_ms) / 1000)
        return version + 1, {}

    runner = AsyncRunner(actors=[make_actor(i) for i in range(num_actors)], learn=learn, initial_params=0,
                         num_updates=updates, item_steps=8, schedule="relaxed", max_policy_lag=ceiling,
                         stall_timeout_s=30, hooks=RunnerHooks(balancer=AutoBalancer(ceiling, num_actors=num_actors, period=2)))

    def on_update(version, metrics, item):
        windows.append(runner.snapshot["lag_window"])
        return False

    runner.run(on_update)
    return runner, lags, windows


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_actors=st.integers(1, 3), ceiling=st.integers(1, 4),
       actor_ms=st.lists(st.floats(0.0, 8.0), min_size=3, max_size=3), learner_ms=st.floats(0.0, 8.0),
       seed=st.integers(0, 10_000))
def test_auto_keeps_every_consumed_lag_within_the_ceiling(num_actors, ceiling, actor_ms, learner_ms, seed):
    runner, lags, windows = _on_policy_run(num_actors, ceiling, actor_ms, learner_ms, seed)
    buf = runner.buffer
    assert len(lags) == 40 and max(lags) <= ceiling
    assert all(1 <= w <= ceiling for w in windows)
    assert buf.produced == buf.consumed + buf.dropped_stale + buf.resident  # the accounting invariant


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_actors=st.integers(1, 3), tolerance=st.floats(1.0, 4.0), actor_ms=st.floats(0.0, 6.0),
       learner_ms=st.floats(0.0, 6.0), seed=st.integers(0, 10_000))
def test_auto_keeps_the_replay_band_within_the_tolerance(num_actors, tolerance, actor_ms, learner_ms, seed):
    """Replay: the gate at insert still holds K, and the limiter error never leaves the widest band
    the tolerance allows (so the replay ratio's guarantee holds at that width)."""
    rng = random.Random(seed)
    ceiling, lags, errors, bands = 2, [], [], []

    def make_actor(i):
        def act(params, version):
            time.sleep(rng.uniform(0, actor_ms) / 1000)
            return None, 8
        return act

    runner = None

    def insert(chunks, group):
        lags.extend(runner.stores[0].version - c.version for c in chunks)

    def learn(group, version):
        time.sleep(rng.uniform(0, learner_ms) / 1000)
        errors.append(runner.buffer.limiter.error)
        bands.append(runner.buffer.band)
        return version + 1, {}

    runner = ReplayRunner(actors=[make_actor(i) for i in range(num_actors)], insert=insert, learn=learn,
                          initial_params=0, num_updates=40, chunk_steps=8, spi=4.0, block_samples=16, min_size=16,
                          max_policy_lag=ceiling, stall_timeout_s=30, band_factor=tolerance,
                          hooks=RunnerHooks(balancer=AutoBalancer(ceiling, tolerance, num_actors=num_actors, period=2)))
    runner.run(lambda *a: False)
    m = 16 + 4.0 * 8
    centre = 16 * 4.0
    assert max(lags) <= ceiling
    assert all(m - 1e-9 <= b <= tolerance * m + 1e-9 for b in bands)
    assert all(centre - tolerance * m - 1e-9 <= e for e in errors)  # never sampled past the band


class _ScriptedWaits:
    """A runner's telemetry and clock driven by the test: each period lasts 1 s and the two sides
    wait the given seconds in it (no threads, no wall clock)."""

    def __init__(self):
        self.now, self.actor, self.learner = 0.0, 0.0, 0.0

    def clock(self) -> float:
        return self.now

    def period(self, actor_wait_s: float, learner_wait_s: float) -> None:
        self.now += 1.0
        self.actor += actor_wait_s
        self.learner += learner_wait_s

    def read(self, now: float) -> dict:
        return {"actor_wait_s": self.actor, "learner_wait_s": self.learner}


def _queue(ceiling: int):
    runner = AsyncRunner(actors=[lambda p, v: (None, 8)] * 3, learn=lambda item, v: (v + 1, {}), initial_params=0,
                         num_updates=100, item_steps=8, schedule="relaxed", max_policy_lag=ceiling, stall_timeout_s=30)
    return runner.buffer


def test_auto_widens_when_both_sides_wait_and_narrows_when_the_learner_is_saturated():
    """The controller through the real TrajectoryQueue, with scripted wait times and an injected
    clock (deterministic): both sides waiting opens the window one step per period up to the
    ceiling; a learner that never waits while the actors do closes it back to 1; the gate dropping
    rollouts narrows it whatever the waits."""
    waits, buf = _ScriptedWaits(), _queue(ceiling=4)
    balancer = AutoBalancer(4, num_actors=3, period=1, clock=waits.clock)
    balancer.start([buf])
    assert buf.admit_window == 1
    balancer.after_update(0, buf, waits)  # the baseline
    windows = []
    for _ in range(5):  # 3 actors waited 1.5 s in all (0.5 each), the learner 0.5 s of each second
        waits.period(1.5, 0.5)
        balancer.after_update(0, buf, waits)
        windows.append(buf.admit_window)
    assert windows == [2, 3, 4, 4, 4]
    assert buf.knobs()["queue_limit"] == 5  # max(2, W + 1)
    for _ in range(4):  # the learner never waits, the actors do: narrow back
        waits.period(1.5, 0.0)
        balancer.after_update(0, buf, waits)
        windows.append(buf.admit_window)
    assert windows[5:] == [3, 2, 1, 1]
    waits.period(1.5, 0.5)
    balancer.after_update(0, buf, waits)
    assert buf.admit_window == 2
    buf.dropped_stale += 8  # the gate dropped a rollout: narrow although both sides waited
    waits.period(1.5, 0.5)
    balancer.after_update(0, buf, waits)
    assert buf.admit_window == 1
    waits.period(0.0, 0.9)  # only the learner waits (the actors are the bottleneck): nothing moves
    balancer.after_update(0, buf, waits)
    assert buf.admit_window == 1
    assert [d[2:5] for d in balancer.decisions][:3] == [("lag_window", 1, 2), ("lag_window", 2, 3),
                                                        ("lag_window", 3, 4)]


@pytest.mark.timeout(600)
def test_auto_runs_through_train_with_ppo_and_dqn(tmp_path):
    """Budget: about 30 s."""
    import tianji_jax as tj

    ppo = tj.train(tj.PPOConfig(runtime="async", schedule="auto", num_actors=2, num_envs=4, num_steps=32,
                                total_env_steps=4 * 32 * 16, eval_every_env_steps=4 * 32 * 4, eval_episodes=0),
                   run_dir=tmp_path / "ppo", progress=False)
    c = ppo.curve
    assert np.all(c["policy_lag_max"] <= 4) and np.all((c["lag_window"] >= 1) & (c["lag_window"] <= 4))
    assert np.all(c["queue_limit"] == np.maximum(2, c["lag_window"] + 1)) and np.all(np.isnan(c["spi_band"]))
    config = tj.DQNConfig(runtime="async", schedule="auto", replay_ratio_tolerance=3.0, total_env_steps=16_000,
                          learning_starts=2_000, eval_every_env_steps=4_000, eval_episodes=0)
    dqn = tj.train(config, run_dir=tmp_path / "dqn", progress=False)
    m = config.updates_per_step * config.batch_size + config.replay_ratio * config.batch_size * config.iteration_env_steps
    band = dqn.curve["spi_band"]
    assert np.all((band >= m - 1e-6) & (band <= 3 * m + 1e-6)) and np.all(np.isnan(dqn.curve["lag_window"]))
    assert "auto" in config.describe()


@pytest.mark.parametrize("cls, changes, match", [
    ("ppo", dict(schedule="auto", queue_batches=3), "set by schedule 'auto'"),
    ("ppo", dict(schedule="auto", max_policy_lag=0), "max_policy_lag must be >= 1 for schedule 'auto'"),
    ("dqn", dict(replay_ratio_tolerance=0.5), "replay_ratio_tolerance"),
    ("dqn", dict(schedule="fast"), "'sync', 'relaxed', 'auto'"),
    ("dqn", dict(schedule="sync", replay_ratio_tolerance=3.0), "applies to schedules 'relaxed' and 'auto'"),
])
def test_bad_auto_settings_are_refused(cls, changes, match):
    import tianji_jax as tj

    with pytest.raises(ValueError, match=match):
        {"ppo": tj.PPOConfig, "dqn": tj.DQNConfig}[cls](runtime="async", **changes)
