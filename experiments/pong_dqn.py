"""Async DQN on envpool Pong-v5 (Nature CNN, frame-deduplicated uint8 replay): SPS at small scale,
and the full-scale command with its replay memory footprint.

The small-scale run (default; ``--quick`` for the test suite) is ``DQNConfig.atari()`` -- CleanRL's
``dqn_atari.py`` settings -- shrunk to a CPU budget (fewer env steps, a smaller buffer and
learning start): one actor thread on cpu:0 steps 8 envpool envs and acts epsilon-greedy, the
learner on cpu:1 stores every frame once (``tianji_jax.buffers.frame_replay``) and runs one gradient
update of batch 32 per 4 env steps, the replay ratio held by the rate limiter. It reports the
steady production SPS (env steps the actor produced per second), the inserted SPS (env steps that
reached replay) and the consumed SPS (transitions sampled by the learner per second = replay
ratio x batch x inserted SPS), the first metrics row (compilation) excluded. Learning Pong takes
millions of env steps: out of reach on a 2-core CPU; ``--full`` runs the full-scale config.
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
from _common import SHARED_NOTE, command, write_csv, write_machine  # noqa: E402

import tianji_jax as tj  # noqa: E402
from tianji_jax.buffers import frame_replay, replay  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "pong_dqn"
ENV = "envpool:Pong-v5"
FULL_CMD = "python experiments/pong_dqn.py --full --run-dir runs/pong_dqn"


def footprint(num_envs: int, capacity: int) -> tuple[int, int]:
    """``(frame replay bytes, naive obs/next_obs replay bytes)`` of a Pong buffer of ``capacity``
    transitions fed by ``num_envs`` envs (84x84 uint8 frames, stacks of 4)."""
    frames = frame_replay.frame_replay_bytes(num_envs, capacity, (84, 84), np.uint8)
    obs = jax.ShapeDtypeStruct((4, 84, 84), np.uint8)
    item = {"obs": obs, "next_obs": obs, "action": jax.ShapeDtypeStruct((), np.int32),
            "reward": jax.ShapeDtypeStruct((), np.float32), "discount": jax.ShapeDtypeStruct((), np.float32)}
    return frames, replay.replay_bytes(item, capacity)


def steady(curve: dict[str, np.ndarray]) -> dict[str, float]:
    """Rates over the rows after the first (which includes compilation), each row weighted by its
    wall time (see ``_common.steady_async``)."""
    wall = curve["wall_time_s"]
    if len(wall) < 2:
        raise ValueError("need >= 2 metrics rows for a steady state (the first includes compilation)")
    dt, span = np.diff(wall), float(wall[-1] - wall[0])
    return {"steady_s": span,
            "production_sps": float(np.sum(curve["production_sps"][1:] * dt) / span),
            "inserted_sps": float((curve["env_steps"][-1] - curve["env_steps"][0]) / span),
            "consumed_sps": float(np.sum(curve["consumed_sps"][1:] * dt) / span),
            "update_s_share": float(np.nansum(curve["update_s"][1:]) / span),
            "rollout_s_share": float(np.nansum(curve["rollout_s"][1:]) / span),
            "actor_wait_frac": float(np.sum(curve["actor_wait_frac"][1:] * dt) / span),
            "learner_wait_frac": float(np.sum(curve["learner_wait_frac"][1:] * dt) / span),
            "replay_ratio_observed": float(curve["replay_ratio_observed"][-1]),
            "td_loss_last": float(curve["td_loss"][-1]), "episodes": float(np.sum(curve["episodes"])),
            "episode_return_mean": float(np.nanmean(curve["episode_return_mean"]))
            if np.isfinite(curve["episode_return_mean"]).any() else float("nan")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="1,600 env steps (the test suite's run)")
    p.add_argument("--full", action="store_true",
                   help="the full-scale run: DQNConfig.atari() (10M env steps, 1M-transition buffer); accelerator")
    p.add_argument("--run-dir", type=Path, default=None, help="--full: run directory (metrics, checkpoints)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    full_cfg = dict(num_envs=8, buffer_capacity=1_000_000, total_env_steps=10_000_000)
    frames_full, naive_full = footprint(full_cfg["num_envs"], full_cfg["buffer_capacity"])
    if args.full:
        cfg = tj.DQNConfig.atari(ENV)  # MemoryError with the numbers if the buffer does not fit
        print(cfg.describe(), flush=True)
        tj.train(cfg, run_dir=args.run_dir)
        return 0
    steps, capacity, starts, every = (1_600, 8_000, 800, 400) if args.quick else (8_000, 40_000, 2_000, 1_000)
    cfg = tj.DQNConfig.atari(ENV, total_env_steps=steps, buffer_capacity=capacity, learning_starts=starts,
                             eval_every_env_steps=every, eval_episodes=0, seed=0)
    print(cfg.describe(), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    curve = tj.train(cfg, progress=False).curve
    wall = time.perf_counter() - t0
    s = steady(curve)
    rows = [{k: float(curve[k][i]) for k in ("env_steps", "wall_time_s", "sps", "production_sps", "consumed_sps",
                                              "replay_ratio_observed", "td_loss", "q_mean", "epsilon",
                                              "policy_lag_mean", "policy_lag_max", "episodes", "episode_return_mean",
                                              "rollout_s", "update_s", "actor_wait_frac", "learner_wait_frac")}
            for i in range(len(curve["env_steps"]))]
    write_csv(rows, args.out / "results.csv")
    frames_run, naive_run = footprint(cfg.num_envs, cfg.buffer_capacity)
    gib = 2**30
    lines = [
        "# Async DQN on envpool Pong-v5 (Nature CNN, frame-deduplicated replay)", "",
        f"Command: `{command()}`", "",
        f"`DQNConfig.atari()` (CleanRL `dqn_atari.py` settings) at CPU scale: {cfg.env_steps:,} env steps, "
        f"{cfg.num_envs} envs, buffer {cfg.buffer_capacity:,} transitions ({frames_run / 2**20:.0f} MiB; "
        f"{naive_run / 2**20:.0f} MiB as obs/next_obs stacks), learning starts at {cfg.learning_starts:,}, "
        f"batch {cfg.batch_size}, replay ratio {cfg.replay_ratio} ({cfg.updates_per_step} gradient updates per "
        f"{cfg.iteration_env_steps} env steps); actor on cpu:0, learner and replay on cpu:1; metrics rows every "
        f"{every} env steps, the first (compilation) excluded from the rates. Wall time {wall:.0f} s.", "",
        SHARED_NOTE, "",
        "| production SPS | inserted SPS | consumed SPS (sampled transitions/s) | replay ratio observed | "
        "learner busy share | actor busy share | actor wait | learner wait |",
        "|---|---|---|---|---|---|---|---|",
        f"| {s['production_sps']:,.1f} | {s['inserted_sps']:,.1f} | {s['consumed_sps']:,.1f} | "
        f"{s['replay_ratio_observed']:.3f} | {s['update_s_share']:.2f} | {s['rollout_s_share']:.2f} | "
        f"{s['actor_wait_frac']:.2f} | {s['learner_wait_frac']:.2f} |", "",
        f"Episodes finished: {s['episodes']:.0f} (a Pong game lasts ~800+ agent steps with random play); the "
        "returns are not a learning result at this scale.", "",
        "## Full scale", "",
        f"`{FULL_CMD}` runs `DQNConfig.atari('envpool:Pong-v5')`: {full_cfg['total_env_steps']:,} env steps, "
        f"{full_cfg['num_envs']} envs, a {full_cfg['buffer_capacity']:,}-transition replay buffer. Its replay "
        f"footprint: **{frames_full / gib:.2f} GiB** with every 84x84 uint8 frame stored once "
        f"(`frame_replay_bytes`), against {naive_full / gib:.2f} GiB for obs/next_obs stacks "
        f"({naive_full / frames_full:.1f}x). The config checks it against free device memory before allocating "
        "(MemoryError with the numbers). CleanRL reports a Pong return of about +20 after 10M env steps with these settings (not reproduced here).", "",
    ]
    (args.out / "summary.md").write_text("\n".join(lines))
    write_machine(args.out, {"quick": args.quick, "env_steps": cfg.env_steps, "wall_s": wall, **s,
                             "full_replay_bytes": frames_full, "full_naive_replay_bytes": naive_full})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
