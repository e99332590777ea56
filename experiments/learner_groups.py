"""Learner groups (TianJi's parallel learners with periodic param averaging) against one learner.

Async PPO on gymnax CartPole-v1, schedule ``relaxed`` (K = 2), two actor threads on cpu:0 either
feeding one learner (the baseline, on cpu:2) or split over G = 2 learner groups (cpu:1 and cpu:2,
one actor each) that average their params every S updates of their own, S in {1, 4, 16}. The
total env-step budget is the same for every variant, so each group runs half the baseline's
updates (with its own learning-rate schedule). Per run: env steps and wall seconds until
``eval_return_mean`` (10 deterministic episodes after every metrics row) first reaches 475, the
eval return at the end of the budget, steady production / consumed SPS (first row excluded),
and the lag of consumed samples (per group). Seeds are the outer loop; ratios against the
baseline of the same seed, then the median over seeds.

Every variant is warmed up (compiled) once before the measured runs, so wall times exclude
compilation. On a 2-core CPU the three simulated devices and two actor threads share the cores;
one small-MLP learner does not keep both busy, so a second group's learner does add throughput
here, but the figures say nothing about separate accelerators.

Writes ``experiments/results/learner_groups/{results.csv, curves.csv, summary.md,
learner_groups.png, machine.json}``.

    python experiments/learner_groups.py            # 5 seeds, 200k env steps per run
    python experiments/learner_groups.py --quick    # baseline and G=2 S=4, 1 seed, 30k env steps (tests)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 3)  # actors on cpu:0, learners on the last one or two

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

import tianji_jax as tj  # noqa: E402


def variants(quick: bool) -> list[tuple[str, int, int]]:
    """(label, num_learner_groups, sync_every); the baseline first."""
    syncs = (4,) if quick else (1, 4, 16)
    return [("1 learner", 1, 1)] + [(f"G=2 S={s}", 2, s) for s in syncs]


def run_one(base: tj.PPOConfig, groups: int, sync_every: int, seed: int, threshold: float):
    cfg = base.replace(num_learner_groups=groups, sync_every=sync_every, seed=seed)
    c = tj.train(cfg, progress=False).curve
    return C.eval_threshold_stats(c, cfg.update_epochs, threshold), c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="baseline and G=2 S=4, 1 seed, 30k env steps")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--total-env-steps", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=10_240, help="env steps between evaluations")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "learner_groups")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.total_env_steps = 1, 30_720
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    t_start, load_start = time.perf_counter(), C.loadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    base = tj.PPOConfig(env="gymnax:CartPole-v1", runtime="async", schedule="relaxed", max_policy_lag=2,
                        num_actors=2, total_env_steps=args.total_env_steps, eval_every_env_steps=args.eval_every,
                        eval_episodes=10)
    vs = variants(args.quick)
    for label, g, s in vs:  # compile every variant's programs before anything is timed
        with C.Timer() as t:
            tj.train(base.replace(num_learner_groups=g, sync_every=s, stop_at_return=-1.0), progress=False)
        print(f"warm-up {label}: {t.s:.1f} s", flush=True)
    rows, curves = [], []
    for seed in range(args.seeds):
        for label, g, s in vs:
            r, c = run_one(base, g, s, seed, args.threshold)
            rows.append({"variant": label, "num_learner_groups": g, "sync_every": s, "seed": seed, **r})
            curves += [{"variant": label, "seed": seed, "env_steps": c["env_steps"][i],
                        "wall_time_s": c["wall_time_s"][i], "eval_return_mean": c["eval_return_mean"][i]}
                       for i in range(len(c["env_steps"]))]
            print(f"seed {seed} {label:10s}: steps to {args.threshold:g} {r['steps_to_threshold']:.0f}, wall "
                  f"{r['wall_s_to_threshold']:.1f} s, final {r['final_eval_return']:.0f}, consumed "
                  f"{r['consumed_env_sps']:,.0f} SPS, lag {r['policy_lag_mean']:.2f}/{r['policy_lag_max']:.0f}",
                  flush=True)
        ref = next(r for r in rows if r["seed"] == seed and r["num_learner_groups"] == 1)
        for r in rows:
            if r["seed"] == seed:
                r["sps_over_1"] = r["consumed_env_sps"] / ref["consumed_env_sps"]
                r["wall_to_threshold_over_1"] = r["wall_s_to_threshold"] / ref["wall_s_to_threshold"]
                r["steps_to_threshold_over_1"] = r["steps_to_threshold"] / ref["steps_to_threshold"]
    C.write_csv(rows, args.out / "results.csv")
    C.write_csv(curves, args.out / "curves.csv")
    summary = make_summary(args, base, vs, rows, time.perf_counter() - t_start, load_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": time.perf_counter() - t_start,
                               "sizes": {"seeds": args.seeds, "total_env_steps": base.env_steps,
                                         "eval_every_env_steps": args.eval_every, "num_envs": base.num_envs,
                                         "num_steps": base.num_steps, "num_actors": base.num_actors}})
    plot(vs, curves, args.threshold, args.out / "learner_groups.png")
    print(summary)
    return 0


def make_summary(args, base, vs, rows, wall_s, load_start) -> str:
    lines = [f"# Learner groups against one learner {'(--quick)' if args.quick else ''}", "",
             f"Command: `{C.command()}`", "", C.SHARED_NOTE, "",
             f"Async PPO on gymnax CartPole-v1, PPOConfig defaults (8 envs x 128 steps per actor rollout, 10 epochs x "
             f"4 minibatches), schedule relaxed (K = 2), 2 actor threads on cpu:0; {base.env_steps:,} env steps per "
             f"run for every variant (each of G groups runs 1/G of the updates). Evaluation of 10 deterministic "
             f"episodes every {args.eval_every} env steps, threshold {args.threshold:g}. {args.seeds} seed(s); "
             f"median [min..max] over seeds; *x 1* = ratio to the one-learner run of the same seed, then the median. "
             f"Wall seconds from the start of `tj.train`, everything compiled beforehand. Throughput = env steps "
             f"consumed per second, first metrics row excluded. 2 CPU cores run 2 actor threads and 1-2 learners "
             f"(each a simulated CPU device): one small-MLP learner leaves part of the cores idle, which a second "
             f"group's learner can use; nothing here measures separate accelerators. Total wall {wall_s:.0f} s; load average at start "
             f"{load_start}.", "",
             "| variant | env steps to threshold | x 1 | wall s to threshold | x 1 | reached | final eval return | "
             "consumed SPS | x 1 | lag mean | lag max |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, _, _ in vs:
        rs = [r for r in rows if r["variant"] == label]
        reached = sum(np.isfinite(r["steps_to_threshold"]) for r in rs)
        lines.append(
            f"| {label} | {C.median_range(r['steps_to_threshold'] for r in rs)} | "
            f"{C.median_range((r['steps_to_threshold_over_1'] for r in rs), '{:.2f}')} | "
            f"{C.median_range((r['wall_s_to_threshold'] for r in rs), '{:.1f}')} | "
            f"{C.median_range((r['wall_to_threshold_over_1'] for r in rs), '{:.2f}')} | {reached}/{len(rs)} | "
            f"{C.median_range((r['final_eval_return'] for r in rs), '{:.0f}')} | "
            f"{C.median_range(r['consumed_env_sps'] for r in rs)} | "
            f"{C.median_range((r['sps_over_1'] for r in rs), '{:.2f}')} | "
            f"{C.median([r['policy_lag_mean'] for r in rs]):.2f} | {max(r['policy_lag_max'] for r in rs):.0f} |")
    return "\n".join(lines) + "\n"


def plot(vs, curves, threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, _, _) in enumerate(vs):
        cs = [c for c in curves if c["variant"] == label]
        for seed in sorted({c["seed"] for c in cs}):
            pts = [c for c in cs if c["seed"] == seed]
            kw = dict(color=f"C{i}", alpha=0.8, label=label if seed == 0 else None)
            axes[0].plot([p["env_steps"] for p in pts], [p["eval_return_mean"] for p in pts], **kw)
            axes[1].plot([p["wall_time_s"] for p in pts], [p["eval_return_mean"] for p in pts], **kw)
    for ax, xl in zip(axes, ("env steps", "wall seconds (compiled beforehand)")):
        ax.axhline(threshold, color="grey", ls=":")
        ax.set_xlabel(xl)
        ax.set_ylabel("eval return (10 episodes)")
    axes[0].legend()
    fig.suptitle("Learner groups (G=2, params averaged every S updates) vs one learner, CartPole-v1")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
