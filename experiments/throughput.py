"""Async PPO throughput against actor threads and learner devices, next to the raw env limit.

For each backend (envpool CartPole-v1, gymnax CartPole-v1; envpool Pong-v5 in full mode only) and
each (actor threads A, learner devices L) it runs ``tj.train`` in the async runtime, schedule
``relaxed``, evaluation off, and takes the steady state (the first metrics row, which includes
compilation, excluded): production SPS (env steps inserted by actors per second) and consumed SPS
(env steps the learner consumed per second; the library's ``consumed_sps`` column counts epoch
reuse, so it is also given). In the same repeat it measures the raw env SPS of the same backend
with random actions and ``A`` threads each stepping their own ``num_envs`` envs exactly as the
actors do (the limit), and, for gymnax, the Anakin runtime's SPS on the same PPO config (the fused
baseline). Repeats are interleaved (repeat loop outermost) so a change in the neighbours' load hits
every configuration alike; each ratio is taken within a repeat, then the median over repeats.

Learner devices are simulated CPU devices (``jax_num_cpu_devices``): actors on cpu:0, the learner
on the last L devices. The machine has 2 cores: any A + L + env threads > 2 oversubscribes it.

Writes ``experiments/results/throughput/{results.csv, raw.csv, summary.md, throughput.png, machine.json}``.

    python experiments/throughput.py            # full: A in 1,2,4; L in 1,2; 3 repeats; + Pong-v5
    python experiments/throughput.py --quick    # (A, L) in (1,1), (2,2); 1 repeat; CartPole only
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import jax

MAX_LEARNERS = 2
jax.config.update("jax_num_cpu_devices", 1 + MAX_LEARNERS)  # before any JAX computation

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

import tianji_jax as tj  # noqa: E402
from tianji_jax.envs.host import EnvpoolVecEnv  # noqa: E402


PONG_NOTE = ("Pong-v5 is sized to fit the time box: the Nature-CNN update on CPU runs at tens of env steps per "
             "second, so each run has 2 metrics rows and the steady state is the single second row (2 updates). "
             "Over so short a window production and consumption are not balanced (the queue is still filling: "
             "consumed / produced 0.5 with one learner device), so read production x raw and the update share "
             "(~1.0: the learner's CNN update is the bottleneck), not the consumed column.")


# ---------------------------------------------------------------------------------------------
# raw env throughput with random actions (the limit)
# ---------------------------------------------------------------------------------------------
def _timed_threads(work, threads: int, seconds: float, barrier: threading.Barrier, stop: threading.Event) -> float:
    """Start ``work(i)`` on ``threads`` daemon threads (each waits on ``barrier`` before its loop),
    let them run ``seconds`` once all are ready, set ``stop``, join them; returns the timed window (s)."""
    ts = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def raw_envpool_sps(env_id: str, num_envs: int, threads: int, seconds: float, n_actions: int) -> dict:
    """``threads`` threads, each stepping its own EnvpoolVecEnv(num_envs) with random actions (as
    the actors do, sync mode). Returns valid transitions/s (what the actors can insert) and all
    env steps/s (reset steps included)."""
    envs = [EnvpoolVecEnv(env_id, num_envs, seed=1000 + i * num_envs) for i in range(threads)]
    counts = [[0, 0] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        rng = np.random.default_rng(i)
        env = envs[i]
        step = env.reset()
        barrier.wait()
        while not stop.is_set():
            step = env.step(rng.integers(0, n_actions, len(step)).astype(np.int32), step.env_id)
            counts[i][0] += int(step.valid.sum())
            counts[i][1] += len(step)

    dt = _timed_threads(work, threads, seconds, barrier, stop)
    for e in envs:
        e.close()
    return {"raw_sps": sum(c[0] for c in counts) / dt, "raw_all_steps_sps": sum(c[1] for c in counts) / dt}


def raw_envpool_compiled_sps(env_id: str, num_envs: int, threads: int, seconds: float, n_actions: int,
                             num_steps: int) -> dict:
    """The same envs stepped through envpool's XLA interface: ``threads`` threads, each calling a
    jitted ``num_steps``-step loop of random actions on its own envs (no Python per step; what a
    compiled actor, ``tianji_jax.runtime.actors.envpool_rollout``, can reach at best). Valid transitions/s
    exclude the reset steps after each done, as :func:`raw_envpool_sps`."""
    from jax import lax

    envs = [EnvpoolVecEnv(env_id, num_envs, seed=1000 + i * num_envs) for i in range(threads)]
    loops = []
    for i, env in enumerate(envs):
        env.reset()
        handle, _, _, step = env._env.xla()

        def loop(h, key, step=step):
            def body(_, c):
                h, key, expect_reset, valid = c
                key, k = jax.random.split(key)
                h, (_, _, te, tr, _) = step(h, jax.random.randint(k, (num_envs,), 0, n_actions, jnp.int32))
                return h, key, te | tr, valid + jnp.sum(~expect_reset)
            h, key, _, valid = lax.fori_loop(0, num_steps, body, (h, key, jnp.zeros(num_envs, bool), jnp.int32(0)))
            return h, key, valid

        fn = jax.jit(loop)
        h, key, v = fn(jnp.asarray(handle), jax.random.PRNGKey(i))  # compile outside the timed window
        jax.block_until_ready(v)
        loops.append([fn, h, key])
    counts = [[0, 0] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        fn, h, key = loops[i]
        barrier.wait()
        while not stop.is_set():
            h, key, v = fn(h, key)
            counts[i][0] += int(v)
            counts[i][1] += num_envs * num_steps

    dt = _timed_threads(work, threads, seconds, barrier, stop)
    for e in envs:
        e.close()
    return {"raw_compiled_sps": sum(c[0] for c in counts) / dt,
            "raw_compiled_all_steps_sps": sum(c[1] for c in counts) / dt}


_GYMNAX_RAW: dict = {}


def _gymnax_rollout(num_envs: int, num_steps: int, device):
    key = (num_envs, num_steps, device.id)
    if key not in _GYMNAX_RAW:
        fn, init = C.gymnax_random_rollout(num_envs, num_steps)  # runs where its inputs live
        _GYMNAX_RAW[key] = (fn, init)
    return _GYMNAX_RAW[key]


def raw_gymnax_sps(num_envs: int, num_steps: int, threads: int, seconds: float, device) -> dict:
    """``threads`` threads, each calling a jitted ``num_steps``-step scan of ``num_envs`` gymnax
    envs with random actions on ``device`` (the actors' device), as the gymnax actors do."""
    fn, init = _gymnax_rollout(num_envs, num_steps, device)
    carries = []
    for i in range(threads):
        k = jax.device_put(jax.random.PRNGKey(i), device)
        state, _ = init(k)
        k, state, r = fn(k, state)  # compile / warm up outside the timed window
        jax.block_until_ready(r)
        carries.append((k, state))
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        k, state = carries[i]
        barrier.wait()
        while not stop.is_set():
            k, state, r = fn(k, state)
            jax.block_until_ready(r)
            counts[i] += num_envs * num_steps

    dt = _timed_threads(work, threads, seconds, barrier, stop)
    return {"raw_sps": sum(counts) / dt, "raw_all_steps_sps": sum(counts) / dt}


# ---------------------------------------------------------------------------------------------
# training runs
# ---------------------------------------------------------------------------------------------
def async_run(base: tj.PPOConfig, actors: int, learners: int, seed: int) -> dict:
    cfg = base.replace(runtime="async", schedule="relaxed", num_actors=actors, num_learner_devices=learners,
                       seed=seed)
    with C.Timer() as t:
        res = tj.train(cfg, progress=False)
    out = C.steady_async(res.curve, cfg.update_epochs)
    out["wall_s_total"] = t.s
    out["first_row_s"] = float(res.curve["wall_time_s"][0])
    return out


def anakin_run(base: tj.PPOConfig, seed: int) -> dict:
    cfg = base.replace(runtime="anakin", seed=seed)
    with C.Timer() as t:
        res = tj.train(cfg, progress=False)
    return {"anakin_sps": C.steady_anakin(res.curve), "wall_s_total": t.s}


def env_threads(backend: str, actors: int, num_envs: int) -> int:
    """Busy threads: actors + learner + envpool's worker threads (min(num_envs, cores) each)."""
    import os

    pool = min(num_envs, os.cpu_count() or 1) if backend == "envpool" else 0
    return actors + 1 + actors * pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 (A, L) points, 1 repeat, CartPole only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--raw-seconds", type=float, default=1.5, help="seconds per raw env measurement")
    parser.add_argument("--no-pong", action="store_true", help="skip Pong-v5 in full mode")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "throughput")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    load_start = C.loadavg()
    if args.quick:
        args.repeats, args.raw_seconds = 1, 0.75
        grid = [(1, 1), (2, 2)]  # the second point varies actors and learner devices together
    else:
        grid = [(a, l) for l in (1, 2) for a in (1, 2, 4)]
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    args.out.mkdir(parents=True, exist_ok=True)

    # Sizes (recorded in summary.md): PPO defaults (8 envs x 128 steps, 10 epochs x 4 minibatches)
    # for CartPole; Pong-v5 tiny (CNN updates on CPU run at tens of env steps per second).
    q = args.quick
    backends = {
        "gymnax:CartPole-v1": tj.PPOConfig(env="gymnax:CartPole-v1", runtime="async", eval_episodes=0,
                                           total_env_steps=24_576 if q else 98_304, eval_every_env_steps=8192),
        "envpool:CartPole-v1": tj.PPOConfig(env="envpool:CartPole-v1", runtime="async", eval_episodes=0,
                                            total_env_steps=16_384 if q else 40_960, eval_every_env_steps=4096),
    }
    if not q and not args.no_pong:
        backends["envpool:Pong-v5"] = tj.PPOConfig(env="envpool:Pong-v5", runtime="async", eval_episodes=0, num_envs=8, num_steps=32,
                                                   update_epochs=1, num_minibatches=4, total_env_steps=1024,
                                                   eval_every_env_steps=512)
    pong_grid = [(1, 1), (2, 1), (1, 2)]
    actor_device = jax.devices()[0]

    rows, raw_rows = [], []
    for rep in range(args.repeats):
        for name, base in backends.items():
            backend, env_id = name.split(":")
            g = pong_grid if "Pong" in env_id else grid
            raw = {}
            for a in sorted({a for a, _ in g}):
                if backend == "envpool":
                    n_act = base.env_spec.action_space.n
                    r = raw_envpool_sps(env_id, base.num_envs, a, args.raw_seconds, n_act)
                    r.update(raw_envpool_compiled_sps(env_id, base.num_envs, a, args.raw_seconds, n_act,
                                                      base.num_steps))
                    r["raw_python_sps"] = r["raw_sps"]  # the bound is the faster way to step the same envs
                    r["raw_python_all_steps_sps"] = r["raw_all_steps_sps"]
                    faster = r["raw_compiled_sps"] > r["raw_python_sps"]
                    r["raw_sps"] = r["raw_compiled_sps"] if faster else r["raw_python_sps"]
                    r["raw_all_steps_sps"] = r["raw_compiled_all_steps_sps"] if faster else r["raw_all_steps_sps"]
                else:
                    r = raw_gymnax_sps(base.num_envs, base.num_steps, a, args.raw_seconds, actor_device)
                raw[a] = r
                raw_rows.append({"repeat": rep, "env": name, "threads": a, "num_envs_per_thread": base.num_envs,
                                 **r})
                print(f"[rep {rep}] raw {name} threads={a}: {r['raw_sps']:,.0f} SPS", flush=True)
            anakin = None
            if backend == "gymnax":
                anakin = anakin_run(base, seed=rep)
                raw_rows.append({"repeat": rep, "env": name, "threads": 0, "num_envs_per_thread": base.num_envs,
                                 "anakin_sps": anakin["anakin_sps"]})
                print(f"[rep {rep}] anakin {name}: {anakin['anakin_sps']:,.0f} SPS", flush=True)
            base_prod = None
            for a, l in g:
                r = async_run(base, a, l, seed=rep)
                if (a, l) == (1, 1):
                    base_prod = r["production_sps"]
                row = {"repeat": rep, "env": name, "actors": a, "learner_devices": l,
                       "busy_threads": env_threads(backend, a, base.num_envs),
                       "oversubscribed": int(env_threads(backend, a, base.num_envs) > 2),
                       **r, "raw_sps": raw[a]["raw_sps"], "raw_sps_1thread": raw[1]["raw_sps"],
                       "production_over_raw": r["production_sps"] / raw[a]["raw_sps"],
                       "production_over_raw_1thread": r["production_sps"] / raw[1]["raw_sps"],
                       # env steps per second of actor rollout time, against raw per thread: the actors'
                       # rate while producing, whatever time they spend waiting for the learner
                       "busy_rate_over_raw": (r["production_sps"] / r["rollout_s_share"] / (raw[a]["raw_sps"] / a)
                                              if r["rollout_s_share"] > 0 else float("nan")),
                       "production_over_async_1x1": r["production_sps"] / base_prod if base_prod else float("nan"),
                       "anakin_sps": anakin["anakin_sps"] if anakin else float("nan"),
                       "consumed_env_over_anakin": (r["consumed_env_sps"] / anakin["anakin_sps"]
                                                    if anakin else float("nan"))}
                rows.append(row)
                print(f"[rep {rep}] {name} A={a} L={l}: production {r['production_sps']:,.0f} SPS "
                      f"({row['production_over_raw']:.3f} x raw), consumed {r['consumed_env_sps']:,.0f} env SPS",
                      flush=True)

    C.write_csv(rows, args.out / "results.csv")
    C.write_csv(raw_rows, args.out / "raw.csv")
    summary = make_summary(args, backends, rows, raw_rows, time.perf_counter() - t_start, load_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": time.perf_counter() - t_start,
                               "sizes": {k: {f: getattr(v, f) for f in ("num_envs", "num_steps", "update_epochs",
                                                                          "num_minibatches", "total_env_steps",
                                                                          "eval_every_env_steps")}
                                         for k, v in backends.items()}})
    plot(rows, args.out / "throughput.png")
    print(summary)
    return 0


def make_summary(args, backends, rows, raw_rows, wall_s, load_start) -> str:
    lines = [f"# Async PPO throughput vs actor threads and learner devices {'(--quick)' if args.quick else ''}", "",
             f"Command: `{C.command()}`", "", C.SHARED_NOTE, "",
             f"{args.repeats} repeat(s), interleaved; median [min..max] over repeats. Total wall {wall_s:.0f} s; "
             f"load average at start {load_start}.", "",
             "Sizes: " + "; ".join(
                 f"{k}: {v.num_envs} envs x {v.num_steps} steps per actor rollout, {v.update_epochs} epochs x "
                 f"{v.num_minibatches} minibatches, {v.env_steps} env steps per run, a metrics row every "
                 f"{v.updates_per_chunk} updates" for k, v in backends.items()) + ". Evaluation off; "
             "steady state = every metrics row but the first (which holds compilation).", "",
             "Columns: *production* = env steps inserted by actors per second; *consumed* = env steps the "
             "learner consumed per second (the library's `consumed_sps` multiplies it by `update_epochs`); "
             "*raw* = random-action env SPS with the same number of threads, each stepping its own "
             "`num_envs` envs as an actor does (valid transitions only: reset steps excluded), measured in the "
             "same repeat (envpool: the faster of a Python loop over the env wrapper and a jitted loop over "
             "envpool's XLA step, see the raw table); *x raw* = production / raw (must be <= 1); *busy rate x "
             "raw* = production per second of actor rollout time (production / rollout share) against raw per "
             "thread: the actors' rate while they produce, time spent waiting for the learner left out; *x 1x1* = production relative to "
             "1 actor, 1 learner device; busy threads = actors + learner + envpool workers (min(num_envs, "
             "cores) per envpool); **OVERSUB** marks busy threads > 2 cores; *rollout/update share* = the "
             "runtime's `rollout_s` (summed over actors) / `update_s` timers over the steady wall time; "
             "*dropped* = (`dropped_stale` + `dropped_partial`) / produced env steps.", ""]
    for name in backends:
        sub = [r for r in rows if r["env"] == name]
        lines += [f"## {name}", "",
                  "| actors | learner devices | busy threads | production SPS | consumed env SPS | consumed / "
                  "produced | raw SPS (same threads) | production x raw | busy rate x raw | production x 1x1 | learner wait | "
                  "actor wait | rollout share | update share | lag mean | dropped |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for a, l in sorted({(r["actors"], r["learner_devices"]) for r in sub}, key=lambda x: (x[1], x[0])):
            rs = [r for r in sub if r["actors"] == a and r["learner_devices"] == l]
            bt = rs[0]["busy_threads"]
            lines.append(
                f"| {a} | {l} | {bt}{' **OVERSUB**' if bt > 2 else ''} | "
                f"{C.median_range(r['production_sps'] for r in rs)} | "
                f"{C.median_range(r['consumed_env_sps'] for r in rs)} | "
                f"{C.median_range((r['consumed_over_produced'] for r in rs), '{:.2f}')} | "
                f"{C.median_range(r['raw_sps'] for r in rs)} | "
                f"{C.median_range((r['production_over_raw'] for r in rs), '{:.3f}')} | "
                f"{C.median_range((r['busy_rate_over_raw'] for r in rs), '{:.2f}')} | "
                f"{C.median_range((r['production_over_async_1x1'] for r in rs), '{:.2f}')} | "
                f"{C.median([r['learner_wait_frac'] for r in rs]):.2f} | "
                f"{C.median([r['actor_wait_frac'] for r in rs]):.2f} | "
                f"{C.median([r['rollout_s_share'] for r in rs]):.2f} | "
                f"{C.median([r['update_s_share'] for r in rs]):.2f} | "
                f"{C.median([r['policy_lag_mean'] for r in rs]):.2f} | "
                f"{C.median([r['dropped_frac'] for r in rs]):.3f} |")
        if "Pong" in name:
            lines += ["", PONG_NOTE]
        if name.startswith("gymnax"):
            an = [r["anakin_sps"] for r in raw_rows if r["env"] == name and r["threads"] == 0]
            best = max(C.median([r["consumed_env_sps"] for r in sub if r["actors"] == a and r["learner_devices"] == l])
                       for a, l in {(r["actors"], r["learner_devices"]) for r in sub})
            lines += ["", f"Anakin (fused act + env + update, one device, same PPO config): "
                          f"{C.median_range(an)} SPS. Async consumed env SPS / Anakin SPS, per point (median "
                          "over repeats): " + ", ".join(
                              f"A={a} L={l}: {C.median([r['consumed_env_over_anakin'] for r in sub if r['actors'] == a and r['learner_devices'] == l]):.2f}"
                              for a, l in sorted({(r['actors'], r['learner_devices']) for r in sub},
                                                 key=lambda x: (x[1], x[0]))) + f"; best async {best:,.0f} SPS."]
        lines.append("")
    lines += ["## Raw env SPS (random actions)", "", "envpool rows: *Python* steps the env wrapper "
              "(`EnvpoolVecEnv`) from a Python loop with numpy random actions; *compiled* steps the same envs "
              "through envpool's XLA interface in one jitted loop per `num_steps` steps (no Python per step); "
              "raw = the faster. " + actor_kinds(backends), "",
              "| env | threads | envs per thread | raw SPS (valid) | raw SPS (all steps) | Python loop (valid) | "
              "compiled loop (valid) |", "|---|---|---|---|---|---|---|"]
    for name in backends:
        for a in sorted({r["threads"] for r in raw_rows if r["env"] == name and r["threads"] > 0}):
            rs = [r for r in raw_rows if r["env"] == name and r["threads"] == a]
            split = ([C.median_range(r["raw_python_sps"] for r in rs), C.median_range(r["raw_compiled_sps"] for r in rs)]
                     if "raw_compiled_sps" in rs[0] else ["", ""])
            lines.append(f"| {name} | {a} | {rs[0]['num_envs_per_thread']} | "
                         f"{C.median_range(r['raw_sps'] for r in rs)} | "
                         f"{C.median_range(r['raw_all_steps_sps'] for r in rs)} | {split[0]} | {split[1]} |")
    lines.append("")
    return "\n".join(lines)


def actor_kinds(backends) -> str:
    """One sentence: how each envpool backend's actors stepped (compiled rollout, or the Python loop and why)."""
    from tianji_jax.runtime.actors.envpool_rollout import compiled_rollout_unsupported

    out = []
    for name, cfg in backends.items():
        if not name.startswith("envpool"):
            continue
        env = cfg.env_spec.make_host_env(cfg.num_envs, 0)
        try:
            why = compiled_rollout_unsupported(env, jax.devices()[0], lambda *a: a, False, None)
        finally:
            env.close()
        out.append(f"{name} actors: " + ("compiled rollout (policy and envpool's XLA step in one jitted loop)"
                                          if why is None else f"Python loop ({why})"))
    return "; ".join(out) + "."


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r["env"] for r in rows})
    fig, axes = plt.subplots(1, len(envs), figsize=(4.5 * len(envs), 3.8), squeeze=False)
    for ax, name in zip(axes[0], envs):
        sub = [r for r in rows if r["env"] == name]
        for l, marker in ((1, "o"), (2, "s")):
            pts = sorted({r["actors"] for r in sub if r["learner_devices"] == l})
            if not pts:
                continue
            prod = [C.median([r["production_sps"] for r in sub if r["actors"] == a and r["learner_devices"] == l])
                    for a in pts]
            raw = [C.median([r["raw_sps"] for r in sub if r["actors"] == a and r["learner_devices"] == l])
                   for a in pts]
            ax.plot(pts, prod, marker=marker, label=f"production, L={l}")
            if l == 1:
                ax.plot(pts, raw, "k--", marker="x", label="raw env (random actions)")
        an = [r["anakin_sps"] for r in sub if np.isfinite(r.get("anakin_sps", np.nan))]
        if an:
            ax.axhline(C.median(an), color="g", ls=":", label="Anakin")
        ax.set_yscale("log")
        ax.set_xlabel("actor threads")
        ax.set_ylabel("env steps / s")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
