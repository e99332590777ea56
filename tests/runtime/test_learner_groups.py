"""TianJi-style learner groups: per-group versions and lag, periodic param averaging, validation."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.runtime.async_on_policy import AsyncOnPolicy
from tianji_jax.runtime.tianji.async_runtime import StallError
from tianji_jax.runtime.layouts.learner_groups import ParamAverager, is_sync_point, tree_mean

BASE = dict(env="gymnax:CartPole-v1", runtime="async", num_envs=4, num_steps=16, num_minibatches=2,
            update_epochs=2, eval_every_env_steps=128, eval_episodes=2)


def _tree(x: float) -> dict:
    return {"w": jnp.full((3, 2), x, jnp.float32), "b": jnp.arange(4, dtype=jnp.float32) * x}


# ---- the averager on its own ---------------------------------------------------------------------
def test_averager_gives_every_group_the_same_mean_each_round():
    devs = jax.devices()[:2] + jax.devices()[:1]
    stop = threading.Event()
    avg = ParamAverager(3, devs, timeout_s=10.0, stop=stop)
    got: dict = {}

    def group(g: int) -> None:
        for r in range(3):  # three rounds: the rendezvous is reusable
            got[(g, r)] = avg.average(g, _tree(float(g + 10 * r)), version=r + 1)
            time.sleep(0.01 * g)  # groups arrive in different orders

    threads = [threading.Thread(target=group, args=(g,)) for g in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert avg.rounds_done == 3
    for r in range(3):
        want = tree_mean([_tree(float(g + 10 * r)) for g in range(3)])
        np.testing.assert_allclose(want["w"], 1.0 + 10 * r)  # mean of g + 10 r over g = 0, 1, 2
        for g in range(3):
            out = got[(g, r)]
            for k in ("w", "b"):
                np.testing.assert_array_equal(out[k], want[k])  # identical bits in every group
                assert out[k].devices() == {devs[g]}, (g, out[k].devices())
                assert out[k].dtype == jnp.float32


def test_averager_stop_returns_none_and_a_missing_group_is_named():
    stop = threading.Event()
    avg = ParamAverager(3, jax.devices()[:1] * 3, timeout_s=0.5, stop=stop)
    t0 = time.monotonic()
    with pytest.raises(StallError, match=r"learner group 0 waited 0.5 s at version 2 for learner group\(s\) \[1, 2\]"):
        avg.average(0, _tree(1.0), version=2)
    assert time.monotonic() - t0 < 5
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    assert avg.average(1, _tree(1.0), version=2) is None
    assert time.monotonic() - t0 < 5


def test_averager_rejects_bad_input():
    stop = threading.Event()
    with pytest.raises(ValueError, match="num_groups must be an int >= 2"):
        ParamAverager(1, jax.devices()[:1], 1.0, stop)
    with pytest.raises(ValueError, match=r"devices: need one per group \(2\), got 1"):
        ParamAverager(2, jax.devices()[:1], 1.0, stop)
    avg = ParamAverager(2, jax.devices()[:1] * 2, 0.3, stop)
    with pytest.raises(ValueError, match=r"group must be in 0..1, got 2"):
        avg.average(2, _tree(0.0), 1)
    # two groups arriving at different versions is a bug in the caller: named, not averaged (group
    # 0 waits up to 30 s; the check runs once it has arrived, however loaded the machine is)
    avg = ParamAverager(2, jax.devices()[:1] * 2, 30.0, stop)
    box: list = []
    t = threading.Thread(target=lambda: box.append(avg.average(0, _tree(0.0), 1)))
    t.start()
    deadline = time.monotonic() + 30
    while 0 not in avg._deposits and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ValueError, match=r"same version: group 1 at 3, others at \[1\]"):
        avg.average(1, _tree(0.0), 3)
    stop.set()  # group 0 gives up waiting: None, as for a stopping run
    t.join(30)
    assert not t.is_alive() and box == [None]


def test_sync_points():
    assert [v for v in range(1, 11) if is_sync_point(v, 3, 10)] == [3, 6, 9, 10]
    assert [v for v in range(1, 5) if is_sync_point(v, 1, 4)] == [1, 2, 3, 4]
    assert [v for v in range(1, 5) if is_sync_point(v, 100, 4)] == [4]


# ---- config ---------------------------------------------------------------------------------------
def test_config_rules_name_the_fields():
    ok = tj.PPOConfig(**BASE, num_actors=4, num_learner_groups=2, sync_every=3, total_env_steps=64 * 7)
    assert ok.num_updates == 6 and ok.updates_per_group == 3 and ok.env_steps == 6 * 64  # rounded to groups
    assert "2 learner groups of 3 updates each, params averaged every 3 updates" in ok.describe()
    cases = [
        (dict(num_actors=3, num_learner_groups=2), r"num_actors=3 must be a multiple of num_learner_groups=2"),
        (dict(num_actors=2, num_learner_groups=2, num_learner_devices=2),
         r"num_learner_groups=2 is not supported with num_learner_devices=2"),
        (dict(num_actors=2, num_learner_groups=2, total_env_steps=64),
         r"total_env_steps=64 must be >= num_learner_groups \* num_envs \* num_steps = 128"),
        (dict(num_actors=1, num_learner_groups=2, schedule="sync"),
         r"num_actors must be 2 \(one per learner group\) for schedule 'sync'"),
        (dict(num_actors=2, num_learner_groups=2, runtime="anakin"), r"num_learner_groups=2 needs runtime='async'"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            tj.PPOConfig(**{**BASE, "total_env_steps": 1024, **kw})


def test_too_few_devices_for_the_groups_is_named():
    from tianji_jax.runtime.async_on_policy import placement

    with pytest.raises(ValueError, match=r"num_learner_groups=3 x num_learner_devices=1: needs 3 devices, only 2"):
        placement(jax.devices()[:2], num_learner_devices=1, num_learner_groups=3)


# ---- the runtime ----------------------------------------------------------------------------------
def _run_sync_groups(sync_every: int):
    """Two groups under schedule sync (one actor each): every published (group, version) params."""
    config = tj.PPOConfig(**BASE, schedule="sync", num_actors=2, num_learner_groups=2, sync_every=sync_every,
                          total_env_steps=64 * 8)
    ppo = AsyncOnPolicy(config)
    published: dict = {}
    lags: list = []

    def on_update(version, metrics, item):
        g = ppo.runner.group_of(item.actor_id)
        published[(g, version)] = jax.device_get(ppo.runner.snapshot["learner_states"][g])
        lags.append((g, int(metrics["policy_lag_max"])))
        return False

    try:
        done = ppo.runner.run(on_update)
    finally:
        ppo.close()
    return ppo, published, lags, done


def test_sync_groups_average_at_sync_points_keep_own_optimizers_and_reproduce():
    ppo, published, lags, done = _run_sync_groups(sync_every=2)
    assert done == 8 and sorted(published) == [(g, v) for g in (0, 1) for v in range(1, 5)]
    assert {lag for _, lag in lags} == {0}  # each group's samples come from its own newest params
    assert [int(s.version) for s in ppo.learner_states] == [4, 4]  # per-group versions
    for g, state in enumerate(ppo.learner_states):  # each group's learner on its own device
        assert {d for leaf in jax.tree.leaves(state.params) for d in leaf.devices()} == {ppo.group_devices[g]}
    assert ppo.group_devices[0] != ppo.group_devices[1]
    leaves = lambda t: jax.tree.leaves(t)  # noqa: E731
    for v in (1, 3):  # between sync points the groups' params differ (different data and keys)
        assert any(not np.array_equal(a, b) for a, b in zip(leaves(published[(0, v)].params),
                                                             leaves(published[(1, v)].params))), v
    for v in (2, 4):  # at sync points every group continues from the same (averaged) params
        for a, b in zip(leaves(published[(0, v)].params), leaves(published[(1, v)].params)):
            np.testing.assert_array_equal(a, b)
    # optimizer states and keys stay per group
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(published[(0, 4)].opt_state),
                                                         leaves(published[(1, 4)].opt_state)))
    assert not np.array_equal(published[(0, 4)].key, published[(1, 4)].key)
    # schedule sync with one actor per group and a deterministic mean: a second run is bit-identical
    _, again, _, _ = _run_sync_groups(sync_every=2)
    for k in published:
        for a, b in zip(leaves(published[k]), leaves(again[k])):
            np.testing.assert_array_equal(a, b)


def test_relaxed_groups_train_log_and_refuse_resume(tmp_path):
    config = tj.PPOConfig(**BASE, schedule="relaxed", num_actors=4, num_learner_groups=2, sync_every=3,
                          total_env_steps=64 * 12, max_policy_lag=2)
    run_dir = tmp_path / "groups"
    result = tj.train(config, run_dir=run_dir, progress=False)
    rows = result.curve
    updates = [r["update"] for r in rows] if isinstance(rows, list) else list(rows["update"])
    assert updates[-1] == config.num_updates == 12
    assert updates == sorted(updates) and len(updates) == 6  # a row every 2 updates of all groups
    lag_max = [r["policy_lag_max"] for r in rows] if isinstance(rows, list) else list(rows["policy_lag_max"])
    assert max(lag_max) <= 2
    final = tj.load(run_dir)
    assert np.isfinite(jax.tree.leaves(final.params)[0]).all()
    with pytest.raises(ValueError, match=r"cannot be resumed: written by a run with learner groups "
                                         r"\(num_learner_groups=2\)"):
        tj.train(config, run_dir=run_dir, resume=True, progress=False)
    # the final params were saved from the groups' devices (cpu:1, cpu:2): a process with one
    # device loads them onto its own
    code = ("import jax, numpy as np, tianji_jax as tj; p = tj.load_params(%r); "
            "assert len(jax.devices()) == 1 and {d for x in jax.tree.leaves(p) for d in x.devices()} == "
            "{jax.devices()[0]}; print('loaded', sum(x.size for x in jax.tree.leaves(p)))" % str(run_dir))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-2000:]
    mine = tj.load_params(run_dir)
    assert proc.stdout.split()[-1] == str(sum(x.size for x in jax.tree.leaves(mine)))
