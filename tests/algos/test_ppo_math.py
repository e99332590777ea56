"""PPO loss, distributions and running statistics as pure functions."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from tianji_jax.algos import distributions
from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.algos.ppo import PPOBatch, make_optimizer, ppo_loss, ppo_update
from tianji_jax.nets.networks import ActorCritic

pytestmark = pytest.mark.timeout(180)


def test_categorical_log_prob_and_entropy():
    logits = jnp.array([[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]])
    p = np.exp(np.asarray(logits)) / np.exp(np.asarray(logits)).sum(-1, keepdims=True)
    a = jnp.array([2, 1])
    np.testing.assert_allclose(distributions.log_prob(logits, a, False), np.log(p[[0, 1], [2, 1]]), rtol=1e-5)
    np.testing.assert_allclose(distributions.entropy(logits, False), -(p * np.log(p)).sum(-1), rtol=1e-5)
    np.testing.assert_array_equal(distributions.mode(logits, False), [2, 0])


def test_gaussian_log_prob_and_entropy_match_scipy():
    mean = jnp.array([[0.5, -1.0], [2.0, 0.0]])
    log_std = jnp.array([0.3, -0.7])
    a = jnp.array([[0.0, 0.0], [1.0, 1.0]])
    std = np.exp(np.asarray(log_std))
    want = stats.norm.logpdf(np.asarray(a), np.asarray(mean), std).sum(-1)
    np.testing.assert_allclose(distributions.log_prob((mean, log_std), a, True), want, rtol=1e-5)
    np.testing.assert_allclose(distributions.entropy((mean, log_std), True), [stats.norm.entropy(0, std).sum()] * 2,
                               rtol=1e-5)
    np.testing.assert_array_equal(distributions.mode((mean, log_std), True), mean)


def test_gaussian_samples_have_the_right_moments():
    mean, log_std = jnp.zeros((20000, 1)) + 1.5, jnp.array([np.log(0.5)])
    x = np.asarray(distributions.sample(jax.random.PRNGKey(0), (mean, log_std), True))
    assert abs(x.mean() - 1.5) < 0.02 and abs(x.std() - 0.5) < 0.02


def _batch(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return PPOBatch(obs=jnp.asarray(rng.normal(size=(n, 4)), jnp.float32),
                    actions=jnp.asarray(rng.integers(0, 2, n), jnp.int32),
                    log_probs=jnp.full((n,), np.log(0.5), jnp.float32),
                    values=jnp.zeros((n,), jnp.float32),
                    advantages=jnp.asarray(rng.normal(size=n), jnp.float32),
                    returns=jnp.asarray(rng.normal(size=n), jnp.float32))


def _const_policy(logits_value=0.0, value=0.0):
    def apply(params, obs):
        n = obs.shape[0]
        return jnp.full((n, 2), logits_value) + params["w"] * 0, jnp.full((n,), value) + params["w"] * 0
    return apply, {"w": jnp.zeros(())}


KW = dict(continuous=False, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01, clip_value_loss=False, normalize_advantages=True)


def test_loss_at_behaviour_policy():
    apply, params = _const_policy()
    batch = _batch()
    loss, m = ppo_loss(params, apply, batch, **KW)
    # ratio == 1 everywhere: normalised advantages have mean 0, so the surrogate is 0
    assert abs(float(m["policy_loss"])) < 1e-6
    assert float(m["clip_fraction"]) == 0.0 and abs(float(m["approx_kl"])) < 1e-7
    np.testing.assert_allclose(m["value_loss"], 0.5 * np.mean(np.asarray(batch.returns) ** 2), rtol=1e-5)
    np.testing.assert_allclose(m["entropy"], np.log(2), rtol=1e-5)
    np.testing.assert_allclose(loss, 0.5 * m["value_loss"] - 0.01 * m["entropy"], rtol=1e-5)


def test_surrogate_is_clipped():
    # behaviour prob 0.5, current prob of action 1 = sigmoid(4) ~ 0.98 -> ratio ~1.96 > 1.2
    def apply(params, obs):
        return jnp.tile(jnp.array([0.0, 4.0]), (obs.shape[0], 1)), jnp.zeros(obs.shape[0])
    batch = _batch().replace(actions=jnp.ones((64,), jnp.int32), advantages=jnp.ones((64,)) * 2.0)
    _, m = ppo_loss({}, apply, batch, **{**KW, "normalize_advantages": False})
    np.testing.assert_allclose(m["policy_loss"], -1.2 * 2.0, rtol=1e-5)  # min(r A, 1.2 A) = 1.2 A
    assert float(m["clip_fraction"]) == 1.0


def test_value_clipping_takes_the_pessimistic_error():
    apply, params = _const_policy(value=1.0)
    batch = _batch().replace(values=jnp.zeros((64,)), returns=jnp.ones((64,)) * 1.0)
    _, unclipped = ppo_loss(params, apply, batch, **KW)
    _, clipped = ppo_loss(params, apply, batch, **{**KW, "clip_value_loss": True})
    assert float(unclipped["value_loss"]) == pytest.approx(0.0, abs=1e-7)
    # clipped prediction is 0.2 -> error 0.8^2, max(0, 0.64) -> 0.5 * 0.64
    assert float(clipped["value_loss"]) == pytest.approx(0.32, rel=1e-5)


def test_update_improves_loss_and_is_pure_under_jit_and_vmap():
    net = ActorCritic(action_dim=2)
    batch = _batch(128)
    params = net.init(jax.random.PRNGKey(0), batch.obs)
    tx = make_optimizer(1e-2, 0.5, None, 1)
    opt_state = tx.init(params)

    @jax.jit
    def upd(key, params, opt_state):
        return ppo_update(key, params, opt_state, batch, apply_fn=net.apply, tx=tx, update_epochs=4,
                          num_minibatches=4, loss_kwargs={**KW, "normalize_advantages": False})

    l0, _ = ppo_loss(params, net.apply, batch, **{**KW, "normalize_advantages": False})
    p1, o1, m = upd(jax.random.PRNGKey(1), params, opt_state)
    l1, _ = ppo_loss(p1, net.apply, batch, **{**KW, "normalize_advantages": False})
    assert float(l1) < float(l0)
    assert int(o1[1][0].count) == 16  # adam count: 4 epochs x 4 minibatches
    p1b, _, _ = upd(jax.random.PRNGKey(1), params, opt_state)
    jax.tree.map(np.testing.assert_array_equal, p1, p1b)
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    pv, _, _ = jax.vmap(upd, in_axes=(0, None, None))(keys, params, opt_state)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[0], b, atol=1e-6),
                 pv, upd(keys[0], params, opt_state)[0])


def test_annealed_learning_rate_is_constant_within_an_update_and_reaches_zero():
    tx = make_optimizer(1.0, 1e9, anneal_steps=4, gradient_steps_per_update=3)
    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    lrs = []
    for _ in range(12):
        # Adam with a constant gradient: bias-corrected m / sqrt(v) == 1, so each step moves by -lr
        updates, state = tx.update({"w": jnp.ones(())}, state, params)
        lrs.append(-float(updates["w"]))
    np.testing.assert_allclose(lrs, [1.0] * 3 + [0.75] * 3 + [0.5] * 3 + [0.25] * 3, rtol=1e-4)


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd.create((3,))
    chunks = [rng.normal(loc=5, scale=2, size=(n, 3)) for n in (10, 1, 37, 100)]
    for c in chunks:
        rms = rms.update(jnp.asarray(c, jnp.float32))
    allx = np.concatenate(chunks)
    np.testing.assert_allclose(rms.mean, allx.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, allx.var(0), rtol=1e-3)
    z = np.asarray(rms.normalize(jnp.asarray(allx, jnp.float32)))
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-3)
    np.testing.assert_allclose(z.std(0), 1, atol=1e-3)


def test_reward_scaler_divides_by_return_std_and_resets_on_done():
    scaler = RewardScaler.create(2)
    scaler, r1 = scaler.scale(jnp.array([1.0, 2.0]), jnp.array([False, True]), 0.9)
    np.testing.assert_allclose(scaler.returns, [1.0, 0.0])  # env 1 finished: its discounted sum restarts
    want = np.array([1.0, 2.0]) / np.sqrt(np.asarray(scaler.rms.var) + 1e-8)
    np.testing.assert_allclose(r1, want, rtol=1e-5)
    scaler, _ = scaler.scale(jnp.array([1.0, 1.0]), jnp.array([False, False]), 0.9)
    np.testing.assert_allclose(scaler.returns, [1.9, 1.0], rtol=1e-6)
