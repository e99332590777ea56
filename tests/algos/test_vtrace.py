"""V-trace (Espeholt et al. 2018): on-policy equals GAE, a plain-loop reference, truncation levels."""

import jax.numpy as jnp
import numpy as np
import pytest

from tianji_jax.algos.ppo import gae, vtrace


def reference(r, v, last_v, final_v, term, trunc, log_rhos, gamma, lam, rho_bar, c_bar):
    """Literal eq. 1 of the paper, one env column at a time, episodes cut at terminated|truncated."""
    t_len = len(r)
    ratio = np.exp(log_rhos)
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    vs = np.zeros(t_len)
    adv = np.zeros(t_len)
    for s in range(t_len - 1, -1, -1):
        done = term[s] or trunc[s]
        if done:
            nv = 0.0 if term[s] else final_v[s]
            vs[s] = v[s] + rho[s] * (r[s] + gamma * nv - v[s])
            adv[s] = rho[s] * (r[s] + gamma * nv - v[s])
        else:
            nv = v[s + 1] if s + 1 < t_len else last_v
            nvs = vs[s + 1] if s + 1 < t_len else last_v
            vs[s] = v[s] + rho[s] * (r[s] + gamma * nv - v[s]) + gamma * c[s] * (nvs - nv)
            adv[s] = rho[s] * (r[s] + gamma * nvs - v[s])
    return adv, vs


def _case(seed, t=12, n=3):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(t, n)).astype(np.float32)
    v = rng.normal(size=(t, n)).astype(np.float32)
    last_v = rng.normal(size=(n,)).astype(np.float32)
    final_v = rng.normal(size=(t, n)).astype(np.float32)
    term = rng.random((t, n)) < 0.1
    trunc = rng.random((t, n)) < 0.1
    log_rhos = rng.normal(scale=0.5, size=(t, n)).astype(np.float32)
    return r, v, last_v, final_v, term, trunc, log_rhos


@pytest.mark.parametrize("seed", range(4))
def test_on_policy_vtrace_targets_equal_gae_returns(seed):
    r, v, last_v, final_v, term, trunc, _ = _case(seed)
    _, returns = gae(r, v, last_v, final_v, term, trunc, 0.99, 0.95)
    _, vs = vtrace(r, v, last_v, final_v, term, trunc, jnp.zeros_like(r), 0.99, 0.95)
    np.testing.assert_allclose(vs, returns, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed, rho_bar, c_bar", [(0, 1.0, 1.0), (1, 1.0, 1.0), (2, 2.0, 0.5), (3, 0.5, 1.0)])
def test_vtrace_matches_the_paper_equation_column_by_column(seed, rho_bar, c_bar):
    r, v, last_v, final_v, term, trunc, log_rhos = _case(seed)
    adv, vs = vtrace(r, v, last_v, final_v, term, trunc, log_rhos, 0.97, 0.9, rho_bar, c_bar)
    for j in range(r.shape[1]):
        ra, rv = reference(r[:, j], v[:, j], last_v[j], final_v[:, j], term[:, j], trunc[:, j], log_rhos[:, j],
                           0.97, 0.9, rho_bar, c_bar)
        np.testing.assert_allclose(np.asarray(vs)[:, j], rv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(adv)[:, j], ra, rtol=1e-5, atol=1e-5)


def test_hand_computed_two_steps_with_clipped_ratio():
    # step 0: ratio e^1 clipped to rho=c=1; step 1: ratio 0.5; gamma 0.5, lambda 1, no episode end
    r = jnp.array([[1.0], [2.0]])
    v = jnp.array([[0.5], [1.0]])
    log_rhos = jnp.log(jnp.array([[np.e], [0.5]]))
    adv, vs = vtrace(r, v, jnp.array([4.0]), jnp.zeros((2, 1)), jnp.zeros((2, 1), bool), jnp.zeros((2, 1), bool),
                     log_rhos, 0.5, 1.0)
    vs1 = 1.0 + 0.5 * (2.0 + 0.5 * 4.0 - 1.0)  # 2.5
    vs0 = 0.5 + 1.0 * (1.0 + 0.5 * 1.0 - 0.5) + 0.5 * 1.0 * (vs1 - 1.0)  # 2.25
    np.testing.assert_allclose(np.asarray(vs)[:, 0], [vs0, vs1], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [1.0 + 0.5 * vs1 - 0.5, 0.5 * (2.0 + 0.5 * 4.0 - 1.0)],
                               rtol=1e-6)
