"""A sweep of learning rates in one program (``tj.sweep``) against the same runs one after another
(``tj.train`` in a loop): wall seconds, their ratio, and whether the members' results match.

PPO on gymnax CartPole-v1 (PPOConfig defaults but ``total_env_steps``; evaluation as in a normal
run: ``eval_episodes`` episodes after every chunk), ``--members`` learning rates log-spaced in
[``--lr-min``, ``--lr-max``], seed 0. Each measurement runs in a fresh Python process: one process
calls ``tj.sweep`` once for all members, another calls ``tj.train`` once per member. The pair runs
``--repeats`` times, interleaved (sweep, sequential, sweep, sequential, ...), with the persistent
compilation cache off (``TIANJI_COMPILATION_CACHE=0``) so every process compiles what it runs. With
``--warm-repeats N`` the pair then runs N more times against a filled persistent cache (a fresh
directory, filled by one unrecorded pair first), as a second ``tianji`` process on the same machine
would. Two walls per process: ``call_wall_s`` (from just before the first ``tj.sweep``/``tj.train``
to after the last, compilation and evaluation included) and ``process_wall_s`` (the whole
subprocess, Python and JAX imports included).

Writes ``experiments/results/sweep_vs_sequential/{results.csv, members.csv, summary.md, machine.json}``.

    python experiments/sweep_vs_sequential.py             # 16 learning rates, 102,400 env steps each, 3 repeats
    python experiments/sweep_vs_sequential.py --quick     # 2 learning rates, 4,096 env steps, 1 repeat (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_NOTE, command, loadavg, median_range, write_csv, write_machine  # noqa: E402

HERE = Path(__file__).resolve()


def base_config(total_env_steps: int, quick: bool):
    import tianji_jax as tj

    if quick:  # tiny: 4 envs x 128 steps, 2 chunks of 4 updates, 2 evaluation episodes per chunk
        return tj.PPOConfig(num_envs=4, num_steps=128, total_env_steps=total_env_steps,
                            eval_every_env_steps=total_env_steps // 2, eval_episodes=2)
    return tj.PPOConfig(total_env_steps=total_env_steps)


def worker(args: argparse.Namespace) -> int:
    """One measurement, in this (fresh) process: writes a JSON record to ``args.record``."""
    load0 = loadavg()
    import tianji_jax as tj
    from tianji_jax.caches import cache_dir

    config = base_config(args.total_env_steps, args.quick)
    lrs = [float(x) for x in json.loads(args.lrs)]
    t0 = time.perf_counter()
    if args.worker == "sweep":
        result = tj.sweep(config, {"learning_rate": lrs}, seeds=[0])
        finals = [r["final_eval_return"] for r in result.table()]
        steps = [r["env_steps"] for r in result.table()]
    else:
        finals, steps = [], []
        for lr in lrs:
            run = tj.train(config.replace(learning_rate=lr), progress=False)
            finals.append(float(run.curve["eval_return_mean"][-1]))
            steps.append(int(run.curve["env_steps"][-1]))
    call_wall = time.perf_counter() - t0
    record = {"mode": args.worker, "call_wall_s": call_wall, "final_eval_returns": finals, "env_steps": steps,
              "learning_rates": lrs, "loadavg_start": load0, "loadavg_end": loadavg(),
              "persistent_cache": str(cache_dir()) if cache_dir() is not None else None}
    Path(args.record).write_text(json.dumps(record))
    return 0


def measure(mode: str, args: argparse.Namespace, lrs: list[float], env: dict[str, str], tmp: Path) -> dict:
    record = tmp / f"{mode}_{time.monotonic_ns()}.json"
    cmd = [sys.executable, str(HERE), "--worker", mode, "--lrs", json.dumps(lrs), "--record", str(record),
           "--total-env-steps", str(args.total_env_steps)] + (["--quick"] if args.quick else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    process_wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(record.read_text())
    out["process_wall_s"] = process_wall
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 learning rates, 4,096 env steps, 1 repeat, no warm")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--lr-min", type=float, default=1e-4)
    parser.add_argument("--lr-max", type=float, default=3e-3)
    parser.add_argument("--total-env-steps", type=int, default=102_400)
    parser.add_argument("--repeats", type=int, default=3, help="cold-cache (sweep, sequential) pairs")
    parser.add_argument("--warm-repeats", type=int, default=1, help="pairs against a filled persistent cache")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results" / "sweep_vs_sequential")
    parser.add_argument("--worker", choices=["sweep", "sequential"], help=argparse.SUPPRESS)
    parser.add_argument("--lrs", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.quick:
        args.members, args.total_env_steps, args.repeats, args.warm_repeats = 2, 4_096, 1, 0
    if args.members < 1 or args.repeats < 1 or args.warm_repeats < 0:
        parser.error("--members and --repeats must be >= 1, --warm-repeats >= 0")
    lrs = [float(x) for x in np.geomspace(args.lr_min, args.lr_max, args.members)]
    args.out.mkdir(parents=True, exist_ok=True)
    load_start = loadavg()

    rows, members = [], []
    with tempfile.TemporaryDirectory(prefix="sweep_vs_seq_") as tmpdir:
        tmp = Path(tmpdir)
        cold = {**os.environ, "TIANJI_COMPILATION_CACHE": "0"}
        cold.pop("JAX_COMPILATION_CACHE_DIR", None)
        warm = {**os.environ, "TIANJI_COMPILATION_CACHE": "1", "TIANJI_COMPILATION_CACHE_DIR": str(tmp / "xla"),
                "TIANJI_COMPILATION_CACHE_MAX_BYTES": "-1"}
        warm.pop("JAX_COMPILATION_CACHE_DIR", None)
        plan = [("cold", r, cold) for r in range(args.repeats)]
        if args.warm_repeats:
            plan += [("fill", 0, warm)] + [("warm", r, warm) for r in range(args.warm_repeats)]
        for cache, repeat, env in plan:
            for mode in ("sweep", "sequential"):
                rec = measure(mode, args, lrs, env, tmp)
                print(f"{cache} repeat {repeat} {mode}: {rec['call_wall_s']:.1f} s in the calls, "
                      f"{rec['process_wall_s']:.1f} s process, load {rec['loadavg_end']}", flush=True)
                if cache == "fill":
                    continue
                rows.append({"cache": cache, "repeat": repeat, "mode": mode, "members": len(lrs),
                             "env_steps_per_member": int(min(rec["env_steps"])),
                             "call_wall_s": rec["call_wall_s"], "process_wall_s": rec["process_wall_s"],
                             "loadavg_1m_start": rec["loadavg_start"][0] if rec["loadavg_start"] else float("nan"),
                             "loadavg_1m_end": rec["loadavg_end"][0] if rec["loadavg_end"] else float("nan")})
                for lr, ret, steps in zip(lrs, rec["final_eval_returns"], rec["env_steps"]):
                    members.append({"cache": cache, "repeat": repeat, "mode": mode, "learning_rate": lr,
                                    "final_eval_return": ret, "env_steps": steps})
                if mode == "sequential":  # a complete pair: (re)write every output, so a stopped run keeps its pairs
                    report(args, lrs, rows, members, load_start)
    print((args.out / "summary.md").read_text())
    return 0


def report(args: argparse.Namespace, lrs: list[float], rows: list[dict], members: list[dict], load_start) -> None:
    """Write results.csv, members.csv, summary.md and machine.json from the pairs measured so far."""
    # the pairs' ratios: sequential / sweep within the same repeat
    def walls(cache: str, mode: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["cache"] == cache and r["mode"] == mode]

    for r in rows:
        if r["mode"] == "sequential":
            sw = next(s for s in rows if s["cache"] == r["cache"] and s["repeat"] == r["repeat"] and s["mode"] == "sweep")
            r["ratio_call_seq_over_sweep"] = r["call_wall_s"] / sw["call_wall_s"]
            r["ratio_process_seq_over_sweep"] = r["process_wall_s"] / sw["process_wall_s"]
    write_csv(rows, args.out / "results.csv")
    write_csv(members, args.out / "members.csv")

    # do the sweep's members match the sequential runs? (same repeat, same cache mode, same lr)
    diffs, seq_spread = [], []
    for m in members:
        if m["mode"] == "sweep":
            twin = next(s for s in members if s["mode"] == "sequential" and s["cache"] == m["cache"]
                        and s["repeat"] == m["repeat"] and s["learning_rate"] == m["learning_rate"])
            diffs.append(abs(m["final_eval_return"] - twin["final_eval_return"]))
    by_lr: dict[float, list[float]] = {}
    for m in members:
        by_lr.setdefault(m["learning_rate"], []).append(m["final_eval_return"])
    seq_spread = [max(v) - min(v) for v in by_lr.values()]
    n_equal = sum(d == 0 for d in diffs)
    first = {m["learning_rate"]: m["final_eval_return"] for m in members
             if m["mode"] == "sweep" and m["cache"] == "cold" and m["repeat"] == 0}
    first_seq = {m["learning_rate"]: m["final_eval_return"] for m in members
                 if m["mode"] == "sequential" and m["cache"] == "cold" and m["repeat"] == 0}

    lines = [f"# One `tj.sweep` of {len(lrs)} learning rates vs {len(lrs)} sequential `tj.train` runs"
             f"{' (--quick)' if args.quick else ''}", "",
             f"Command: `{command()}`", "",
             f"PPO on gymnax CartPole-v1, PPOConfig defaults but total_env_steps={args.total_env_steps:,} per member "
             f"({rows[0]['env_steps_per_member']:,} trained), seed 0, learning rates log-spaced "
             f"{lrs[0]:.3g}..{lrs[-1]:.3g}; evaluation after every chunk in both. Each measurement is a fresh "
             f"process (sweep: one `tj.sweep` call; sequential: `tj.train` per learning rate in a loop), "
             f"interleaved sweep, sequential, sweep, ... Cold: `TIANJI_COMPILATION_CACHE=0` (every process "
             f"compiles what it runs; `tj.train` compiles once per learning rate, since a single run folds its "
             f"hyper-parameters into constants). Warm: the persistent cache filled by an unrecorded pair first.",
             "", SHARED_NOTE, "",
             f"Load average (1, 5, 15 min): {load_start} at the start, {loadavg()} at the end. Pairs measured: "
             f"{sum(r['mode'] == 'sequential' and r['cache'] == 'cold' for r in rows)} cold of {args.repeats}, "
             f"{sum(r['mode'] == 'sequential' and r['cache'] == 'warm' for r in rows)} warm of {args.warm_repeats} "
             "planned.", "",
             "| cache | repeats | sweep call wall s | sequential call wall s | **sequential / sweep** (call) "
             "| sweep process wall s | sequential process wall s | sequential / sweep (process) |",
             "|---|---|---|---|---|---|---|---|"]
    for cache in ("cold", "warm"):
        seq = [r for r in rows if r["cache"] == cache and r["mode"] == "sequential"]
        if not seq:
            continue
        lines.append(
            f"| {cache} | {len(seq)} | {median_range(walls(cache, 'sweep', 'call_wall_s'), '{:.1f}')} "
            f"| {median_range(walls(cache, 'sequential', 'call_wall_s'), '{:.1f}')} "
            f"| **{median_range([r['ratio_call_seq_over_sweep'] for r in seq], '{:.2f}x')}** "
            f"| {median_range(walls(cache, 'sweep', 'process_wall_s'), '{:.1f}')} "
            f"| {median_range(walls(cache, 'sequential', 'process_wall_s'), '{:.1f}')} "
            f"| {median_range([r['ratio_process_seq_over_sweep'] for r in seq], '{:.2f}x')} |")
    lines += ["", "Cells: median [min..max] over the repeats; a ratio is taken within one repeat.", "",
              "## Do the sweep's members equal the sequential runs?", "",
              f"Final eval return (mean of {base_config(args.total_env_steps, args.quick).eval_episodes} episodes), "
              f"sweep member vs the `tj.train` run of the same learning rate in the same repeat: max abs diff "
              f"**{max(diffs):.4g}** over {len(diffs)} pairs ({n_equal} exactly equal); max spread of one learning "
              f"rate's final return over every measurement (both modes, all repeats): {max(seq_spread):.4g}. "
              "(`tj.sweep` computes each member's run equal up to float rounding -- the single run folds its "
              "hyper-parameters into constants -- and training can amplify rounding over a long run.)", "",
              "| learning rate | final eval return, sweep (cold repeat 0) | sequential (cold repeat 0) |",
              "|---|---|---|"]
    lines += [f"| {lr:.3g} | {first[lr]:.1f} | {first_seq[lr]:.1f} |" for lr in lrs]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    write_machine(args.out, {"loadavg_start": load_start, "sizes": {
        "members": len(lrs), "total_env_steps": args.total_env_steps, "repeats": args.repeats,
        "warm_repeats": args.warm_repeats, "pairs_done": len(rows) // 2}})


if __name__ == "__main__":
    sys.exit(main())
