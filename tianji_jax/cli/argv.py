"""Command-line argument rewriting and checks shared by ``tianji train``: values users write that the
configs accept but the parser would not (``--total-env-steps 1e6`` for an int option), and one-line
errors for bad values of choice flags (``Literal[...]`` and ``bool`` fields) before the parser would
print its multi-line box."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal, Union

__all__ = ["flag_value", "algo_of", "whole_floats_to_ints", "choice_flags", "check_choices", "check_ints", "check_foreign_flags"]


def flag_value(argv: list[str], flag: str, default: str | None) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag X`` or ``--flag=X``; the last one wins)."""
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def algo_of(argv: list[str]) -> str:
    """The value of ``--algo`` in ``argv`` (``--algo X`` or ``--algo=X``; the last one wins), default 'ppo'."""
    return flag_value(argv, "--algo", "ppo")


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


def _choices_of(tp: Any) -> tuple[str, ...] | None:
    """The values the parser accepts for a field of type ``tp``, spelled as on the command line, if
    it is a choice type: ``bool`` (``'True'``, ``'False'``), ``Literal[...]``, or a union of those
    and ``None`` (``'None'``); else None."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if tp is bool:
        return ("True", "False")
    if typing.get_origin(tp) is Literal:
        return tuple(str(v) for v in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType):
        out: list[str] = []
        for arg in typing.get_args(tp):
            sub = ("None",) if arg is type(None) else _choices_of(arg)
            if sub is None:
                return None
            out += [c for c in sub if c not in out]
        return tuple(out)
    return None


def _walk_fields(cls: type, visit: Any) -> None:
    """Call ``visit(field, type)`` for every field of the argument dataclass ``cls``, nested
    dataclass fields flattened (as ``tyro.conf.OmitArgPrefixes`` does)."""

    def walk(c: type) -> None:
        try:
            hints = typing.get_type_hints(c, include_extras=True)
        except Exception:  # noqa: BLE001 - unresolvable annotations (another package's config): the parser decides
            return
        for f in dataclasses.fields(c):
            tp = hints.get(f.name, f.type)
            inner = tp
            while typing.get_origin(inner) is Annotated:
                inner = typing.get_args(inner)[0]
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                walk(inner)
                continue
            visit(f, tp)

    walk(cls)


def choice_flags(cls: type) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """The choice flags of the argument dataclass ``cls`` (nested dataclass fields flattened, as
    ``tyro.conf.OmitArgPrefixes`` does): ``{flag: (canonical flag, field name, allowed values)}``,
    each field under both spellings (``--double-q`` and ``--double_q``)."""
    flags: dict[str, tuple[str, str, tuple[str, ...]]] = {}

    def visit(f: dataclasses.Field, tp: Any) -> None:
        allowed = _choices_of(tp)
        if allowed:
            canonical = f"--{f.name.replace('_', '-')}"
            flags[canonical] = flags[f"--{f.name}"] = (canonical, f.name, allowed)

    _walk_fields(cls, visit)
    return flags


def check_ints(argv: list[str], cls: type) -> None:
    """Check the values of the int options of ``cls`` (fields typed ``int`` or ``int | None``,
    nested dataclasses flattened) in ``argv`` (after :func:`whole_floats_to_ints`), so that
    ``--burn-in-steps 1.5`` is one line, not the parser's box.

    Raises:
        ValueError: e.g. ``--burn-in-steps: '1.5' is not an integer; allowed: whole numbers such as
            2 (or 2.0)``.
    """
    if "-h" in argv or "--help" in argv:
        return
    flags: dict[str, tuple[str, bool]] = {}

    def visit(f: dataclasses.Field, tp: Any) -> None:
        while typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
        optional = typing.get_origin(tp) in (Union, types.UnionType) and set(typing.get_args(tp)) == {int, type(None)}
        if tp is int or optional:
            canonical = f"--{f.name.replace('_', '-')}"
            flags[canonical] = flags[f"--{f.name}"] = (canonical, optional)

    _walk_fields(cls, visit)
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag not in flags:
            continue
        if not eq:
            if i + 1 >= len(argv):
                continue  # the parser reports a missing value
            value = argv[i + 1]
        canonical, optional = flags[flag]
        if optional and value == "None":
            continue
        try:
            int(value)
        except ValueError:
            raise ValueError(f"{canonical}: {value!r} is not an integer; allowed: whole numbers such as 2 (or 2.0)"
                             + (" or None" if optional else "")) from None


def check_foreign_flags(argv: list[str], algo: str, cls: type) -> None:
    """Refuse, in one line, an option that ``algo``'s argument dataclass ``cls`` lacks but another
    registered algorithm's config has (``tianji train --algo dqn --recurrent lstm``), naming the
    algorithms that take it and, where the capability table gives one
    (:func:`~tianji_jax.algos.capabilities.field_reason`), why ``algo`` does not. Other unknown options
    are left to the parser.

    Raises:
        ValueError: such an option.
    """
    from tianji_jax.algos.registry import algorithm_names, get_algorithm
    from tianji_jax.algos.capabilities import field_reason

    own: set[str] = set()
    _walk_fields(cls, lambda f, tp: own.add(f.name))
    for arg in argv:
        if not arg.startswith("--"):
            continue
        name = arg[2:].partition("=")[0].replace("-", "_")
        if name in own:
            continue
        takers = []
        for other in algorithm_names():
            try:
                fields = {f.name for f in dataclasses.fields(get_algorithm(other).config_cls)}
            except Exception:  # noqa: BLE001 - another package's broken registration: its own error comes later
                continue
            if other != algo and name in fields:
                takers.append(other)
        if takers:
            why = field_reason(algo, name)
            raise ValueError(f"--{name.replace('_', '-')} is not an option of --algo {algo} (it is one of "
                             f"{', '.join(takers)})" + (f": {why}" if why else ""))


def check_choices(argv: list[str], cls: type) -> None:
    """Check the values of the choice flags of ``cls`` (:func:`choice_flags`) in ``argv``
    (``--flag X`` or ``--flag=X``), so that a bad one is one line, not the parser's box.

    Raises:
        ValueError: one line naming the flag, the value and the allowed values, e.g. ``--distributional:
            'foo' is not one of 'none', 'c51', 'qr'``, or that the flag got no value.
    """
    if "-h" in argv or "--help" in argv:
        return  # the help wins, as in the parser
    flags = choice_flags(cls)
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag not in flags:
            continue
        canonical, _, allowed = flags[flag]
        one_of = ", ".join(repr(a) for a in allowed)
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ValueError(f"{canonical}: no value given; allowed: one of {one_of}")
            value = argv[i + 1]
        if value not in allowed:
            raise ValueError(f"{canonical}: {value!r} is not one of {one_of}")
