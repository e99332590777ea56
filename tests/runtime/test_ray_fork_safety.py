"""Starting Ray forks the learner's process; OpenBLAS's fork handler stops its threads under a LAPACK
call in flight (an orthogonal initialiser's QR, dispatched asynchronously by JAX), which then never
returns: the run hung in its first ``int(version)``. ``RayContext`` waits for every live array before
``ray.init``. Here ``ray.init`` is replaced by a stand-in that records whether every leaf of the
learner's initial state was computed when it would have forked (no Ray process is started)."""

from __future__ import annotations

import jax
import pytest

ray = pytest.importorskip("ray")

import tianji_jax as tj
from tianji_jax.runtime.async_on_policy import AsyncOnPolicy
from tianji_jax.runtime.async_replay import AsyncReplay

pytestmark = pytest.mark.timeout(300)


class _Started(Exception):
    """Raised by the stand-in where Ray would have started."""


@pytest.mark.parametrize("runtime, config", [
    (AsyncOnPolicy, tj.PPOConfig(env="envpool:CartPole-v1", runtime="async", actor_backend="ray", num_envs=4,
                                 num_steps=8, num_minibatches=1, total_env_steps=64, hidden_sizes=(512, 512))),
    (AsyncReplay, tj.DQNConfig(env="envpool:CartPole-v1", runtime="async", actor_backend="ray", num_envs=4,
                               num_steps=8, batch_size=32, learning_starts=64, total_env_steps=256, replay_ratio=0.125,
                               hidden_sizes=(512, 512))),
])
def test_the_learner_state_is_computed_before_ray_forks(monkeypatch, runtime, config):
    seen: list[bool] = []

    def stand_in(*args, **kwargs):
        owner = stand_in.owner
        states = (owner.learner_states, getattr(owner, "replay_states", None))
        seen.append(all(leaf.is_ready() for leaf in jax.tree.leaves(states) if isinstance(leaf, jax.Array)))
        raise _Started

    class Recording(runtime):  # the instance under construction, for the stand-in to read
        def __init__(self, *args, **kwargs):
            stand_in.owner = self
            super().__init__(*args, **kwargs)

    assert not ray.is_initialized()
    monkeypatch.setattr(ray, "init", stand_in)
    with pytest.raises(_Started):
        Recording(config)
    assert seen == [True]
