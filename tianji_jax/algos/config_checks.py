"""Cross-field rules of the algorithm configs: host env backends, async-only fields, learner
groups, multi-host (``jax.distributed``) and Ray actor settings, and the ``HOST:PORT`` form of a
coordinator address.

Pure validation: imports nothing from :mod:`tianji_jax.runtime` (whose
:mod:`~tianji_jax.runtime.layouts.distributed` re-exports :func:`check_coordinator`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tianji_jax.algos.config_base import check_int

if TYPE_CHECKING:
    from tianji_jax.envs.registry import EnvSpec

__all__ = ["check_coordinator", "loopback_ip"]


def check_coordinator(coordinator: Any) -> tuple[str, int]:
    """``(host, port)`` from ``"HOST:PORT"``.

    Raises:
        ValueError: not of the form ``HOST:PORT`` with a port in 1..65535.
    """
    if not isinstance(coordinator, str) or ":" not in coordinator:
        raise ValueError(f"coordinator must be 'HOST:PORT' (e.g. '10.0.0.1:12345'), got {coordinator!r}")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"coordinator must be 'HOST:PORT' with a port in 1..65535, got {coordinator!r}")
    return host, int(port)


def loopback_ip(host: str) -> str | None:
    """The loopback address a coordinator host names (``"127.0.0.1"`` for ``localhost`` and
    ``127.x.y.z`` as given, ``"::1"`` for ``::1`` / ``[::1]``), or None for any other host (a job
    across machines)."""
    import ipaddress

    name = host.strip("[]")
    if name == "localhost":
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    return str(ip) if ip.is_loopback else None


def _check_distributed(config: Any) -> None:
    """The multi-host fields of a :class:`~tianji_jax.config.PPOConfig` (clear errors naming the field)."""
    check_int("num_processes", config.num_processes, minimum=1)
    check_int("process_id", config.process_id, minimum=0, maximum=config.num_processes - 1)
    check_int("heartbeat_timeout_s", config.heartbeat_timeout_s, minimum=1)
    if config.num_processes == 1:
        if config.coordinator is not None:
            raise ValueError(f"coordinator={config.coordinator!r} needs num_processes > 1")
        return
    if config.coordinator is None:
        raise ValueError(f"num_processes={config.num_processes} needs coordinator='HOST:PORT' (process 0's address)")
    check_coordinator(config.coordinator)
    if config.stop_at_return is not None:
        raise ValueError("stop_at_return is not supported with num_processes > 1 yet (every process must run the "
                         "same number of updates); got stop_at_return="
                         f"{config.stop_at_return}")
    unit = getattr(config, "global_batch_size", None) or config.global_iteration_env_steps
    if config.total_env_steps < unit:
        raise ValueError(f"total_env_steps={config.total_env_steps} must be >= num_processes * num_envs * num_steps "
                         f"= {unit} (one global update)")


def _check_ray(config: Any, spec: EnvSpec) -> None:
    """The Ray actor fields of an algorithm config (clear errors naming the field)."""
    check_int("ray_max_restarts", config.ray_max_restarts, minimum=0)
    if config.actor_backend not in ("threads", "ray"):
        raise ValueError(f"actor_backend must be one of ('threads', 'ray'), got {config.actor_backend!r}")
    if config.actor_backend == "threads":
        if config.ray_address is not None:
            raise ValueError(f"ray_address={config.ray_address!r} needs actor_backend='ray'")
        default = {f.name: f.default for f in dataclasses.fields(config)}["ray_max_restarts"]
        if config.ray_max_restarts != default:
            raise ValueError(f"ray_max_restarts={config.ray_max_restarts} needs actor_backend='ray' (it is how often Ray "
                             f"restarts a dead remote actor); allowed with actor_backend='threads': {default} (default)")
        return
    if getattr(spec, "action_kind", None) == "multi_discrete":
        raise ValueError(f"actor_backend='ray' is not supported with env {config.env!r}: its {spec.action_space!r} "
                         "action space is MultiDiscrete, and Ray actor processes step envs through the host env "
                         "API (Discrete and Box actions); allowed: actor_backend='threads'")
    if config.ray_address is not None and (not isinstance(config.ray_address, str) or not config.ray_address):
        raise ValueError(f"ray_address must be None, 'auto' or 'HOST:PORT', got {config.ray_address!r}")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ImportError("actor_backend='ray' needs Ray: pip install 'tianji-jax[ray]'")


def _check_async_only(config: Any, names: tuple[str, ...]) -> None:
    """Async-runtime fields must keep their defaults under ``runtime='anakin'`` (a value there
    would be silently ignored)."""
    if config.runtime != "anakin":
        return
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for name in names:
        value = getattr(config, name)
        if value != defaults[name]:
            raise ValueError(f"{name}={value!r} only applies to runtime='async' (actor threads, the lag-bounded queue); "
                             f"got runtime='anakin'. Allowed: runtime='async', or {name}={defaults[name]!r} (default)")


def _check_learner_groups(config: Any) -> None:
    """The learner-group fields of an algorithm config (after the fields they depend on)."""
    check_int("num_learner_groups", config.num_learner_groups, minimum=1)
    check_int("sync_every", config.sync_every, minimum=1)
    groups = config.num_learner_groups
    if groups == 1:
        if config.sync_every != 1:
            raise ValueError(f"sync_every={config.sync_every} needs num_learner_groups > 1 (it is the number of "
                             "updates between the groups' param averagings); got num_learner_groups=1")
        return
    for name, value, allowed in (("num_learner_devices", getattr(config, "num_learner_devices", 1), 1),
                                 ("num_processes", getattr(config, "num_processes", 1), 1)):
        if value != allowed:
            raise ValueError(f"num_learner_groups={groups} is not supported with {name}={value} yet; allowed: "
                             f"{name}={allowed} (each group is one learner device in one process)")
    if config.num_actors % groups:
        raise ValueError(f"num_actors={config.num_actors} must be a multiple of num_learner_groups={groups} (the "
                         f"actors split evenly over the groups); allowed: {[groups * k for k in range(1, 5)]}, ...")
    if hasattr(config, "global_batch_size") and config.total_env_steps // config.global_batch_size < groups:
        raise ValueError(f"total_env_steps={config.total_env_steps} must be >= num_learner_groups * num_envs * "
                         f"num_steps = {groups * config.batch_size} (one update per learner group)")


def _check_host_fields(config: Any, spec: EnvSpec) -> None:
    """Rules for host env backends (envpool, gymnasium), shared by the configs."""
    batch = getattr(config, "env_batch_size", None)
    if batch is not None:
        check_int("env_batch_size", batch, minimum=1, maximum=config.num_envs)
        if spec.backend != "envpool":
            raise ValueError(f"env_batch_size={batch}: only the envpool backend has an async mode; "
                             f"env {config.env!r} needs env_batch_size=None")


def _check_replay_layout(config: Any, frames: bool) -> None:
    """The learner layouts of the replay data path (a DQN-family config, after its other fields):
    data-parallel learners shard the replay by env and the batch (``num_learner_devices`` divides
    ``num_envs``, ``batch_size`` and ``buffer_capacity``); learner groups split the replay and
    ``learning_starts`` (each group's share must hold a batch when it starts learning); neither
    splits the frame replay of envpool Atari games (``frames``) yet."""
    ld = config.num_learner_devices
    sizes = ("num_envs", "batch_size", "buffer_capacity")
    bad = [f"{k}={getattr(config, k)}" for k in sizes if getattr(config, k) % ld]
    procs = config.num_processes
    if procs > 1:
        shards = procs * ld
        wrong = [f"{k}={getattr(config, k)}" for k in sizes[1:] if getattr(config, k) % shards]
        if wrong:
            raise ValueError(f"num_processes={procs} x num_learner_devices={ld} = {shards} replay shards must divide "
                             f"batch_size and buffer_capacity (each shard holds buffer_capacity / {shards} "
                             f"transitions and samples batch_size / {shards}); got {', '.join(wrong)}")
        if frames:
            raise ValueError(f"num_processes={procs}: the frame replay of envpool Atari games is not sharded over "
                             "processes yet; allowed: num_processes=1")
        if config.learning_starts // procs < config.batch_size // procs + (config.n_step - 1) * config.num_envs * \
                config.num_actors:
            raise ValueError(f"num_processes={procs}: each process learns after learning_starts / {procs} of its "
                             f"env steps, which must be >= batch_size / {procs} + (n_step - 1) * num_envs * "
                             f"num_actors; got learning_starts={config.learning_starts}")
    if bad:
        raise ValueError(f"num_learner_devices={ld} must divide num_envs, batch_size and buffer_capacity (the "
                         f"replay is sharded by env, each replica samples batch_size / {ld}); got {', '.join(bad)}; "
                         f"allowed: {[d for d in range(1, config.num_envs + 1) if not any(getattr(config, k) % d for k in sizes)]}")
    _check_learner_groups(config)
    groups = config.num_learner_groups
    if groups > 1:
        per_group = config.learning_starts // groups
        need = config.batch_size + (config.n_step - 1) * config.num_envs * (config.num_actors // groups)
        if config.buffer_capacity % groups or config.buffer_capacity // groups < config.batch_size:
            raise ValueError(f"num_learner_groups={groups}: each group's replay holds buffer_capacity / {groups} "
                             f"transitions, a whole number >= batch_size={config.batch_size}; got buffer_capacity="
                             f"{config.buffer_capacity}")
        if per_group < need:
            raise ValueError(f"num_learner_groups={groups}: each group learns after learning_starts / {groups} = "
                             f"{per_group} of its env steps, which must be >= batch_size + (n_step - 1) * num_envs "
                             f"* actors per group = {need}; allowed: learning_starts >= {need * groups}")
        if config.learning_iterations < groups:
            raise ValueError(f"num_learner_groups={groups}: the run has {config.learning_iterations} learner blocks, "
                             "fewer than one per group; raise total_env_steps")
        if frames:
            raise ValueError(f"num_learner_groups={groups}: the frame replay of envpool Atari games is not split "
                             "over learner groups yet; allowed: num_learner_groups=1")
    if frames and config.num_learner_devices > 1:
        raise ValueError(f"num_learner_devices={config.num_learner_devices}: the frame replay of envpool Atari games "
                         "is not sharded over data-parallel learners yet; allowed: num_learner_devices=1")


def check_atari(config: Any, spec: EnvSpec, defaults: dict) -> bool:
    """The Atari fields of a DQN-family config (``episodic_life``, ``reward_clip``,
    ``repeat_action_probability``: only envpool Atari games may change them from ``defaults``) and
    whether the run stores stacked uint8 frames in the frame replay (returned), whose per-env ring
    must hold a whole transition."""
    from tianji_jax.algos.config_base import check_bool, check_float

    for name in ("episodic_life", "reward_clip"):
        check_bool(name, getattr(config, name))
    check_float("repeat_action_probability", config.repeat_action_probability, low=0.0, high=1.0)
    if not spec.is_atari:
        changed = {k: getattr(config, k) for k in defaults if getattr(config, k) != defaults[k]}
        if changed:
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in changed.items())}: Atari settings apply to "
                             f"envpool Atari games only; env {config.env!r} needs the defaults {defaults}")
    shape = tuple(spec.observation_shape)
    frames = spec.is_atari and len(shape) == 3 and str(spec.observation_space.dtype) == "uint8"
    if frames:
        writers = config.num_actors * config.num_envs
        need = writers * (shape[0] + config.n_step)
        if config.buffer_capacity < need:
            raise ValueError(
                f"buffer_capacity={config.buffer_capacity} must be >= num_actors * num_envs * (frame stack + n_step) "
                f"= {writers} * ({shape[0]} + {config.n_step}) = {need}: the frame replay keeps one ring of "
                "buffer_capacity / (num_actors * num_envs) frames per env, which must hold a whole transition")
    return frames


def check_distributional(config: Any) -> None:
    """The distributional head of a DQN-family config: ``distributional`` in ('none', 'c51',
    'qr'), ``num_atoms >= 2``, C51's ``v_min < v_max``, no Huber threshold (the losses are
    C51's cross-entropy and QR's quantile Huber loss with kappa 1)."""
    from tianji_jax.algos.config_base import check_float

    kinds = ("none", "c51", "qr")
    if config.distributional not in kinds:
        raise ValueError(f"distributional must be one of {kinds}, got {config.distributional!r}")
    check_int("num_atoms", config.num_atoms, minimum=2)
    check_float("v_min", config.v_min)
    check_float("v_max", config.v_max)
    if config.distributional == "c51" and not config.v_min < config.v_max:
        raise ValueError(f"v_max={config.v_max} must be > v_min={config.v_min} (C51's support)")
    if config.distributional != "none" and config.huber_delta is not None:
        raise ValueError(f"huber_delta={config.huber_delta}: the TD loss's Huber threshold does not apply to "
                         f"distributional={config.distributional!r} (C51: cross-entropy; QR: kappa 1); allowed: None")
