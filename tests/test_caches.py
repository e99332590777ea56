"""clear_caches frees compiled code (each XLA CPU executable holds memory mappings; a process has
at most vm.max_map_count of them)."""

from __future__ import annotations

import os

import jax
import pytest

import tianji_jax as tj


def _maps() -> int:
    with open(f"/proc/{os.getpid()}/maps") as f:
        return sum(1 for _ in f)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_clear_caches_frees_compiled_trainers_and_their_mappings():
    tj.clear_caches()
    before = _maps()
    configs = [tj.PPOConfig(env="gymnax:CartPole-v1", num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1,
                            total_env_steps=64, hidden_sizes=(8 + i,)) for i in range(3)]
    trainers = []
    for c in configs:
        t = tj.make_train(c)
        state = t(t.init(jax.random.PRNGKey(0)))[0]
        jax.block_until_ready(state)
        trainers.append(t)
    assert tj.make_train(configs[0]) is trainers[0]  # cached: a second train compiles nothing
    grown = _maps()
    assert grown > before
    del trainers, t, state
    tj.clear_caches()
    assert tj.make_train(configs[0]) is not None
    after = _maps()
    # the three trainers' executables are gone (make_train itself compiles nothing until called)
    assert after < grown, (before, grown, after)
    assert after - before < (grown - before) / 2, (before, grown, after)
