"""Command-line argument rewriting shared by ``tianji train``: values users write that the
configs accept but the parser would not (``--total-env-steps 1e6`` for an int option)."""

from __future__ import annotations

import dataclasses

__all__ = ["whole_floats_to_ints"]


def whole_floats_to_ints(argv: list[str]) -> list[str]:
    """``argv`` with the whole-number float values of int options written as ints (``--total-env-steps 1e6``
    -> ``1000000``), as the configs accept ``1e6`` for an int field (of any registered algorithm's
    config); other values are left to the parser."""
    from tianji_jax.algos.registry import algorithm_names, get_algorithm
    from tianji_jax.config import CheckpointConfig

    classes = [CheckpointConfig]
    for name in algorithm_names():
        try:
            classes.append(get_algorithm(name).config_cls)
        except Exception:  # noqa: BLE001 - another package's broken registration: its own error comes later
            pass
    names = {f.name for cls in classes for f in dataclasses.fields(cls) if f.type in ("int", "int | None")}
    flags = {f"--{n}" for n in names} | {f"--{n.replace('_', '-')}" for n in names}

    def whole(value: str) -> str:
        try:
            int(value)
            return value
        except ValueError:
            pass
        try:
            number = float(value)
        except ValueError:
            return value
        return str(int(number)) if number.is_integer() else value

    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag in flags and eq:
            out[i] = f"{flag}={whole(value)}"
        elif arg in flags and i + 1 < len(out):
            out[i + 1] = whole(out[i + 1])
    return out
