"""GAE on hand-made trajectories (values checked to 1e-6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianji_jax.algos.ppo import gae

pytestmark = pytest.mark.timeout(120)

G, L = 0.9, 0.8


def reference(rewards, values, last_value, final_values, terminated, truncated, gamma, lam):
    """Loop-by-loop textbook GAE in float64 (Schulman et al. 2016, eq. 16)."""
    T = len(rewards)
    adv = np.zeros(T)
    nxt = 0.0
    for t in reversed(range(T)):
        if terminated[t]:
            boot = 0.0
        elif truncated[t]:
            boot = final_values[t]
        else:
            boot = values[t + 1] if t + 1 < T else last_value
        delta = rewards[t] + gamma * boot - values[t]
        carry = 0.0 if (terminated[t] or truncated[t]) else nxt
        adv[t] = delta + gamma * lam * carry
        nxt = adv[t]
    return adv


def run(r, v, last, fv, term, trunc):
    a, ret = gae(jnp.array(r), jnp.array(v), jnp.array(last), jnp.array(fv), jnp.array(term), jnp.array(trunc), G, L)
    return np.asarray(a, np.float64), np.asarray(ret, np.float64)


def test_no_boundary_matches_closed_form():
    r, v, last = [1.0, 2.0, 3.0], [0.5, 0.25, 1.0], 2.0
    a, ret = run(r, v, last, [0, 0, 0], [False] * 3, [False] * 3)
    d2 = 3.0 + G * 2.0 - 1.0
    d1 = 2.0 + G * 1.0 - 0.25
    d0 = 1.0 + G * 0.25 - 0.5
    want = [d0 + G * L * (d1 + G * L * d2), d1 + G * L * d2, d2]
    np.testing.assert_allclose(a, want, atol=1e-6)
    np.testing.assert_allclose(ret, np.array(want) + v, atol=1e-6)


def test_termination_does_not_bootstrap():
    # step 1 terminates: its target is r only; step 0 does not see past it either.
    r, v, last, fv = [1.0, 2.0, 3.0], [0.5, 0.25, 1.0], 2.0, [0.0, 100.0, 0.0]
    a, _ = run(r, v, last, fv, [False, True, False], [False] * 3)
    d1 = 2.0 - 0.25
    d0 = 1.0 + G * 0.25 - 0.5
    d2 = 3.0 + G * 2.0 - 1.0
    np.testing.assert_allclose(a, [d0 + G * L * d1, d1, d2], atol=1e-6)


def test_truncation_bootstraps_from_final_observation_value():
    r, v, last, fv = [1.0, 2.0, 3.0], [0.5, 0.25, 1.0], 2.0, [0.0, 7.0, 0.0]
    a, _ = run(r, v, last, fv, [False] * 3, [False, True, False])
    d1 = 2.0 + G * 7.0 - 0.25  # V(final obs) = 7, not V(reset obs) = 1.0
    d0 = 1.0 + G * 0.25 - 0.5
    d2 = 3.0 + G * 2.0 - 1.0
    np.testing.assert_allclose(a, [d0 + G * L * d1, d1, d2], atol=1e-6)


def test_termination_and_time_limit_on_same_step_does_not_bootstrap():
    r, v, last, fv = [1.0, 2.0, 3.0], [0.5, 0.25, 1.0], 2.0, [0.0, 7.0, 0.0]
    a, _ = run(r, v, last, fv, [False, True, False], [False, True, False])
    d1 = 2.0 - 0.25
    np.testing.assert_allclose(a[1], d1, atol=1e-6)


def test_random_rollouts_match_reference_loop():
    rng = np.random.default_rng(0)
    for _ in range(5):
        T = 17
        r, v, fv = rng.normal(size=T), rng.normal(size=T), rng.normal(size=T)
        last = rng.normal()
        term, trunc = rng.random(T) < 0.2, rng.random(T) < 0.2
        a, _ = run(r.astype(np.float32), v.astype(np.float32), np.float32(last), fv.astype(np.float32), term, trunc)
        np.testing.assert_allclose(a, reference(r, v, last, fv, term, trunc, G, L), atol=1e-5)


def test_batched_over_envs_equals_per_env_and_jits():
    rng = np.random.default_rng(1)
    T, N = 9, 3
    r, v, fv = (rng.normal(size=(T, N)).astype(np.float32) for _ in range(3))
    last = rng.normal(size=N).astype(np.float32)
    term, trunc = rng.random((T, N)) < 0.2, rng.random((T, N)) < 0.2
    a, _ = jax.jit(gae, static_argnums=(6, 7))(r, v, last, fv, term, trunc, G, L)
    for n in range(N):
        np.testing.assert_allclose(np.asarray(a)[:, n],
                                   reference(r[:, n], v[:, n], last[n], fv[:, n], term[:, n], trunc[:, n], G, L),
                                   atol=1e-5)
    # vmap over a leading seed axis works too
    av, _ = jax.vmap(lambda *xs: gae(*xs, G, L))(*(jnp.stack([x, x]) for x in (r, v, last, fv, term, trunc)))
    np.testing.assert_allclose(np.asarray(av[1]), np.asarray(a), atol=1e-6)
