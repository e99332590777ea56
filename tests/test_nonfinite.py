"""The non-finite guard: a NaN/inf loss or gradient skips the step (counted in ``nonfinite_skips``),
params never become non-finite, and a run whose updates keep failing stops with one clear error,
in every runtime."""

from __future__ import annotations

import csv
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tianji_jax as tj
from tianji_jax.algos.guard import all_finite, guarded_apply
from tianji_jax.runtime.nonfinite import NonFiniteError, NonFiniteMonitor


def test_guarded_apply_bit_exact_when_finite_and_skips_otherwise():
    tx = optax.adam(1e-2)
    params = {"w": jnp.arange(4.0), "b": jnp.ones(())}
    opt = tx.init(params)
    grads = {"w": jnp.array([0.1, -0.2, 0.3, 0.4]), "b": jnp.asarray(0.5)}
    upd, ref_opt = tx.update(grads, opt, params)
    ref = optax.apply_updates(params, upd)
    got, got_opt = guarded_apply(tx, grads, opt, params, all_finite(grads))
    for a, b in zip(jax.tree.leaves((ref, ref_opt)), jax.tree.leaves((got, got_opt))):
        np.testing.assert_array_equal(a, b)
    bad = {**grads, "w": grads["w"].at[2].set(jnp.nan)}
    assert not bool(all_finite(bad)) and not bool(all_finite(jnp.asarray(jnp.inf), grads))
    kept, kept_opt = guarded_apply(tx, bad, opt, params, all_finite(bad))
    for a, b in zip(jax.tree.leaves((params, opt)), jax.tree.leaves((kept, kept_opt))):
        np.testing.assert_array_equal(a, b)


def test_monitor_counts_consecutive_updates_across_rows():
    seen = []
    mon = NonFiniteMonitor(3, lambda s: seen.append(s) or f"ckpt/{s}")
    mon.observe(np.array([0, 1, 1]), {"env_steps": 300, "update": 3})  # streak 2 at the end
    with pytest.raises(NonFiniteError, match=r"3 consecutive updates \(from update 2, env step 100\).*"
                                              r"value_loss=inf.*ckpt/100"):
        mon.observe(np.array([2, 0, 0])[:1], {"env_steps": 400, "update": 4, "value_loss": math.inf})
    mon = NonFiniteMonitor(2)
    for _ in range(5):  # isolated skips never stop a run
        mon.observe(np.array([1, 0]), {"env_steps": 1, "update": 1})


def _rows(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("runtime", ["anakin", "async"])
def test_ppo_diverging_learning_rate_stops_with_finite_params(tmp_path, runtime):
    """Budget: about 10 s each. learning_rate=10 on Pendulum made every parameter NaN from update 4."""
    config = tj.PPOConfig(env="gymnax:Pendulum-v1", learning_rate=10.0, total_env_steps=40_960, num_envs=8,
                          num_steps=128, eval_every_env_steps=2048, eval_episodes=1, max_nonfinite_updates=3,
                          runtime=runtime)
    with pytest.raises(NonFiniteError, match=r"consecutive updates \(from update \d+, env step \d+\) had a "
                                             r"non-finite loss or gradient.*max_nonfinite_updates=3"):
        tj.train(config, run_dir=tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    assert sum(int(r["nonfinite_skips"]) for r in rows) > 0
    loaded = tj.load(tmp_path / "run") if (tmp_path / "run" / "checkpoints").exists() else None
    if loaded is not None and loaded.state is not None:
        assert all(bool(np.all(np.isfinite(x))) for x in jax.tree.leaves(loaded.params))


def test_dqn_diverging_learning_rate_stops():
    """Budget: about 10 s. A learning rate of 1e30 overflows the Q-network's params to inf at once."""
    config = tj.DQNConfig(env="gymnax:CartPole-v1", learning_rate=1e30, total_env_steps=20_000, learning_starts=500,
                          eval_every_env_steps=2_000, eval_episodes=1, max_nonfinite_updates=2, prioritized=True)
    with pytest.raises(NonFiniteError, match="td_loss|grad_norm|q_mean"):
        tj.train(config, progress=False)


def test_ppo_finite_run_has_zero_skips():
    result = tj.train(tj.PPOConfig(env="gymnax:CartPole-v1", total_env_steps=4096, num_envs=4,
                                   eval_every_env_steps=2048, eval_episodes=1), progress=False)
    assert np.all(result.curve["nonfinite_skips"] == 0)


def test_cli_reports_the_nonfinite_stop_in_one_line(tmp_path, capsys):
    """Budget: about 10 s."""
    from tianji_jax.cli import main

    code = main(["train", "--env", "gymnax:Pendulum-v1", "--learning-rate", "10", "--total-env-steps", "16384",
                 "--num-envs", "8", "--eval-every-env-steps", "2048", "--eval-episodes", "1",
                 "--max-nonfinite-updates", "2", "--progress", "False", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    line = [x for x in err.splitlines() if x.startswith("tianji train: error:")]
    assert len(line) == 1 and "consecutive updates" in line[0] and "Traceback" not in err
