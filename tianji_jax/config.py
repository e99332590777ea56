"""Frozen, validated run configurations.

A config is validated once, in ``__post_init__``, before any environment is stepped or any
function is compiled. Every bad value raises ``ValueError`` (or ``TypeError`` for a value of the
wrong type) naming the field, the value given and what is allowed.

The algorithm configs live with their algorithm (:mod:`tianji_jax.algos.ppo.config`,
:mod:`tianji_jax.algos.dqn.config`) and are re-exported here; the checks they share are in
:mod:`tianji_jax.config_base` and :mod:`tianji_jax.config_checks`. This module adds the
checkpointing settings and loading a config back from a run directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tianji_jax.algos.dqn.config import DQNConfig
from tianji_jax.algos.ppo.config import PPOConfig
from tianji_jax.algos.pqn.config import PQNConfig
from tianji_jax.algos.sac.config import SACConfig
from tianji_jax.config_base import _check_bool, _check_int, _plain_numbers

__all__ = ["PPOConfig", "PQNConfig", "DQNConfig", "SACConfig"]


# ================================================================================================
# Checkpointing settings and loading a config back from a run directory (issue 5)
# ================================================================================================
@dataclass(frozen=True)
class CheckpointConfig:
    """How :func:`tianji_jax.train` checkpoints a run into ``RUN_DIR/checkpoints/`` (orbax).

    Kept apart from :class:`PPOConfig` / :class:`DQNConfig` because none of it changes what is
    computed: it never enters compile keys and may differ between a run and its resume.

    Raises:
        ValueError / TypeError: a field outside its allowed range (the message names the field).
    """

    checkpoint_every_env_steps: int | None = None
    """Save a checkpoint after the first chunk that reaches each multiple of this many env steps
    (rounded up to whole chunks); None: after every chunk (every ``eval_every_env_steps``). A final
    checkpoint is always saved."""
    keep_checkpoints: int = 2
    """Keep the latest this many checkpoints (>= 1; they are what a resume continues from)."""
    keep_best_checkpoints: int = 1
    """Also keep the best this many by ``eval_return_mean`` (>= 0); never at the expense of the latest."""
    checkpoint_replay: bool = True
    """Replay algorithms (DQN family, SAC): save the replay buffer's contents (needed to resume;
    recorded in the checkpoint's metadata). Without it a checkpoint serves evaluation and ``load`` but not ``--resume``."""
    async_checkpointing: bool = True
    """Write checkpoints in a background thread (the host loop only waits for the device-to-host copy)."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        if self.checkpoint_every_env_steps is not None:
            _check_int("checkpoint_every_env_steps", self.checkpoint_every_env_steps, minimum=1)
        _check_int("keep_checkpoints", self.keep_checkpoints, minimum=1)
        _check_int("keep_best_checkpoints", self.keep_best_checkpoints, minimum=0)
        _check_bool("checkpoint_replay", self.checkpoint_replay)
        _check_bool("async_checkpointing", self.async_checkpointing)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the fields."""
        return dataclasses.asdict(self)



class UntrustedCodeError(ValueError):
    """A stored config names code to import and call (a user torso ``"package.module:factory"``)
    and loading it was not allowed (``trust_code=False``, the default of every loader)."""


def code_named_in(data: dict[str, Any]) -> dict[str, str]:
    """The fields of a stored config (``config.json``'s dict) that name code which rebuilding the
    config would import and call: ``{"torso": "package.module:factory"}`` for a user torso;
    ``{}`` when the config uses only built-in parts (a torso name such as ``"auto"`` or
    ``"nature_cnn"``; the algorithm is a registered name, and env ids name registered envs)."""
    torso = data.get("torso") if isinstance(data, dict) else None
    return {"torso": torso} if isinstance(torso, str) and ":" in torso else {}


def config_from_dict(data: dict[str, Any], *, trust_code: bool = False) -> "PPOConfig | DQNConfig":
    """Rebuild a config from the dict written to ``config.json`` (``to_dict()`` plus ``"algo"``;
    ``derived`` and ``description`` are ignored).

    A stored config may name code (a user torso's import path, :func:`code_named_in`); rebuilding
    it imports that module and calls the factory, so a run directory received from someone else
    could run any importable callable. That needs ``trust_code=True``; built-in torsos and
    registered algorithms need nothing.

    Args:
        data: the dict; ``data["algo"]`` is a registered algorithm name (default ``"ppo"`` when absent).
        trust_code: allow importing the code the dict names (see above).

    Returns:
        A validated :class:`PPOConfig` or :class:`DQNConfig`.

    Raises:
        UntrustedCodeError: (a ValueError) the dict names code and ``trust_code`` is False; one line
            naming the field, the import path and the keyword / flag that allows it.
        ValueError: unknown ``algo``, unknown fields, or an env that was an object (written as
            ``"object:module.Class"``; pass the config yourself for such runs), or any validation error.
        TypeError: ``data`` is not a dict, or a field of the wrong type.
    """
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict (the contents of config.json), got {type(data).__name__}")
    from tianji_jax.algos.registry import get_algorithm

    cls = get_algorithm(data.get("algo", "ppo")).config_cls  # ValueError naming the registered names
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in data.items() if k not in ("algo", "derived", "description")}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"config fields {unknown} are not fields of {cls.__name__} (written by another version?)")
    named = code_named_in(fields)
    if named and trust_code is not True:
        field, path = next(iter(named.items()))
        raise UntrustedCodeError(
            f"{field}={path!r} names code that loading this run would import and call; allowed only with your "
            "consent: trust_code=True (tianji_jax.load / train / load_config), --trust-code (tianji eval), "
            "--trust-code True (tianji train --resume), if you trust where the run came from")
    env = fields.get("env")
    if isinstance(env, str) and env.startswith("object:"):
        raise ValueError(f"env={env!r} was an environment object, which config.json cannot hold; "
                         "build the config yourself and pass it (tianji_jax.load(run_dir, config=config), "
                         "train(config, run_dir=..., resume=True))")
    if isinstance(fields.get("hidden_sizes"), list):
        fields["hidden_sizes"] = tuple(fields["hidden_sizes"])
    return cls(**fields)


def load_config(run_dir: Any, *, trust_code: bool = False) -> "PPOConfig | DQNConfig":
    """The config of the run in ``run_dir`` (from its ``config.json``).

    Args:
        run_dir: the run directory.
        trust_code: allow importing code the config names (a user torso; :func:`config_from_dict`).

    Raises:
        FileNotFoundError: ``run_dir`` has no ``config.json``.
        UntrustedCodeError: the config names code and ``trust_code`` is False.
        ValueError: as :func:`config_from_dict`, or ``config.json`` is not valid JSON.
    """
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory: no config.json in it")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    return config_from_dict(data, trust_code=trust_code)


__all__ += ["CheckpointConfig", "UntrustedCodeError", "code_named_in", "config_from_dict", "load_config"]
