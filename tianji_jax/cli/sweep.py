"""``tianji sweep``: :func:`tianji_jax.sweep` from the command line.

    tianji sweep --algo ppo --grid learning_rate=2.5e-4,1e-3 --grid ent_coef=0,0.01 --seeds 0,1,2 \\
        --out sweep.csv --total-env-steps 100000

``--grid NAME=V1,V2,...`` (repeatable) names a traced hyper-parameter of the algorithm and its
values; ``--seeds`` the run seeds (comma-separated, default: the config's ``--seed``, 0); ``--out`` the CSV of the results
table (one row per member; default ``sweep.csv``); every other option is a field of the
algorithm's config, as for ``tianji train`` (``tianji sweep --algo NAME --help`` lists them).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Annotated

import tyro

from tianji_jax.algos.registry import get_algorithm
from tianji_jax.algos.capabilities import UnsupportedCell
from tianji_jax.cli.argv import check_choices, check_foreign_flags, check_ints, whole_floats_to_ints

__all__ = ["sweep_main"]

_OWN = ("--grid", "--seeds", "--out", "--algo")


def _split(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``(own options -> their values in order, the rest)``; ``--flag X`` and ``--flag=X`` forms.

    Raises:
        ValueError: an own option without a value.
    """
    own: dict[str, list[str]] = {k: [] for k in _OWN}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag = arg.split("=", 1)[0]
        if flag in own:
            if "=" in arg:
                own[flag].append(arg.split("=", 1)[1])
            elif i + 1 < len(argv):
                own[flag].append(argv[i + 1])
                i += 1
            else:
                raise ValueError(f"{flag} needs a value")
        else:
            rest.append(arg)
        i += 1
    return own, rest


def _number(name: str, text: str) -> float | int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--grid {name}: {text!r} is not a number") from None
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _grid(specs: list[str], numeric: tuple[str, ...]) -> dict[str, list[float | int | str]]:
    """``["lr=1e-3,3e-4", ...]`` -> ``{"lr": [0.001, 0.0003]}``: the values of the ``numeric``
    names (the algorithm's traced hyper-parameters) parsed as numbers; any other name's values
    stay text, for :func:`~tianji_jax.sweep.sweep` to refuse the name itself in one line.

    Raises:
        ValueError: a spec without ``=``, a repeated name or a traced value that is not a number.
    """
    grid: dict[str, list[float | int]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or not name or not values:
            raise ValueError(f"--grid {spec!r}: expected NAME=V1,V2,... (e.g. --grid learning_rate=1e-4,3e-4)")
        if name in grid:
            raise ValueError(f"--grid {name} is given twice; put all its values in one --grid {name}=V1,V2")
        grid[name] = [_number(name, v) if name in numeric else v for v in values.split(",")]
    return grid


def _seeds(specs: list[str]) -> list[int]:
    seeds = []
    for spec in specs or ["0"]:
        for text in spec.split(","):
            try:
                seeds.append(int(text))
            except ValueError:
                raise ValueError(f"--seeds: {text!r} is not an integer (e.g. --seeds 0,1,2)") from None
    return seeds


def _writable(out: Path) -> Path:
    """``out`` once its directory exists (created as ``tianji plot`` does) and can be written, checked
    before anything trains.

    Raises:
        ValueError: one line, when ``out`` is a directory or its directory cannot be made or written.
    """
    if out.is_dir():
        raise ValueError(f"--out {out}: is a directory; allowed: a CSV file path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {out}: cannot create its directory ({err.strerror})") from None
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"--out {out}: not writable")
    return out


def sweep_main(argv: list[str]) -> int:
    """Run ``tianji sweep`` with ``argv``; returns the exit status (0 ok, 2 bad usage or config)."""
    argv = whole_floats_to_ints(argv)
    try:
        own, rest = _split(argv)
        algo = own["--algo"][-1] if own["--algo"] else "ppo"
        config_cls = get_algorithm(algo).config_cls
        help_wanted = "-h" in rest or "--help" in rest
        if not own["--grid"] and not help_wanted:
            raise ValueError("--grid NAME=V1,V2,... is required (a traced hyper-parameter and its values)")
        args_type = dataclasses.make_dataclass(
            "SweepArgs", [("config", Annotated[config_cls, tyro.conf.arg(name="")])], frozen=True,
            namespace={"__doc__": f"Train a grid of {algo}'s traced hyper-parameters x seeds in one compiled "
                                  "program (options: --grid NAME=V1,V2 (repeatable), --seeds 0,1,2, --out CSV, "
                                  "--algo NAME; the rest below are the config's fields)."})
        check_foreign_flags(rest, algo, args_type)  # another algorithm's option: one line, with why
        check_choices(rest, args_type)  # a bad choice (Literal or bool flag): one line, not tyro's box
        check_ints(rest, args_type)  # a non-integer value of an int option: one line
        args = tyro.cli(args_type, args=rest, prog=f"tianji sweep --algo {algo}",
                        config=(tyro.conf.OmitArgPrefixes, tyro.conf.FlagConversionOff))
        grid = _grid(own["--grid"], get_algorithm(algo).traced_hyperparameters)
        seeds = _seeds(own["--seeds"]) if own["--seeds"] else None  # None: the config's --seed
        if seeds is not None and any(a == "--seed" or a.startswith("--seed=") for a in rest):
            raise ValueError("--seed and --seeds are both given; use --seeds S1,S2,... alone for several seeds")
        out = _writable(Path(own["--out"][-1] if own["--out"] else "sweep.csv"))
        from tianji_jax.sweep import sweep

        result = sweep(args.config, grid, seeds, progress=True)
    except (ValueError, TypeError, MemoryError) as err:
        msg = str(err)
        if isinstance(err, UnsupportedCell) and err.cell.env != "gymnax" and err.field == "runtime":
            # the config's advice (runtime='async') does not apply to sweeps
            msg = msg.split("; allowed")[0] + "; sweep trains in the Anakin runtime only: allowed: a device env " \
                  "(gymnax, a JAX suite, brax)"
        print(f"tianji sweep: error: {msg}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help (0) or a flag tyro cannot parse (2)
        return exc.code if isinstance(exc.code, int) else 2
    result.to_csv(out)
    for row in result.table():
        print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    n = len(result.members)
    print(f"tianji sweep: {n} member{'s' * (n != 1)} in {result.wall_s:.1f} s; table written to {out}", file=sys.stderr)
    return 0
