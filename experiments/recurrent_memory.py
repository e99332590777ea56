"""Recurrent PPO (LSTM, GRU) against feed-forward PPO with the last 4 observations stacked, on
two tasks that need memory: CartPole without its velocities and bsuite's MemoryChain.

* ``gymnax:CartPole-v1|mask=0,2`` keeps the cart position and the pole angle. The velocities can
  be estimated from two consecutive observations, so a stack of 4 frames is a fair feed-forward
  baseline here: it tells how much of the gap a frame stack closes on this task.
* ``gymnax:MemoryChain-bsuite`` (memory length 5): the context bit is shown at the first step only
  and the reward (+1 / -1) depends on recalling it at the last; a 4-frame stack has lost it by
  then, so feed-forward PPO with the stack stays at chance (mean return 0) and only memory solves it.

Burn-in under relaxed hand-offs (masked CartPole only): the LSTM run again on the async runtime
(``relaxed``, 2 device actors, ``max_policy_lag`` 2), without and with ``burn_in_steps=8`` (the first
8 of each column's 32 steps only carry the core's state into the loss): does keeping the steps
whose state is the stalest out of the loss change the env steps or wall seconds to the threshold?

Every other run is Anakin PPO with the same hyper-parameters per task (``SETTINGS``: masked CartPole's
are those of ``tests/learning/test_recurrent.py``'s acceptance test) and stops at the first evaluation
(20 deterministic episodes) whose mean reaches the task's threshold, or at the budget. Per run:
env steps and wall seconds (from the start of ``tj.train``, compilation or its load from the
persistent compilation cache included) to the threshold, best evaluation, and the training throughput over the rows after the first (env steps
per second, compilation excluded); the summary gives per (task, variant) the median [range] over
seeds and the throughput cost of recurrence (recurrent SPS / frame-stack SPS, same seeds).

Resumable: a (task, variant, seed) already in ``results.csv`` is not run again (delete its row to
redo it). Seeds are the outer loop, so drift in the neighbours' load hits every variant alike;
load averages before and after each run are recorded.

Writes ``experiments/results/recurrent_memory/{results.csv, curves.csv, summary.md, curves.png, machine.json}``
(``--quick``: under ``recurrent_memory/quick/``).

    python experiments/recurrent_memory.py            # 3 seeds, the budgets in SETTINGS
    python experiments/recurrent_memory.py --quick    # 1 seed, 2 updates per run (used by the tests)
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _common  # noqa: E402

import tianji_jax as tj  # noqa: E402

_CARTPOLE = dict(num_envs=8, num_steps=32, num_minibatches=2, update_epochs=20, learning_rate=5e-4, gamma=0.999,
                 gae_lambda=0.98, ent_coef=0.0, activation="relu", hidden_sizes=(64,), scale_rewards=True,
                 rnn_hidden_size=64, eval_every_env_steps=12_800, eval_episodes=20)
SETTINGS = {
    # task: (env id, threshold, budget in env steps, PPO settings)
    "masked_cartpole": ("gymnax:CartPole-v1|mask=0,2", 400.0, 409_600, _CARTPOLE),
    "memory_chain": ("gymnax:MemoryChain-bsuite", 0.9, 204_800,
                     {**_CARTPOLE, "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.01, "scale_rewards": False,
                      "eval_every_env_steps": 10_240}),
}
_RELAXED = dict(runtime="async", schedule="relaxed", max_policy_lag=2, num_actors=2)
VARIANTS = {  # variant: (recurrent cell, env-id suffix, more config fields, the tasks it runs on)
    "lstm": ("lstm", "", {}, tuple(SETTINGS)),
    "gru": ("gru", "", {}, tuple(SETTINGS)),
    "ff_stack4": ("none", "|frame_stack=4", {}, tuple(SETTINGS)),
    # burn-in under relaxed hand-offs (async runtime, 2 device actors, lag <= 2): the state stored at a
    # rollout's start comes from a policy up to 2 versions old; burn_in_steps=8 keeps the first 8 of
    # each column's 32 steps out of the loss
    "lstm_relaxed": ("lstm", "", _RELAXED, ("masked_cartpole",)),
    "lstm_relaxed_burn8": ("lstm", "", {**_RELAXED, "burn_in_steps": 8}, ("masked_cartpole",)),
}
COLUMNS = ["task", "variant", "seed", "threshold", "budget", "steps_to_threshold", "wall_s_to_threshold",
           "best_eval_return", "final_eval_return", "env_steps", "wall_s", "steady_sps", "load_before", "load_after"]


QUICK = dict(total_env_steps=2 * 8 * 32, eval_every_env_steps=8 * 32, eval_episodes=2)


def config_for(task: str, variant: str, seed: int, quick: bool = False) -> tj.PPOConfig:
    """The PPO config of one run (``quick``: 2 updates, 2 evaluation episodes)."""
    env, threshold, budget, settings = SETTINGS[task]
    cell, suffix, extra, _ = VARIANTS[variant]
    return tj.PPOConfig(**{**settings, "env": env + suffix, "recurrent": cell, "seed": seed, **extra,
                           "total_env_steps": budget, "stop_at_return": threshold, **(QUICK if quick else {})})


def run_one(task: str, variant: str, seed: int, quick: bool) -> tuple[dict, list[dict]]:
    """One run: its results row and its curve (rows of task, variant, seed, env_steps, eval_return)."""
    config = config_for(task, variant, seed, quick)
    load_before = _common.loadavg()
    result = tj.train(config, progress=False)
    c = result.curve
    hit = np.nonzero(c["eval_return_mean"] >= config.stop_at_return)[0]
    row = {"task": task, "variant": variant, "seed": seed, "threshold": config.stop_at_return,
           "budget": config.total_env_steps,
           "steps_to_threshold": float(c["env_steps"][hit[0]]) if len(hit) else math.nan,
           "wall_s_to_threshold": float(c["wall_time_s"][hit[0]]) if len(hit) else math.nan,
           "best_eval_return": float(np.nanmax(c["eval_return_mean"])),
           "final_eval_return": float(c["eval_return_mean"][-1]),
           "env_steps": float(c["env_steps"][-1]), "wall_s": float(c["wall_time_s"][-1]),
           "steady_sps": (math.nan if len(c["wall_time_s"]) < 2 else _common.steady_anakin(c)
                          if config.runtime == "anakin"  # async rows: env steps the learner consumed per second
                          else _common.steady_async(c, config.update_epochs)["consumed_env_sps"]),
           "load_before": (load_before or [math.nan])[0], "load_after": (_common.loadavg() or [math.nan])[0]}
    curve = [{"task": task, "variant": variant, "seed": seed, "env_steps": float(x), "eval_return": float(y)}
             for x, y in zip(c["env_steps"], c["eval_return_mean"])]
    return row, curve


def read_rows(path: Path) -> list[dict]:
    """A CSV written by this script (``results.csv`` / ``curves.csv``), numbers as floats."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [{k: (v if k in ("task", "variant") else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def summarise(rows: list[dict], quick: bool) -> str:
    def vals(task, variant, key):
        return [r[key] for r in rows if r["task"] == task and r["variant"] == variant]

    episodes = QUICK["eval_episodes"] if quick else SETTINGS["masked_cartpole"][3]["eval_episodes"]
    lines = [f"# Recurrent PPO vs a 4-frame stack on tasks that need memory{' (--quick)' if quick else ''}", "",
             *(["**--quick**: 2 updates per run and 2 evaluation episodes, which only checks the pipeline: a "
                "threshold 'solved' here is chance (the full run's results are in experiments/README.md).", ""]
               if quick else []),
             f"Command: `{_common.command()}`", "", _common.SHARED_NOTE, "",
             "PPO with the same settings per task for every variant (`SETTINGS` in the script; Anakin, except the "
             "`lstm_relaxed*` variants: async runtime, `relaxed`, 2 device actors, lag <= 2, their SPS the env steps "
             f"the learner consumed per second); each run stops at its first evaluation ({episodes} deterministic "
             "episodes) whose mean reaches the threshold. "
             "Wall seconds are from the start of `tj.train`: compilation included, or its load from JAX's "
             "persistent compilation cache (on by default; programs compiled by an earlier run load in well under "
             "a second). SPS excludes the first row (compilation) and is '-' for runs that stopped at their first "
             "row. "
             "Median [min..max] over seeds; 'solved' counts the seeds that reached the threshold.", "",
             "| task | variant | solved | env steps to threshold | wall s to threshold | best eval | SPS | SPS / ff_stack4 |",
             "|---|---|---|---|---|---|---|---|"]
    for task in SETTINGS:
        base = {int(r["seed"]): r["steady_sps"] for r in rows if r["task"] == task and r["variant"] == "ff_stack4"}
        for variant in VARIANTS:
            n = len(vals(task, variant, "seed"))
            if not n:
                continue
            solved = sum(np.isfinite(vals(task, variant, "steps_to_threshold")))
            ratio = [r["steady_sps"] / base[int(r["seed"])] for r in rows if r["task"] == task
                     and r["variant"] == variant and int(r["seed"]) in base]
            lines.append(f"| {task} (>= {SETTINGS[task][1]:g}) | {variant} | {solved}/{n} | "
                         f"{_common.median_range(vals(task, variant, 'steps_to_threshold'))} | "
                         f"{_common.median_range(vals(task, variant, 'wall_s_to_threshold'), '{:.0f}')} | "
                         f"{_common.median_range(vals(task, variant, 'best_eval_return'), '{:.2f}')} | "
                         f"{_common.median_range(vals(task, variant, 'steady_sps'))} | "
                         f"{_common.median_range(ratio, '{:.2f}')} |")
    burn = [vals("masked_cartpole", v, "steps_to_threshold") for v in ("lstm_relaxed", "lstm_relaxed_burn8")]
    if all(burn):
        lines += ["", "Burn-in under `relaxed` (masked CartPole, async, 2 actors, lag <= 2), env steps to the "
                  f"threshold: without {_common.median_range(burn[0])}, with 8 burn-in steps "
                  f"{_common.median_range(burn[1])}; wall seconds: without "
                  f"{_common.median_range(vals('masked_cartpole', 'lstm_relaxed', 'wall_s_to_threshold'), '{:.0f}')}, "
                  f"with {_common.median_range(vals('masked_cartpole', 'lstm_relaxed_burn8', 'wall_s_to_threshold'), '{:.0f}')}."]
    return "\n".join(lines) + "\n"


def plot(curve_rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SETTINGS), figsize=(5 * len(SETTINGS), 3.6))
    colors = {"lstm": "C0", "gru": "C1", "ff_stack4": "C2", "lstm_relaxed": "C3", "lstm_relaxed_burn8": "C4"}
    runs = sorted({(r["task"], r["variant"], int(r["seed"])) for r in curve_rows})
    for ax, task in zip(np.atleast_1d(axes), SETTINGS):
        labelled = set()
        for t, variant, seed in runs:
            if t != task:
                continue
            pts = [(r["env_steps"], r["eval_return"]) for r in curve_rows
                   if (r["task"], r["variant"], int(r["seed"])) == (t, variant, seed)]
            ax.plot(*zip(*pts), color=colors[variant], alpha=0.7, marker="o", markersize=3,  # 1-row runs show too
                    label=None if variant in labelled else variant)
            labelled.add(variant)
        ax.axhline(SETTINGS[task][1], color="k", ls="--", lw=0.8)
        ax.set_title(task)
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return (mean)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 updates per run (the tests)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "recurrent_memory")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    out = args.out / "quick" if args.quick and args.out.name == "recurrent_memory" else args.out
    out.mkdir(parents=True, exist_ok=True)
    seeds = 1 if args.quick else args.seeds
    path, curves_path = out / "results.csv", out / "curves.csv"
    rows = [] if args.quick else read_rows(path)
    curves = [] if args.quick else read_rows(curves_path)
    for seed in range(seeds):
        for task in SETTINGS:
            for variant in VARIANTS:
                if task not in VARIANTS[variant][3]:
                    continue
                if any(r["task"] == task and r["variant"] == variant and int(r["seed"]) == seed for r in rows):
                    continue
                t0 = time.perf_counter()
                row, curve = run_one(task, variant, seed, args.quick)
                rows.append(row)
                curves = [c for c in curves if (c["task"], c["variant"], int(c["seed"])) != (task, variant, seed)]
                curves += curve
                _common.write_csv([{c: r[c] for c in COLUMNS} for r in rows], path)  # resumable: after every run
                _common.write_csv(curves, curves_path)
                print(f"{task} {variant} seed {seed}: best eval {row['best_eval_return']:.2f}, to threshold "
                      f"{row['steps_to_threshold']} env steps ({time.perf_counter() - t0:.0f} s)", flush=True)
    summary = summarise(rows, args.quick)
    (out / "summary.md").write_text(summary)
    if curves:
        plot(curves, out)
    _common.write_machine(out, {"seeds": seeds, "quick": args.quick, "cpu_count": os.cpu_count()})
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
