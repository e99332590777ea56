"""Reproducible async runs (record_schedule / replay_schedule): the schedule file, and the
replaying runner with fake compute (actors and a learner that are hash chains, so any difference
in which rollout an update consumed, or which version a rollout acted with, changes the result)."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from tianji_jax.runtime.tianji.async_runtime import AsyncRunner, RunnerHooks
from tianji_jax.runtime.tianji.scheduled import ScheduledRunner, VersionedParamStore
from tianji_jax.buffers.schedule_file import FORMAT, ScheduleRecorder, load_schedule

pytestmark = pytest.mark.timeout(120)

MOD = 2**61 - 1


def _mix(*xs: int) -> int:
    h = 1469598103934665603
    for x in xs:
        h = (h * 1099511628211 + x) % MOD
    return h


def _actors(n: int, seed: int, max_sleep: float):
    """Fake actors: each keeps its own counter (its "env state"); a rollout's data mixes the actor,
    its state and the params it acted with, after a random sleep (thread timing)."""
    rng = random.Random(seed)
    sleeps = [[rng.uniform(0, max_sleep) for _ in range(1000)] for _ in range(n)]

    def make(i):
        state = {"k": 0}

        def act(params, version):
            time.sleep(sleeps[i][state["k"] % 1000])
            state["k"] += 1
            return _mix(i, state["k"], params, version), 4
        return act
    return [make(i) for i in range(n)]


def _learn(seed: int, max_sleep: float):
    rng = random.Random(seed + 1)
    box = {"params": 0}

    def learn(item, version):
        time.sleep(rng.uniform(0, max_sleep))
        box["params"] = _mix(box["params"], item.data, item.version, version)
        return box["params"], {}
    return learn, box


def _run(runner: AsyncRunner) -> None:
    runner.run(lambda version, metrics, item: False)


def _record(path, seed, num_updates=30, admission=False):
    learn, box = _learn(seed, 0.004)
    runner = AsyncRunner(actors=_actors(3, seed, 0.01), learn=learn, initial_params=0, num_updates=num_updates,
                         item_steps=4, schedule="relaxed", max_policy_lag=1, queue_batches=2, stall_timeout_s=30,
                         admission=admission,
                         hooks=RunnerHooks(recorder=ScheduleRecorder(path, num_actors=3, item_steps=4, max_policy_lag=1)))
    _run(runner)
    runner.hooks.recorder.close()
    return box["params"], runner


def _replay(path, seed, num_updates=30):
    learn, box = _learn(seed, 0.004)
    runner = ScheduledRunner(replay=load_schedule(path), actors=_actors(3, seed, 0.01), learn=learn,
                             initial_params=0, num_updates=num_updates, item_steps=4, schedule="relaxed",
                             max_policy_lag=1, queue_batches=2, stall_timeout_s=30)
    _run(runner)
    return box["params"], runner


def test_a_recorded_relaxed_run_replays_bit_for_bit_and_another_schedule_differs(tmp_path):
    path = tmp_path / "a.jsonl"
    recorded, rec = _record(path, seed=0)
    schedule = load_schedule(path)
    assert len(schedule.consumed) == 30 and rec.buffer.dropped_stale > 0  # the gate dropped some rollouts
    assert len(schedule.dropped) * 4 == rec.buffer.dropped_stale
    # replayed with other thread timings (other sleeps): the same result as the recorded run, twice
    first, r1 = _replay(path, seed=5)
    second, r2 = _replay(path, seed=9)
    assert first == second == recorded
    assert r1.buffer.dropped_stale == rec.buffer.dropped_stale and r1.buffer.consumed == rec.buffer.consumed
    # a schedule recorded with other timings interleaves differently, and so does its replay
    other_path = tmp_path / "b.jsonl"
    other, _ = _record(other_path, seed=3, admission=True)
    assert load_schedule(other_path) != schedule
    assert _replay(other_path, seed=5)[0] == other != recorded


def test_replay_stops_at_the_schedules_end_and_checks_the_run(tmp_path):
    path = tmp_path / "a.jsonl"
    _record(path, seed=1, num_updates=12)
    params, runner = _replay(path, seed=2, num_updates=40)  # a budget past the record: ends with it
    assert sum(runner.updates_done) == 12
    learn, _ = _learn(0, 0)
    with pytest.raises(ValueError, match="num_actors 3; this run has 2"):
        ScheduledRunner(replay=load_schedule(path), actors=_actors(2, 0, 0), learn=learn, initial_params=0,
                        num_updates=12, item_steps=4, max_policy_lag=1)
    with pytest.raises(ValueError, match="schedule='relaxed'"):
        ScheduledRunner(replay=load_schedule(path), actors=_actors(1, 0, 0), learn=learn, initial_params=0,
                        num_updates=12, item_steps=4, schedule="sync", max_policy_lag=0)


def _write(path, header, lines):
    path.write_text("\n".join(json.dumps(x) for x in [header, *lines]) + "\n")


HEADER = {"format": FORMAT, "num_actors": 2, "item_steps": 4, "max_policy_lag": 1, "start_version": 0}


@pytest.mark.parametrize("header, lines, match", [
    ({"format": "other"}, [], "not a schedule file"),
    ({k: v for k, v in HEADER.items() if k != "item_steps"}, [], "header line lacks 'item_steps'"),
    (HEADER, [{"update": 1, "actor": 0, "rollout": 0, "version": 0, "dropped": []}], "update 1, expected 0"),
    (HEADER, [{"update": 0, "actor": 2, "rollout": 0, "version": 0, "dropped": []}], "out of range"),
    (HEADER, [{"update": 0, "actor": 0, "rollout": 0, "version": 0, "dropped": []},
              {"update": 1, "actor": 0, "rollout": 2, "version": 1, "dropped": []}], "have a gap"),
    (HEADER, [{"update": 0, "actor": 0, "rollout": 0, "version": 0, "dropped": []},
              {"update": 1, "actor": 0, "rollout": 0, "version": 0, "dropped": []}], "appears twice"),
    (HEADER, [{"update": 0, "actor": 0, "rollout": 0, "version": 0, "dropped": []},
              {"update": 1, "actor": 0, "rollout": 1, "version": 1, "dropped": []},
              {"update": 2, "actor": 1, "rollout": 0, "version": 2, "dropped": [[0, 2, 0]]}], "never go backwards"),
    (HEADER, [{"update": 0, "actor": 0, "rollout": 0, "version": 0, "dropped": []},
              {"update": 1, "actor": 0, "rollout": 1, "version": 1, "dropped": []},
              {"update": 2, "actor": 1, "rollout": 0, "version": 0, "dropped": []}], "lag 2 > max_policy_lag 1"),
    (HEADER, ["x"], "line 2: not an update line"),
])
def test_a_bad_schedule_file_is_refused_naming_the_line(tmp_path, header, lines, match):
    path = tmp_path / "s.jsonl"
    _write(path, header, lines)
    with pytest.raises(ValueError, match=match):
        load_schedule(path)


def test_the_versioned_store_keeps_a_version_until_its_last_reader():
    import collections
    import threading

    stop = threading.Event()
    store = VersionedParamStore("p0", 0, collections.Counter({0: 1, 2: 2}))
    store.publish("p1", 1)  # no reader: not kept once newer exists
    store.publish("p2", 2)
    store.publish("p3", 3)
    assert store.wait_exact(0, 1.0, stop) == "p0"
    assert store.wait_exact(2, 1.0, stop) == "p2" and store.wait_exact(2, 1.0, stop) == "p2"
    with pytest.raises(RuntimeError, match="version 2 were not kept"):
        store.wait_exact(2, 1.0, stop)
    with pytest.raises(RuntimeError, match="version 1 were not kept"):
        store.wait_exact(1, 1.0, stop)
    assert store.wait_exact(4, 0.2, stop) is None  # not yet published: times out


# ---- through train(): PPO with device actors and with envpool sync-mode host actors ----------------

def _params(result):
    import jax

    return jax.tree.leaves(jax.device_get(result.state.learner.params))


def _same(a, b) -> bool:
    import numpy as np

    return all(np.array_equal(x, y) for x, y in zip(_params(a), _params(b)))


def _other_schedule(path, like, out):
    """A valid schedule of the same run that interleaves differently from ``like``: round robin over
    the actors, each rollout acted with the version ``lag`` updates old (the first that differs)."""
    header = json.loads(open(path).readline())
    n, updates = header["num_actors"], len(like.consumed)
    for lag in (1, 2):
        lines = [{"update": u, "actor": u % n, "rollout": u // n, "version": max(0, u - lag), "dropped": []}
                 for u in range(updates)]
        if [(e["actor"], e["rollout"], e["version"]) for e in lines] != list(like.consumed):
            _write(out, header, lines)
            return out
    raise AssertionError("no other schedule found")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "envpool:CartPole-v1"])
def test_a_recorded_ppo_run_replays_bit_for_bit(tmp_path, env):
    """Budget: about 60 s (four short runs of 8 updates; the first compiles). The gymnax run is
    recorded under 'auto', the envpool one under 'relaxed'; each is replayed once under 'relaxed'
    and once under 'auto' (a replay runs no knob, so the two schedules replay each other's records)."""
    import tianji_jax as tj

    recorded_under = "auto" if env.startswith("gymnax") else "relaxed"
    base = dict(env=env, runtime="async", num_actors=2, num_envs=4, num_steps=32,
                total_env_steps=4 * 32 * 8, eval_every_env_steps=4 * 32 * 4, eval_episodes=0, seed=3)
    recorded = tj.train(tj.PPOConfig(record_schedule=True, schedule=recorded_under, **base), run_dir=tmp_path / "rec",
                        progress=False)
    # a replay runs under the bound in force when recording: 'auto' defaults to 4, 'relaxed' to 2
    base.update(schedule="relaxed", max_policy_lag=4 if recorded_under == "auto" else 2)
    path = tmp_path / "rec" / "schedule.jsonl"
    schedule = load_schedule(path)
    assert len(schedule.consumed) == 8 and {a for a, _, _ in schedule.consumed} == {0, 1}
    assert schedule.config["schedule"] == recorded_under
    config = tj.PPOConfig(replay_schedule=str(path), **base)
    first = tj.train(config, run_dir=tmp_path / "rep1", progress=False)
    second = tj.train(config.replace(schedule="auto"), run_dir=tmp_path / "rep2", progress=False)
    assert _same(first, recorded) and _same(second, recorded)
    other = _other_schedule(path, schedule, tmp_path / "other.jsonl")
    third = tj.train(tj.PPOConfig(replay_schedule=str(other), **base), run_dir=tmp_path / "rep3", progress=False)
    assert not _same(third, recorded)
    # the replayed run's own lag columns are the schedule's; no knob is in force while replaying
    lags = [u - v for u, (_, _, v) in enumerate(schedule.consumed)]
    assert first.curve["policy_lag_max"].max() == max(lags) and np.all(np.isnan(first.curve["lag_window"]))
    # a replay must compute what its recording computed: another config, or past the schedule's end, is refused
    for changes, match in ((dict(seed=4), "recorded with another config: seed: recorded 3, given 4"),
                           (dict(total_env_steps=4 * 32 * 16), "total_env_steps: recorded 1024, given 2048"),
                           (dict(max_policy_lag=3), "recorded under the lag bound max_policy_lag=(4|2); this config's "
                                                    "bound is 3")):
        with pytest.raises(ValueError, match=match):
            tj.PPOConfig(replay_schedule=str(path), **{**base, **changes})
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(open(path).readlines()[:5]))  # the header and 4 of the 8 updates
    with pytest.raises(ValueError, match="holds 4 updates; this config runs 8"):
        tj.PPOConfig(replay_schedule=str(cut), **base)


@pytest.mark.parametrize("changes, match", [
    (dict(schedule="one_step", num_actors=1), "deterministic already"),
    (dict(num_learner_groups=2, num_actors=2), "learner groups average"),
    (dict(env="envpool:CartPole-v1", env_batch_size=2), "envpool's async mode"),
    (dict(env="envpool:CartPole-v1", normalize_observations=True), "running statistics .observation normalisation"),
    (dict(env="envpool:CartPole-v1", scale_rewards=True), "allowed: schedule .relaxed. or .auto."),
    (dict(runtime="anakin"), "only applies to runtime='async'"),
    (dict(replay_schedule="/nonexistent/schedule.jsonl"), "cannot read it"),
    (dict(record_schedule=True, replay_schedule="x"), "choose one"),
    (dict(record_schedule="yes"), "record_schedule"),
])
def test_schedule_options_are_refused_where_they_cannot_fix_the_run(changes, match):
    import tianji_jax as tj

    config = dict(runtime="async", schedule="relaxed", num_actors=2, record_schedule=True, num_envs=4)
    config.update(changes)
    if "replay_schedule" in changes and "record_schedule" not in changes:
        config["record_schedule"] = False
    with pytest.raises((ValueError, TypeError), match=match):
        tj.PPOConfig(**config)


def test_a_schedule_of_another_config_is_refused(tmp_path):
    import tianji_jax as tj

    path = tmp_path / "s.jsonl"
    _write(path, {**HEADER, "num_actors": 3}, [])
    with pytest.raises(ValueError, match="recorded with num_actors=3; this config has num_actors=2"):
        tj.PPOConfig(runtime="async", num_actors=2, replay_schedule=str(path))
    with pytest.raises(ValueError, match="not a schedule file"):
        tj.PPOConfig(runtime="async", num_actors=2, replay_schedule=__file__)


def test_a_recording_run_cannot_be_resumed(tmp_path):
    """A schedule covers a run from its start: resuming with record_schedule=True is refused in one
    line; without it the run resumes."""
    import tianji_jax as tj

    config = tj.PPOConfig(runtime="async", num_actors=2, record_schedule=True, num_envs=4, num_steps=32,
                          total_env_steps=4 * 32 * 4, eval_every_env_steps=4 * 32, eval_episodes=0)

    def interrupt(row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tj.train(config, run_dir=tmp_path / "run", progress=False, callback=interrupt)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    with pytest.raises(ValueError, match="allowed: resume with record_schedule=False"):
        tj.train(config, run_dir=tmp_path / "run", resume=True, progress=False)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before  # refused before any write
    with pytest.raises(ValueError, match="give train\\(\\) a run_dir"):
        tj.train(config, progress=False)
    recorded = (tmp_path / "run" / "schedule.jsonl").read_text()
    tj.train(config.replace(record_schedule=False), run_dir=tmp_path / "run", resume=True, progress=False)
    assert (tmp_path / "run" / "schedule.jsonl").read_text() == recorded  # the part recorded before is kept


def test_a_loaded_schedules_config_is_the_callers_own(tmp_path):
    """load_schedule is memoised per file version; a caller that edits the config dict it got
    must not change what the next caller reads."""
    path = tmp_path / "s.jsonl"
    _write(path, {**HEADER, "config": {"seed": 3, "nested": {"a": 1}}}, [])
    first = load_schedule(path)
    first.config["seed"] = 99
    first.config["nested"]["a"] = 2
    assert load_schedule(path).config == {"seed": 3, "nested": {"a": 1}}
