"""PPO in Anakin mode over many seeds at once: steps and seconds to a threshold, and throughput.

Runs ``--seeds`` seeds of one config two ways in the same process and reports the ratio:
(a) all seeds in one ``jax.vmap``-ed compiled chunk, (b) the seeds one after another with
``tianji_jax.train``'s compiled chunk. Per seed it records the first env step at which the training
``episode_return_mean`` (episodes ended within a chunk) and ``eval_return_mean`` (10 deterministic
episodes) reach ``--threshold``, and the return at the end of the budget.

Writes ``experiments/results/anakin_seeds/{results.csv, summary.md, curves.png, machine.json}``.

    python experiments/anakin_seeds.py            # full: 8 seeds, 500k env steps each
    python experiments/anakin_seeds.py --quick    # 2 seeds, 24,576 env steps (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import tianji_jax as tj
from tianji_jax.run.provenance import provenance
from tianji_jax.runtime.anakin import host_metrics
from tianji_jax.run.host_on_policy import on_policy_evaluator


def first_hit(steps: np.ndarray, values: np.ndarray, threshold: float) -> float:
    hit = np.nonzero(values >= threshold)[0]
    return float(steps[hit[0]]) if len(hit) else math.nan


def run_vmapped(config: tj.PPOConfig, seeds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Returns (env_steps (C,), train_return (S, C), eval_return (S, C), wall seconds incl. compile)."""
    t0 = time.perf_counter()
    trainer = tj.make_train(config)
    u = trainer.updates_per_chunk
    chunks = config.num_updates // u
    init = jax.jit(jax.vmap(trainer.init))
    chunk = jax.jit(jax.vmap(trainer.chunk))
    evaluate = jax.jit(jax.vmap(on_policy_evaluator(config, trainer, config.eval_episodes), in_axes=(0, 0, None)))
    states = init(jax.vmap(jax.random.PRNGKey)(jnp.arange(seeds, dtype=jnp.uint32)))
    steps, train_ret, eval_ret = [], [], []
    for c in range(chunks):
        states, metrics = chunk(states)
        m = host_metrics(metrics)
        count = m["episode_count"].sum(axis=1)
        train_ret.append(np.where(count > 0, m["episode_return_sum"].sum(axis=1) / np.maximum(count, 1), np.nan))
        returns, _ = evaluate(states.params, states.obs_rms, jax.random.PRNGKey(10_000 + c))
        eval_ret.append(np.asarray(returns).mean(axis=1))
        steps.append((c + 1) * u * config.batch_size)
    return np.asarray(steps), np.stack(train_ret, 1), np.stack(eval_ret, 1), time.perf_counter() - t0


def run_sequential(config: tj.PPOConfig, seeds: int) -> float:
    """Wall seconds for the same seeds one after another (same chunking, compile included once)."""
    t0 = time.perf_counter()
    for s in range(seeds):
        cfg = config.replace(seed=s, total_env_steps=(config.num_updates // config.updates_per_chunk)
                             * config.updates_per_chunk * config.batch_size)
        tj.train(cfg, progress=False)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 24,576 env steps")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "anakin_seeds")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.total_env_steps = 2, 24_576
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    config = tj.PPOConfig(total_env_steps=args.total_env_steps)
    args.out.mkdir(parents=True, exist_ok=True)

    steps, train_ret, eval_ret, t_vmap = run_vmapped(config, args.seeds)
    t_seq = run_sequential(config, args.seeds)
    env_steps_total = args.seeds * steps[-1]

    rows = []
    for s in range(args.seeds):
        rows.append({"seed": s, "train_steps_to_threshold": first_hit(steps, train_ret[s], args.threshold),
                     "eval_steps_to_threshold": first_hit(steps, eval_ret[s], args.threshold),
                     "final_train_return": float(train_ret[s, -1]), "final_eval_return": float(eval_ret[s, -1])})
    with open(args.out / "results.csv", "w") as f:
        cols = list(rows[0])
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(repr(r[c]) for c in cols) + "\n")

    def med(key):
        vals = np.array([r[key] for r in rows], float)
        ok = vals[np.isfinite(vals)]
        rng = f"[{ok.min():.0f}..{ok.max():.0f}]" if len(ok) else "[-]"
        return f"{np.median(ok):.0f} {rng} ({len(ok)}/{len(vals)} seeds)" if len(ok) else f"never ({len(vals)} seeds)"

    command = " ".join([Path(sys.executable).name, *sys.argv])
    summary = f"""# PPO Anakin over seeds (gymnax CartPole-v1, default PPOConfig)

Command: `{command}`

| quantity | value |
|---|---|
| seeds | {args.seeds} |
| env steps per seed | {steps[-1]} |
| env steps to training return >= {args.threshold:g}, median [range] | {med('train_steps_to_threshold')} |
| env steps to eval return >= {args.threshold:g}, median [range] | {med('eval_steps_to_threshold')} |
| final eval return, median | {np.median([r['final_eval_return'] for r in rows]):.1f} |
| wall s, all seeds in one vmap (compile + eval included) | {t_vmap:.1f} |
| wall s, seeds one after another with `tj.train` | {t_seq:.1f} |
| vmap speed-up (sequential / vmap) | {t_seq / t_vmap:.2f}x |
| SPS, vmapped (all seeds) | {env_steps_total / t_vmap:,.0f} |
"""
    (args.out / "summary.md").write_text(summary)
    (args.out / "machine.json").write_text(json.dumps(provenance(), indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in range(args.seeds):
        ax.plot(steps, eval_ret[s], alpha=0.7, label=f"seed {s}" if args.seeds <= 8 else None)
    ax.axhline(args.threshold, color="k", ls="--", lw=0.8)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return (10 episodes)")
    ax.set_title("PPO Anakin, gymnax CartPole-v1")
    if args.seeds <= 8:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "curves.png", dpi=100)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
