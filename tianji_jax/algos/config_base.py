"""What every algorithm config shares: type and range checks of single fields, the numpy-scalar
normalisation, the ``replace`` / ``to_dict`` base class and the torso text of ``describe()``.

Imports nothing from :mod:`tianji_jax.config` or the algorithm packages (they import this), and
nothing from :mod:`tianji_jax.runtime`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Self

_ACTIVATIONS = ("tanh", "relu")

FIELD_GROUPS = {
    "run": "settings of the run that never enter compiled code (seed, early stop, the non-finite stop rule)",
    "tianji": "the async (TianJi) runtime: schedule, lag bound, actors, queue, stall timeout; async only",
    "layout": "where things run: host env batching, learner devices and groups, processes, Ray actors",
}
"""Field groups a config field may declare (``run(default)``, ``tianji(default)``,
``layout(default)``). Fields of these groups never change the compiled math, so a compile key is
the config with all of them at their defaults (:func:`not_compiled`); ``tianji`` fields keep
their defaults under ``runtime='anakin'``. Fields without a group (the algorithm's
hyper-parameters, the env, the budget and evaluation cadence) enter the compile key."""


def _group(name: str, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"group": name})


def run(default: Any) -> Any:
    """A dataclass field of the ``run`` group (see :data:`FIELD_GROUPS`) with ``default``."""
    return _group("run", default)


def tianji(default: Any) -> Any:
    """A dataclass field of the ``tianji`` group (see :data:`FIELD_GROUPS`) with ``default``."""
    return _group("tianji", default)


def layout(default: Any) -> Any:
    """A dataclass field of the ``layout`` group (see :data:`FIELD_GROUPS`) with ``default``."""
    return _group("layout", default)


def fields_in(config: Any, *groups: str) -> tuple[str, ...]:
    """Names of ``config``'s fields in any of ``groups``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(config) if f.metadata.get("group") in groups)


def not_compiled(config: Any) -> dict[str, Any]:
    """``{name: default}`` of every field in a group of :data:`FIELD_GROUPS`: what a compile key
    resets (``config.replace(**not_compiled(config))``)."""
    return {f.name: f.default for f in dataclasses.fields(config) if f.metadata.get("group") in FIELD_GROUPS}


def plain_numbers(config: Any) -> None:
    """Replace numpy scalars in ``config``'s fields by Python ints/floats/bools (so ``np.int64(8)``
    from a sweep is accepted and the config stays JSON-able and hashable the same way), a whole
    float in an int field by its int (``total_env_steps=1e6``; ``1.5`` stays, for the type check
    to refuse) and a list in a tuple field by a tuple (``hidden_sizes=[64, 64]``)."""
    import numpy as np

    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if isinstance(v, (np.bool_, np.integer, np.floating)):
            v = v.item()  # a Python bool / int / float
        if isinstance(v, float) and v.is_integer() and f.type in ("int", "int | None"):
            v = int(v)
        elif isinstance(v, list) and f.type.startswith("tuple"):
            v = tuple(v)
        object.__setattr__(config, f.name, v)


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> None:
    """Check a config field ``name`` holds an int (not a bool) within ``[minimum, maximum]``.

    Raises:
        TypeError: not an int; ValueError: outside the bounds (one line naming the field)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    """Check a config field ``name`` holds a finite number (not a bool) in ``[low, high]``
    (``(low, high]`` with ``low_open``).

    Raises:
        TypeError: not a number; ValueError: not finite, or outside the interval (one line naming
            the field and the interval)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value < low or (low_open and value == low)):
        bound = f"> {low}" if low_open else f">= {low}"
        interval = f"in {'(' if low_open else '['}{low}, {high}]" if high is not None else bound
        raise ValueError(f"{name} must be {interval}, got {value}")
    if high is not None and value > high:
        interval = f"in {'(' if low_open else '['}{low}, {high}]" if low is not None else f"<= {high}"
        raise ValueError(f"{name} must be {interval}, got {value}")


def check_bool(name: str, value: Any) -> None:
    """Check a config field ``name`` holds a bool.

    Raises:
        TypeError: anything else (``1``, ``"True"``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True/False), got {value!r}")


def _check_shared(config: Any) -> None:
    """The checks every algorithm's config shares (one line naming the field each): the optimizer's
    ``learning_rate`` / ``max_grad_norm`` (> 0) and ``gamma`` (in [0, 1]), ``hidden_sizes`` (a
    non-empty tuple of positive ints), ``activation``, and ``stop_at_return`` (a number, needing
    ``eval_episodes >= 1``)."""
    check_float("learning_rate", config.learning_rate, low=0.0, low_open=True)
    check_float("max_grad_norm", config.max_grad_norm, low=0.0, low_open=True)
    check_float("gamma", config.gamma, low=0.0, high=1.0)
    if (not isinstance(config.hidden_sizes, tuple) or len(config.hidden_sizes) == 0
            or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in config.hidden_sizes)):
        raise ValueError(f"hidden_sizes must be a non-empty tuple of positive ints, got {config.hidden_sizes!r}")
    if config.activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {config.activation!r}")
    if config.stop_at_return is not None:
        check_float("stop_at_return", config.stop_at_return)
        if config.eval_episodes == 0:
            raise ValueError("stop_at_return needs evaluation: eval_episodes must be >= 1, got 0")


def _describe_env_layer(config: Any, normalised: str = "acted on and learned from") -> str:
    """The env layer of ``describe()``: the wrappers the env id names (``|``-separated, applied
    left to right) and the statistics the config asks for (observation normalisation, reward
    scaling); empty when there are none. ``normalised`` says where normalised observations are used."""
    from tianji_jax.envs.wrappers import is_wrapper_name

    name = config.env_spec.name if isinstance(config.env, str) else ""
    terms = name.split("|")[1:]
    is_wrapper = [is_wrapper_name(t.partition("=")[0]) for t in terms]
    wrappers = [t for t, w in zip(terms, is_wrapper) if w]
    options = [t for t, w in zip(terms, is_wrapper) if not w]  # e.g. brax's backend / episode_length
    parts = [f"env options {', '.join(options)}"] if options else []
    parts += [f"wrappers {', '.join(wrappers)} (from the env id)"] if wrappers else []
    if getattr(config, "normalize_observations", False):
        parts.append("observation normalisation by running mean/std, clipped to [-10, 10] "
                     f"(observations {normalised})")
    if getattr(config, "scale_rewards", False):
        parts.append("reward scaling by the running std of the discounted return")
    return f"; env layer: {'; '.join(parts)}" if parts else ""


def torso_text(config: Any) -> str:
    """The network's torso as ``describe()`` states it (see :func:`tianji_jax.nets.networks.resolve_torso`)."""
    from tianji_jax.nets.networks import resolve_torso, torso_path

    torso = resolve_torso(getattr(config, "torso", "auto"), tuple(config.env_spec.observation_shape))
    chosen = " (auto)" if getattr(config, "torso", "auto") == "auto" else ""
    if callable(torso):
        return f"user torso {torso_path(torso)}"
    if torso == "nature_cnn":
        return f"Nature CNN torso{chosen}"
    mlp = f"MLP {list(config.hidden_sizes)} {config.activation}"
    return (f"small CNN (16 3x3 filters) + {mlp} torso{chosen}" if torso == "small_cnn" else f"{mlp} torso{chosen}")


def _check_torso(config: Any, obs_shape: tuple[int, ...]) -> None:
    """``torso``: ``'auto'``, a built-in torso name that takes observations of ``obs_shape``, or a
    user torso (an import path ``'package.module:factory'`` that imports, or a callable).

    Raises:
        ValueError: one line naming the value and what is allowed.
    """
    from tianji_jax.nets.networks import TORSOS, resolve_torso, torso_factory

    torso = config.torso
    if torso == "auto" or (isinstance(torso, str) and torso in TORSOS):
        resolve_torso(torso, obs_shape)  # a built-in torso that cannot take this observation
        return
    if isinstance(torso, str) and ":" not in torso:
        raise ValueError(f"torso must be one of {('auto', *TORSOS)} or a user torso 'package.module:factory', "
                         f"got {torso!r}")
    torso_factory(torso)  # imports it now: a bad path fails here, in one line


class AgentConfig:
    """The base of every algorithm's config (:class:`~tianji_jax.algos.on_policy_config.OnPolicyConfig`
    and :class:`~tianji_jax.algos.replay_config.ReplayConfig` extend it; generic code is typed by
    it): ``replace``, ``to_dict`` and where the actors step the envs."""

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, validated again.

        Raises:
            ValueError / TypeError: as the constructor (a changed field out of range or of the
                wrong type, or an unknown field name: TypeError).
        """
        return dataclasses.replace(self, **changes)

    @property
    def host_stepped(self) -> bool:
        """Actors step the envs on the host (``HostActor``): host env backends (envpool,
        gymnasium), and device envs on Ray actor processes (through
        :class:`~tianji_jax.envs.gymnax_host.GymnaxHostVecEnv`). Such actors keep no device actor
        state: a checkpoint holds none, and a resume starts fresh episodes."""
        return bool(self.env_spec.on_host or getattr(self, "actor_backend", "threads") == "ray")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the fields (an env object is written as its class name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not isinstance(out["env"], str):
            out["env"] = f"object:{type(out['env']).__module__}.{type(out['env']).__qualname__}"
        if "torso" in out and callable(out["torso"]):  # its import path (importable when top-level)
            from tianji_jax.nets.networks import torso_path

            out["torso"] = torso_path(out["torso"])
        out["hidden_sizes"] = list(out["hidden_sizes"])
        return out
