"""The line protocol between ``experiments/convergence.py`` and its runner scripts (stdlib only).

Each runner is started as ``<venv python> <runner>.py '<spec json>'`` in its own process (and its
own virtual environment for the peers) and reports on stdout, one JSON object per line:

- ``CONV_INFO {...}``: versions and the hyper-parameters actually used (once, before training);
- ``CONV_EVAL {"env_steps": int, "wall_s": float, "eval_s": float, "eval_return_mean": float}``
  after every evaluation: ``env_steps`` = training env steps taken so far (all envs), ``wall_s`` =
  seconds since the parent's clock read just before it started this process (so interpreter
  start-up, imports, JIT compilation and environment creation all count), ``eval_s`` = seconds
  spent in evaluations so far (included in ``wall_s``), ``eval_return_mean`` = mean undiscounted
  return of ``eval_episodes`` deterministic (greedy / mode-of-the-policy) episodes;
- ``CONV_DONE {...}``: the run finished its env-step budget;
- ``CONV_UNSUPPORTED {"reason": str}``: the system cannot run this row (then exit code 3);
- ``CONV_PROFILE {"startup_s", "process_s", "timers"}`` (tianji_jax, spec ``profile`` true only):
  seconds from ``t0`` to the start of training and to its end (the run stops at ``threshold``),
  and the run's ``timers.json`` (:mod:`tianji_jax.run.profiling`).

The spec (a JSON object) has ``algo`` ("ppo" | "dqn"), ``env`` ("CartPole-v1" | "LunarLander"),
``seed`` (int), ``eval_every`` (env steps between evaluations), ``eval_episodes`` (int), ``t0``
(the parent's ``time.time()`` just before it started the process) and runner-specific keys
(``mode`` for tianji_jax, ``threads`` for the torch peers, ``tmp_dir`` for Ray).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

UNSUPPORTED_EXIT = 3


def read_spec() -> dict[str, Any]:
    """The spec given as the only command-line argument."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} '<spec json>'")
    return json.loads(sys.argv[1])


def send(kind: str, payload: dict[str, Any]) -> None:
    """Print one protocol line ``<kind> <json>`` and flush."""
    print(f"{kind} {json.dumps(payload, default=str)}", flush=True)


class EvalLog:
    """Reports evaluations; ``timed()`` measures the seconds spent evaluating."""

    def __init__(self, spec: dict[str, Any]):
        self.t0 = float(spec["t0"])
        self.eval_s = 0.0
        self.count = 0

    def report(self, env_steps: int, returns: list[float] | float) -> None:
        """Send one ``CONV_EVAL`` line: the mean of ``returns`` at ``env_steps`` training env steps."""
        rs = returns if isinstance(returns, list) else [returns]
        mean = float(sum(float(r) for r in rs) / len(rs))
        self.count += 1
        send("CONV_EVAL", {"env_steps": int(env_steps), "wall_s": time.time() - self.t0,
                           "eval_s": self.eval_s, "eval_return_mean": mean})

    def add_eval_time(self, seconds: float) -> None:
        """Add ``seconds`` spent evaluating (reported, cumulative, as ``eval_s``)."""
        self.eval_s += float(seconds)


def unsupported(reason: str) -> None:
    """Report that this system cannot run the row, then exit with :data:`UNSUPPORTED_EXIT`."""
    send("CONV_UNSUPPORTED", {"reason": reason})
    raise SystemExit(UNSUPPORTED_EXIT)
