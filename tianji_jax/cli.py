"""The ``tianji`` command: ``tianji train`` over the same config dataclasses as the Python API.

Every field of :class:`~tianji_jax.config.PPOConfig` is a flag (``--total-env-steps``,
``--num-envs``, ...) documented in ``tianji train --help``. ``--algo dqn`` switches to
:class:`~tianji_jax.config.DQNConfig`'s fields (``tianji train --algo dqn --help``): the value of
``--algo`` is read from the command line first and picks the argument dataclass tyro parses.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from tianji_jax.config import DQNConfig, PPOConfig

__all__ = ["main", "TrainArgs", "DQNTrainArgs"]

_USAGE = """usage: tianji {train} ...

commands:
  train   train an agent (tianji train --help for every option)
"""


@dataclass(frozen=True)
class TrainArgs:
    """Train an agent and write its run directory (config.json, provenance.json, metrics.csv,
    final_params/)."""

    config: Annotated[PPOConfig, tyro.conf.arg(name="")]
    algo: Literal["ppo", "dqn"] = "ppo"
    """Algorithm: 'ppo' (the options listed here) or 'dqn' (its options: tianji train --algo dqn --help)."""
    run_dir: Path | None = None
    """Run directory; default runs/<algo>-<env>-s<seed>-<UTC time>."""
    progress: bool = True
    """Show a progress bar on stderr."""


@dataclass(frozen=True)
class DQNTrainArgs:
    """Train a DQN-family agent (Anakin, gymnax, Discrete actions) and write its run directory
    (config.json, provenance.json, metrics.csv, final_params/)."""

    config: Annotated[DQNConfig, tyro.conf.arg(name="")]
    algo: Literal["dqn"] = "dqn"
    """Algorithm ('tianji train --help' for PPO's options)."""
    run_dir: Path | None = None
    """Run directory; default runs/<algo>-<env>-s<seed>-<UTC time>."""
    progress: bool = True
    """Show a progress bar on stderr."""


def _algo_of(argv: list[str]) -> str:
    """The value of ``--algo`` in ``argv`` (``--algo X`` or ``--algo=X``; the last one wins), default 'ppo'."""
    algo = "ppo"
    for i, arg in enumerate(argv):
        if arg == "--algo" and i + 1 < len(argv):
            algo = argv[i + 1]
        elif arg.startswith("--algo="):
            algo = arg.split("=", 1)[1]
    return algo


def _default_run_dir(args: TrainArgs | DQNTrainArgs) -> Path:
    env = args.config.env_spec.name.replace("/", "_")
    return Path("runs") / f"{args.algo}-{env}-s{args.config.seed}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def _train(argv: list[str]) -> int:
    try:
        args_type = DQNTrainArgs if _algo_of(argv) == "dqn" else TrainArgs
        args = tyro.cli(args_type, args=argv, prog="tianji train",
                        config=(tyro.conf.OmitArgPrefixes, tyro.conf.FlagConversionOff))
    except (ValueError, TypeError, MemoryError) as err:  # config validation: one clear line, no traceback
        print(f"tianji train: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help (0) or a flag tyro cannot parse (2)
        return exc.code if isinstance(exc.code, int) else 2
    from tianji_jax.training import train

    config = args.config
    run_dir = args.run_dir or _default_run_dir(args)
    print(config.describe(), flush=True)
    print(f"run directory: {run_dir}", flush=True)
    try:
        result = train(config, run_dir=run_dir, progress=args.progress)
    except FileExistsError as err:
        print(f"tianji train: error: {err}", file=sys.stderr)
        return 2
    curve = result.curve
    last = {k: float(v[-1]) for k, v in curve.items() if len(v)}
    print(f"done: {int(last.get('env_steps', 0))} env steps in {last.get('wall_time_s', 0):.1f} s; "
          f"episode_return_mean {last.get('episode_return_mean', float('nan')):.1f}, "
          f"eval_return_mean {last.get('eval_return_mean', float('nan')):.1f}"
          + (" (stopped at --stop-at-return)" if result.stopped_early else ""), flush=True)
    return 0


def _two_cpu_devices() -> None:
    """Give the CPU platform 2 devices so async actors and learner can sit on different devices
    (design.md section 3). Only possible before JAX's backend starts; otherwise left as is."""
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", 2)
    except RuntimeError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tianji``. Returns the process exit status (0 ok, 2 bad usage/config)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _two_cpu_devices()
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return _train(rest)
    print(f"tianji: error: unknown command {command!r}; allowed: train\n{_USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
