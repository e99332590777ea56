"""Anakin DQN: config validation, the compiled chunk (replay contents and version stamps checked
against the actor's own log, exact replay ratio, target updates, epsilon schedule, donation, vmap
over seeds), the host loop's run directory and ``tianji train --algo dqn``."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import CartPole, EnvParams

import tianji_jax as tj
from tianji_jax.buffers import replay
from tianji_jax.cli.commands import main
from tianji_jax.nets.networks import QNetwork

pytestmark = pytest.mark.timeout(300)

# 4 envs x 2 steps = 8 env steps per iteration; replay ratio 1/4 -> 2 gradient updates per block;
# learning starts after 6 iterations (48 env steps).
SMALL = dict(num_envs=4, num_steps=2, buffer_capacity=512, batch_size=16, learning_starts=48, replay_ratio=0.25,
             n_step=3, target_update_period=4, total_env_steps=8 * 20, eval_every_env_steps=8 * 10,
             eval_episodes=2, hidden_sizes=(16,))


def small(**changes) -> tj.DQNConfig:
    return tj.DQNConfig(**{**SMALL, **changes})


def np_tree(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


# ---- config ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, field", [
    (dict(gamma=1.5), "gamma"),
    (dict(num_envs=0), "num_envs"),
    (dict(n_step=0), "n_step"),
    (dict(batch_size=0), "batch_size"),
    (dict(seed=-1), "seed"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(max_grad_norm=-1.0), "max_grad_norm"),
    (dict(epsilon_end=1.5), "epsilon_end"),
    (dict(epsilon_decay_fraction=-0.1), "epsilon_decay_fraction"),
    (dict(per_alpha=-1.0), "per_alpha"),
    (dict(per_beta_start=2.0), "per_beta_start"),
    (dict(huber_delta=0.0), "huber_delta"),
    (dict(replay_ratio=0.3), "replay_ratio"),  # 8 * 0.3 = 2.4 updates per iteration
    (dict(replay_ratio=0.0), "replay_ratio"),
    (dict(replay_ratio=0.05), "replay_ratio"),  # 8 * 0.05 = 0.4 < 1
    (dict(tau=0.01), "tau"),  # both target rules
    (dict(target_update_period=None), "target_update_period"),  # neither
    (dict(target_update_period=None, tau=1.5), "tau"),
    (dict(target_update_period=0), "target_update_period"),
    (dict(runtime="async", max_policy_lag=-1), "max_policy_lag"),
    (dict(env="envpool:CartPole-v1"), "runtime='anakin': env 'envpool:CartPole-v1' runs on the host"),
    (dict(epsilon_start=0.1, epsilon_end=0.2), "epsilon_end"),
    (dict(epsilon_schedule="apx"), "epsilon_schedule"),
    (dict(apex_epsilon=1.5), "apex_epsilon"),
    (dict(apex_alpha=-1.0), "apex_alpha"),
    (dict(env_batch_size=4), "env_batch_size"),
    (dict(runtime="sebulba"), "runtime"),
    (dict(env="gymnax:Pendulum-v1"), "Discrete"),
    (dict(env="gymnax:CartPol-v1"), "CartPole-v1"),
    (dict(learning_starts=20), "learning_starts"),
    (dict(total_env_steps=100, learning_starts=200), "leaves no gradient update"),
    (dict(tau=2.0, target_update_period=50), "tau must be in (0.0, 1.0]"),
    (dict(total_env_steps=2**31), "total_env_steps must be <= 2147483647"),  # < batch_size + (n_step - 1) * num_envs = 24
    (dict(buffer_capacity=8), "buffer_capacity"),
    (dict(buffer_capacity=2**30 + 1), r"buffer_capacity must be <= 1073741824"),  # the sum-tree's int32 indices
    (dict(total_env_steps=4), "total_env_steps"),
    (dict(hidden_sizes=(16, 0)), "hidden_sizes"),
    (dict(activation="gelu"), "activation"),
    (dict(stop_at_return=100.0, eval_episodes=0), "stop_at_return"),
])
def test_bad_config_raises_naming_field(changes, field):
    with pytest.raises(ValueError) as err:
        small(**changes)
    assert field in str(err.value)


@pytest.mark.parametrize("changes, field", [(dict(num_envs=1.5), "num_envs"), (dict(double_q=1), "double_q")])
def test_wrong_type_raises_type_error(changes, field):
    with pytest.raises(TypeError, match=field):
        small(**changes)


def test_make_dqn_train_refuses_an_async_config():
    with pytest.raises(ValueError, match=r"make_train builds the Anakin runtime only; got runtime='async'"):
        tj.make_dqn_train(small(runtime="async"))
    assert isinstance(tj.make_dqn_train(small()), tj.DQNAnakin)


def test_replay_memory_checked_before_allocation(monkeypatch):
    config = small()
    monkeypatch.setattr(replay.state, "_free_host_bytes", lambda: config.replay_bytes - 1)
    if jax.devices()[0].platform != "cpu":  # an accelerator's buffer is checked against its own memory
        monkeypatch.setattr(replay.state, "_device_stats",
                            lambda device: {"bytes_limit": config.replay_bytes - 1, "bytes_in_use": 0})
    with pytest.raises(MemoryError, match=str(config.replay_bytes)):
        small(buffer_capacity=SMALL["buffer_capacity"])


def test_derived_sizes_describe_and_dict():
    config = small()
    assert config.iteration_env_steps == 8
    assert config.updates_per_step == 2
    assert config.num_iterations == 20
    assert config.env_steps == 160
    assert config.learning_iterations == 14  # iterations 7..20 end with > 48 env steps
    assert config.num_gradient_steps == 28
    assert config.iterations_per_chunk == 10
    assert config.epsilon_decay_steps == 80
    # obs (4,) float32 twice + action + reward + discount = 44 bytes, + 8 bytes of slot stamps,
    # + the priority sum/min trees (2 x 2 x 512 leaves, float32) + 16 bytes of scalars
    assert config.replay_bytes == 512 * (44 + 8) + 2 * 2 * 512 * 4 + 16
    text = config.describe()
    for part in ("Double DQN (3-step)", "CartPole-v1", "2 gradient update(s)", "512 transitions", "160 env steps"):
        assert part in text, part
    d = config.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(tj.DQNConfig)}
    assert json.loads(json.dumps(d))["hidden_sizes"] == [16]
    assert config.replace(seed=3).seed == 3
    with pytest.raises(ValueError, match="gamma"):
        config.replace(gamma=2.0)
    assert tj.DQNConfig(env="CartPole-v1").env == "gymnax:CartPole-v1"
    assert tj.DQNConfig(target_update_period=None, tau=0.005).tau == 0.005


# ---- network ---------------------------------------------------------------------------------------
def test_dueling_head_mean_q_is_value():
    net = QNetwork(action_dim=3, hidden_sizes=(8,), dueling=True)
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    params = net.init(jax.random.PRNGKey(0), obs)
    q = net.apply(params, obs)
    assert q.shape == (5, 3) and q.dtype == jnp.float32
    p = params["params"]
    h = jax.nn.relu(obs @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    value = (h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"])[:, 0]
    np.testing.assert_allclose(q.mean(axis=-1), value, atol=1e-5)
    plain = QNetwork(action_dim=3, hidden_sizes=(8,))
    assert plain.apply(plain.init(jax.random.PRNGKey(0), obs), obs).shape == (5, 3)


# ---- the compiled chunk ------------------------------------------------------------------------------
def test_replay_holds_exact_n_step_transitions_stamped_with_acting_version():
    config = small()
    trainer = tj.make_dqn_train(config, iterations_per_chunk=20)
    state, m = trainer(trainer.init(jax.random.PRNGKey(0)))
    m, rs = np_tree(m), np_tree(state.replay)
    n, t, h = config.num_envs, config.num_steps, config.n_step - 1
    # every step of every env is inserted once, n - 1 steps late
    assert int(rs.num_inserted) == (20 * t - h) * n == int(rs.size)
    # the actor's own log of the version it acted with: 0 until learning starts, then +1 per block
    learned = m["learned"]
    np.testing.assert_array_equal(learned, np.arange(1, 21) * 8 > config.learning_starts)
    np.testing.assert_array_equal(m["acting_version"], np.concatenate([[0], np.cumsum(learned)[:-1]]))
    # stamps: insert k holds step s = k // N (time-major), acted in iteration s // T
    order = np.argsort(rs.insert_index[: rs.size])
    k = rs.insert_index[order]
    np.testing.assert_array_equal(k, np.arange(rs.size))
    np.testing.assert_array_equal(rs.policy_version[order], m["acting_version"][(k // n) // t])
    # n-step windows across iterations: a transition that did not end its episode bootstraps from
    # the observation n steps later of the same env
    d = jax.tree.map(lambda x: x[order], rs.data)
    full = np.isclose(d.discount, config.gamma ** 3)
    later = np.arange(rs.size) + 3 * n
    ok = full & (later < rs.size)
    assert ok.sum() > 50
    np.testing.assert_array_equal(d.next_obs[ok], d.obs[later[ok]])
    np.testing.assert_allclose(d.reward[ok], 1 + config.gamma + config.gamma ** 2, rtol=1e-6)
    # terminated transitions have discount 0 and a shorter sum
    assert np.all(np.isclose(d.discount, 0.0) | full)
    assert np.any(np.isclose(d.discount, 0.0))
    assert int(state.learner.version) == int(learned.sum())


class ShortCartPole(CartPole):
    """CartPole truncated after 5 steps (before a random policy usually terminates)."""

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=5)


def test_truncation_bootstraps_through_final_obs():
    config = small(env=ShortCartPole(), n_step=1, learning_starts=16)
    trainer = tj.make_dqn_train(config, iterations_per_chunk=10)
    state, _ = trainer(trainer.init(jax.random.PRNGKey(0)))
    rs = np_tree(state.replay)
    order = np.argsort(rs.insert_index[: rs.size])
    d = jax.tree.map(lambda x: x[order], rs.data)
    n = config.num_envs
    # a time-limit cut is not a termination: discount gamma, not 0
    not_terminal = d.discount > 0
    np.testing.assert_allclose(d.discount[not_terminal], config.gamma, rtol=1e-6)
    # next_obs is the true successor (CartPole's Euler step x' = x + 0.02 x_dot), also where the
    # env was reset right after: there the next item's obs is the reset observation instead
    np.testing.assert_allclose(d.next_obs[not_terminal, 0], d.obs[not_terminal, 0] + 0.02 * d.obs[not_terminal, 1],
                               atol=1e-6)
    reset_after = np.zeros(rs.size, bool)
    reset_after[:-n] = np.any(d.next_obs[:-n] != d.obs[n:], axis=-1)
    assert (reset_after & not_terminal).sum() >= n  # truncations happened and bootstrap from final_obs


def test_replay_ratio_is_exact():
    config = small(replay_ratio=0.5, learning_starts=40)  # 4 updates per iteration from iteration 6 on
    trainer = tj.make_dqn_train(config, iterations_per_chunk=20)
    state, m = trainer(trainer.init(jax.random.PRNGKey(1)))
    env_steps = int(state.env_steps)
    assert env_steps == config.env_steps == 160
    grad_steps = int(state.learner.gradient_steps)
    assert grad_steps == config.replay_ratio * (env_steps - config.learning_starts) == config.num_gradient_steps
    assert int(np.asarray(m["gradient_steps"]).sum()) == grad_steps
    assert int(state.learner.version) * config.updates_per_step == grad_steps


def test_hard_target_update_copies_every_period():
    config = small(replay_ratio=0.125, target_update_period=3)  # 1 update per iteration
    trainer = tj.make_dqn_train(config, iterations_per_chunk=1)
    state = trainer.init(jax.random.PRNGKey(2))
    prev_target = np_tree(state.learner.target_params)
    copies = 0
    for _ in range(14):
        state, _ = trainer(state)
        gs = int(state.learner.gradient_steps)
        online, target = np_tree(state.learner.params), np_tree(state.learner.target_params)
        same_as_online = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(online), jax.tree.leaves(target)))
        unchanged = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(prev_target), jax.tree.leaves(target)))
        if gs > 0 and gs % 3 == 0:
            assert same_as_online
            copies += 1
        else:
            assert unchanged
            if gs > 0:
                assert not same_as_online
        prev_target = target
    assert copies == 2  # gradient steps 1..8 (learning from iteration 7)


def test_polyak_target_update():
    config = small(replay_ratio=0.125, target_update_period=None, tau=0.25)
    trainer = tj.make_dqn_train(config, iterations_per_chunk=1)
    state = trainer.init(jax.random.PRNGKey(3))
    for _ in range(6):  # no learning yet: the target stays the initial copy
        state, _ = trainer(state)
    before = np_tree(state.learner.target_params)
    state, _ = trainer(state)
    assert int(state.learner.gradient_steps) == 1
    after, online = np_tree(state.learner.target_params), np_tree(state.learner.params)
    jax.tree.map(lambda a, o, b: np.testing.assert_allclose(a, 0.25 * o + 0.75 * b, rtol=1e-6, atol=1e-7),
                 after, online, before)


def test_epsilon_schedule_reaches_end():
    config = small(epsilon_start=0.9, epsilon_end=0.1, epsilon_decay_fraction=0.5)
    trainer = tj.make_dqn_train(config, iterations_per_chunk=20)
    _, m = trainer(trainer.init(jax.random.PRNGKey(0)))
    eps = np.asarray(m["epsilon"])
    assert eps[0] == pytest.approx(0.9)
    assert np.all(np.diff(eps) <= 1e-7)
    # epsilon at the first step of iteration i (after 8 i env steps), over 80 env steps
    np.testing.assert_allclose(eps, 0.9 - 0.8 * np.minimum(np.arange(20) * 8 / 80, 1.0), atol=1e-6)
    assert eps[-1] == pytest.approx(0.1)


def test_chunk_donates_state():
    trainer = tj.make_dqn_train(small(), iterations_per_chunk=10)
    state = trainer.init(jax.random.PRNGKey(0))
    old_buffer, old_params = state.replay.data.obs, jax.tree.leaves(state.learner.params)[0]
    new_state, _ = trainer(state)
    assert old_buffer.is_deleted() and old_params.is_deleted()
    assert not new_state.replay.data.obs.is_deleted()


def test_vmapped_seeds_equal_unbatched_runs():
    config = small()
    trainer = tj.make_dqn_train(config, iterations_per_chunk=20)
    keys = jax.vmap(jax.random.PRNGKey)(np.arange(3, dtype=np.uint32))
    states = jax.vmap(trainer.init)(keys)
    states, metrics = jax.jit(jax.vmap(trainer.chunk))(states)
    assert metrics["td_loss"].shape == (3, 20)
    for i in range(3):
        single, m = trainer(trainer.init(jax.random.PRNGKey(i)))
        jax.tree.map(lambda b, s: np.testing.assert_allclose(np.asarray(b)[i], np.asarray(s), atol=1e-5),
                     (states.learner.params, states.replay.data), (single.learner.params, single.replay.data))
        np.testing.assert_array_equal(np.asarray(states.replay.policy_version)[i], np.asarray(single.replay.policy_version))
        assert int(single.learner.gradient_steps) == config.num_gradient_steps
    leaves = jax.tree.leaves(states.learner.params)
    assert any(not np.allclose(np.asarray(x)[0], np.asarray(x)[1]) for x in leaves)


@pytest.mark.parametrize("changes", [dict(prioritized=True, dueling=True), dict(double_q=False, huber_delta=1.0)])
def test_variants_run_and_learn(changes):
    config = small(**changes)
    trainer = tj.make_dqn_train(config, iterations_per_chunk=20)
    state, m = trainer(trainer.init(jax.random.PRNGKey(0)))
    learned = np.asarray(m["learned"])
    assert np.all(np.isfinite(np.asarray(m["td_loss"])[learned]))
    if config.prioritized:  # sampled items got new priorities (|td| + eps)^alpha != the initial 1
        pr = np.asarray(state.replay.priority)[: int(state.replay.size)]
        assert np.sum(~np.isclose(pr, 1.0)) > 0


# ---- host loop and CLI -----------------------------------------------------------------------------
def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_train_writes_run_directory(tmp_path):
    config = small(total_env_steps=8 * 25)  # 25 iterations: chunks of 10, 10 and a tail of 5
    result = tj.train(config, run_dir=tmp_path / "run", progress=False)
    rows = _read_csv(tmp_path / "run" / "metrics.csv")
    assert [int(r["env_steps"]) for r in rows] == [80, 160, 200]
    for col in ("epsilon", "replay_ratio_observed", "td_loss", "q_mean"):
        assert col in tj.METRIC_COLUMNS
    first, *rest = rows
    assert float(first["replay_ratio_observed"]) == pytest.approx(4 * 2 / 80)  # learning starts after 48 env steps...
    assert first["td_loss"] != ""  # ...inside the first chunk (iterations 7-10)
    for r in rest:
        assert float(r["replay_ratio_observed"]) == pytest.approx(config.replay_ratio)
        assert math.isfinite(float(r["td_loss"])) and math.isfinite(float(r["q_mean"]))
        assert r["policy_loss"] == "" and r["value_loss"] == ""
        assert 1 <= float(r["eval_return_mean"]) <= 500
    assert float(rows[-1]["epsilon"]) == pytest.approx(config.epsilon_end)
    assert int(rows[-1]["update"]) == int(result.state.learner.version) == 19
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["algo"] == "dqn"
    assert saved["derived"]["updates_per_step"] == 2
    assert saved["derived"]["num_gradient_steps"] == int(result.state.learner.gradient_steps) == 38
    assert (tmp_path / "run" / "provenance.json").exists()
    params = tj.load_params(tmp_path / "run")
    assert {tuple(np.shape(x)) for x in jax.tree.leaves(params)} >= {(4, 16), (16, 2)}
    ev = tj.evaluate(config, result.state, num_episodes=3, seed=1)
    assert ev["returns"].shape == (3,)
    with pytest.raises(FileExistsError):
        tj.train(config, run_dir=tmp_path / "run", progress=False)


def test_ppo_rows_leave_dqn_columns_empty():
    config = tj.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 2,
                          eval_every_env_steps=4 * 32, eval_episodes=0)
    result = tj.train(config, progress=False)
    for col in ("epsilon", "replay_ratio_observed", "td_loss", "q_mean"):
        assert np.all(np.isnan(result.curve[col])), col


def test_cli_algo_dqn_tiny_run(tmp_path, capsys):
    run_dir = tmp_path / "cli"
    argv = ["train", "--algo", "dqn", "--run-dir", str(run_dir), "--progress", "False"]
    for k, v in small(total_env_steps=8 * 10).to_dict().items():
        argv += [f"--{k.replace('_', '-')}", *(map(str, v) if isinstance(v, list) else [str(v)])]
    assert main(argv) == 0
    assert "tianji_jax.train: done: 80 env steps" in capsys.readouterr().err
    assert json.loads((run_dir / "config.json").read_text())["algo"] == "dqn"
    assert len(_read_csv(run_dir / "metrics.csv")) == 1


def _exit_code(argv):
    """``main``'s exit status, whether returned or raised as SystemExit (as in test_cli.py)."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_cli_algo_dqn_help_and_errors(capsys):
    assert _exit_code(["train", "--algo", "dqn", "--help"]) in (0, None)
    out = capsys.readouterr().out
    missing = [f.name for f in dataclasses.fields(tj.DQNConfig) if f"--{f.name.replace('_', '-')}" not in out]
    assert missing == []
    assert main(["train", "--algo=dqn", "--replay-ratio", "0.1234", "--progress", "False"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tianji train: error: ") and "replay_ratio" in err
    assert _exit_code(["train", "--help"]) in (0, None)
    assert "--algo {" + ",".join(tj.algorithm_names()) + "}" in capsys.readouterr().out  # ppo,pqn,dqn,sac
