"""Async DQN: gate at insert, replay ratio held by the limiter, stamps checked against the actors' logs."""

import threading

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.buffers.queues import ReplayIngress, TrajectoryItem
from tianji_jax.buffers.rate_limiter import RateLimiter
from tianji_jax.runtime.async_replay import AsyncReplay

pytestmark = pytest.mark.timeout(300)

SMALL = dict(runtime="async", total_env_steps=12_000, num_envs=4, num_steps=8, batch_size=32, replay_ratio=0.125,
             learning_starts=512, buffer_capacity=4096, eval_episodes=0, eval_every_env_steps=4_000)


def _ingress(k=1):
    return ReplayIngress(RateLimiter(spi=1.0, min_size=10, min_diff=0, max_diff=40, batch_items=10,
                                     chunk_items=10), k)


def test_gate_at_insert_drops_stale_chunks_and_counts_them():
    ing, stop = _ingress(k=1), threading.Event()
    for v in (3, 1, 2):  # a straggler acted with version 1
        assert ing.put(TrajectoryItem(data=v, version=v, actor_id=0, num_steps=10), 1.0, stop)
    fresh, can = ing.take(3, 10, 0.1, stop)
    assert [it.data for it in fresh] == [3, 2] and can
    assert ing.dropped_stale == 10 and ing.limiter.dropped == 10 and ing.inserted == 20
    assert ing.produced == ing.inserted + ing.dropped_stale + ing.resident
    assert ing.take(3, 10, 0.05, stop) == ([], True)  # 20 inserted x spi 1 - 10 sampled leaves credit 10
    assert ing.take(3, 10, 0.05, stop) == ([], False)  # credit 0: another block would go below min_diff


def test_actor_blocks_when_the_learner_falls_behind():
    ing, stop = _ingress(), threading.Event()
    while ing.admit(10, 0.01, stop):
        ing.put(TrajectoryItem(data=0, version=0, actor_id=0, num_steps=10), 0.0, stop, admitted=True)
    assert ing.limiter.error <= ing.limiter.max_diff and ing.produced == 40  # (I + c) * spi - S <= max_diff


def test_async_dqn_keeps_the_replay_ratio_and_stamps_what_actors_acted_with():
    config = tj.DQNConfig(**SMALL)
    dqn = AsyncReplay(config)
    lags = []
    done = dqn.runner.run(lambda v, m, item: lags.append(int(m["policy_lag_max"])) or False)
    assert done == config.learning_iterations
    buf = dqn.runner.buffer
    lim = buf.limiter
    batch = config.batch_size
    # replay ratio = gradient updates per env step inserted after learning_starts (as Anakin counts
    # it), within the limiter's band once I >= 10 * min_size
    after = lim.inserted - config.learning_starts
    observed = lim.sampled / batch / after
    assert lim.inserted >= 10 * config.learning_starts
    assert abs(observed - config.replay_ratio) <= (lim.max_diff - lim.min_diff) / (after * batch)
    assert int(dqn.learner_state.gradient_steps) == done * config.updates_per_step
    # every stored stamp is a version some actor logged acting with; the gate held
    rs = jax.device_get(dqn.replay_state)
    stamps = set(np.asarray(rs.policy_version)[: int(rs.size)].tolist())
    assert stamps <= set(dqn.runner.actor_logs[0]) and buf.dropped_stale == 0
    assert buf.produced == buf.inserted + buf.dropped_stale + buf.resident
    assert dqn.replay_state.policy_version.devices() == {dqn.learner_device} != {dqn.actor_device}


def test_async_dqn_config_fields_are_validated():
    with pytest.raises(ValueError, match="max_policy_lag"):
        tj.DQNConfig(**{**SMALL, "max_policy_lag": -1})
    with pytest.raises(ValueError, match="num_actors"):
        tj.DQNConfig(**{**SMALL, "num_actors": 0})
    with pytest.raises(ValueError, match="stall_timeout_s"):
        tj.DQNConfig(**{**SMALL, "stall_timeout_s": 0.0})
    with pytest.raises(ValueError, match="schedule"):
        tj.DQNConfig(**{**SMALL, "schedule": "one_step"})
    with pytest.raises(ValueError, match=r"num_actors must be 1 \(one per learner group\) for schedule 'sync'"):
        tj.DQNConfig(**{**SMALL, "schedule": "sync", "num_actors": 2})
    assert "async runtime" in tj.DQNConfig(**SMALL).describe()


def test_train_async_dqn_writes_rows_with_the_dqn_and_async_columns(tmp_path):
    config = tj.DQNConfig(**{**SMALL, "eval_episodes": 2})
    result = tj.train(config, run_dir=tmp_path, progress=False)
    c = result.curve
    assert len(c["env_steps"]) >= 2 and np.all(np.isfinite(c["eval_return_mean"]))
    assert np.all(np.isfinite(c["td_loss"])) and np.all(c["epsilon"] <= 1.0)
    assert abs(c["replay_ratio_observed"][-1] - config.replay_ratio) < 0.02
    assert np.all(c["dropped_stale"] >= 0) and np.isfinite(c["production_sps"]).all()
    assert int(result.state.learner.version) == config.learning_iterations
    # the last block waited for the last inserts: the run took at least the env steps describe() states,
    # and the limiter's band (1x the narrowest) lets an actor insert at most one chunk beyond them
    assert f"= {config.env_steps} env steps" in config.describe()
    assert config.env_steps <= c["env_steps"][-1] <= config.env_steps + config.iteration_env_steps
    assert (tmp_path / "final_params").is_dir()

