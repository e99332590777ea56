"""Ablation over the policy-lag bound K (``max_policy_lag``) and the rate limiter's band.

Async PPO on gymnax CartPole-v1 (and envpool CartPole-v1 with ``--envpool``), one actor thread, for
K in {0 (schedule ``sync``), 1, 2, 4, 8} (schedule ``relaxed``), with the default band
``queue_batches=2`` and, for K >= 2, a wider band ``queue_batches=4``. Per run: env steps and wall
seconds until ``eval_return_mean`` (10 deterministic episodes after every metrics row) first
reaches the threshold (475), the eval return at the end of the budget, steady-state throughput
(first metrics row excluded), the fraction of produced env steps dropped, and the lag of consumed
samples (mean / max). Seeds are the outer loop (every K runs once per seed before the next seed),
so drift in the neighbours' load hits every K alike; ratios against K=0 (``sync``) are taken per
seed, then the median over seeds.

All runs of one env share one compiled program (the schedule, K and band do not change compiled
code), compiled by a warm-up run before the measured runs: wall times exclude compilation.

Writes ``experiments/results/staleness/{results.csv, curves.csv, summary.md, staleness.png, machine.json}``.

    python experiments/staleness.py                # 3 seeds, 200k env steps per run, gymnax
    python experiments/staleness.py --envpool      # also envpool CartPole-v1 (band queue_batches=2 only)
    python experiments/staleness.py --quick        # K in {0, 2, 8}, 1 seed, 30k env steps (tests)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 2)  # actor on cpu:0, learner on cpu:1 (docs/runtime.md, "Placement")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

import tianji_jax as tj  # noqa: E402


def variants(lags, bands):
    """(label, K, queue_batches, schedule)."""
    out = []
    for k in lags:
        out.append((f"K={k} qb=2", k, 2, "sync" if k == 0 else "relaxed"))
    for qb in bands:
        for k in lags:
            if k >= 2 and qb != 2:
                out.append((f"K={k} qb={qb}", k, qb, "relaxed"))
    return out


def run_one(base: tj.PPOConfig, k: int, qb: int, schedule: str, seed: int, threshold: float):
    cfg = base.replace(schedule=schedule, max_policy_lag=None if schedule == "sync" else k, queue_batches=qb,
                       seed=seed)
    c = tj.train(cfg, progress=False).curve
    return C.eval_threshold_stats(c, cfg.update_epochs, threshold), c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="K in {0, 2, 8}, band 2 only, 1 seed, 30k env steps")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--total-env-steps", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=10_240, help="env steps between evaluations")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--envpool", action="store_true", help="also envpool CartPole-v1 (slower: ~10k SPS here)")
    parser.add_argument("--envpool-total-env-steps", type=int, default=150_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "staleness")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    load_start = C.loadavg()
    lags, bands = (0, 1, 2, 4, 8), (2, 4)
    if args.quick:
        args.seeds, args.total_env_steps, lags, bands = 1, 30_720, (0, 2, 8), (2,)
        args.envpool = False
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    args.out.mkdir(parents=True, exist_ok=True)

    envs = {"gymnax:CartPole-v1": tj.PPOConfig(env="gymnax:CartPole-v1", runtime="async",
                                               total_env_steps=args.total_env_steps,
                                               eval_every_env_steps=args.eval_every, eval_episodes=10)}
    if args.envpool:
        envs["envpool:CartPole-v1"] = tj.PPOConfig(env="envpool:CartPole-v1", runtime="async",
                                                   total_env_steps=args.envpool_total_env_steps,
                                                   eval_every_env_steps=args.eval_every, eval_episodes=10)
    vs = variants(lags, bands)
    rows, curves = [], []
    for name, base in envs.items():
        with C.Timer() as t:  # warm-up: compiles the rollout, the update and the evaluator for every variant
            tj.train(base.replace(stop_at_return=-1.0), progress=False)
        print(f"{name}: warm-up (compilation) {t.s:.1f} s", flush=True)
        env_vs = vs if name.startswith("gymnax") else [v for v in vs if v[2] == 2]  # envpool: default band only
        for seed in range(args.seeds):
            for label, k, qb, schedule in env_vs:
                r, c = run_one(base, k, qb, schedule, seed, args.threshold)
                rows.append({"env": name, "variant": label, "max_policy_lag": k, "queue_batches": qb,
                             "schedule": schedule, "seed": seed, **r})
                for i in range(len(c["env_steps"])):
                    curves.append({"env": name, "variant": label, "seed": seed, "env_steps": c["env_steps"][i],
                                   "wall_time_s": c["wall_time_s"][i], "eval_return_mean": c["eval_return_mean"][i],
                                   "policy_lag_mean": c["policy_lag_mean"][i]})
                print(f"{name} seed {seed} {label:10s} ({schedule}): steps to {args.threshold:g} "
                      f"{r['steps_to_threshold']:.0f}, wall {r['wall_s_to_threshold']:.1f} s, final "
                      f"{r['final_eval_return']:.0f}, consumed {r['consumed_env_sps']:,.0f} SPS, lag "
                      f"{r['policy_lag_mean']:.2f}/{r['policy_lag_max']:.0f}, dropped {r['dropped_frac']:.3f}",
                      flush=True)
            # ratios against K=0 (sync) of the same env and seed
            base_row = next(r for r in rows if r["env"] == name and r["seed"] == seed and r["max_policy_lag"] == 0)
            for r in rows:
                if r["env"] == name and r["seed"] == seed:
                    r["sps_over_sync"] = r["consumed_env_sps"] / base_row["consumed_env_sps"]
                    r["wall_to_threshold_over_sync"] = r["wall_s_to_threshold"] / base_row["wall_s_to_threshold"]
                    r["steps_to_threshold_over_sync"] = r["steps_to_threshold"] / base_row["steps_to_threshold"]

    C.write_csv(rows, args.out / "results.csv")
    C.write_csv(curves, args.out / "curves.csv")
    summary = make_summary(args, envs, vs, rows, time.perf_counter() - t_start, load_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": time.perf_counter() - t_start,
                               "sizes": {"seeds": args.seeds, "total_env_steps": {k: v.env_steps for k, v in envs.items()},
                                         "eval_every_env_steps": args.eval_every, "num_envs": 8, "num_steps": 128,
                                         "update_epochs": 10, "num_minibatches": 4, "num_actors": 1}})
    plot(envs, vs, rows, curves, args.threshold, args.out / "staleness.png")
    print(summary)
    return 0


def make_summary(args, envs, vs, rows, wall_s, load_start) -> str:
    lines = [f"# Policy-lag bound K and rate-limiter band {'(--quick)' if args.quick else ''}", "",
             f"Command: `{C.command()}`", "", C.SHARED_NOTE, "",
             f"Async PPO, PPOConfig defaults (8 envs x 128 steps, 10 epochs x 4 minibatches), one actor thread "
             f"(cpu:0) and the learner (cpu:1); evaluation of 10 deterministic episodes every "
             f"{args.eval_every} env steps (rounded to whole updates), threshold {args.threshold:g}. "
             f"{args.seeds} seed(s); median [min..max] over seeds; *x sync* = ratio to K=0 (`sync`) on the same "
             f"seed, then the median. Wall seconds are from the start of `tj.train` with everything already "
             f"compiled (a warm-up run compiled the one program all variants share). Throughput = env steps "
             f"consumed by the learner per second (production is the same within 1%: nothing else is "
             f"consumed), first metrics row excluded. *dropped* = env steps dropped (by the lag gate, plus, for envpool, "
             f"the host actor's discarded leftovers, `dropped_partial`) / produced. Time-to-threshold resolution: "
             f"one evaluation every {args.eval_every} env steps. With one actor the observed lag is bounded by the "
             f"band as well as by K: admission lets the actor start a rollout only when the rate limiter "
             f"(`queue_batches` trajectories) has room, so lag <= min(K, queue_batches). "
             f"Total wall {wall_s:.0f} s; load average at start {load_start}.", ""]
    for name, base in envs.items():
        lines += [f"## {name} ({base.env_steps} env steps per run)", "",
                  "| K | queue_batches | schedule | env steps to threshold | x sync | wall s to threshold | x sync | "
                  "reached | final eval return | consumed SPS | x sync | lag mean | lag max | dropped |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for label, k, qb, schedule in vs:
            rs = [r for r in rows if r["env"] == name and r["variant"] == label]
            if not rs:
                continue
            reached = sum(np.isfinite(r["steps_to_threshold"]) for r in rs)
            lines.append(
                f"| {k} | {qb} | {schedule} | {C.median_range(r['steps_to_threshold'] for r in rs)} | "
                f"{C.median_range((r['steps_to_threshold_over_sync'] for r in rs), '{:.2f}')} | "
                f"{C.median_range((r['wall_s_to_threshold'] for r in rs), '{:.1f}')} | "
                f"{C.median_range((r['wall_to_threshold_over_sync'] for r in rs), '{:.2f}')} | "
                f"{reached}/{len(rs)} | {C.median_range((r['final_eval_return'] for r in rs), '{:.0f}')} | "
                f"{C.median_range(r['consumed_env_sps'] for r in rs)} | "
                f"{C.median_range((r['sps_over_sync'] for r in rs), '{:.2f}')} | "
                f"{C.median([r['policy_lag_mean'] for r in rs]):.2f} | "
                f"{max(r['policy_lag_max'] for r in rs):.0f} | "
                f"{C.median_range((r['dropped_frac'] for r in rs), '{:.3f}')} |")
        lines.append("")
    return "\n".join(lines)


def plot(envs, vs, rows, curves, threshold, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(envs), 3, figsize=(14, 3.8 * len(envs)), squeeze=False)
    for (name, _), ax in zip(envs.items(), axes):
        for i, (label, k, qb, schedule) in enumerate(vs):
            cs = [c for c in curves if c["env"] == name and c["variant"] == label]
            if not cs:
                continue
            seeds = sorted({c["seed"] for c in cs})
            steps = np.asarray([c["env_steps"] for c in cs if c["seed"] == seeds[0]])
            ret = np.median(np.stack([[c["eval_return_mean"] for c in cs if c["seed"] == s] for s in seeds]), 0)
            wall = np.median(np.stack([[c["wall_time_s"] for c in cs if c["seed"] == s] for s in seeds]), 0)
            style = "-" if qb == 2 else "--"
            ax[0].plot(steps, ret, style, color=f"C{k % 10 if k < 8 else 5}", label=label)
            ax[1].plot(wall, ret, style, color=f"C{k % 10 if k < 8 else 5}", label=label)
        for a in ax[:2]:
            a.axhline(threshold, color="k", lw=0.7, ls=":")
            a.set_ylabel("eval return (median over seeds)")
        ax[0].set_xlabel("env steps")
        ax[1].set_xlabel("wall s (compiled)")
        ax[0].set_title(name, fontsize=9)
        ax[0].legend(fontsize=7)
        labels = [v[0] for v in vs if any(r["env"] == name and r["variant"] == v[0] for r in rows)]
        sps = [C.median([r["consumed_env_sps"] for r in rows if r["env"] == name and r["variant"] == lb])
               for lb in labels]
        ax[2].bar(range(len(labels)), sps)
        ax[2].set_xticks(range(len(labels)))
        ax[2].set_xticklabels(labels, rotation=45, fontsize=7)
        ax[2].set_ylabel("consumed env steps / s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
