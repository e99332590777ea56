"""A config as a run directory stores it: rebuilt from ``config.json`` (:func:`config_from_dict`,
:func:`load_config`) through the algorithm registry, refusing to import code the stored config
names (a user torso) unless the caller trusts it (:class:`UntrustedCodeError`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tianji_jax.algos.config_base import AgentConfig

__all__ = ["UntrustedCodeError", "code_named_in", "config_from_dict", "load_config"]


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


def config_from_dict(data: dict[str, Any], *, trust_code: bool = False) -> "AgentConfig":
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
        A validated config of the registered algorithm (:class:`~tianji_jax.config.PPOConfig`, ...).

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


def load_config(run_dir: Any, *, trust_code: bool = False) -> "AgentConfig":
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
