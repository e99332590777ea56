"""Async PPO on envpool Pong-v5 (Nature CNN): ``relaxed`` against ``sync`` throughput, side by side.

The TianJi claim at the scale of one machine: when acting costs about as much as learning,
relaxing the hand-off between actor and learner overlaps the two. ``sync`` makes the actor wait
for params k before rollout k (lock-step); ``relaxed`` lets it start the next rollout with the
newest params it has (lag <= K). Both runs use the same config, seed and devices (actor on
cpu:0, learner on cpu:1); repeats are interleaved; the ratio is taken within each repeat.

Time to a Pong threshold is out of reach on a 2-core CPU (about 50 env steps per second here); the
full-scale command for an accelerator is printed in the summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 2)  # before any computation: actor and learner devices

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command, median, median_range, write_csv, write_machine  # noqa: E402

import tianji_jax as tj  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "pong_relaxed_vs_sync"


def run(schedule: str, num_steps: int, updates: int, epochs: int, seed: int) -> dict[str, float]:
    cfg = tj.PPOConfig(env="envpool:Pong-v5", runtime="async", schedule=schedule, num_envs=8, num_steps=num_steps,
                       num_minibatches=4, update_epochs=epochs, total_env_steps=8 * num_steps * updates,
                       eval_every_env_steps=8 * num_steps, eval_episodes=0, learning_rate=2.5e-4, seed=seed)
    t0 = time.perf_counter()
    c = tj.train(cfg, progress=False).curve
    wall = time.perf_counter() - t0
    rows = slice(1, None)  # the first row includes compilation
    dt = np.diff(c["wall_time_s"])
    steps = np.diff(c["env_steps"])
    return {
        "schedule": schedule, "seed": seed, "wall_s": wall,
        "consumed_sps": float(steps.sum() / dt.sum()),
        "rollout_share": float(c["rollout_s"][rows].sum() / dt.sum()),
        "update_share": float(c["update_s"][rows].sum() / dt.sum()),
        "actor_wait_frac": float(np.mean(c["actor_wait_frac"][rows])),
        "learner_wait_frac": float(np.mean(c["learner_wait_frac"][rows])),
        "policy_lag_max": float(np.max(c["policy_lag_max"])),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1 repeat, 3 updates of 8 envs x 16 steps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    repeats, num_steps, updates, epochs = (1, 16, 3, 1) if args.quick else (args.repeats, 32, 6, 2)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run("sync", num_steps, 2, 1, 0)  # compile both programs' shared parts once, outside the timings
    rows = []
    for r in range(repeats):
        for schedule in (("sync", "relaxed") if r % 2 == 0 else ("relaxed", "sync")):
            rows.append(run(schedule, num_steps, updates, epochs, seed=r))
            print(rows[-1], flush=True)
    write_csv(rows, args.out / "results.csv")
    by = {s: [x for x in rows if x["schedule"] == s] for s in ("sync", "relaxed")}
    ratios = [b["consumed_sps"] / a["consumed_sps"] for a, b in zip(by["sync"], by["relaxed"])]
    lines = [
        "# Async PPO on envpool Pong-v5: relaxed vs sync", "",
        f"Command: `{command()}`", "",
        f"8 envs x {num_steps} steps per rollout, {epochs} epoch(s) x 4 minibatches, Nature CNN, {updates} updates "
        f"per run (first metrics row, with compilation, excluded), {repeats} interleaved repeat(s); actor on cpu:0, "
        "learner on cpu:1. Machine: 2 CPU cores shared with other work, so read the ratio (taken within each "
        "repeat), not the absolute rates.", "",
        "| schedule | consumed SPS | actor busy share | learner busy share | actor wait | learner wait | lag max |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, xs in by.items():
        lines.append(f"| {s} | {median_range([x['consumed_sps'] for x in xs], '{:,.1f}')} | "
                     f"{median([x['rollout_share'] for x in xs]):.2f} | {median([x['update_share'] for x in xs]):.2f} | "
                     f"{median([x['actor_wait_frac'] for x in xs]):.2f} | "
                     f"{median([x['learner_wait_frac'] for x in xs]):.2f} | "
                     f"{max(x['policy_lag_max'] for x in xs):.0f} |")
    ratio = median(ratios)
    lines += ["", f"**relaxed / sync consumed SPS: {median_range(ratios, '{:.2f}')}**", ""]
    if ratio < 1.2:
        lines += [
            "Why the ratio is below 1.2 here: overlap can save at most the smaller of the two phases. The "
            "busy shares above say how the wall time splits between acting (inference + env step) and "
            "learning; on this CPU the Nature CNN update dominates, so hiding the (smaller) acting time "
            "behind it bounds the gain at 1 + acting/learning, and both devices share the same 2 cores, "
            "so the actor's inference and envpool's threads also slow the learner down.", ""]
    lines += ["Full scale (accelerator): `tianji train --env envpool:Pong-v5 --runtime async --schedule relaxed "
              "--num-envs 64 --num-steps 128 --update-epochs 4 --num-minibatches 4 --total-env-steps 10000000` "
              "against the same with `--schedule sync`.", ""]
    (args.out / "summary.md").write_text("\n".join(lines))
    write_machine(args.out, {"repeats": repeats, "num_steps": num_steps, "updates": updates, "epochs": epochs,
                             "wall_s": time.perf_counter() - t0})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
