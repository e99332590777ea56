"""Data-parallel learners over a one-axis device mesh (axis ``"data"``): the pieces the Anakin
runtime and the async on-policy learner share.

The layout is the async runtime's ``num_learner_devices = L > 1`` layout (docs/runtime.md,
"Data-parallel learners"): learner state (params, optimizer state, keys, version) replicated
(``P()``); each device holds whole env columns ``[d * N / L, (d + 1) * N / L)`` of the ``N``
envs; every update averages the replicas' gradients (``lax.pmean`` inside the agent's ``learn``
with ``axis_name="data"``), so the replicas stay identical.

Anakin on ``L`` devices (:class:`~tianji_jax.runtime.anakin.OnPolicyAnakin` /
:class:`~tianji_jax.runtime.anakin.ReplayAnakin` with ``devices``) shards its actor state by env
column (:func:`actor_specs`) and lets XLA partition the rollout along that axis (the rollout is
written for all ``N`` envs; with JAX's partitionable threefry its random draws are those of the
one-device rollout), then runs the same ``shard_map``-ped learn as the async learner on the
trajectory's env columns. So an Anakin run on ``L`` devices computes what an async ``sync`` run
with one actor and ``L`` learner devices computes.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tianji_jax import caches

__all__ = ["mesh_devices", "make_mesh", "traj_spec", "on_policy_learn", "actor_specs", "shardings"]


def mesh_devices(num: int) -> list:
    """The first ``num`` devices of this process (a data-parallel Anakin run's).

    Raises:
        ValueError: fewer than ``num`` devices (the message says how to get more CPU devices).
    """
    devs = jax.devices()
    if num > len(devs):
        raise ValueError(
            f"num_learner_devices={num}: needs {num} devices, only {len(devs)} {devs[0].platform} device(s); allowed "
            f"1..{len(devs)} (on CPU, start Python with XLA_FLAGS=--xla_force_host_platform_device_count=N or set "
            "jax_num_cpu_devices before JAX starts)")
    return list(devs[:num])


def make_mesh(devices: list) -> Mesh:
    """A one-axis mesh ``("data",)`` over ``devices`` (in that order), for programs with
    collectives over it: on CPU devices it first makes sure such programs are not loaded from the
    persistent compilation cache unsafely (:func:`tianji_jax.caches.guard_cpu_collectives`)."""
    caches.guard_cpu_collectives(devices)
    return Mesh(np.asarray(devices), ("data",))


def traj_spec(key: str) -> P:
    """The partition of an on-policy trajectory leaf: leaves are ``(T, N, ...)`` (``last_obs`` and
    a recurrent agent's ``hidden_init`` are ``(N, ...)``); the env axis N is sharded."""
    return P("data") if key in ("last_obs", "hidden_init") else P(None, "data")


def on_policy_learn(agent: Any, mesh: Mesh) -> Callable:
    """``agent.learn`` data-parallel over ``mesh``: ``(learner, traj) -> (learner, metrics)`` with
    ``learner`` and ``metrics`` replicated and ``traj`` sharded by :func:`traj_spec` (not jitted:
    it runs inside the caller's program or the caller jits it)."""
    from tianji_jax.algos.on_policy import RECURRENT_TRAJECTORY_KEYS, TRAJECTORY_KEYS

    keys = TRAJECTORY_KEYS + (RECURRENT_TRAJECTORY_KEYS if agent.recurrent else ())
    specs = {k: traj_spec(k) for k in keys}
    # check_vma=False: pmap semantics. With it on, the gradient w.r.t. replicated params would
    # already be summed over the axis, and the update's pmean would then return the sum of the
    # replicas' gradients instead of their mean.
    return jax.shard_map(partial(agent.learn, axis_name="data"), mesh=mesh, in_specs=(P(), specs),
                         out_specs=(P(), P()), check_vma=False)


def actor_specs(config: Any, agent_for: Callable[[Any], Any], num_shards: int) -> Any:
    """Partition specs of ``config``'s actor state with its env axis over ``"data"``.

    Found by shape, not by name: the actor state of a config with ``num_envs / num_shards`` envs
    (an abstract ``init_actor``; no compilation) differs from the full one only along each
    leaf's env axis, which is sharded; every other leaf (keys, statistics, counters) is
    replicated. That probe config is a copy of ``config`` with ``num_envs`` set and not validated
    again (its per-device env count need not satisfy rules such as a whole number of replay
    updates per iteration, which hold for the run's config).

    Args:
        config: a validated config (``num_shards`` divides its ``num_envs``).
        agent_for: ``config -> agent``, building the agent of exactly the config it is given.
        num_shards: ``L``, dividing ``config.num_envs``.

    Returns:
        A pytree of :class:`~jax.sharding.PartitionSpec` structured like the actor state.

    Raises:
        ValueError: a leaf changed along several axes, or by another factor than ``L`` (an actor
            state this layout cannot split by env).
    """
    key = jax.random.PRNGKey(0)
    full = jax.eval_shape(agent_for(config).init_actor, key)
    probe = copy.copy(config)
    object.__setattr__(probe, "num_envs", config.num_envs // num_shards)
    part = jax.eval_shape(agent_for(probe).init_actor, key)

    def spec(path, a, b):
        axes = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if not axes:
            return P()
        if len(axes) > 1 or a.shape[axes[0]] != b.shape[axes[0]] * num_shards:
            raise ValueError(f"actor state leaf {jax.tree_util.keystr(path)} {a.shape} vs {b.shape} with "
                             f"num_envs / {num_shards}: not split along one env axis, cannot shard it by env")
        return P(*([None] * axes[0]), "data")

    return jax.tree_util.tree_map_with_path(spec, full, part)


def shardings(mesh: Mesh, specs: Any) -> Any:
    """``specs`` (a pytree of PartitionSpec) as NamedShardings on ``mesh``."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
