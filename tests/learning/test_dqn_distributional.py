"""Distributional DQN (``DQNConfig(distributional='c51' | 'qr')``): the C51 projection and the
quantile Huber loss against hand computations, the network's distributional head, config errors,
async ``sync`` == Anakin, and learning CartPole-v1 to an eval return of 475."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.algos.dqn.distributional import (c51_support, categorical_projection, distributional_loss,
                                                 quantile_huber_loss, quantile_midpoints)
from tianji_jax.nets.networks import QNetwork

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: dqn_settings
from dqn_settings import CARTPOLE_FAST  # noqa: E402


def test_support_and_midpoints():
    np.testing.assert_allclose(c51_support(5, -2.0, 2.0), [-2, -1, 0, 1, 2])
    np.testing.assert_allclose(quantile_midpoints(4), [0.125, 0.375, 0.625, 0.875])
    with pytest.raises(ValueError):
        c51_support(1, 0.0, 1.0)


def test_categorical_projection_by_hand():
    z = c51_support(5, -2.0, 2.0)  # atoms -2 -1 0 1 2, dz = 1
    p = jnp.asarray([[0.1, 0.2, 0.3, 0.25, 0.15]])
    # reward 0.5, discount 0.5: Tz = [-0.5, 0, 0.5, 1, 1.5]
    m = np.asarray(categorical_projection(jnp.asarray([0.5]), jnp.asarray([0.5]), p, z))[0]
    # -0.5 -> half to -1, half to 0; 0 -> all to 0; 0.5 -> half 0, half 1; 1 -> all 1; 1.5 -> half 1, half 2
    want = [0.0, 0.05, 0.05 + 0.2 + 0.15, 0.15 + 0.25 + 0.075, 0.075]
    np.testing.assert_allclose(m, want, atol=1e-6)
    assert m.sum() == pytest.approx(1.0, abs=1e-6)


def test_categorical_projection_clips_to_the_edges_and_conserves_mass():
    z = c51_support(11, -1.0, 1.0)
    key = jax.random.PRNGKey(0)
    p = jax.nn.softmax(jax.random.normal(key, (64, 11)), axis=-1)
    rewards = jax.random.uniform(jax.random.PRNGKey(1), (64,), minval=-5, maxval=5)
    discounts = jnp.where(jnp.arange(64) % 4 == 0, 0.0, 0.97)
    m = np.asarray(categorical_projection(rewards, discounts, p, z))
    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)
    assert (m >= 0).all()
    big = np.asarray(rewards) > 3  # every Tz beyond v_max: all mass on the top atom
    np.testing.assert_allclose(m[big, -1], 1.0, atol=1e-5)
    small = np.asarray(rewards) < -3
    np.testing.assert_allclose(m[small, 0], 1.0, atol=1e-5)
    # terminal (discount 0): all mass at the reward, split between its two atoms
    r0 = float(rewards[0])
    if -1 < r0 < 1:
        lo = int(np.floor((r0 + 1) / 0.2))
        frac = (r0 + 1) / 0.2 - lo
        assert m[0, lo] == pytest.approx(1 - frac, abs=1e-5) and m[0, lo + 1] == pytest.approx(frac, abs=1e-5)


def test_quantile_huber_loss_by_hand():
    theta = jnp.asarray([[0.0, 1.0]])     # N = 2 quantiles, tau_hat = 0.25, 0.75
    target = jnp.asarray([[0.5, 3.0]])
    got = float(quantile_huber_loss(theta, target, kappa=1.0)[0])
    want = 0.0
    for i, (t, tau) in enumerate(zip([0.0, 1.0], [0.25, 0.75])):
        terms = []
        for tj_ in [0.5, 3.0]:
            u = tj_ - t
            huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
            terms.append(abs(tau - (u < 0)) * huber)
        want += np.mean(terms)
    assert got == pytest.approx(want, rel=1e-6)
    # the gradient pushes quantile i towards the tau_i-quantile of the targets
    g = jax.grad(lambda th: quantile_huber_loss(th, target)[0])(theta)
    assert float(g[0, 0]) < 0 and float(g[0, 1]) < 0   # both below most targets: move up


def test_distributional_loss_bootstraps_the_selected_action():
    k = 3
    out = jnp.zeros((1, 2, k))
    nxt = jnp.stack([jnp.full((k,), 1.0), jnp.full((k,), 5.0)])[None]   # action 1's quantiles are higher
    select_0 = jnp.asarray([[1.0, 0.0]])   # the selector prefers action 0
    loss0 = distributional_loss("qr", out, nxt, select_0, jnp.asarray([0]), jnp.asarray([0.0]), jnp.asarray([1.0]),
                                None)
    loss1 = distributional_loss("qr", out, nxt, select_0[:, ::-1], jnp.asarray([0]), jnp.asarray([0.0]),
                                jnp.asarray([1.0]), None)
    # targets 1 (action 0) -> per quantile mean of 0.5 * tau... ; targets 5 -> linear part: larger loss
    assert float(loss1[0]) > float(loss0[0]) > 0


def test_network_distributional_head_shapes():
    for dueling in (False, True):
        net = QNetwork(action_dim=3, hidden_sizes=(8,), dueling=dueling, num_atoms=7)
        params = net.init(jax.random.PRNGKey(0), jnp.zeros((2, 4)))
        assert net.apply(params, jnp.ones((2, 4))).shape == (2, 3, 7)
    plain = QNetwork(action_dim=3, hidden_sizes=(8,))
    assert plain.apply(plain.init(jax.random.PRNGKey(0), jnp.zeros((2, 4))), jnp.ones((2, 4))).shape == (2, 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(distributional="iqn"), r"distributional must be one of \('none', 'c51', 'qr'\), got 'iqn'"),
    (dict(distributional="c51", num_atoms=1), r"num_atoms must be >= 2, got 1"),
    (dict(distributional="c51", v_min=1.0, v_max=1.0), r"v_max=1.0 must be > v_min=1.0"),
    (dict(distributional="qr", huber_delta=1.0), r"huber_delta=1.0: .* does not apply to distributional='qr'"),
])
def test_bad_distributional_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        tj.DQNConfig(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["c51", "qr"])
def test_async_sync_equals_anakin(kind):
    config = tj.DQNConfig(num_envs=4, num_steps=4, learning_starts=64, buffer_capacity=512, batch_size=16,
                          replay_ratio=0.25, total_env_steps=512, eval_every_env_steps=256, eval_episodes=1,
                          distributional=kind, prioritized=True, dueling=True, v_min=0.0, v_max=50.0)
    assert "C51" in config.describe() or "QR-DQN" in config.describe()
    anakin = tj.train(config, progress=False)
    sync = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
    for x, y in zip(jax.tree.leaves(anakin.state.learner), jax.tree.leaves(sync.state.learner)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.all(np.isfinite(anakin.curve["td_loss"][-1:]))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind, extra", [("c51", dict(v_min=0.0, v_max=100.0)), ("qr", {})])
def test_distributional_dqn_solves_cartpole(kind, extra):
    """Budget: 150k env steps (the DQN learning tests' budget); seed 0 reached 475 at about 30k
    (C51, support [0, 100]: CartPole's discounted returns lie in it) and 55k (QR-DQN, 51
    quantiles) env steps; about 1-2 min each on 2 CPU cores."""
    config = tj.DQNConfig(seed=0, total_env_steps=150_000, distributional=kind, **{**CARTPOLE_FAST, **extra})
    result = tj.train(config, progress=False)
    print(np.c_[result.curve["env_steps"], result.curve["eval_return_mean"]])
    assert result.stopped_early and result.curve["eval_return_mean"][-1] >= 475.0
