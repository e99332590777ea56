"""The non-finite guard: a NaN/inf loss or gradient skips the step (counted in ``nonfinite_skips``),
params never become non-finite, and a run whose updates keep failing stops with one clear error,
in every runtime."""

from __future__ import annotations

import csv
import inspect
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tianji_jax as tj
from tianji_jax.algos import guard, registry
from tianji_jax.algos.guard import all_finite, gradient_step, guarded_apply
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


def _loss(params, x):
    """Finite for finite x; its gradient in ``w`` is infinite where ``w == 0`` (sqrt)."""
    loss = jnp.sum(jnp.sqrt(jnp.abs(params["w"])) * x) + params["b"] ** 2
    return loss, {"x_mean": jnp.mean(x)}


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_gradient_step_equals_tx_update_when_finite_and_skips_nan_loss_and_inf_gradient():
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    params = {"w": jnp.array([1.0, 2.0, 3.0]), "b": jnp.asarray(0.5)}
    opt = tx.init(params)
    x = jnp.array([0.3, -0.2, 0.7])
    step = jax.jit(lambda p, o, x: gradient_step(_loss, tx, p, o, x))(params, opt, x)
    (loss, aux), grads = jax.value_and_grad(_loss, has_aux=True)(params, x)
    updates, ref_opt = tx.update(grads, opt, params)
    ref = optax.apply_updates(params, updates)
    assert bool(step.finite) and step.finite.dtype == jnp.bool_
    _assert_trees_equal((step.params, step.opt_state), (ref, ref_opt))
    _assert_trees_equal((step.loss, step.aux, step.grads), (loss, aux, grads))
    np.testing.assert_array_equal(step.grad_norm, optax.tree.norm(grads))
    assert int(guard.skip_count(step.finite)) == 0

    nan_loss = gradient_step(lambda p, x: (_loss(p, x)[0] + jnp.nan, {}), tx, params, opt, x)
    inf_grad = gradient_step(_loss, tx, {**params, "w": params["w"].at[1].set(0.0)}, opt, x)
    assert bool(jnp.all(jnp.isfinite(jax.tree.leaves(nan_loss.grads)[0]))) and bool(jnp.isfinite(inf_grad.loss))
    assert not bool(jnp.all(jnp.isfinite(inf_grad.grads["w"])))
    for bad, p in ((nan_loss, params), (inf_grad, {**params, "w": params["w"].at[1].set(0.0)})):
        assert not bool(bad.finite) and int(guard.skip_count(bad.finite)) == 1
        _assert_trees_equal((bad.params, bad.opt_state), (p, opt))
    unguarded = gradient_step(_loss, tx, {**params, "w": params["w"].at[1].set(0.0)}, opt, x, guard=False)
    assert not bool(unguarded.finite) and not all(bool(jnp.all(jnp.isfinite(v)))
                                                  for v in jax.tree.leaves(unguarded.opt_state))


def test_gradient_step_averages_over_the_axis_and_takes_one_decision_for_all_replicas():
    tx = optax.sgd(0.1)
    params = {"w": jnp.array([1.0, 2.0, 3.0]), "b": jnp.asarray(0.5)}
    opt = tx.init(params)
    xs = jnp.array([[0.3, -0.2, 0.7], [0.1, 0.4, -0.5]])
    run = jax.vmap(lambda x: gradient_step(_loss, tx, params, opt, x, axis_name="d", pmean_aux=True), axis_name="d")
    step = run(xs)
    one = gradient_step(lambda p, xs: (_loss(p, xs[0])[0] + _loss(p, xs[1])[0]) / 2, tx, params, opt, xs,
                        has_aux=False)
    for leaf_dp, leaf_one in zip(jax.tree.leaves(step.params), jax.tree.leaves(one.params)):
        np.testing.assert_allclose(leaf_dp[0], leaf_one, rtol=1e-6)
        np.testing.assert_array_equal(leaf_dp[0], leaf_dp[1])
    np.testing.assert_allclose(step.aux["x_mean"], [jnp.mean(xs)] * 2, rtol=1e-6)
    bad = run(xs.at[1, 0].set(jnp.inf))  # one replica's loss is inf: both replicas skip
    assert not bool(jnp.any(bad.finite))
    for leaf, ref in zip(jax.tree.leaves(bad.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(leaf, jnp.stack([ref, ref]))


_SMALL = {
    "on_policy": dict(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, total_env_steps=64,
                      eval_every_env_steps=64, eval_episodes=0),
    "replay": dict(num_envs=4, num_steps=2, buffer_capacity=512, batch_size=16, learning_starts=48,
                   replay_ratio=0.25, total_env_steps=160, eval_every_env_steps=80, eval_episodes=0,
                   hidden_sizes=(16,)),
}


@pytest.mark.parametrize("name", tj.algorithm_names())
def test_every_registered_algorithm_updates_through_the_generic_gradient_step(name, monkeypatch):
    """Tracing one Anakin chunk (no compilation) of each registered algorithm calls
    ``guard.gradient_step`` (counted through a wrapper): an algorithm computing its own gradients
    and optimizer step would bypass it and fail here."""
    algo = registry.get_algorithm(name)
    trainer = tj.make_train(algo.config_cls(**_SMALL[algo.data_path]), updates_per_chunk=1)
    state = jax.eval_shape(lambda k: trainer._init(k), jax.random.PRNGKey(0))
    calls = []
    real = guard.gradient_step

    def counting(*args, **kwargs):
        calls.append(kwargs.get("axis_name"))
        return real(*args, **kwargs)

    monkeypatch.setattr(guard, "gradient_step", counting)
    jax.eval_shape(lambda s: trainer._chunk(s), state)  # a fresh function: traced, never a cache hit
    assert len(calls) >= 1, f"{name}'s update never called tianji_jax.algos.guard.gradient_step"


def test_no_module_differentiates_or_steps_an_optimizer_outside_the_guard():
    """Source check backing the one above: gradients (``value_and_grad``/``grad``) and optimizer
    steps (``apply_updates``) appear in ``tianji_jax`` only in ``algos/guard.py``."""
    root = pathlib.Path(inspect.getfile(tj)).parent
    pattern = re.compile(r"value_and_grad|\bgrad\(|apply_updates|jax\.grad\b")
    offenders = [f"{path.relative_to(root)}:{i}" for path in sorted(root.rglob("*.py")) if path.name != "guard.py"
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


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
    from tianji_jax.cli.commands import main

    code = main(["train", "--env", "gymnax:Pendulum-v1", "--learning-rate", "10", "--total-env-steps", "16384",
                 "--num-envs", "8", "--eval-every-env-steps", "2048", "--eval-episodes", "1",
                 "--max-nonfinite-updates", "2", "--progress", "False", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    line = [x for x in err.splitlines() if x.startswith("tianji train: error:")]
    assert len(line) == 1 and "consecutive updates" in line[0] and "Traceback" not in err


_TINY_REPLAY = dict(num_envs=4, num_steps=4, buffer_capacity=256, batch_size=16, learning_starts=32, replay_ratio=0.25,
                    total_env_steps=512, eval_episodes=0, hidden_sizes=(16,))
_TINY_ON_POLICY = dict(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=2, total_env_steps=64,
                       eval_episodes=0, hidden_sizes=(16,))


@pytest.mark.parametrize("make", [
    lambda: tj.PPOConfig(**_TINY_ON_POLICY),
    lambda: tj.PQNConfig(**_TINY_ON_POLICY),
    # 4 updates a block: 12 finite steps, then the skipped block holds step 16, a copy of period 8
    lambda: tj.DQNConfig(**_TINY_REPLAY, target_update_period=8, prioritized=True, normalize_observations=True),
    lambda: tj.DQNConfig(**_TINY_REPLAY, distributional="c51", target_update_period=None, tau=0.01),
    lambda: tj.DQNConfig(**_TINY_REPLAY, distributional="qr", target_update_period=None, tau=0.01),
    lambda: tj.SACConfig(**_TINY_REPLAY, env="gymnax:Pendulum-v1"),
    lambda: tj.SACConfig(**_TINY_REPLAY, env="gymnax:Pendulum-v1", autotune=False),
], ids=["ppo", "pqn", "dqn-hard-per-norm", "c51-polyak", "qr-polyak", "sac", "sac-fixed-alpha"])
def test_a_skipped_update_changes_nothing_but_the_counters(make):
    """Budget ~5 s each. After a few finite updates (so that target nets differ from the online
    ones), an update on NaN rewards is skipped: every leaf of the learner state -- params, target
    params, optimizer states, temperature, observation statistics -- is bit-identical to before,
    only the PRNG key and the version / gradient-step counters move (and a replay's priorities
    stay). The target step used to run after a skipped update (SAC's target critics, DQN's
    Polyak targets and hard copies moved)."""
    config = make()
    agent = registry.agent_class_for(config)(config)
    learner, actor = agent.init_learner(jax.random.PRNGKey(0)), agent.init_actor(jax.random.PRNGKey(1))
    rollout, learn = jax.jit(agent.rollout), jax.jit(agent.learn)
    counters = ("key", "version", "gradient_steps")
    if registry.algorithm_for(config).data_path == "on_policy":
        actor, traj = rollout(learner.params, learner.version, actor)
        learner, metrics = learn(learner, traj)
        assert int(metrics[guard.SKIP_METRIC]) == 0
        new, metrics = learn(learner, {**traj, "reward": jnp.full_like(traj["reward"], jnp.nan)})
        steps = config.update_epochs * config.num_minibatches
    else:
        rs = agent.init_replay()
        for v in range(4):
            actor, items, item_version, mask, _ = rollout(learner.params, jnp.int32(v), actor)
            rs = agent.insert(rs, items, item_version, mask)
            learner = agent.observe(learner, items, mask)
        for _ in range(3):
            learner, rs, metrics = learn(learner, rs, jnp.int32(64))
            assert int(metrics[guard.SKIP_METRIC]) == 0
        bad = rs.replace(data=rs.data.replace(reward=jnp.full_like(rs.data.reward, jnp.nan)))
        new, rs_after, metrics = learn(learner, bad, jnp.int32(64))
        _assert_trees_equal(rs_after, bad)
        steps = config.updates_per_step
    assert int(metrics[guard.SKIP_METRIC]) == steps >= 2
    assert int(new.version) == int(learner.version) + 1
    frozen = lambda s: s.replace(**{c: None for c in counters if hasattr(s, c)})  # noqa: E731
    changed = [jax.tree_util.keystr(path) for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(frozen(learner)),
                                                                    jax.tree.leaves(frozen(new)))
               if not np.array_equal(np.asarray(a), np.asarray(b))]
    assert jax.tree.structure(frozen(learner)) == jax.tree.structure(frozen(new))
    assert changed == [], f"a skipped update changed {changed}"
