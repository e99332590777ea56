"""PQN math (Gallici et al. 2024): Q(lambda) returns against direct references, the TD loss and
its gradient by hand, the guarded update, epsilon schedules and epsilon-greedy, and the LayerNorm
option of the Q-network."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from tianji_jax.algos.pqn import PQNBatch, epsilon_at, epsilon_greedy, pqn_loss, pqn_update, q_lambda_returns
from tianji_jax.nets.networks import QNetwork

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------------------------------------
# Q(lambda) returns
# ------------------------------------------------------------------------------------------------
def _ref_recursion(r, nq, term, trunc, gamma, lam):
    """The recursion of the definition, one env and one step at a time."""
    T, N = r.shape
    g = np.zeros((T, N))
    for n in range(N):
        for t in reversed(range(T)):
            done = bool(term[t, n]) or bool(trunc[t, n])
            boot = nq[t, n] if (done or t == T - 1) else g[t + 1, n]
            g[t, n] = r[t, n] + gamma * (1.0 - term[t, n]) * ((1.0 - lam) * nq[t, n] + lam * boot)
    return g


def _ref_forward_view(r, nq, term, trunc, gamma, lam):
    """Forward view: ``(1 - lam) sum_n lam^(n-1) G^(n)``, the remaining weight ``lam^(m-1)`` on the
    longest n-step return ``G^(m)`` that stays inside the episode and the rollout."""
    T, N = r.shape
    out = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            e = t
            while not (term[e, i] or trunc[e, i]) and e < T - 1:
                e += 1
            m = e - t + 1

            def n_step(n):
                disc = sum(gamma ** k * r[t + k, i] for k in range(n))
                last = t + n - 1
                return disc + gamma ** n * (1.0 - term[last, i]) * nq[last, i]

            out[t, i] = sum((1 - lam) * lam ** (n - 1) * n_step(n) for n in range(1, m)) + lam ** (m - 1) * n_step(m)
    return out


def _random_rollout(seed, T=9, N=5):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, N)).astype(np.float32)
    nq = rng.normal(size=(T, N)).astype(np.float32)
    term = rng.random((T, N)) < 0.15
    trunc = rng.random((T, N)) < 0.15
    term[0, 0] = True  # termination at the first step
    trunc[-1, 1], term[-1, 1] = True, False  # truncation at the last step
    trunc[3, 2] = term[3, 2] = True  # both: termination wins
    return r, nq, term, trunc


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.65, 1.0])
def test_q_lambda_matches_the_recursion_and_the_forward_view(lam):
    r, nq, term, trunc = _random_rollout(0)
    got = np.asarray(q_lambda_returns(r, nq, term, trunc, 0.9, lam))
    assert got.dtype == np.float32 and got.shape == r.shape
    np.testing.assert_allclose(got, _ref_recursion(r, nq, term, trunc, 0.9, lam), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _ref_forward_view(r, nq, term, trunc, 0.9, lam), rtol=1e-5, atol=1e-5)
    # the special cells, by hand
    assert got[0, 0] == pytest.approx(r[0, 0])
    assert got[-1, 1] == pytest.approx(r[-1, 1] + 0.9 * nq[-1, 1])
    assert got[3, 2] == pytest.approx(r[3, 2])


def test_lambda_zero_is_the_one_step_target():
    r, nq, term, trunc = _random_rollout(1)
    got = q_lambda_returns(r, nq, term, trunc, 0.97, 0.0)
    np.testing.assert_allclose(got, r + 0.97 * (1.0 - term) * nq, rtol=1e-6, atol=1e-6)


def test_lambda_one_without_dones_is_the_discounted_sum_plus_the_last_bootstrap():
    rng = np.random.default_rng(2)
    T, N, gamma = 7, 3, 0.9
    r = rng.normal(size=(T, N)).astype(np.float32)
    nq = rng.normal(size=(T, N)).astype(np.float32)
    no = np.zeros((T, N), bool)
    got = np.asarray(q_lambda_returns(r, nq, no, no, gamma, 1.0))
    for t in range(T):
        k = T - t
        want = sum(gamma ** j * r[t + j] for j in range(k)) + gamma ** k * nq[-1]
        np.testing.assert_allclose(got[t], want, rtol=1e-5)


def test_truncation_bootstraps_and_termination_does_not():
    r = np.array([[1.0], [2.0], [5.0]], np.float32)
    nq = np.array([[10.0], [20.0], [30.0]], np.float32)
    gamma, lam = 0.5, 0.8
    flag = np.array([[False], [True], [False]])
    none = np.zeros_like(flag)
    trunc = np.asarray(q_lambda_returns(r, nq, none, flag, gamma, lam))[:, 0]
    term = np.asarray(q_lambda_returns(r, nq, flag, none, gamma, lam))[:, 0]
    assert trunc[2] == term[2] == pytest.approx(5.0 + 0.5 * 30.0)
    assert trunc[1] == pytest.approx(2.0 + 0.5 * 20.0)  # bootstraps from the true final observation
    assert term[1] == pytest.approx(2.0)  # nothing after a terminal state
    assert trunc[0] == pytest.approx(1.0 + 0.5 * (0.2 * 10.0 + 0.8 * 12.0))
    assert term[0] == pytest.approx(1.0 + 0.5 * (0.2 * 10.0 + 0.8 * 2.0))
    # the next episode (step 2) does not leak into steps 0 and 1
    r2 = r.copy()
    r2[2] = -100.0
    np.testing.assert_allclose(np.asarray(q_lambda_returns(r2, nq, none, flag, gamma, lam))[:2, 0], trunc[:2])


# ------------------------------------------------------------------------------------------------
# loss and update
# ------------------------------------------------------------------------------------------------
def _linear(params, obs):
    return obs @ params["w"]


def test_pqn_loss_value_and_gradient_by_hand():
    w = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)  # (obs 2, actions 2)
    obs = np.array([[1.0, 2.0], [0.0, -1.0], [2.0, 1.0]], np.float32)
    actions = np.array([0, 1, 1], np.int32)
    targets = np.array([1.0, -1.0, 0.0], np.float32)
    # Q(s, a): [1 + 1, -3, -4 + 3] = [2, -3, -1]; errors [1, -2, -1]
    batch = PQNBatch(obs=jnp.asarray(obs), actions=jnp.asarray(actions), targets=jnp.asarray(targets))
    (loss, metrics), grads = jax.value_and_grad(pqn_loss, has_aux=True)({"w": jnp.asarray(w)}, _linear, batch)
    assert float(loss) == pytest.approx(0.5 * (1 + 4 + 1) / 3)
    assert float(metrics["td_loss"]) == pytest.approx(1.0)
    assert float(metrics["q_mean"]) == pytest.approx((2 - 3 - 1) / 3)
    # dL/dw[:, a] = (1/B) sum_{i: a_i = a} err_i obs_i
    want = np.zeros((2, 2))
    want[:, 0] = 1.0 * obs[0] / 3
    want[:, 1] = (-2.0 * obs[1] - 1.0 * obs[2]) / 3
    np.testing.assert_allclose(grads["w"], want, rtol=1e-6)
    # targets are held fixed
    g_targets = jax.grad(lambda y: pqn_loss({"w": jnp.asarray(w)}, _linear, batch.replace(targets=y))[0])(
        jnp.asarray(targets))
    np.testing.assert_array_equal(g_targets, np.zeros(3))


def _regression_batch(n=64, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    actions = rng.integers(0, 3, n).astype(np.int32)
    true_w = rng.normal(size=(4, 3)).astype(np.float32)
    targets = (obs @ true_w)[np.arange(n), actions]
    return PQNBatch(obs=jnp.asarray(obs), actions=jnp.asarray(actions), targets=jnp.asarray(targets))


def _params():
    return {"w": jnp.zeros((4, 3), jnp.float32)}


def _update(batch, tx, epochs, minibatches, params=None, key=0):
    params = _params() if params is None else params
    fn = jax.jit(lambda k, p, s, b: pqn_update(k, p, s, b, apply_fn=_linear, tx=tx, update_epochs=epochs,
                                               num_minibatches=minibatches))
    return fn(jax.random.PRNGKey(key), params, tx.init(params), batch)


def test_pqn_update_skips_every_step_on_a_nan_target():
    batch = _regression_batch()
    batch = batch.replace(targets=batch.targets.at[5].set(jnp.nan))
    tx = optax.adam(1e-2)
    params = {"w": jnp.ones((4, 3), jnp.float32)}
    # one minibatch: every step sees the NaN
    new, opt_state, metrics = _update(batch, tx, 3, 1, params)
    np.testing.assert_array_equal(new["w"], params["w"])
    for a, b in zip(jax.tree.leaves(opt_state), jax.tree.leaves(tx.init(params))):
        np.testing.assert_array_equal(a, b)
    assert metrics["nonfinite_skips"].dtype == jnp.int32 and int(metrics["nonfinite_skips"]) == 3
    # all targets NaN, several minibatches: epochs * minibatches skips
    nan_batch = batch.replace(targets=jnp.full_like(batch.targets, jnp.nan))
    new, _, metrics = _update(nan_batch, tx, 3, 4, params)
    np.testing.assert_array_equal(new["w"], params["w"])
    assert int(metrics["nonfinite_skips"]) == 12


def test_pqn_update_lowers_the_loss_and_reports_metrics():
    batch = _regression_batch()
    tx = optax.adam(5e-2)
    before = float(pqn_loss(_params(), _linear, batch)[0])
    new, _, metrics = _update(batch, tx, 4, 4)
    after = float(pqn_loss(new, _linear, batch)[0])
    assert after < 0.5 * before
    assert set(metrics) == {"td_loss", "q_mean", "grad_norm", "nonfinite_skips"}
    assert int(metrics["nonfinite_skips"]) == 0 and float(metrics["grad_norm"]) > 0
    for k in ("td_loss", "q_mean", "grad_norm"):
        assert metrics[k].dtype == jnp.float32 and metrics[k].shape == ()


def test_pqn_update_metrics_are_the_mean_over_minibatch_steps():
    """With a zero learning rate every step sees the same params, so the mean over the equal-size
    minibatches of a permutation is the full-batch value."""
    batch = _regression_batch()
    params = {"w": jnp.asarray(np.random.default_rng(3).normal(size=(4, 3)), jnp.float32)}
    _, _, metrics = _update(batch, optax.sgd(0.0), 2, 4, params)
    loss, want = pqn_loss(params, _linear, batch)
    np.testing.assert_allclose(metrics["td_loss"], want["td_loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["q_mean"], want["q_mean"], rtol=1e-5, atol=1e-6)


def test_pqn_update_data_parallel_matches_one_learner_and_skips_together():
    """Two replicas under shard_map, each with half the batch: with one minibatch per epoch the
    averaged gradient is the full-batch one, and a NaN on one shard skips the step on both."""
    devices = jax.devices()[:2]
    assert len(devices) == 2
    mesh = Mesh(np.array(devices), ("data",))
    tx = optax.sgd(0.1)
    batch = _regression_batch()
    params = _params()

    def per_replica(key, p, s, b):
        new, s, m = pqn_update(key, p, s, b, apply_fn=_linear, tx=tx, update_epochs=2, num_minibatches=1,
                               axis_name="data")
        return jax.tree.map(lambda x: x[None], new), m

    learn = jax.jit(jax.shard_map(per_replica, mesh=mesh, in_specs=(P(), P(), P(), P("data")),
                                  out_specs=(P("data"), P()), check_vma=False))
    replicas, metrics = learn(jax.random.PRNGKey(0), params, tx.init(params), batch)
    w = np.asarray(replicas["w"])
    np.testing.assert_array_equal(w[0], w[1])
    single, _, single_metrics = _update(batch, tx, 2, 1)
    np.testing.assert_allclose(w[0], single["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["td_loss"], single_metrics["td_loss"], rtol=1e-5)
    # a NaN only in the second shard's half
    nan_batch = batch.replace(targets=batch.targets.at[-1].set(jnp.nan))
    replicas, metrics = learn(jax.random.PRNGKey(0), params, tx.init(params), nan_batch)
    np.testing.assert_array_equal(np.asarray(replicas["w"]), np.zeros((2, 4, 3)))
    assert int(metrics["nonfinite_skips"]) == 2


# ------------------------------------------------------------------------------------------------
# exploration
# ------------------------------------------------------------------------------------------------
def test_epsilon_at_endpoints_midpoint_and_traced():
    assert float(epsilon_at(0, 1.0, 0.05, 1000)) == pytest.approx(1.0)
    assert float(epsilon_at(500, 1.0, 0.05, 1000)) == pytest.approx(0.525)
    assert float(epsilon_at(1000, 1.0, 0.05, 1000)) == pytest.approx(0.05)
    assert float(epsilon_at(10 ** 9, 1.0, 0.05, 1000)) == pytest.approx(0.05)
    assert float(epsilon_at(7, 1.0, 0.05, 0)) == pytest.approx(0.05)
    traced = jax.jit(lambda s: epsilon_at(s, 0.5, 0.1, 400))(jnp.int32(100))
    assert traced.dtype == jnp.float32 and float(traced) == pytest.approx(0.4)
    steps = jnp.array([0, 200, 400, 800], jnp.int32)
    np.testing.assert_allclose(epsilon_at(steps, 0.5, 0.1, 400), [0.5, 0.3, 0.1, 0.1], rtol=1e-6)


def test_epsilon_greedy_zero_is_argmax():
    q = jax.random.normal(jax.random.PRNGKey(0), (64, 5))
    actions, log_prob = epsilon_greedy(jax.random.PRNGKey(1), q, 0.0)
    assert actions.dtype == jnp.int32 and log_prob.dtype == jnp.float32
    np.testing.assert_array_equal(actions, np.argmax(np.asarray(q), axis=-1))
    np.testing.assert_array_equal(log_prob, np.zeros(64))


def test_epsilon_greedy_one_is_uniform():
    q = jnp.array([[0.0, 3.0, 1.0, -1.0]])
    keys = jax.random.split(jax.random.PRNGKey(2), 8000)
    actions, log_prob = jax.vmap(lambda k: epsilon_greedy(k, q, 1.0))(keys)
    counts = np.bincount(np.asarray(actions).ravel(), minlength=4)
    assert np.all(np.abs(counts - 2000) < 200), counts  # std ~ 39 per count
    np.testing.assert_allclose(log_prob, np.log(0.25), rtol=1e-6)


def test_epsilon_greedy_log_prob_is_the_behaviour_probability():
    q = jnp.tile(jnp.array([[0.0, 3.0, 1.0, -1.0]]), (20000, 1))
    eps = jnp.full((20000,), 0.3)
    actions, log_prob = epsilon_greedy(jax.random.PRNGKey(3), q, eps)
    a, lp = np.asarray(actions), np.asarray(log_prob)
    np.testing.assert_allclose(lp[a == 1], np.log(0.3 / 4 + 0.7), rtol=1e-6)
    np.testing.assert_allclose(lp[a != 1], np.log(0.3 / 4), rtol=1e-6)
    assert abs(np.mean(a == 1) - (0.3 / 4 + 0.7)) < 0.02


# ------------------------------------------------------------------------------------------------
# the network's LayerNorm option
# ------------------------------------------------------------------------------------------------
_CASES = [(dict(), (4,)), (dict(dueling=True), (4,)), (dict(torso="nature_cnn"), (4, 84, 84)),
          (dict(torso="small_cnn", obs_shape=(10, 10, 4)), (10, 10, 4))]

# the parameter paths of QNetwork(action_dim=3, **kwargs) before the layer_norm field existed
_BEFORE = [
    ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel", "Dense_2/bias", "Dense_2/kernel"],
    ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel", "Dense_2/bias", "Dense_2/kernel",
     "Dense_3/bias", "Dense_3/kernel"],
    ["Dense_0/bias", "Dense_0/kernel", "NatureCNN_0/Conv_0/bias", "NatureCNN_0/Conv_0/kernel",
     "NatureCNN_0/Conv_1/bias", "NatureCNN_0/Conv_1/kernel", "NatureCNN_0/Conv_2/bias",
     "NatureCNN_0/Conv_2/kernel", "NatureCNN_0/Dense_0/bias", "NatureCNN_0/Dense_0/kernel"],
    ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel", "Dense_2/bias", "Dense_2/kernel",
     "SmallCNN_0/bias", "SmallCNN_0/kernel"],
]


def _paths(net, obs_shape):
    shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1, *obs_shape), np.float32))
    return {"/".join(k.key for k in path[1:]): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_layer_norm_off_keeps_the_parameter_tree(case):
    kwargs, obs_shape = _CASES[case]
    default = _paths(QNetwork(action_dim=3, **kwargs), obs_shape)
    off = _paths(QNetwork(action_dim=3, layer_norm=False, **kwargs), obs_shape)
    assert off == default
    assert sorted(off) == _BEFORE[case]


def test_layer_norm_on_adds_layer_norms():
    mlp = _paths(QNetwork(action_dim=3, layer_norm=True), (4,))
    assert mlp["LayerNorm_0/scale"] == (120,) and mlp["LayerNorm_1/bias"] == (84,)
    assert not any(k.startswith("LayerNorm_2") for k in mlp)  # none on the head
    nature = _paths(QNetwork(action_dim=3, torso="nature_cnn", layer_norm=True), (4, 84, 84))
    assert [nature[f"NatureCNN_0/LayerNorm_{i}/scale"] for i in range(4)] == [(32,), (64,), (64,), (512,)]
    small = _paths(QNetwork(action_dim=3, torso="small_cnn", obs_shape=(10, 10, 4), layer_norm=True), (10, 10, 4))
    assert small["SmallCNN_0/LayerNorm_0/scale"] == (16,)
    assert small["LayerNorm_0/scale"] == (120,) and small["LayerNorm_1/scale"] == (84,)


def test_layer_norm_comes_before_the_activation():
    net = QNetwork(action_dim=2, hidden_sizes=(8,), activation="relu", layer_norm=True)
    obs = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    params = net.init(jax.random.PRNGKey(1), obs)["params"]
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(2), x.shape), params)
    pre = np.asarray(obs) @ np.asarray(params["Dense_0"]["kernel"]) + np.asarray(params["Dense_0"]["bias"])
    normed = (pre - pre.mean(-1, keepdims=True)) / np.sqrt(pre.var(-1, keepdims=True) + 1e-6)
    h = np.maximum(normed * np.asarray(params["LayerNorm_0"]["scale"]) + np.asarray(params["LayerNorm_0"]["bias"]), 0)
    want = h @ np.asarray(params["Dense_1"]["kernel"]) + np.asarray(params["Dense_1"]["bias"])
    np.testing.assert_allclose(net.apply({"params": params}, obs), want, rtol=1e-4, atol=1e-5)
