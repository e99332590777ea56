"""Data-parallel DQN learners: the replay buffer sharded along the env axis over ``L`` learner
devices, one learner replica per device.

Layout (``num_learner_devices = L > 1``, mesh axis ``"data"``):

* **replay**: ``L`` independent buffers of ``buffer_capacity / L`` transitions, stacked on a
  leading axis sharded over the devices (``P("data")``): device ``d`` holds the transitions of
  env columns ``[d * N / L, (d + 1) * N / L)`` of every actor (``N = num_envs``), with its own
  write position, size and, with prioritised replay, its own sum-tree and max priority (as
  Ape-X's replay shards, Horgan et al. 2018). A chunk's items are split by env column before
  they leave the actor's side (:func:`split_by_env`), so each device inserts only its own;
* **learner**: params, target params and optimizer state replicated (``P()``). Every gradient
  update, each replica samples ``batch_size / L`` items from its own shard, and the loss and
  gradients are averaged over the devices before one identical step
  (:meth:`~tianji_jax.algos.dqn.agent.DQNAgent.learn` with ``axis_name``): the replay ratio
  and the batch are the single-device ones, spread over ``L`` devices.

Why by env: every n-step window lives in one env's stream, so splitting by env never cuts a
transition, and with envs split evenly every shard fills at the same rate (each holds ``1/L`` of
the items, so sampling ``1/L`` of the batch from each is uniform over the union for uniform
replay; prioritised draws are proportional within each shard).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tianji_jax.buffers import replay
from tianji_jax.runtime.layouts.data_parallel import make_mesh

__all__ = ["init_sharded_replay", "split_by_env", "make_sharded_fns", "block_fns", "make_multi_host_fns"]


def init_sharded_replay(agent: Any, num_shards: int, check_memory: bool = False, total_shards: int | None = None
                        ) -> Any:
    """``num_shards`` empty replay buffers of ``buffer_capacity / total_shards`` transitions
    (``total_shards``: every process's shards, default ``num_shards``), stacked on a leading axis
    (leaves ``(L, ...)``). Traceable unless ``check_memory`` (which checks that one shard fits in
    free device memory).

    Raises:
        ValueError: frame replay (Atari; not sharded yet).
        MemoryError: ``check_memory`` and a shard would not fit.
    """
    if agent.frame_replay:
        raise ValueError("data-parallel learners do not shard the frame replay (envpool Atari) yet")
    capacity = agent.config.buffer_capacity // (total_shards or num_shards)
    if check_memory:
        replay.check_fits(replay.replay_bytes(agent.example_item, capacity))
    one = replay.init(agent.example_item, capacity, check_memory=False)
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_shards, *x.shape)).copy(), one)


def split_by_env(tree: Any, num_envs: int, num_shards: int) -> Any:
    """Leaves ``(T * N, ...)`` in time-major order (item ``t * N + e``) -> ``(L, T * N / L, ...)``,
    shard ``d`` holding env columns ``[d * N / L, (d + 1) * N / L)``, time-major within it."""
    per = num_envs // num_shards

    def split(x):
        t = x.shape[0] // num_envs
        x = x.reshape((t, num_shards, per, *x.shape[1:]))
        return jnp.swapaxes(x, 0, 1).reshape((num_shards, t * per, *x.shape[3:]))

    return jax.tree.map(split, tree)


def make_sharded_fns(agent: Any, devices: list) -> tuple[Mesh, Callable, Callable, Callable]:
    """``(mesh, place, insert, learn)`` for data-parallel learners on ``devices``.

    * ``place(items, item_version, mask)``: split by env (:func:`split_by_env`) and put on the
      devices, sharded over ``"data"``;
    * ``insert(replay_state, items, item_version, mask) -> replay_state``: each device adds its
      own items to its own shard (jitted, the replay donated);
    * ``learn(learner, replay_state, env_steps) -> (learner, replay_state, metrics)``: one learner
      block, replicas in lockstep (jitted, the replay donated); ``learner`` and ``metrics``
      replicated.
    """
    num = len(devices)
    mesh = make_mesh(list(devices))
    shard = NamedSharding(mesh, P("data"))
    n_envs = agent.config.num_envs

    def place(items: Any, item_version: Any, mask: Any) -> tuple:
        return jax.device_put(split_by_env((items, item_version, mask), n_envs, num), shard)

    insert, learn = block_fns(agent, mesh)
    return mesh, place, jax.jit(insert, donate_argnums=0), jax.jit(learn, donate_argnums=1)


def block_fns(agent: Any, mesh: Mesh) -> tuple[Callable, Callable]:
    """``(insert, learn)`` of the layout above over ``mesh``, not jitted (data-parallel Anakin runs
    them inside its program; :func:`make_sharded_fns` jits them):

    * ``insert(replay_state, items, item_version, mask) -> replay_state``: every leaf ``(L, ...)``
      sharded over ``"data"`` (items as :func:`split_by_env` lays them out); each device adds its
      own items to its own shard;
    * ``learn(learner, replay_state, env_steps) -> (learner, replay_state, metrics)``: one learner
      block, replicas in lockstep; ``learner``, ``env_steps`` (int32 scalar) and ``metrics``
      replicated.
    """
    num = mesh.devices.size
    local = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731 - a device's block of one shard
    stack = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731

    def insert_shard(rs, items, item_version, mask):
        return stack(agent.insert(local(rs), local(items), local(item_version), local(mask)))

    def learn_shard(learner, rs, env_steps):
        learner, rs, metrics = agent.learn(learner, local(rs), env_steps, axis_name="data", num_shards=num)
        return learner, stack(rs), metrics

    # check_vma=False: pmap semantics (runtime/layouts/data_parallel.py): learn averages the gradients itself
    insert = jax.shard_map(insert_shard, mesh=mesh, in_specs=(P("data"),) * 4, out_specs=P("data"), check_vma=False)
    learn = jax.shard_map(learn_shard, mesh=mesh, in_specs=(P(), P("data"), P()), out_specs=(P(), P("data"), P()),
                          check_vma=False)
    return insert, learn


def make_multi_host_fns(agent: Any, local_devices: list, global_devices: list
                        ) -> tuple[Mesh, Mesh, Callable, Callable, Callable]:
    """``(local_mesh, global_mesh, place, insert, learn)`` for multi-host learners
    (``jax.distributed``, :mod:`tianji_jax.runtime.layouts.distributed`).

    Layout: the data-parallel layout above over every process's learner devices. Each process
    keeps its own ``L`` replay shards (its own env columns) as arrays of its *local* mesh:
    ``place`` and ``insert`` are :func:`make_sharded_fns`'s on the local mesh and involve no other
    process, so every process inserts its own actors' chunks whenever they arrive. ``learn`` is
    the one collective: it views the local shards as this process's part of a global replay
    array (``P * L`` shards over the global mesh, no copy), runs one learner block with the
    gradients averaged over every learner device of every process (each samples
    ``batch_size / (P * L)`` items from its own shard) and hands back the updated local shards
    (priorities) and the replicated learner state. Every process must call it the same number of
    times in the same order (the lockstep rule of :mod:`~tianji_jax.runtime.layouts.distributed`).

    ``learn(learner, replay_state, env_steps)``: ``learner`` replicated over the global mesh,
    ``replay_state`` local shards (donated), ``env_steps`` this process's estimate of the run's
    env steps (an int; prioritised replay's beta anneals on it); returns ``(learner,
    replay_state, metrics)``.
    """
    local_mesh, place, insert, _ = make_sharded_fns(agent, local_devices)
    num, per = len(global_devices), len(local_devices)
    global_mesh = make_mesh(list(global_devices))
    g_shard, l_shard = NamedSharding(global_mesh, P("data")), NamedSharding(local_mesh, P("data"))
    order = {d: i for i, d in enumerate(local_devices)}

    def learn_shard(learner, rs, env_steps):
        local = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
        learner, rs, metrics = agent.learn(learner, local(rs), env_steps[0], axis_name="data", num_shards=num)
        return learner, jax.tree.map(lambda x: x[None], rs), metrics

    learn_global = jax.jit(jax.shard_map(learn_shard, mesh=global_mesh, in_specs=(P(), P("data"), P("data")),
                                         out_specs=(P(), P("data"), P()), check_vma=False), donate_argnums=1)

    def shards(x: jax.Array) -> list:
        return [s.data for s in sorted(x.addressable_shards, key=lambda s: order[s.device])]

    def learn(learner: Any, replay_state: Any, env_steps: Any) -> tuple:
        view = jax.tree.map(lambda x: jax.make_array_from_single_device_arrays((num, *x.shape[1:]), g_shard,
                                                                              shards(x)), replay_state)
        steps = jax.make_array_from_process_local_data(g_shard, np.full((per,), int(env_steps), np.int32), (num,))
        learner, view, metrics = learn_global(learner, view, steps)
        replay_state = jax.tree.map(lambda x: jax.make_array_from_single_device_arrays((per, *x.shape[1:]), l_shard,
                                                                                      shards(x)), view)
        return learner, replay_state, metrics

    return local_mesh, global_mesh, place, insert, learn
