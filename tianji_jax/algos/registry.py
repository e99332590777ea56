"""The algorithm registry: name -> :class:`Algorithm` (its config class, data path and the
functions the generic front end calls). ``tianji train --algo`` choices, :func:`tianji_jax.train`
dispatch, :func:`tianji_jax.evaluate`, ``config.json`` loading and :func:`tianji_jax.load` all
come from it.

Registering an algorithm from your own package: call :func:`register_algorithm` at import, or
declare an entry point in the group ``tianji_jax.algorithms`` whose object is an
:class:`Algorithm` (loaded the first time a name is looked up or the names are listed). See
``docs/algorithms.md``.

The functions are given as ``"module:attribute"`` strings and imported when first called, so
that this module (on the math side of the layering) imports no runtime.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

__all__ = ["Algorithm", "DATA_PATHS", "register_algorithm", "get_algorithm", "algorithm_for", "algorithm_names",
           "agent_class_for"]

DATA_PATHS = ("on_policy", "replay")
"""``on_policy``: consume-once trajectory queue, lag gate at consumption, samples-per-insert 1.
``replay``: ingress with the lag gate at insert, learner-owned replay, samples-per-insert from the
algorithm's replay ratio."""


_GENERIC = {
    "on_policy": (("train", "tianji_jax.run.host_on_policy:train_on_policy"),
                  ("evaluate", "tianji_jax.run.host_on_policy:evaluate_on_policy"),
                  ("host_actor", "tianji_jax.runtime.actors.host_actor:on_policy_host_actor")),
    "replay": (("train", "tianji_jax.run.host_replay:train_replay"),
               ("evaluate", "tianji_jax.run.host_replay:evaluate_replay"),
               ("host_actor", "tianji_jax.runtime.actors.replay_host:replay_host_actor")),
}
"""The generic train / evaluate / host-actor functions of each data path (an agent's defaults)."""


def _resolve(ref: str | Callable) -> Callable:
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm.

    Attributes:
        name: the ``--algo`` value and ``config.json``'s ``"algo"`` (lower case, no spaces).
        config: ``"module:Class"`` (or the class) of its frozen, validated config dataclass.
        data_path: one of :data:`DATA_PATHS`.
        train: ``"module:function"`` (or the function) with the signature
            ``train(config, *, run_dir, progress, callback, resume, checkpoint, tensorboard, wandb,
            check_versions) -> TrainResult`` (:func:`tianji_jax.train` validates the shared
            arguments and calls it).
        evaluate: ``evaluate(config, state, num_episodes, seed) -> EvalResult``, the
            deterministic policy's returns.
        host_actor: ``"module:function"`` (or the function) building one actor on a host env
            for the generic remote (Ray) worker, or None (the algorithm has no remote actors):
            ``host_actor(config, actor_id, device, *, seed, timer, key_folds, run_env_steps) ->
            actor``, where ``actor(params, version) -> (chunk, env_steps)`` acts with the policy
            on ``device`` and ``chunk`` is a pytree the learner's insert takes once placed on its
            device (host arrays after ``jax.device_get``); the actor has ``chunker`` (its
            :class:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker`) and ``close()``. Its PRNG
            key is the algorithm's actor key folded with each of ``key_folds`` in turn; its
            envs are seeded from ``seed`` (not ``config.seed``); ``timer(name, t0)`` adds phase seconds; ``run_env_steps()`` is the run's env steps.
        description: one line describing it (shown in ``tianji train --help`` under ``--algo``).
        traced_hyperparameters: config fields that may vary without recompiling: the agent uses
            them only arithmetically (never for a shape, a loop bound or a Python branch), so
            :func:`tianji_jax.sweep` builds the agent with tracers in their place and trains a grid
            of them in one vmapped program (empty: none may be swept).
        agent: ``"module:Class"`` (or the class) of the algorithm's agent, built as
            ``Class(config)``: for the on-policy data path a subclass of
            :class:`~tianji_jax.algos.on_policy.OnPolicyAgent` (its network, acting step and
            learner update). With an agent, ``train``, ``evaluate`` and ``host_actor`` default to
            the generic on-policy ones (:mod:`tianji_jax.run.host_on_policy`,
            ``runtime.host_actor:on_policy_host_actor``), which run it on every runtime the
            capability table allows: registering it is the whole cost of a new on-policy algorithm.

    Raises:
        ValueError: a malformed name, an unknown data path, or no ``train`` / ``evaluate``
            without an on-policy ``agent`` to default them from.
    """

    name: str
    config: str | type
    data_path: Literal["on_policy", "replay"]
    train: str | Callable | None = None
    evaluate: str | Callable | None = None
    host_actor: str | Callable | None = None
    description: str = ""
    traced_hyperparameters: tuple[str, ...] = field(default=())
    agent: str | type | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not self.name.replace("_", "").isalnum() \
                or self.name != self.name.lower():
            raise ValueError(f"Algorithm.name must be a lower-case identifier such as 'ppo', got {self.name!r}")
        if self.data_path not in DATA_PATHS:
            raise ValueError(f"Algorithm.data_path must be one of {DATA_PATHS}, got {self.data_path!r}")
        if self.agent is not None:  # the generic runtimes of its data path
            for name, default in _GENERIC[self.data_path]:
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
        for name in ("train", "evaluate"):
            if getattr(self, name) is None:
                raise ValueError(f"Algorithm.{name} is required unless an agent is given "
                                 f"(agent='module:Class'); algorithm {self.name!r}")

    @property
    def agent_cls(self) -> type:
        """The agent class (imported on first use).

        Raises:
            ValueError: the algorithm registered no agent.
        """
        if self.agent is None:
            raise ValueError(f"algorithm {self.name!r} registered no agent class")
        return _resolve(self.agent)

    @property
    def config_cls(self) -> type:
        """The config class (imported on first use)."""
        return _resolve(self.config)

    def train_fn(self) -> Callable:
        """The train function (imported on first use)."""
        return _resolve(self.train)

    def evaluate_fn(self) -> Callable:
        """The evaluate function (imported on first use)."""
        return _resolve(self.evaluate)

    def host_actor_fn(self) -> Callable:
        """The host actor factory (imported on first use).

        Raises:
            ValueError: the algorithm registered none (it cannot run remote actors).
        """
        if self.host_actor is None:
            raise ValueError(f"algorithm {self.name!r} registered no host_actor factory: it cannot run remote "
                             "actors (actor_backend='ray'); allowed: actor_backend='threads'")
        return _resolve(self.host_actor)


_LOCK = threading.Lock()
_REGISTRY: dict[str, Algorithm] = {}
_ENTRY_POINTS_LOADED = [False]


def register_algorithm(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Add ``algorithm`` under ``algorithm.name``; returns it.

    Raises:
        TypeError: not an :class:`Algorithm`.
        ValueError: the name is taken (pass ``replace=True`` to override a registration).
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"register_algorithm takes an Algorithm, got {type(algorithm).__name__}")
    with _LOCK:
        if algorithm.name in _REGISTRY and not replace and _REGISTRY[algorithm.name] != algorithm:
            raise ValueError(f"algorithm {algorithm.name!r} is already registered "
                             f"(registered: {sorted(_REGISTRY)}); pass replace=True to override it")
        _REGISTRY[algorithm.name] = algorithm
    return algorithm


def _load_entry_points() -> None:
    if _ENTRY_POINTS_LOADED[0]:
        return
    _ENTRY_POINTS_LOADED[0] = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="tianji_jax.algorithms"):
        try:
            obj = ep.load()
            register_algorithm(obj() if callable(obj) and not isinstance(obj, Algorithm) else obj)
        except Exception as err:  # noqa: BLE001 - another package's plugin must not break tianji
            warnings.warn(f"tianji_jax: algorithm entry point {ep.name!r} skipped: {type(err).__name__}: {err}",
                          RuntimeWarning, stacklevel=2)


def algorithm_names() -> tuple[str, ...]:
    """Registered names, built-in first, then in registration order."""
    _load_entry_points()
    return tuple(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise ValueError(f"algo must be one of {algorithm_names()}, got {name!r}")
    return _REGISTRY[name]


def algorithm_for(config: Any) -> Algorithm:
    """The algorithm whose config class ``config`` is an instance of (the most derived one when
    several registered classes match).

    Raises:
        TypeError: no registered algorithm has this config class.
    """
    matches = [_REGISTRY[n] for n in algorithm_names() if isinstance(config, _REGISTRY[n].config_cls)]
    if matches:  # the most specific config class wins (a subclass of PPOConfig registered on its own)
        return max(matches, key=lambda a: len(a.config_cls.__mro__))
    names = ", ".join(f"{_REGISTRY[n].config_cls.__name__} ({n})" for n in algorithm_names())
    raise TypeError(f"config must be one of {names}, got {type(config).__name__}")


def agent_class_for(config: Any) -> type:
    """The agent class for ``config``: its algorithm's, or, for an algorithm registered without one
    (a config subclass reusing a built-in algorithm's runtime), the most specific registered
    algorithm's whose config class ``config`` is an instance of and which has one.

    Raises:
        TypeError: no registered algorithm with an agent has this config class.
    """
    matches = [_REGISTRY[n] for n in algorithm_names()
               if _REGISTRY[n].agent is not None and isinstance(config, _REGISTRY[n].config_cls)]
    if not matches:
        raise TypeError(f"no registered algorithm with an agent takes a {type(config).__name__}")
    return max(matches, key=lambda a: len(a.config_cls.__mro__)).agent_cls


register_algorithm(Algorithm(
    name="ppo", config="tianji_jax.algos.ppo.config:PPOConfig", data_path="on_policy",
    agent="tianji_jax.algos.ppo.agent:PPOAgent",
    traced_hyperparameters=("learning_rate", "max_grad_norm", "gamma", "gae_lambda", "clip_eps", "vf_coef",
                            "ent_coef"),
    description="PPO (Schulman et al. 2017) with GAE or V-trace; categorical or Gaussian policies"))
register_algorithm(Algorithm(
    name="pqn", config="tianji_jax.algos.pqn.config:PQNConfig", data_path="on_policy",
    agent="tianji_jax.algos.pqn.agent:PQNAgent",
    traced_hyperparameters=("learning_rate", "max_grad_norm", "gamma", "q_lambda", "reward_scale"),
    description="PQN (Gallici et al. 2024): LayerNorm Q-network, Q(lambda) on-policy, no replay or target net"))
register_algorithm(Algorithm(
    name="dqn", config="tianji_jax.algos.dqn.config:DQNConfig", data_path="replay",
    agent="tianji_jax.algos.dqn.agent:DQNAgent",
    traced_hyperparameters=("learning_rate", "max_grad_norm", "gamma", "tau"),
    description="the DQN family (Mnih et al. 2015): double Q, n-step, dueling, prioritised replay"))
register_algorithm(Algorithm(
    name="sac", config="tianji_jax.algos.sac.config:SACConfig", data_path="replay",
    agent="tianji_jax.algos.sac.agent:SACAgent",
    traced_hyperparameters=("learning_rate", "max_grad_norm", "gamma", "tau", "init_alpha"),
    description="SAC (Haarnoja et al. 2018): twin soft Q, squashed Gaussian actor, learned temperature; Box actions"))
