"""Async PPO with remote actor processes (Ray), data-parallel learner devices and learner processes
(jax.distributed), against one process.

envpool CartPole-v1, PPO defaults (8 envs x 128 steps per actor rollout, 10 epochs x 4 minibatches),
schedule ``relaxed`` (K = 2), evaluation off. Points:

* ``threads`` A=1 L=1: the single-process run (one actor thread, one learner device): the baseline;
* ``ray`` A in (1, 2, 4), L in (1, 2): A remote actor processes on a private local Ray instance
  (each its own 8 envs and CPU policy copy; ``actor_backend='ray'``) feeding one learner process
  whose learner runs data-parallel over L simulated CPU devices (``jax_num_cpu_devices``);
* ``distributed`` P = 2: two learner processes (multi-host ``jax.distributed`` on 127.0.0.1, each
  ``tianji train --num-processes 2`` with one actor thread and one learner device; gradients
  averaged over both, the global batch twice the single run's, so half the updates for the same
  env steps). Its rates and threshold come from process 0's ``metrics.csv`` (global counters).

Per run: steady production SPS and consumed env SPS (every metrics row but the first, which holds
start-up and compilation; :func:`_common.steady_async`); time to threshold = wall seconds from the
start of ``tj.train`` (start-up included: Ray actor processes import JAX and compile their policy)
until a row's training ``episode_return_mean`` >= 475, and env steps to it; per-chunk transfer cost =
the runtime's ``h2d_s`` over the steady rows / chunks produced in them (threads: params to the actor
device + the chunk to the learner device; Ray: the rollout's round trip beyond the actor's own
rollout time — task dispatch, params from the object store, the chunk back through it — plus the
chunk onto the learner device). Every figure is also given as a ratio against the baseline of the
same repeat; repeats are interleaved; median over repeats.

Ray actors feed one learner process (Ray actors with several learner processes are not supported);
L counts data-parallel learner devices inside it.

Writes ``experiments/results/scaling/{results.csv, summary.md, scaling.png, machine.json}``.

    python experiments/scaling.py            # full: A in 1,2,4; L in 1,2; P = 2; 300k env steps; 3 repeats
    python experiments/scaling.py --quick    # threads 1x1, ray (2,2), P = 2; 8k env steps; 1 repeat
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

MAX_LEARNERS = 2
jax.config.update("jax_num_cpu_devices", 1 + MAX_LEARNERS)  # before any JAX computation

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

import tianji_jax as tj  # noqa: E402

THRESHOLD = 475.0


def run(base: tj.PPOConfig, backend: str, actors: int, learners: int, seed: int) -> dict:
    """One training run in this process; see :func:`summarize`."""
    cfg = base.replace(actor_backend=backend, num_actors=actors, num_learner_devices=learners, seed=seed)
    with C.Timer() as t:
        res = tj.train(cfg, progress=False)
    return summarize(res.curve, cfg, t.s, processes=1)


CLI = "import sys; from tianji_jax.cli.commands import main; sys.exit(main(sys.argv[1:]))"


def run_distributed(base: tj.PPOConfig, num_processes: int, seed: int, timeout_s: float = 900.0) -> dict:
    """One multi-host run: ``num_processes`` ``tianji train`` processes on 127.0.0.1 (one actor
    thread and one learner device each), measured from process 0's ``metrics.csv``; every child is
    killed by its pid at the end."""
    import pandas as pd

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flags = ["--env", base.env, "--runtime", "async", "--eval-episodes", "0", "--total-env-steps",
             str(base.total_env_steps), "--eval-every-env-steps", str(base.eval_every_env_steps), "--seed", str(seed),
             "--progress", "False", "--tensorboard", "False", "--num-processes", str(num_processes),
             "--coordinator", f"127.0.0.1:{port}"]
    with tempfile.TemporaryDirectory() as tmp, C.Timer() as t:
        logs = [open(Path(tmp) / f"p{i}.log", "w+") for i in range(num_processes)]
        procs = [subprocess.Popen([sys.executable, "-c", CLI, "train", *flags, "--process-id", str(i),
                                   "--run-dir", str(Path(tmp) / "run")], stdout=logs[i], stderr=subprocess.STDOUT)
                 for i in range(num_processes)]
        try:
            rcs = [p.wait(timeout_s) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
        if rcs != [0] * num_processes:
            logs[0].seek(0)
            raise RuntimeError(f"learner processes exited with {rcs}; process 0's log:\n{logs[0].read()[-3000:]}")
        df = pd.read_csv(Path(tmp) / "run" / "metrics.csv")
        curve = {k: df[k].to_numpy(float) for k in df.columns}
        for f in logs:
            f.close()
    cfg = base.replace(num_processes=num_processes, coordinator=f"127.0.0.1:{port}", seed=seed)
    return summarize(curve, cfg, t.s, processes=num_processes)


def summarize(c: dict, cfg: tj.PPOConfig, wall_s: float, processes: int) -> dict:
    """A run's steady rates, time/steps to threshold and per-chunk transfer cost from its curve
    (with several learner processes the counters are global and the timers per-process means)."""
    out = C.steady_async(c, cfg.update_epochs)
    dt = np.diff(c["wall_time_s"])
    chunks = float(np.sum(c["production_sps"][1:] * dt)) / cfg.batch_size / processes  # per process
    out["transfer_ms_per_chunk"] = 1e3 * float(np.nansum(c["h2d_s"][1:])) / chunks if chunks > 0 else math.nan
    hit = np.nonzero(c["episode_return_mean"] >= THRESHOLD)[0]
    out["time_to_threshold_s"] = float(c["wall_time_s"][hit[0]]) if len(hit) else math.nan
    out["steps_to_threshold"] = float(c["env_steps"][hit[0]]) if len(hit) else math.nan
    out["first_row_s"] = float(c["wall_time_s"][0])
    out["wall_s_total"] = wall_s
    out["lost_chunks"] = float(c["lost_chunks"][-1])
    out["final_train_return"] = float(c["episode_return_mean"][np.isfinite(c["episode_return_mean"])][-1])
    return out


def processes(backend: str, actors: int, learner_processes: int) -> int:
    """Busy processes: the learner processes plus one per remote actor (threads: one in all)."""
    return learner_processes + (actors if backend == "ray" else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 points, 8k env steps, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scaling")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    from tianji_jax.runtime.actors.ray_actors import RayContext

    t_start = time.perf_counter()
    load_start = C.loadavg()
    if args.quick:
        args.repeats = 1
        # one point per backend; the Ray point varies actors and learner devices together
        grid = [("threads", 1, 1, 1), ("ray", 2, 2, 1), ("distributed", 1, 1, 2)]
        budget = 8_192
    else:
        grid = ([("threads", 1, 1, 1)] + [("ray", a, l, 1) for l in (1, 2) for a in (1, 2, 4)]
                + [("distributed", 1, 1, 2)])
        budget = 307_200
    base = tj.PPOConfig(env="envpool:CartPole-v1", runtime="async", eval_episodes=0, total_env_steps=budget,
                        eval_every_env_steps=4096 if args.quick else 16_384)
    args.out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    # one private local instance for every run, a CPU slot per actor even past the cores (oversubscribed)
    ray_ctx = RayContext(None, num_cpus=max(cores, max(a for _, a, _, _ in grid)))
    rows = []
    try:
        for rep in range(args.repeats):
            baseline = None
            for backend, a, l, p in grid:
                r = run_distributed(base, p, seed=rep) if backend == "distributed" else run(base, backend, a, l, seed=rep)
                if backend == "threads":
                    baseline = r
                procs = processes(backend, a, p)
                busy = (1 + a) * p  # per learner process: its learner and its actor threads (or Ray actors)
                row = {"repeat": rep, "actor_backend": backend, "actor_processes": a if backend == "ray" else 0,
                       "actor_threads": 0 if backend == "ray" else a * p, "learner_devices": l, "learner_processes": p,
                       "processes": procs, "busy_workers": busy, "oversubscribed": int(busy > cores), **r}
                for k in ("production_sps", "consumed_env_sps", "time_to_threshold_s", "transfer_ms_per_chunk"):
                    row[f"{k}_over_single"] = r[k] / baseline[k] if baseline and baseline[k] else math.nan
                rows.append(row)
                print(f"[rep {rep}] {backend} A={a} L={l} P={p}: production {r['production_sps']:,.0f} SPS "
                      f"({row['production_sps_over_single']:.2f} x single), consumed {r['consumed_env_sps']:,.0f} "
                      f"env SPS, transfer {r['transfer_ms_per_chunk']:.2f} ms/chunk, threshold at "
                      f"{r['time_to_threshold_s']:.0f} s", flush=True)
    finally:
        ray_ctx.close()
    C.write_csv(rows, args.out / "results.csv")
    summary = make_summary(args, base, grid, rows, cores, time.perf_counter() - t_start, load_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": time.perf_counter() - t_start,
                               "sizes": {f: getattr(base, f) for f in ("num_envs", "num_steps", "update_epochs",
                                                                        "num_minibatches", "total_env_steps",
                                                                        "eval_every_env_steps")}})
    plot(rows, args.out / "scaling.png")
    print(summary)
    return 0


def make_summary(args, base, grid, rows, cores, wall_s, load_start) -> str:
    lines = [f"# Remote actor processes (Ray), learner devices and learner processes vs one process "
             f"{'(--quick)' if args.quick else ''}",
             "", f"Command: `{C.command()}`", "", C.SHARED_NOTE, "",
             f"{args.repeats} repeat(s), interleaved; median [min..max] over repeats. Total wall {wall_s:.0f} s; "
             f"load average at start {load_start}.", "",
             f"Sizes: envpool CartPole-v1, {base.num_envs} envs x {base.num_steps} steps per actor rollout, "
             f"{base.update_epochs} epochs x {base.num_minibatches} minibatches, {base.env_steps} env steps per run, "
             f"a metrics row every {base.updates_per_chunk} updates, schedule relaxed (K = 2), evaluation off. "
             "Steady state = every metrics row but the first (start-up and compilation).", "",
             "Columns: *single* = the one-process run (actor thread + learner, `actor_backend='threads'`); "
             "*ray A* = A remote actor processes on a private local Ray instance; *L* = data-parallel learner "
             "devices in the learner process; *distributed P* = P learner processes on jax.distributed (one actor "
             "thread and one learner device each, gradients averaged over all, global batch P x the single "
             "run's; counters from process 0's metrics.csv are global, timers per-process means); "
             "*production* = env steps inserted per second; *consumed* = env "
             "steps the learner consumed per second (no epoch reuse); *threshold* = wall seconds from the start "
             f"of `tj.train` (start-up included) until training `episode_return_mean` >= {THRESHOLD:g} "
             "(empty: not reached within the run); *transfer* = ms per chunk of the runtime's `h2d_s` (Ray: "
             "round trip beyond the actor's rollout + onto the learner device; threads: device transfers); "
             "*x single* = ratio against the single-process run of the same repeat.", "",
             f"Oversubscription: this machine has {cores} core(s). Busy workers = per learner process, the learner + "
             "one per actor (thread or process); envpool's worker threads and the Ray daemons (GCS, raylet) come on "
             "top. **OVERSUB** marks busy workers > cores (on 2 cores: A >= 2, or 2 learner processes), where more "
             "processes share the same cores instead of adding compute.", "",
             "| backend | actors | learner devices | learner processes | production SPS | x single | consumed env SPS | "
             "x single | transfer ms/chunk | x single | threshold s | x single | reached | steps to threshold | "
             "start-up s | lost chunks |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for backend, a, l, p in grid:
        rs = [r for r in rows if r["actor_backend"] == backend and r["learner_devices"] == l
              and r["learner_processes"] == p and (r["actor_processes"] or r["actor_threads"] // p) == a]
        over = " **OVERSUB**" if rs[0]["oversubscribed"] else ""
        lines.append(
            f"| {backend}{over} | {a * p if backend == 'distributed' else a} | {l} | {p} | "
            f"{C.median_range(r['production_sps'] for r in rs)} | "
            f"{C.median_range((r['production_sps_over_single'] for r in rs), '{:.2f}')} | "
            f"{C.median_range(r['consumed_env_sps'] for r in rs)} | "
            f"{C.median_range((r['consumed_env_sps_over_single'] for r in rs), '{:.2f}')} | "
            f"{C.median_range((r['transfer_ms_per_chunk'] for r in rs), '{:.2f}')} | "
            f"{C.median_range((r['transfer_ms_per_chunk_over_single'] for r in rs), '{:.1f}')} | "
            f"{C.median_range((r['time_to_threshold_s'] for r in rs), '{:.0f}')} | "
            f"{C.median_range((r['time_to_threshold_s_over_single'] for r in rs), '{:.2f}')} | "
            f"{sum(np.isfinite(r['time_to_threshold_s']) for r in rs)}/{len(rs)} | "
            f"{C.median_range(r['steps_to_threshold'] for r in rs)} | "
            f"{C.median_range((r['first_row_s'] for r in rs), '{:.0f}')} | "
            f"{C.median_range(r['lost_chunks'] for r in rs)} |")
    lines.append("")
    return "\n".join(lines) + "\n"


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("production_sps_over_single", "production SPS / single process"),
              ("time_to_threshold_s_over_single", "time to threshold / single process"),
              ("transfer_ms_per_chunk", "transfer ms per chunk")]
    for ax, (key, title) in zip(axes, panels):
        for l in sorted({r["learner_devices"] for r in rows if r["actor_backend"] == "ray"}):
            ray_l = [r for r in rows if r["actor_backend"] == "ray" and r["learner_devices"] == l]
            xs = sorted({r["actor_processes"] for r in ray_l})
            ys = [C.median([r[key] for r in ray_l if r["actor_processes"] == a]) for a in xs]
            ax.plot(xs, ys, "o-", label=f"Ray actors, {l} learner device(s)")
        single = C.median([r[key] for r in rows if r["actor_backend"] == "threads"])
        if np.isfinite(single):
            ax.axhline(single, color="gray", ls="--", label="single process")
        multi = C.median([r[key] for r in rows if r["actor_backend"] == "distributed"])
        if np.isfinite(multi):
            ax.axhline(multi, color="C3", ls=":", label="2 learner processes (jax.distributed)")
        ax.set_xlabel("remote actor processes")
        ax.set_title(title, fontsize=10)
        ax.set_xticks([1, 2, 4])
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
