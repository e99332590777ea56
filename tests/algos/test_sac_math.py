"""SAC math and networks (:mod:`tianji_jax.algos.sac`): the squashed-Gaussian density against an
independent float64 computation, the CDF of the squashing and numerical quadrature; bounds,
reparameterised gradients; the soft target and the three losses on hand-computed values; the
actor's and twin critics' shapes, bounds and parameter independence."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from tianji_jax.algos.sac import (LOG_STD_MAX, LOG_STD_MIN, SACActor, TwinQ, actor_loss, critic_loss,
                                  default_target_entropy, make_sac_networks, soft_q_target, squashed_gaussian_mode,
                                  squashed_gaussian_sample, temperature_loss)

pytestmark = pytest.mark.timeout(120)

LOW = np.array([-2.0, 0.0], np.float32)
HIGH = np.array([2.0, 1.0], np.float32)


def _eps(key, shape):
    """The standard normal noise ``squashed_gaussian_sample`` draws from ``key`` (white-box: it
    draws ``jax.random.normal(key, mean.shape, mean.dtype)``)."""
    return np.asarray(jax.random.normal(key, shape, jnp.float32), np.float64)


def _reference_log_prob(u, mean, std, low, high):
    """log N(u; mean, std) - log |d action / d u| in float64, with d action / d u =
    half * sech(u)^2, so log|.| = log(half) - 2 log cosh(u) (no tanh involved)."""
    log_normal = -0.5 * ((u - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    half = (high - low) / 2
    log_cosh = np.abs(u) + np.log1p(np.exp(-2 * np.abs(u))) - np.log(2.0)  # exact, no overflow
    return np.sum(log_normal - (np.log(half) - 2 * log_cosh), axis=-1)


# ----------------------------------------------------------------------------- squashed Gaussian


def test_log_prob_matches_an_independent_change_of_variables():
    key_m, key_s, key = jax.random.split(jax.random.PRNGKey(0), 3)
    mean = jax.random.normal(key_m, (256, 2)) * 3.0
    log_std = jax.random.uniform(key_s, (256, 2), minval=LOG_STD_MIN, maxval=LOG_STD_MAX)
    action, log_prob = squashed_gaussian_sample(key, mean, log_std, LOW, HIGH)
    assert action.shape == (256, 2) and log_prob.shape == (256,)
    assert action.dtype == jnp.float32 and log_prob.dtype == jnp.float32
    m, s = np.asarray(mean, np.float64), np.exp(np.asarray(log_std, np.float64))
    u = m + s * _eps(key, (256, 2))
    np.testing.assert_allclose(np.asarray(action), LOW + (np.tanh(u) + 1) * (HIGH - LOW) / 2, atol=1e-5)
    ref = _reference_log_prob(u, m, s, LOW.astype(np.float64), HIGH.astype(np.float64))
    np.testing.assert_allclose(np.asarray(log_prob), ref, rtol=1e-4, atol=1e-3)


def test_log_prob_is_finite_where_the_naive_correction_underflows():
    """|u| of 20-60: float32 tanh(u)^2 == 1 so the naive log(1 - tanh^2) is -inf (log_prob +inf);
    the stable form must stay finite, match float64, and have finite gradients."""
    mean = jnp.array([[20.0, -30.0], [60.0, -45.0], [0.0, 9.5]], jnp.float32)
    log_std = jnp.full((3, 2), -5.0, jnp.float32)
    key = jax.random.PRNGKey(3)
    with np.errstate(divide="ignore"):
        assert not np.isfinite(np.log(1.0 - np.tanh(np.float32(30.0)) ** 2))  # the hazard is real
    action, log_prob = squashed_gaussian_sample(key, mean, log_std, LOW, HIGH)
    assert np.all(np.isfinite(np.asarray(log_prob)))
    u = np.asarray(mean, np.float64) + np.exp(-5.0) * _eps(key, (3, 2))
    ref = _reference_log_prob(u, np.asarray(mean, np.float64), np.exp(-5.0), LOW.astype(np.float64),
                              HIGH.astype(np.float64))
    np.testing.assert_allclose(np.asarray(log_prob), ref, rtol=1e-4)
    assert np.all(np.asarray(action) >= LOW) and np.all(np.asarray(action) <= HIGH)
    grads = jax.grad(lambda m, s: jnp.sum(squashed_gaussian_sample(key, m, s, LOW, HIGH)[1]), argnums=(0, 1))(
        mean, log_std)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def test_density_is_the_derivative_of_the_cdf_of_the_samples():
    """1-D, asymmetric bounds: exp(log_prob) of each sample equals dF/da of the exact CDF
    F(a) = Phi((atanh((a - low) / half - 1) - mean) / std), by central differences in float64."""
    low, high, m, s = -1.0, 4.0, 0.4, 0.8
    mean = jnp.full((2000, 1), m, jnp.float32)
    log_std = jnp.full((2000, 1), math.log(s), jnp.float32)
    action, log_prob = squashed_gaussian_sample(jax.random.PRNGKey(7), mean, log_std, jnp.array([low]),
                                                jnp.array([high]))
    a = np.asarray(action[:, 0], np.float64)
    half = (high - low) / 2

    def cdf(x):
        return special.ndtr((np.arctanh((x - low) / half - 1.0) - m) / s)

    inside = (a > low + 0.05) & (a < high - 0.05)  # keep a +- h inside the support
    assert inside.mean() > 0.8
    h = 1e-5
    density = (cdf(a[inside] + h) - cdf(a[inside] - h)) / (2 * h)
    np.testing.assert_allclose(np.exp(np.asarray(log_prob, np.float64)[inside]), density, rtol=2e-3)


@pytest.mark.parametrize("m, s", [(0.0, 1.0), (1.5, 2.5), (-0.7, 0.2)])
def test_the_density_integrates_to_one_over_the_box(m, s):
    """Quadrature over [low, high] of exp(log N(u) - log|da/du|), u = atanh((a - low)/half - 1),
    the formula the sampler is checked against above: mass 1 (std 2.5 piles mass at the bounds,
    so the grid is in u-quantiles mapped to a: a trapezoid in a-space on a fine grid)."""
    low, high = -3.0, 0.5
    half = (high - low) / 2
    # a fine grid in a, denser near the bounds through a tanh-spaced u grid
    u = np.linspace(m - 12 * s, m + 12 * s, 400_001)
    a = low + (np.tanh(u) + 1) * half
    p = np.exp(_reference_log_prob(u[:, None], m, s, np.array([low]), np.array([high])))
    mass = np.sum(0.5 * (p[1:] + p[:-1]) * np.diff(a))
    assert mass == pytest.approx(1.0, abs=2e-3)


def test_actions_stay_in_asymmetric_bounds_and_reach_both_ends():
    key_m, key_s, key = jax.random.split(jax.random.PRNGKey(1), 3)
    mean = jax.random.normal(key_m, (4096, 2)) * 20.0
    log_std = jax.random.uniform(key_s, (4096, 2), minval=LOG_STD_MIN, maxval=LOG_STD_MAX)
    action, log_prob = jax.jit(squashed_gaussian_sample)(key, mean, log_std, LOW, HIGH)
    a = np.asarray(action)
    assert np.all(a >= LOW) and np.all(a <= HIGH)
    np.testing.assert_allclose(a.min(axis=0), LOW, atol=1e-3)
    np.testing.assert_allclose(a.max(axis=0), HIGH, atol=1e-3)
    assert np.all(np.isfinite(np.asarray(log_prob)))


def test_mode_is_the_tanh_squashed_mean():
    mean = jnp.array([[0.0, 0.0], [1.0, -0.5], [100.0, -100.0], [-3.0, 2.0]], jnp.float32)
    mode = np.asarray(squashed_gaussian_mode(mean, LOW, HIGH))
    expected = LOW + (np.tanh(np.asarray(mean, np.float64)) + 1) * (HIGH - LOW) / 2
    np.testing.assert_allclose(mode, expected, atol=1e-6)
    np.testing.assert_allclose(mode[0], [0.0, 0.5])  # centre of the box
    np.testing.assert_array_equal(mode[2], [HIGH[0], LOW[1]])  # saturated: exactly at the bounds
    # the sample collapses onto the mode as the std vanishes
    sample, _ = squashed_gaussian_sample(jax.random.PRNGKey(0), mean, jnp.full((4, 2), -20.0), LOW, HIGH)
    np.testing.assert_allclose(np.asarray(sample), mode, atol=1e-5)


def test_gradients_flow_through_the_sample_to_mean_and_log_std():
    key = jax.random.PRNGKey(5)
    mean = jnp.array([[0.3, -0.2], [1.0, 0.5]], jnp.float32)
    log_std = jnp.array([[-0.5, 0.1], [0.0, -1.0]], jnp.float32)
    g_mean, g_log_std = jax.grad(lambda m, s: jnp.sum(squashed_gaussian_sample(key, m, s, LOW, HIGH)[0]),
                                 argnums=(0, 1))(mean, log_std)
    # d action / d mean = half * (1 - tanh(u)^2); d action / d log_std = that * std * eps
    eps = _eps(key, (2, 2))
    u = np.asarray(mean, np.float64) + np.exp(np.asarray(log_std, np.float64)) * eps
    da_du = (HIGH - LOW) / 2 * (1 - np.tanh(u) ** 2)
    np.testing.assert_allclose(np.asarray(g_mean), da_du, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(g_log_std), da_du * np.exp(np.asarray(log_std, np.float64)) * eps,
                               rtol=1e-4, atol=1e-7)
    # the log-density depends on both too (the entropy term of the policy loss)
    lg = jax.grad(lambda m, s: jnp.sum(squashed_gaussian_sample(key, m, s, LOW, HIGH)[1]), argnums=(0, 1))(
        mean, log_std)
    assert all(np.all(np.abs(np.asarray(g)) > 1e-6) for g in lg)


# ----------------------------------------------------------------------------- targets and losses


def test_soft_q_target_on_hand_values():
    y = soft_q_target(reward=jnp.array([1.0, 2.0]), discount=jnp.array([0.99, 0.0]),
                      next_q1=jnp.array([10.0, 5.0]), next_q2=jnp.array([8.0, 7.0]),
                      next_log_prob=jnp.array([-1.0, 3.0]), alpha=0.5)
    # 1 + 0.99 * (min(10, 8) - 0.5 * -1) = 1 + 0.99 * 8.5; terminated: the reward alone
    np.testing.assert_allclose(np.asarray(y), [1.0 + 0.99 * 8.5, 2.0], rtol=1e-6)


def test_critic_loss_on_hand_values_with_a_stopped_target():
    q1, q2, target = jnp.array([1.0, 2.0]), jnp.array([0.0, 4.0]), jnp.array([1.0, 1.0])
    loss, td = critic_loss(q1, q2, target)
    assert float(loss) == pytest.approx(0.5 + 5.0)  # mean(0, 1) + mean(1, 9)
    np.testing.assert_allclose(np.asarray(td), [0.5, 2.0])  # (|0| + |-1|) / 2, (|1| + |3|) / 2
    g1, g2, gy = jax.grad(lambda a, b, c: critic_loss(a, b, c)[0], argnums=(0, 1, 2))(q1, q2, target)
    np.testing.assert_allclose(np.asarray(g1), [0.0, 1.0])  # 2 (q1 - y) / B
    np.testing.assert_allclose(np.asarray(g2), [-1.0, 3.0])
    np.testing.assert_array_equal(np.asarray(gy), [0.0, 0.0])


def test_actor_loss_on_hand_values_with_a_stopped_alpha():
    log_prob, q1, q2 = jnp.array([-1.0, 2.0]), jnp.array([3.0, 1.0]), jnp.array([2.0, 5.0])
    loss = actor_loss(log_prob, q1, q2, 0.1)
    assert float(loss) == pytest.approx(((0.1 * -1 - 2) + (0.1 * 2 - 1)) / 2)  # -1.45
    g_lp, g_q1, g_q2, g_alpha = jax.grad(actor_loss, argnums=(0, 1, 2, 3))(log_prob, q1, q2, jnp.float32(0.1))
    np.testing.assert_allclose(np.asarray(g_lp), [0.05, 0.05])
    np.testing.assert_allclose(np.asarray(g_q1), [0.0, -0.5])  # the min picks q2 then q1
    np.testing.assert_allclose(np.asarray(g_q2), [-0.5, 0.0])
    assert float(g_alpha) == 0.0


def test_temperature_loss_on_hand_values():
    loss = temperature_loss(jnp.float32(0.3), jnp.array([-1.0, 2.0]), -1.0)
    assert float(loss) == pytest.approx(-0.3 * ((-2.0 + 1.0) / 2))  # 0.15
    g_la, g_lp = jax.grad(temperature_loss, argnums=(0, 1))(jnp.float32(0.3), jnp.array([-1.0, 2.0]), -1.0)
    assert float(g_la) == pytest.approx(0.5)  # -mean(log_prob + target_entropy)
    np.testing.assert_array_equal(np.asarray(g_lp), [0.0, 0.0])


@pytest.mark.parametrize("log_prob, raises", [([2.0, 3.0], True), ([-2.0, 0.5], False)])
def test_temperature_rises_when_entropy_is_below_target(log_prob, raises):
    """Entropy estimate -log_prob vs target -1: [-2, -3] below target -> a gradient step raises
    log_alpha; mean entropy 0.75 above -> it lowers it."""
    target_entropy = default_target_entropy(1)
    grad = float(jax.grad(temperature_loss)(jnp.float32(0.0), jnp.array(log_prob), target_entropy))
    new_log_alpha = 0.0 - 0.1 * grad
    assert (new_log_alpha > 0.0) == raises and grad != 0.0


def test_default_target_entropy():
    assert default_target_entropy(6) == -6.0 and isinstance(default_target_entropy(1), float)
    with pytest.raises(ValueError, match="action_dim"):
        default_target_entropy(0)


# ----------------------------------------------------------------------------- networks


def _sizes(params) -> list[int]:
    return [int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)]


def test_actor_shapes_and_log_std_bounds():
    actor = SACActor(action_dim=2, hidden_sizes=(32, 32))
    obs = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    params = actor.init(jax.random.PRNGKey(1), obs)
    assert min(_sizes(params)) > 0 and params["params"]["Dense_0"]["kernel"].shape == (3, 32)
    mean, log_std = actor.apply(params, obs)
    assert mean.shape == log_std.shape == (5, 2) and mean.dtype == log_std.dtype == jnp.float32
    assert np.all(np.asarray(log_std) >= LOG_STD_MIN) and np.all(np.asarray(log_std) <= LOG_STD_MAX)
    # blow the parameters up: the log_std head saturates at both ends, never past them
    big = jax.tree_util.tree_map(lambda x: x * 1000.0, params)
    _, log_std = actor.apply(big, jax.random.normal(jax.random.PRNGKey(2), (256, 3)))
    ls = np.asarray(log_std)
    assert ls.min() >= LOG_STD_MIN and ls.max() <= LOG_STD_MAX
    assert ls.min() == pytest.approx(LOG_STD_MIN, abs=1e-3) and ls.max() == pytest.approx(LOG_STD_MAX, abs=1e-3)
    # integer observations are cast; extra dims are flattened
    p2 = SACActor(action_dim=1, hidden_sizes=(8,)).init(jax.random.PRNGKey(0), jnp.ones((2, 2, 3), jnp.int32))
    assert p2["params"]["Dense_0"]["kernel"].shape == (6, 8)


def test_twin_q_critics_are_independent():
    critic = TwinQ(hidden_sizes=(32, 32))
    obs = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    action = jax.random.uniform(jax.random.PRNGKey(1), (5, 2), minval=-1, maxval=1)
    params = critic.init(jax.random.PRNGKey(2), obs, action)
    assert min(_sizes(params)) > 0
    assert all(x.shape[0] == 2 for x in jax.tree_util.tree_leaves(params))  # one slice per critic
    assert params["params"]["critics"]["Dense_0"]["kernel"].shape == (2, 3 + 2, 32)  # obs ++ action
    q1, q2 = critic.apply(params, obs, action)
    assert q1.shape == q2.shape == (5,) and q1.dtype == q2.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(q1) - np.asarray(q2)) > 1e-4)  # different inits
    for which in (0, 1):
        g = jax.grad(lambda p: jnp.sum(critic.apply(p, obs, action)[which]))(params)
        for leaf in jax.tree_util.tree_leaves(g):
            assert np.any(np.asarray(leaf[which]) != 0.0) and np.all(np.asarray(leaf[1 - which]) == 0.0)
    # Q depends on the action
    g_a = jax.grad(lambda a: jnp.sum(critic.apply(params, obs, a)[0]))(action)
    assert np.all(np.abs(np.asarray(g_a)) > 0.0)


def test_make_sac_networks_small_cnn_images():
    actor, critic = make_sac_networks(3, (16,), "relu", "auto", (10, 10, 4))  # MinAtar-like planes
    assert actor.torso == critic.torso == "small_cnn"
    obs = (jax.random.uniform(jax.random.PRNGKey(0), (4, 10, 10, 4)) > 0.5).astype(jnp.uint8)
    action = jnp.zeros((4, 3), jnp.float32)
    pa = actor.init(jax.random.PRNGKey(1), obs)
    pc = critic.init(jax.random.PRNGKey(2), obs, action)
    assert min(_sizes(pa)) > 0 and min(_sizes(pc)) > 0
    assert pc["params"]["critics"]["SmallCNN_0"]["kernel"].shape == (2, 3, 3, 4, 16)  # a torso per critic
    mean, log_std = actor.apply(pa, obs)
    q1, q2 = critic.apply(pc, obs, action)
    assert mean.shape == log_std.shape == (4, 3) and q1.shape == q2.shape == (4,)
    assert not np.allclose(np.asarray(q1), np.asarray(q2))


def test_nature_cnn_frames_trace():
    """Atari frame stacks: 'auto' picks the Nature CNN, one per critic (shapes only, nothing runs)."""
    actor, critic = make_sac_networks(2, (16,), obs_shape=(4, 84, 84))
    assert actor.torso == critic.torso == "nature_cnn"
    obs = jax.ShapeDtypeStruct((2, 4, 84, 84), jnp.uint8)
    pa = jax.eval_shape(actor.init, jax.random.PRNGKey(0), obs)
    pc = jax.eval_shape(critic.init, jax.random.PRNGKey(0), obs, jax.ShapeDtypeStruct((2, 2), jnp.float32))
    assert min(_sizes(pa)) > 0 and min(_sizes(pc)) > 0
    assert pa["params"]["Dense_0"]["kernel"].shape == (512, 16)  # the MLP follows the 512 features
    assert pc["params"]["critics"]["Dense_0"]["kernel"].shape == (2, 512 + 2, 16)
    out = jax.eval_shape(actor.apply, pa, obs)
    assert out[0].shape == out[1].shape == (2, 2)


class _Tiny(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return nn.relu(nn.Dense(8)(obs.reshape((obs.shape[0], -1)).astype(jnp.float32)))


def _tiny():
    return _Tiny()


def test_user_torso_and_errors():
    actor, critic = make_sac_networks(2, (8,), "tanh", _tiny, (3,))
    obs, action = jnp.ones((2, 3)), jnp.zeros((2, 2))
    pa, pc = actor.init(jax.random.PRNGKey(0), obs), critic.init(jax.random.PRNGKey(0), obs, action)
    assert pa["params"]["_Tiny_0"]["Dense_0"]["kernel"].shape == (3, 8)
    assert pc["params"]["critics"]["_Tiny_0"]["Dense_0"]["kernel"].shape == (2, 3, 8)
    assert actor.apply(pa, obs)[0].shape == (2, 2) and critic.apply(pc, obs, action)[0].shape == (2,)
    with pytest.raises(ValueError, match="action_dim"):
        make_sac_networks(0, obs_shape=(3,))
    with pytest.raises(ValueError, match="activation"):
        make_sac_networks(1, activation="gelu", obs_shape=(3,))
    with pytest.raises(ValueError, match="small_cnn"):
        make_sac_networks(1, torso="small_cnn", obs_shape=(3,))
    with pytest.raises(ValueError, match="torso='auto'"):
        SACActor(action_dim=1, torso="auto").init(jax.random.PRNGKey(0), obs)


def test_sac_modules_import_no_runtime():
    """The layering rule for the new package (also covered suite-wide by test_layering)."""
    pkg = Path(__file__).resolve().parents[2] / "tianji_jax" / "algos" / "sac"
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("tianji_jax.runtime") for n in names), (path.name, names)
