"""DQN math (tianji_jax.algos.dqn) against hand-computed values and a plain-Python reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianji_jax.algos import dqn

pytestmark = pytest.mark.timeout(120)

# One env, 5 steps: terminated at step 1, truncated (time limit) at step 3.
R = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)[:, None]
TERM = np.array([0, 1, 0, 0, 0], bool)[:, None]
TRUNC = np.array([0, 0, 0, 1, 0], bool)[:, None]
# value of the true successor of each step; at step 3 that is the true final obs (40), not a reset obs
V = np.array([10.0, 20.0, 30.0, 40.0, 50.0], np.float32)[:, None]
GAMMA = 0.5


def reference_n_step(rewards, terminated, truncated, values, gamma, n):
    """Plain loops over (t, env): the definition, with no vectorisation tricks."""
    T, N = rewards.shape
    targets = np.zeros((T, N))
    discounts = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            ret, k = 0.0, 0
            for j in range(n):
                if t + j >= T:
                    break
                ret += gamma ** j * rewards[t + j, i]
                k += 1
                if terminated[t + j, i] or truncated[t + j, i]:
                    break
            last = t + k - 1
            disc = 0.0 if terminated[last, i] else gamma ** k
            targets[t, i] = ret + disc * values[last, i]
            discounts[t, i] = disc
    return targets, discounts


def test_n_step_one_step_by_hand():
    targets, discounts = dqn.n_step_targets(R, TERM, TRUNC, V, GAMMA, n=1)
    # r + 0.5 * (1 - term) * V(successor); the truncated step 3 bootstraps from V(final obs) = 40
    np.testing.assert_allclose(targets[:, 0], [1 + 5, 2, 3 + 15, 4 + 20, 5 + 25])
    np.testing.assert_allclose(discounts[:, 0], [0.5, 0.0, 0.5, 0.5, 0.5])


def test_n_step_three_steps_by_hand_across_termination_and_truncation():
    ns = dqn.n_step_returns(R, TERM, TRUNC, GAMMA, n=3)
    # start 0: 1 + .5*2, cut by the termination at 1 -> no bootstrap
    # start 2: 3 + .5*4, cut by the truncation at 3 -> bootstrap .25 * V(final obs of step 3)
    # start 4: end of the rollout -> a 1-step target
    np.testing.assert_allclose(ns.returns[:, 0], [2.0, 2.0, 5.0, 4.0, 5.0])
    np.testing.assert_allclose(ns.discounts[:, 0], [0.0, 0.0, 0.25, 0.5, 0.5])
    np.testing.assert_array_equal(ns.bootstrap_index[:, 0], [1, 1, 3, 3, 4])
    np.testing.assert_array_equal(ns.num_steps[:, 0], [2, 1, 2, 1, 1])
    targets, _ = dqn.n_step_targets(R, TERM, TRUNC, V, GAMMA, n=3)
    np.testing.assert_allclose(targets[:, 0], [2.0, 2.0, 5.0 + 0.25 * 40, 4.0 + 0.5 * 40, 5.0 + 0.5 * 50])


def test_n_step_without_boundaries_and_rollout_end():
    no = np.zeros_like(TERM)
    ns = dqn.n_step_returns(R, no, no, GAMMA, n=3)
    np.testing.assert_allclose(ns.returns[:, 0], [1 + 1 + 0.75, 2 + 1.5 + 1, 3 + 2 + 1.25, 4 + 2.5, 5])
    np.testing.assert_allclose(ns.discounts[:, 0], [0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_array_equal(ns.bootstrap_index[:, 0], [2, 3, 4, 4, 4])
    # n longer than the rollout: every start runs to the end
    ns = dqn.n_step_returns(R, no, no, GAMMA, n=8)
    np.testing.assert_array_equal(ns.num_steps[:, 0], [5, 4, 3, 2, 1])


def test_termination_wins_over_truncation_on_the_same_step():
    term = np.array([[0], [1]], bool)
    trunc = np.array([[0], [1]], bool)
    targets, disc = dqn.n_step_targets(np.ones((2, 1)), term, trunc, np.full((2, 1), 100.0), 0.9, n=2)
    np.testing.assert_allclose(targets[:, 0], [1.9, 1.0])
    np.testing.assert_allclose(disc[:, 0], [0.0, 0.0])


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_n_step_matches_reference_on_random_rollouts(n):
    rng = np.random.default_rng(n)
    T, N = 12, 4
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    term = rng.random((T, N)) < 0.15
    trunc = rng.random((T, N)) < 0.15
    values = rng.normal(size=(T, N)).astype(np.float32)
    want_t, want_d = reference_n_step(rewards, term, trunc, values, 0.9, n)
    fn = jax.jit(dqn.n_step_targets, static_argnames="n")
    got_t, got_d = fn(rewards, term, trunc, values, 0.9, n=n)
    np.testing.assert_allclose(got_t, want_t, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_d, want_d, rtol=1e-6)


def test_n_step_transitions_bootstrap_from_the_true_final_observation():
    T, N = 5, 2
    obs = jnp.arange(T * N, dtype=jnp.float32).reshape(T, N)[..., None]  # (T, N, 1)
    # final_obs differs from the next obs where an episode ended (auto-reset): marked 1001, 1003, 2002
    final_obs = jnp.concatenate([obs[1:], obs[-1:] + 100.0], axis=0)
    done = np.zeros((T, N), bool)
    term = done.copy()
    trunc = done.copy()
    term[1, 0] = True
    trunc[3, 0] = True
    trunc[2, 1] = True
    final_obs = final_obs.at[1, 0].set(1001.0).at[3, 0].set(1003.0).at[2, 1].set(2002.0)
    actions = jnp.arange(T * N).reshape(T, N)
    tr = dqn.n_step_transitions(obs, actions, np.ones((T, N)), term, trunc, final_obs, GAMMA, n=3)
    np.testing.assert_array_equal(tr.obs, obs)
    np.testing.assert_array_equal(tr.action, actions)
    # env 0: starts 2 and 3 are cut by the truncation at 3 and must see the true final obs 1003
    np.testing.assert_array_equal(tr.next_obs[:, 0, 0], [1001.0, 1001.0, 1003.0, 1003.0, final_obs[4, 0, 0]])
    np.testing.assert_allclose(tr.discount[:, 0], [0.0, 0.0, 0.25, 0.5, 0.5])
    # env 1: truncation at 2; starts 3 and 4 run to the rollout end
    np.testing.assert_array_equal(tr.next_obs[:, 1, 0],
                                  [2002.0, 2002.0, 2002.0, final_obs[4, 1, 0], final_obs[4, 1, 0]])
    np.testing.assert_allclose(tr.reward[:, 1], [1.75, 1.5, 1.0, 1.5, 1.0])
    np.testing.assert_allclose(tr.discount[:, 1], [0.125, 0.25, 0.5, 0.25, 0.5])


def test_n_step_validation():
    with pytest.raises(ValueError, match="n must be"):
        dqn.n_step_returns(R, TERM, TRUNC, GAMMA, n=0)
    with pytest.raises(ValueError, match="gamma"):
        dqn.n_step_returns(R, TERM, TRUNC, 1.5, n=1)
    with pytest.raises(ValueError, match="terminated"):
        dqn.n_step_returns(R, TERM[:4], TRUNC, GAMMA, n=1)


def test_double_q_vs_max():
    q_online = jnp.array([[1.0, 5.0, 2.0], [0.0, 0.0, 3.0]])
    q_target = jnp.array([[4.0, 1.0, 9.0], [7.0, 2.0, -1.0]])
    np.testing.assert_allclose(dqn.max_q_target(q_target), [9.0, 7.0])
    # online argmax = [1, 2] -> target values [1, -1]
    np.testing.assert_allclose(dqn.double_q_target(q_online, q_target), [1.0, -1.0])
    # ties: lowest index
    np.testing.assert_allclose(dqn.double_q_target(jnp.zeros((1, 3)), q_target[:1]), [4.0])
    g = jax.grad(lambda qt: dqn.double_q_target(q_online, qt).sum())(q_target)
    np.testing.assert_array_equal(g, 0.0)  # targets carry no gradient
    with pytest.raises(ValueError, match="same shape"):
        dqn.double_q_target(q_online, q_target[:, :2])


def test_huber_td_loss_values_and_gradient():
    q = jnp.array([[0.0, 1.0], [2.0, 0.0], [0.0, -1.0]])
    actions = jnp.array([1, 0, 1], jnp.int32)
    targets = jnp.array([1.5, 0.0, 2.0])  # td = [0.5, -2, 3]
    loss, td = dqn.td_loss(q, actions, targets)
    np.testing.assert_allclose(td, [0.5, -2.0, 3.0])
    # huber: 0.5*0.25, 1*(2-0.5), 1*(3-0.5)
    np.testing.assert_allclose(loss, (0.125 + 1.5 + 2.5) / 3, rtol=1e-6)
    grad = jax.grad(lambda q: dqn.td_loss(q, actions, targets)[0])(q)
    want = np.zeros((3, 2))
    want[0, 1], want[1, 0], want[2, 1] = -0.5 / 3, 1.0 / 3, -1.0 / 3  # -clip(td, -1, 1) / B
    np.testing.assert_allclose(grad, want, rtol=1e-6)
    # importance weights scale each item's term; the mean still divides by B
    w = jnp.array([1.0, 0.5, 0.0])
    loss_w, _ = dqn.td_loss(q, actions, targets, w)
    np.testing.assert_allclose(loss_w, (0.125 + 0.75) / 3, rtol=1e-6)
    # a different delta and the squared loss
    loss_d, _ = dqn.td_loss(q, actions, targets, huber_delta=2.0)
    np.testing.assert_allclose(loss_d, (0.125 + 2.0 + 2.0 * (3 - 1)) / 3, rtol=1e-6)
    loss_sq, _ = dqn.td_loss(q, actions, targets, huber_delta=None)
    np.testing.assert_allclose(loss_sq, (0.125 + 2.0 + 4.5) / 3, rtol=1e-6)
    # the target gets no gradient
    g_t = jax.grad(lambda t: dqn.td_loss(q, actions, t)[0])(targets)
    np.testing.assert_array_equal(g_t, 0.0)


def test_td_loss_validation():
    q = jnp.zeros((3, 2))
    with pytest.raises(ValueError, match="actions"):
        dqn.td_loss(q, jnp.zeros((4,), jnp.int32), jnp.zeros(3))
    with pytest.raises(ValueError, match="weights"):
        dqn.td_loss(q, jnp.zeros((3,), jnp.int32), jnp.zeros(3), jnp.ones(2))
    with pytest.raises(ValueError, match="huber_delta"):
        dqn.td_loss(q, jnp.zeros((3,), jnp.int32), jnp.zeros(3), huber_delta=0.0)


def test_polyak_and_hard_updates():
    target = {"w": jnp.array([0.0, 10.0]), "b": jnp.array(4.0)}
    online = {"w": jnp.array([1.0, 0.0]), "b": jnp.array(0.0)}
    out = dqn.polyak_update(target, online, 0.25)
    np.testing.assert_allclose(out["w"], [0.25, 7.5])
    np.testing.assert_allclose(out["b"], 3.0)
    np.testing.assert_allclose(dqn.polyak_update(target, online, 1.0)["w"], online["w"])
    with pytest.raises(ValueError, match="tau"):
        dqn.polyak_update(target, online, 1.5)

    hard = jax.jit(dqn.periodic_hard_update, static_argnames="period")
    for step, copied in [(0, True), (1, False), (2, False), (3, True), (6, True), (7, False)]:
        res = hard(target, online, jnp.int32(step), period=3)
        want = online if copied else target
        np.testing.assert_array_equal(res["w"], want["w"])
        np.testing.assert_array_equal(res["b"], want["b"])
    with pytest.raises(ValueError, match="period"):
        dqn.periodic_hard_update(target, online, 1, 0)


def test_epsilon_schedules():
    eps = dqn.linear_epsilon(jnp.array([0, 250, 500, 1000, 5000]), 1.0, 0.1, 1000)
    np.testing.assert_allclose(eps, [1.0, 0.775, 0.55, 0.1, 0.1], rtol=1e-6)
    assert eps.dtype == jnp.float32
    np.testing.assert_allclose(jax.jit(dqn.linear_epsilon, static_argnums=(1, 2, 3))(100, 1.0, 0.0, 400), 0.75)
    with pytest.raises(ValueError, match="decay_steps"):
        dqn.linear_epsilon(0, 1.0, 0.1, 0)
    with pytest.raises(ValueError, match="end"):
        dqn.linear_epsilon(0, 1.0, -0.1, 10)

    # N = 8, alpha = 7: i / (N - 1) * alpha = i, so eps_i = 0.4^(1 + i)
    np.testing.assert_allclose(dqn.apex_epsilons(8), 0.4 ** (1.0 + np.arange(8)), rtol=1e-5)
    np.testing.assert_allclose(dqn.apex_epsilons(3, base=0.5, alpha=2.0), [0.5, 0.25, 0.125], rtol=1e-6)
    np.testing.assert_allclose(dqn.apex_epsilons(1), [0.4])
    with pytest.raises(ValueError, match="num_actors"):
        dqn.apex_epsilons(0)
    with pytest.raises(ValueError, match="alpha"):
        dqn.apex_epsilons(4, alpha=-1.0)


def test_vmap_over_seeds_matches_unbatched():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 6, 2)).astype(np.float32)  # (seeds, T, N)
    term = rng.random((3, 6, 2)) < 0.2
    trunc = rng.random((3, 6, 2)) < 0.2
    values = rng.normal(size=(3, 6, 2)).astype(np.float32)
    batched = jax.vmap(lambda r, a, b, v: dqn.n_step_targets(r, a, b, v, 0.99, 3)[0])(rewards, term, trunc, values)
    for s in range(3):
        np.testing.assert_allclose(batched[s], dqn.n_step_targets(rewards[s], term[s], trunc[s], values[s], 0.99, 3)[0],
                                   rtol=1e-6)
