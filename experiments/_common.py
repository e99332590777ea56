"""Helpers shared by the experiments/ scripts: the recorded command, CSV, machine info, statistics.

Every figure in these benchmarks is a ratio against a baseline measured in the same run, median
of repeats; the machine has 2 CPU cores shared with other jobs, so absolute numbers drift.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

SHARED_NOTE = ("Machine: 2 CPU cores **shared with other engineers' jobs** (load average recorded in "
               "machine.json); absolute rates drift with the neighbours' load, so read the ratios, each "
               "against a baseline measured in the same repeat of the same run.")


def command() -> str:
    """The exact command line of this process, as it would be typed."""
    return " ".join([Path(sys.executable).name, *sys.argv])


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_machine(out: Path, extra: dict[str, Any]) -> None:
    """``machine.json``: the library's provenance record plus load averages and run sizes."""
    from tianji_jax.run.provenance import provenance

    info = provenance()
    info["shared_machine"] = True
    info["loadavg_end"] = loadavg()
    info.update(extra)
    (out / "machine.json").write_text(json.dumps(info, indent=2, default=str) + "\n")


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows of dicts (the union of keys, in first-seen order) to a CSV file."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(_fmt(r.get(c, math.nan)) for c in cols) + "\n")


def _fmt(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (int, np.integer, bool, np.bool_)):
        return str(int(v))
    s = str(v)
    return f'"{s}"' if "," in s else s


def median_range(values: Iterable[float], fmt: str = "{:,.0f}") -> str:
    """``median [min..max] (n)`` over the finite values, or ``-``."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    if not len(v):
        return "-"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(np.median(v))} [{fmt.format(v.min())}..{fmt.format(v.max())}]"


def median(values: Iterable[float]) -> float:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    return float(np.median(v)) if len(v) else math.nan


def steady_async(curve: dict[str, np.ndarray], update_epochs: int) -> dict[str, float]:
    """Steady-state rates of an async ``tj.train`` curve, the first row (compilation) excluded.

    Per-row rates in metrics.csv are computed when the caller thread handles the row's update
    event; when that thread falls behind, several rows are computed milliseconds apart and their
    per-row rates are meaningless on their own (``sps`` 0, ``production_sps`` 600k, ...). So
    weight each row's rate by the wall time since the previous row: ``sum(rate_i * dt_i) /
    sum(dt_i)`` is the number of env steps over the span divided by the span.
    """
    wall = curve["wall_time_s"]
    if len(wall) < 2:
        raise ValueError("need >= 2 metrics rows for a steady state (the first includes compilation)")
    dt = np.diff(wall)
    span = float(wall[-1] - wall[0])
    produced = float(np.sum(curve["production_sps"][1:] * dt))
    consumed_with_reuse = float(np.sum(curve["consumed_sps"][1:] * dt))
    dropped = float(curve["dropped_stale"][-1] - curve["dropped_stale"][0]
                    + curve["dropped_partial"][-1] - curve["dropped_partial"][0])
    timers = {k: float(np.nansum(curve[k][1:])) for k in ("rollout_s", "h2d_s", "update_s")}
    return {
        "steady_s": span,
        "production_sps": produced / span,
        "consumed_sps": consumed_with_reuse / span,  # the library's definition: epoch reuse counted
        # env steps consumed by the learner per second (no reuse), from the same counters as production
        # (``env_steps`` of a row is the update the row belongs to, read earlier than the counters)
        "consumed_env_sps": consumed_with_reuse / update_epochs / span,
        "consumed_over_produced": (consumed_with_reuse / update_epochs) / produced if produced > 0 else math.nan,
        "dropped_frac": dropped / produced if produced > 0 else math.nan,
        "policy_lag_mean": float(np.nanmean(curve["policy_lag_mean"][1:])),
        "policy_lag_max": float(np.nanmax(curve["policy_lag_max"])),
        "actor_wait_frac": float(np.nansum(curve["actor_wait_frac"][1:] * dt) / span),
        "learner_wait_frac": float(np.nansum(curve["learner_wait_frac"][1:] * dt) / span),
        **{k + "_share": v / span for k, v in timers.items()},
    }


def eval_threshold_stats(curve: dict[str, np.ndarray], update_epochs: int, threshold: float) -> dict[str, float]:
    """An async run judged on its evaluations: env steps and wall seconds (from the start of
    ``tj.train``) of the first row whose ``eval_return_mean`` >= ``threshold`` (NaN: never), the
    final and best eval return, the env steps and wall seconds of the run, and
    :func:`steady_async`'s rates."""
    hit = np.nonzero(curve["eval_return_mean"] >= threshold)[0]
    return {
        "steps_to_threshold": float(curve["env_steps"][hit[0]]) if len(hit) else math.nan,
        "wall_s_to_threshold": float(curve["wall_time_s"][hit[0]]) if len(hit) else math.nan,
        "final_eval_return": float(curve["eval_return_mean"][-1]),
        "best_eval_return": float(np.nanmax(curve["eval_return_mean"])),
        "env_steps": float(curve["env_steps"][-1]),
        "wall_s_total": float(curve["wall_time_s"][-1]),
        **steady_async(curve, update_epochs),
    }


def steady_anakin(curve: dict[str, np.ndarray]) -> float:
    """Env steps per second over the rows after the first (which includes compilation)."""
    wall, steps = curve["wall_time_s"], curve["env_steps"]
    if len(wall) < 2:
        raise ValueError("need >= 2 metrics rows for a steady state (the first includes compilation)")
    return float((steps[-1] - steps[0]) / (wall[-1] - wall[0]))


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0
        return False


def gymnax_random_rollout(num_envs: int, num_steps: int):
    """``(rollout, reset)``, both jitted: ``reset(key) -> (state, obs)`` for ``num_envs`` gymnax
    CartPole-v1 envs, and ``rollout(key, state) -> (key, state, reward_sum)``, a ``num_steps``-step
    ``lax.scan`` with uniformly random actions (the env's bound: no policy). Each runs where its
    inputs live."""
    import jax

    import tianji_jax as tj
    from tianji_jax.envs.gymnax_env import GymnaxVecEnv

    spec = tj.PPOConfig(env="gymnax:CartPole-v1").env_spec
    env = GymnaxVecEnv(spec, num_envs)
    n = spec.action_space.n

    def rollout(k, state):
        def body(carry, _):
            k, s = carry
            k, ka, ks = jax.random.split(k, 3)
            s, ts = env.step(ks, s, jax.random.randint(ka, (num_envs,), 0, n))
            return (k, s), ts.reward.sum()
        (k, state), r = jax.lax.scan(body, (k, state), None, num_steps)
        return k, state, r.sum()

    return jax.jit(rollout), jax.jit(env.reset)
