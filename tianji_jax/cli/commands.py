"""The ``tianji`` command: ``tianji train`` over the same config dataclasses as the Python API,
``tianji eval RUN_DIR`` and ``tianji plot RUN_DIR [RUN_DIR ...]``.

Every field of :class:`~tianji_jax.config.PPOConfig` is a flag (``--total-env-steps``,
``--num-envs``, ...) documented in ``tianji train --help``. ``--algo dqn`` switches to
:class:`~tianji_jax.config.DQNConfig`'s fields (``tianji train --algo dqn --help``): the value of
``--algo`` is read from the command line first and picks the argument dataclass tyro parses.
"""

from __future__ import annotations

import re

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from tianji_jax.algos.registry import algorithm_for, algorithm_names, get_algorithm
from tianji_jax.cli.argv import (algo_of, check_choices, check_foreign_flags, check_ints, flag_value,
                                 whole_floats_to_ints)
from tianji_jax.config import CheckpointConfig, DQNConfig, PPOConfig
from tianji_jax.run.run_status import SigintLatch

__all__ = ["main", "TrainArgs", "DQNTrainArgs", "EvalArgs", "PlotArgs"]

_USAGE = """usage: tianji {train,sweep,eval,plot} ...

commands:
  train   train an agent, or continue one with --resume RUN_DIR (tianji train --help for every option)
  sweep   train a grid of traced hyper-parameters x seeds in one compiled program (tianji sweep --help)
  eval    evaluate a run's latest checkpoint with the deterministic policy (tianji eval --help)
  plot    draw return curves of one or more runs into a PNG (tianji plot --help)
"""
_COMMANDS = ("train", "sweep", "eval", "plot")


@dataclass(frozen=True, kw_only=True)
class _RunArgs:
    """The options of ``tianji train`` besides the algorithm's config (shared by PPO and DQN)."""

    run_dir: Path | None = None
    """Run directory; default runs/<algo>-<env>-s<seed>-<UTC time>."""
    progress: bool = True
    """Show a progress bar on stderr."""
    resume: Path | None = None
    """Continue the run in this directory from its latest complete checkpoint; the other options
    default to that run's config, and changing one that alters the computation is an error."""
    checkpoint: Annotated[CheckpointConfig, tyro.conf.arg(name="")] = CheckpointConfig()
    tensorboard: bool = True
    """Also write every metrics.csv column to TensorBoard event files in RUN_DIR/tensorboard."""
    wandb: bool = False
    """Also log to Weights & Biases (needs the optional wandb package)."""
    profile: bool = False
    """Write a jax.profiler trace and timers.json (seconds per phase: compiled chunks, evaluation,
    checkpoints, logging, compilation, async actor/learner phases) to RUN_DIR/profile/; needs --run-dir."""
    trust_code: bool = False
    """With --resume: allow importing the code the run's config.json names (a user torso
    'package.module:factory'); a run that names code is refused without it."""


@dataclass(frozen=True, kw_only=True)
class TrainArgs(_RunArgs):
    """Train an agent and write its run directory (config.json, provenance.json, metrics.csv,
    final_params/)."""

    config: Annotated[PPOConfig, tyro.conf.arg(name="")]
    algo: str = "ppo"
    """Algorithm: a registered name (tianji_jax.algos.registry): 'ppo' (the options listed here), 'dqn'
    (its options: tianji train --algo dqn --help), or one registered by another package."""


@dataclass(frozen=True, kw_only=True)
class DQNTrainArgs(_RunArgs):
    """Train a DQN-family agent (Discrete actions; Anakin on gymnax, or the async runtime) and write
    its run directory (config.json, provenance.json, metrics.csv, final_params/)."""

    config: Annotated[DQNConfig, tyro.conf.arg(name="")]
    algo: Literal["dqn"] = "dqn"
    """Algorithm ('tianji train --help' for PPO's options)."""


def _args_type(algo: str) -> type:
    """The argument dataclass tyro parses for ``--algo algo``: PPO's and DQN's are written out
    above; any other registered algorithm gets the run options plus its config's fields.

    Raises:
        ValueError: ``algo`` is not registered (the message lists the registered names).
    """
    spec = get_algorithm(algo)
    if algo == "ppo":  # the default: its --algo lists every registered name as a choice, with its description
        names = algorithm_names()
        described = "; ".join(f"'{n}': {get_algorithm(n).description or 'registered by another package'}"
                              for n in names)
        help_text = (f"Algorithm (a registered name): {described}. The options listed here are PPO's; another "
                     "algorithm's: tianji train --algo NAME --help.")
        return dataclasses.make_dataclass(
            "TrainArgs", [("algo", Annotated[Literal[names], tyro.conf.arg(help=help_text)],  # type: ignore[valid-type]
                           dataclasses.field(default="ppo"))],
            bases=(TrainArgs,), frozen=True, kw_only=True, namespace={"__doc__": TrainArgs.__doc__})
    if algo in _BUILT_IN_ARGS:
        return _BUILT_IN_ARGS[algo]
    return dataclasses.make_dataclass(
        f"{algo.title()}TrainArgs", [("config", Annotated[spec.config_cls, tyro.conf.arg(name="")]),
                                     ("algo", Literal[algo], dataclasses.field(default=algo))],  # type: ignore[valid-type]
        bases=(_RunArgs,), frozen=True, kw_only=True)


_BUILT_IN_ARGS = {"ppo": TrainArgs, "dqn": DQNTrainArgs}


def _default_run_dir(args: TrainArgs | DQNTrainArgs) -> Path:
    env = re.sub(r"[^A-Za-z0-9._-]+", "_", args.config.env_spec.name)  # wrapper ids hold | = , characters
    return Path("runs") / f"{args.algo}-{env}-s{args.config.seed}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def _multi_host(argv: list[str]) -> int | None:
    """``--num-processes P > 1``: outside the training child, run it under the supervisor
    (:func:`tianji_jax.runtime.layouts.distributed.supervise`) and return its status; inside it, join the
    jax.distributed job before JAX starts and return None (training follows). Bad values: 2."""
    import os

    from tianji_jax.runtime.layouts import distributed as dist

    try:
        if flag_value(argv, "--num-processes", None) is not None:
            import dataclasses

            from tianji_jax.algos.registry import get_algorithm

            algo = algo_of(argv)
            try:
                names = {f.name for f in dataclasses.fields(get_algorithm(algo).config_cls)}
            except ValueError:
                names = {"num_processes"}  # an unknown --algo is reported by the parser
            if "num_processes" not in names:
                raise ValueError(f"--num-processes: --algo {algo} has no multi-host learners yet (the capability "
                                 "table, docs/concepts/capabilities.md); allowed: leave --num-processes out (one process)")
        raw = {f: flag_value(argv, f"--{f}", d) for f, d in
               (("num-processes", "1"), ("process-id", "0"), ("heartbeat-timeout-s", "60"), ("coordinator", None))}
        ints = {}
        for f in ("num-processes", "process-id", "heartbeat-timeout-s"):
            try:
                ints[f] = int(raw[f])
            except ValueError:
                raise ValueError(f"--{f} must be an int, got {raw[f]!r}") from None
        if ints["num-processes"] <= 1:
            return None
        if not 0 <= ints["process-id"] < ints["num-processes"]:
            raise ValueError(f"--process-id must be in 0..{ints['num-processes'] - 1}, got {ints['process-id']}")
        if raw["coordinator"] in (None, "None"):
            raise ValueError(f"--num-processes {ints['num-processes']} needs --coordinator HOST:PORT (process 0's "
                             "address)")
        dist.check_coordinator(raw["coordinator"])
        if os.environ.get(dist.CHILD_ENV) != "1":
            # validate every flag here, before the job is joined: a process waiting for its peers
            # would otherwise report a bad value only once all of them have joined. The supervisor
            # never computes; any accelerator stays free for the training child.
            import jax

            jax.config.update("jax_platforms", "cpu")
            parsed = _parse_train_args(argv)
            if isinstance(parsed, int):
                return parsed
            return dist.supervise(argv, num_processes=ints["num-processes"], process_id=ints["process-id"],
                                  heartbeat_timeout_s=ints["heartbeat-timeout-s"])
        dist.initialize(raw["coordinator"], ints["num-processes"], ints["process-id"],
                        heartbeat_timeout_s=ints["heartbeat-timeout-s"])
    except (ValueError, RuntimeError) as err:
        print(f"tianji train: error: {err}", file=sys.stderr)
        return 2
    return None


def _parse_train_args(argv: list[str]) -> TrainArgs | DQNTrainArgs | int:
    """The parsed ``tianji train`` arguments (the config validated), or the exit status after
    printing the error (2) or the help (0)."""
    resume_dir = flag_value(argv, "--resume", None)
    try:
        default = None
        if resume_dir is not None and resume_dir != "None":  # the run's config is the default of every option
            from tianji_jax.config import load_config

            trusted = flag_value(argv, "--trust-code", None) or flag_value(argv, "--trust_code", "False")
            bare = argv[-1] in ("--trust-code", "--trust_code")
            if bare or trusted not in ("True", "False"):
                raise ValueError("--trust-code takes a value here: --trust-code True or --trust-code False, got "
                                 + ("nothing" if bare else repr(trusted)))
            stored = load_config(resume_dir, trust_code=trusted == "True")
            algo = algorithm_for(stored).name
            if flag_value(argv, "--algo", algo) != algo:
                raise ValueError(f"--algo {algo_of(argv)}: the run in {resume_dir!r} is a {algo!r} run")
            procs = getattr(stored, "num_processes", 1)
            given = flag_value(argv, "--num-processes", None) or flag_value(argv, "--num_processes", None)
            if given is not None and given != str(procs):  # before the stored coordinator's own check
                raise ValueError(f"--num-processes {given}: the run in {resume_dir!r} ran with num_processes={procs}; "
                                 "a resume relaunches the same number of processes (allowed: "
                                 f"--num-processes {procs})")
            args_type = _args_type(algo)
            default = args_type(config=stored, algo=algo)
        else:
            args_type = _args_type(algo_of(argv))
            check_foreign_flags(argv, algo_of(argv), args_type)  # another algorithm's option: one line, with why
        check_choices(argv, args_type)  # a bad choice (Literal or bool flag): one line, not tyro's box
        check_ints(argv, args_type)  # a non-integer value of an int option: one line
        args = tyro.cli(args_type, args=argv, prog="tianji train", default=default,
                        config=(tyro.conf.OmitArgPrefixes, tyro.conf.FlagConversionOff))
        if default is not None:  # a resume: a changed computation is refused before the run is described
            from tianji_jax.checkpoint.core import check_compatible

            check_compatible({**stored.to_dict(), "algo": algo}, {**args.config.to_dict(), "algo": algo})
        return args
    except (ValueError, TypeError, MemoryError, FileNotFoundError) as err:  # one clear line, no traceback
        print(f"tianji train: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help (0) or a flag tyro cannot parse (2)
        return exc.code if isinstance(exc.code, int) else 2


def _train(argv: list[str]) -> int:
    argv = whole_floats_to_ints(argv)
    if "--help" not in argv and "-h" not in argv:
        status = _multi_host(argv)
        if status is not None:
            return status
    args = _parse_train_args(argv)
    if isinstance(args, int):
        return args
    from tianji_jax.checkpoint.core import CheckpointError
    from tianji_jax.runtime.nonfinite import NonFiniteError
    from tianji_jax.runtime.tianji.async_runtime import PeerStoppedError
    from tianji_jax.training import train

    config = args.config
    if args.resume is not None and args.run_dir is not None and Path(args.run_dir) != Path(args.resume):
        print(f"tianji train: error: --run-dir {args.run_dir} and --resume {args.resume} differ; a resumed run "
              "continues in its own directory", file=sys.stderr)
        return 2
    if args.profile and args.run_dir is None and args.resume is None:
        print("tianji train: error: --profile needs --run-dir (the trace and timers.json go to RUN_DIR/profile/)",
              file=sys.stderr)
        return 2
    run_dir = args.resume or args.run_dir or _default_run_dir(args)
    extras: dict = {}  # only what differs from train()'s defaults
    if args.resume is not None:
        extras["resume"] = True
    if args.checkpoint != CheckpointConfig():
        extras["checkpoint"] = args.checkpoint
    if not args.tensorboard:
        extras["tensorboard"] = False
    if args.wandb:
        extras["wandb"] = True
    if args.profile:
        extras["profile"] = True
    print(config.describe(), flush=True)
    print(f"{'resuming' if args.resume is not None else 'run directory'}: {run_dir}", flush=True)
    started = time.time()
    try:
        with SigintLatch() as latch:
            result = train(config, run_dir=run_dir, progress=args.progress, callback=latch.check, **extras)
    except (FileExistsError, NotADirectoryError, CheckpointError, ValueError, ImportError) as err:
        print(f"tianji train: error: {err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:  # the non-finite guard's stop: its message says what and where
        print(f"tianji train: error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, PeerStoppedError) as err:  # Ctrl-C (here or, multi-host, on another process)
        from tianji_jax.run.run_status import interrupt_message, resume_hint

        if args.resume is not None:  # a resume that fell back to an older checkpoint went on in a new directory
            from tianji_jax.checkpoint.fallback import continued_in

            run_dir = continued_in(run_dir, started) or run_dir
        message = interrupt_message(run_dir, *resume_hint(config, args.checkpoint))
        if isinstance(err, PeerStoppedError):
            message = message.replace("tianji train: interrupted; ", f"tianji train: stopped: {err}; ", 1)
        print(message, file=sys.stderr)
        return 130 if isinstance(err, KeyboardInterrupt) else _EXIT_PEER_STOPPED
    # train() printed the run's one summary line ("tianji_jax.train: done: ..." or "... nothing to do ...")
    if args.profile and not getattr(result, "already_finished", False):
        print(f"profile: {Path(run_dir) / 'profile'} (timers.json: seconds per phase; plugins/profile/: the "
              "jax.profiler trace for TensorBoard/XProf or Perfetto)", flush=True)
    return 0


@dataclass(frozen=True)
class EvalArgs:
    """Evaluate a run's checkpoint with the deterministic policy (argmax / mean action; DQN: greedy in
    Q) on separate envs; observation statistics are restored from the checkpoint and frozen. Prints
    the mean and std of the episodic return."""

    run_dir: tyro.conf.Positional[Path]
    """The run directory (written by tianji train)."""
    episodes: int = 10
    """Episodes to play (>= 1)."""
    seed: int = 0
    """Seed of the evaluation envs, in [0, 2**32)."""
    step: int | None = None
    """Env steps of the checkpoint to evaluate (a directory name under RUN_DIR/checkpoints); default: the latest."""
    trust_code: bool = False
    """Allow importing the code the run's config.json names (a user torso 'package.module:factory');
    a run that names code is refused without it."""
    json: bool = False
    """Print one JSON object instead of the sentence."""


@dataclass(frozen=True)
class PlotArgs:
    """Draw return against env steps and against wall time (one line per run) and, for async runs,
    the histogram of their policy lag; writes a PNG."""

    run_dirs: tyro.conf.Positional[tuple[Path, ...]]
    """One or more run directories."""
    out: Path | None = None
    """PNG to write; default RUN_DIR/plot.png of the first run."""


def _parse(cls, argv: list[str], prog: str):
    return tyro.cli(cls, args=argv, prog=prog)


def _eval(argv: list[str]) -> int:
    try:
        args = _parse(EvalArgs, argv, "tianji eval")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    import json
    import math

    import numpy as np

    from tianji_jax.checkpoint.core import CheckpointError
    from tianji_jax.training import evaluate, load

    try:
        if isinstance(args.episodes, bool) or args.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
        if not 0 <= args.seed < 2**32:
            raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}")
        run = load(args.run_dir, step=args.step, trust_code=args.trust_code)
        result = evaluate(run.config, run.state, num_episodes=args.episodes, seed=args.seed)
    except (CheckpointError, ValueError, TypeError) as err:
        print(f"tianji eval: error: {err}", file=sys.stderr)
        return 2
    returns = np.asarray(result["returns"], np.float64)
    out = {"run_dir": str(args.run_dir), "step": run.step, "episodes": args.episodes, "seed": args.seed,
           "return_mean": float(returns.mean()), "return_std": float(returns.std()),
           "length_mean": float(np.mean(result["lengths"]))}
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        print(f"{args.run_dir} at {run.step} env steps: return {out['return_mean']:.3f} +- {out['return_std']:.3f} "
              f"(mean +- std over {args.episodes} episodes, seed {args.seed}; mean length "
              f"{out['length_mean']:.1f})" + ("" if math.isfinite(out["return_mean"]) else " (non-finite)"),
              flush=True)
    return 0


def _plot(argv: list[str]) -> int:
    try:
        args = _parse(PlotArgs, argv, "tianji plot")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    from tianji_jax.run.plotting import plot_runs

    if not args.run_dirs:
        print("tianji plot: error: give one or more run directories: tianji plot RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        return 2
    out = args.out or args.run_dirs[0] / "plot.png"
    try:
        plot_runs(args.run_dirs, out)
    except (FileNotFoundError, ValueError, ImportError) as err:
        print(f"tianji plot: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}", flush=True)
    return 0


def _learner_layout(argv: list[str]) -> tuple[str, str]:
    """``(num_learner_devices, num_learner_groups)`` as strings: the flags' values, else (with
    ``--resume DIR``) the resumed run's ``config.json``, else ``"1"``."""
    import json

    saved: dict = {}
    resume = flag_value(argv, "--resume", None)
    if resume is not None:
        try:
            saved = json.loads((Path(resume) / "config.json").read_text())
        except (OSError, ValueError):
            saved = {}  # a missing or bad run directory is reported by the resume itself
    return tuple(flag_value(argv, f"--{name.replace('_', '-')}", str(saved.get(name, 1)))  # type: ignore[return-value]
                 for name in ("num_learner_devices", "num_learner_groups"))


def _two_cpu_devices(argv: list[str] | None = None) -> None:
    """Give the CPU platform enough devices for async actors and learners to sit on different ones
    (docs/runtime.md, "Placement"): 2, or ``num_learner_devices L`` x ``num_learner_groups G`` + 1
    when that is more (from the flags, whole floats such as ``2.0`` included, or from the run a
    ``--resume`` continues). Left alone when ``XLA_FLAGS`` already sets
    ``--xla_force_host_platform_device_count`` (the user's choice), and only possible before JAX's
    backend starts; otherwise left as is. Accelerators are unaffected."""
    import os

    import jax

    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    want = 2
    try:
        devices, groups = (float(v) for v in _learner_layout(argv or []))
        if devices.is_integer() and groups.is_integer():
            want = max(2, int(devices) * int(groups) + 1)
    except (TypeError, ValueError):
        pass  # a bad value is reported by the config's validation
    try:
        jax.config.update("jax_num_cpu_devices", want)
    except RuntimeError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tianji``. Returns the process exit status (0 ok, 2 bad usage/config)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _two_cpu_devices(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        import os

        from tianji_jax.runtime.layouts.distributed import CHILD_ENV

        if os.environ.get(CHILD_ENV) != "1":
            return _train(rest)
        # multi-host child: on failure exit at once, skipping jax's atexit shutdown barrier (it would
        # wait for peers that are waiting for this process inside a collective)
        try:
            status = _train(rest)
        except BaseException as exc:  # noqa: BLE001
            import traceback

            from tianji_jax.runtime.layouts.distributed import child_failed

            traceback.print_exc()
            sys.stderr.flush()
            status = child_failed(exc)
        if status != 0:
            sys.stdout.flush()
            sys.stderr.flush()
            if status in (2, 130, _EXIT_PEER_STOPPED):  # every process stops together: leave the job together
                from tianji_jax.runtime.layouts.distributed import leave_job

                leave_job()
            os._exit(status)
        return status
    if command == "sweep":
        from tianji_jax.cli.sweep import sweep_main

        return sweep_main(rest)
    if command == "eval":
        return _eval(rest)
    if command == "plot":
        return _plot(rest)
    print(f"tianji: error: unknown command {command!r}; allowed: {', '.join(_COMMANDS)}\n{_USAGE}",
          file=sys.stderr, end="")
    return 2


_EXIT_PEER_STOPPED = 4
"""``tianji train``'s status when another process of its multi-host job stopped the run."""


def console_main() -> None:
    """The ``tianji`` command: :func:`main`, then exit. After Ctrl-C (status 130) the process ends
    at once, without the interpreter's teardown, which joins every non-daemon thread: a library's
    background thread interrupted mid-task (orbax finalising a checkpoint) can block it forever.
    Everything tianji writes is closed by then; an unfinished checkpoint is a temporary directory
    that a resume skips. Output piped into a reader that stops early (``tianji train --help |
    head``) ends quietly (Python's recipe: stdout pointed at devnull, status 1)."""
    import os

    try:
        status = main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    if status == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(status)


if __name__ == "__main__":
    console_main()
