"""Actor-to-learner trajectory throughput against a plain ``jax.device_put`` of the same arrays.

The async runtime moves every finished trajectory (``(T, N, ...)`` arrays: obs, final_obs, actions,
log-probs, values, rewards, flags, episode statistics, version stamps, last_obs) to the learner with
``AsyncOnPolicy.to_learner`` (one device, or sharded along the env axis over data-parallel learners).
This script times that call, blocking until the arrays are on the learner, and in the same repeat a
plain ``jax.device_put`` of the same arrays to the same device (the hardware/runtime limit here),
plus a numpy copy of the same bytes (the memory-bandwidth ceiling of a CPU "transfer"). Sources: a
host numpy dict (the envpool/gymnasium actor path: the chunker's output) and arrays already on the
actor device cpu:0 (the gymnax actor path). Sizes: CartPole (obs 4 float32) and Atari (obs
4x84x84 uint8), 8 envs x 128 steps each. Within a repeat the methods take turns (round-robin); ratios within a repeat, median
over repeats.

On a CPU backend a "device" is host memory, so a transfer is a memcpy at best, and ``device_put``
of a suitably aligned numpy array may alias it without copying (reported as ``zero_copy``).

Writes ``experiments/results/transfer/{results.csv, summary.md, transfer.png, machine.json}``.

    python experiments/transfer.py            # 5 repeats, ~0.8 s per method per repeat
    python experiments/transfer.py --quick    # 3 repeats, ~0.2 s per method per repeat
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 3)  # actors on cpu:0; learners cpu:2 (L=1) or cpu:1, cpu:2 (L=2)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

import tianji_jax as tj  # noqa: E402
from tianji_jax.runtime.async_on_policy import AsyncOnPolicy  # noqa: E402
from tianji_jax.runtime.actors.chunker import CHUNK_KEYS  # noqa: E402

T, N = 128, 8


def make_traj(obs_shape: tuple[int, ...], obs_dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """A host trajectory laid out as ``TrajectoryChunker.pop`` returns it (random contents)."""
    rng = np.random.default_rng(seed)

    def obs(shape):
        if np.dtype(obs_dtype) == np.uint8:
            return rng.integers(0, 256, shape, dtype=np.uint8)
        return rng.standard_normal(shape).astype(obs_dtype)

    f = lambda: rng.standard_normal((T, N)).astype(np.float32)  # noqa: E731
    b = lambda: rng.random((T, N)) < 0.05  # noqa: E731
    term, trunc = b(), b()
    traj = {"obs": obs((T, N, *obs_shape)), "action": rng.integers(0, 4, (T, N), dtype=np.int32),
            "log_prob": f(), "value": f(), "reward": f(), "terminated": term, "truncated": trunc,
            "done": term | trunc, "final_obs": obs((T, N, *obs_shape)), "episode_return": f(),
            "episode_length": rng.integers(0, 500, (T, N), dtype=np.int32),
            "policy_version": np.zeros((T, N), np.int32)}
    traj["last_obs"] = traj["final_obs"][T - 1].copy()
    assert tuple(traj) == CHUNK_KEYS, (tuple(traj), CHUNK_KEYS)
    return traj


def nbytes(traj: dict) -> int:
    return int(sum(v.nbytes for v in traj.values()))


def block(x):
    return jax.block_until_ready(x)


def time_cases(cases: dict, min_seconds: float, seed: int, rounds: int = 8) -> dict:
    """Median seconds per call of each case. Every case is warmed up once, then the cases take
    turns in ``rounds`` rounds (in a new random order each round, so a change in the neighbours'
    load, or what the allocator holds after the previous method, hits all of them alike), each
    turn timing single calls for about ``min_seconds / rounds`` (>= 1 call). The median over all
    calls resists the bursts a shared machine adds."""
    for fn in cases.values():
        block(fn())
    samples: dict = {k: [] for k in cases}
    per_turn = min_seconds / rounds
    order = list(cases)
    rng = np.random.default_rng(seed)  # a different sequence of orders in every repeat
    for _ in range(rounds):
        rng.shuffle(order)  # no method always runs right after the same other one
        for k in order:
            fn = cases[k]
            t_turn = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                block(fn())
                t1 = time.perf_counter()
                samples[k].append(t1 - t0)
                if t1 - t_turn >= per_turn:
                    break
    return {k: float(np.median(v)) for k, v in samples.items()}


def aliases(src: np.ndarray, out: jax.Array) -> bool:
    try:
        return out.addressable_data(0).unsafe_buffer_pointer() == src.ctypes.data
    except Exception:  # noqa: BLE001 - best effort
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, short measurements")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.8, help="minimum seconds per measurement")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "transfer")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    load_start = C.loadavg()
    if args.quick:
        args.repeats, args.seconds = 3, 0.2
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    args.out.mkdir(parents=True, exist_ok=True)

    actor_dev = jax.devices()[0]
    # The runtime's own placement and to_learner, from configs of the matching obs sizes.
    # (num_envs=8, num_steps=128 so the sharded path splits the env axis exactly as in a run.)
    setups = {
        "CartPole (obs 4 float32)": (tj.PPOConfig(env="gymnax:CartPole-v1", runtime="async", num_envs=N,
                                                  num_steps=T, eval_episodes=0), (4,), np.float32),
        "Atari (obs 4x84x84 uint8)": (tj.PPOConfig(env="envpool:Pong-v5", runtime="async", num_envs=N, num_steps=T,
                                                   eval_episodes=0), (4, 84, 84), np.uint8),
    }
    runtimes = {}
    for name, (cfg, obs_shape, dtype) in setups.items():
        for L in (1, 2):
            ppo = AsyncOnPolicy(cfg.replace(num_learner_devices=L))
            ppo.close()  # only its placement and to_learner are used (host envs not stepped)
            runtimes[(name, L)] = ppo
    rows = []
    zero_copy = {}
    for rep in range(args.repeats):
        for name, (cfg, obs_shape, dtype) in setups.items():
            host = make_traj(obs_shape, dtype, seed=rep)
            size = nbytes(host)
            on_actor = block(jax.device_put(host, actor_dev))
            dst = runtimes[(name, 1)].learner_device
            scratch = {k: np.empty_like(v) for k, v in host.items()}

            def memcpy():
                for k, v in host.items():
                    np.copyto(scratch[k], v)
                return None

            cases = {("host numpy", "numpy copy (memory bandwidth)", 1): memcpy}
            for src_name, src in (("host numpy", host), ("actor device cpu:0", on_actor)):
                cases[(src_name, "jax.device_put (bound)", 1)] = lambda src=src: jax.device_put(src, dst)
                for L in (1, 2):
                    ppo = runtimes[(name, L)]
                    cases[(src_name, f"AsyncOnPolicy.to_learner, L={L}", L)] = lambda src=src, ppo=ppo: ppo.to_learner(src)
            out_host, out_dev = jax.device_put(host, dst), jax.device_put(on_actor, dst)
            alias_now = {"host numpy": aliases(host["obs"], out_host["obs"]),
                         "actor device cpu:0": (out_dev["obs"].addressable_data(0).unsafe_buffer_pointer()
                                                == on_actor["obs"].addressable_data(0).unsafe_buffer_pointer())}
            del out_host, out_dev
            for src_name, a in alias_now.items():
                zero_copy[(name, src_name)] = zero_copy.get((name, src_name), 0) + int(a)
            times = time_cases(cases, args.seconds, seed=rep)
            for (src_name, method, L), s in times.items():
                bound = times[(src_name, "jax.device_put (bound)", 1)]
                rows.append({"repeat": rep, "size": name, "source": src_name, "method": method,
                             "learner_devices": L, "bytes": size, "seconds_per_call": s,
                             "bytes_per_s": size / s, "ratio_to_device_put": bound / s,
                             "zero_copy_device_put": int(alias_now[src_name])})
                print(f"[rep {rep}] {name:28s} {src_name:20s} {method:32s} {size / s / 1e9:7.2f} GB/s "
                      f"({bound / s:.2f} x device_put)", flush=True)

    C.write_csv(rows, args.out / "results.csv")
    summary = make_summary(args, rows, zero_copy, time.perf_counter() - t_start, load_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": time.perf_counter() - t_start,
                               "sizes": {"T": T, "N": N, "repeats": args.repeats, "min_seconds": args.seconds}})
    plot(rows, args.out / "transfer.png")
    print(summary)
    return 0


def make_summary(args, rows, zero_copy, wall_s, load_start) -> str:
    lines = [f"# Actor-to-learner trajectory transfer {'(--quick)' if args.quick else ''}", "",
             f"Command: `{C.command()}`", "", C.SHARED_NOTE, "",
             f"{args.repeats} repeats; within a repeat the methods take turns (8 round-robin rounds, ~{args.seconds} s "
             f"per method in all, after one warm-up call each; the median seconds per call of each method); median "
             f"[min..max] over repeats. Total wall {wall_s:.0f} s; load average at start "
             f"{load_start}.", "",
             f"One trajectory = {T} steps x {N} envs, every key the chunker emits ({', '.join(CHUNK_KEYS)}). "
             "*x device_put* = seconds of a plain `jax.device_put(traj, learner_device)` from the same source / "
             "seconds of the method, in the same repeat (1.0 = at the bound; > 1 = faster than the bound). "
             "Learner devices: cpu:2 (L=1) or cpu:1 + cpu:2 with the env axis sharded (L=2); the actor device "
             "is cpu:0. All are simulated CPU devices: the bytes never leave host memory.", ""]
    for size in dict.fromkeys(r["size"] for r in rows):
        sub = [r for r in rows if r["size"] == size]
        lines += [f"## {size}: {sub[0]['bytes'] / 1e6:.2f} MB per trajectory", "",
                  "| source | method | GB/s | ms per trajectory | x device_put |", "|---|---|---|---|---|"]
        for src, method in dict.fromkeys((r["source"], r["method"]) for r in sub):
            rs = [r for r in sub if r["source"] == src and r["method"] == method]
            lines.append(f"| {src} | {method} | {C.median_range((r['bytes_per_s'] / 1e9 for r in rs), '{:.2f}')} | "
                         f"{C.median_range((r['seconds_per_call'] * 1e3 for r in rs), '{:.3f}')} | "
                         f"{C.median_range((r['ratio_to_device_put'] for r in rs), '{:.2f}')} |")
        zc = ", ".join(f"from {s}: in {v} of {args.repeats} repeats" for (n, s), v in zero_copy.items() if n == size)
        lines += ["", f"`jax.device_put` aliased the source `obs` buffer (zero copy, no bytes moved) {zc}; a repeat "
                      "where it did shows as a far higher GB/s for both device_put and to_learner (same call).", ""]
    return "\n".join(lines)


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        sub = [r for r in rows if r["size"] == size]
        keys = list(dict.fromkeys((r["source"], r["method"]) for r in sub))
        vals = [C.median([r["bytes_per_s"] / 1e9 for r in sub if (r["source"], r["method"]) == k]) for k in keys]
        ax.barh(range(len(keys)), vals, color=["C0" if "bound" in k[1] else "C2" if "numpy" in k[1] else "C1"
                                               for k in keys])
        ax.set_yticks(range(len(keys)))
        ax.set_yticklabels([f"{s}: {m}" for s, m in keys], fontsize=7)
        ax.set_xlabel("GB/s (median over repeats)")
        ax.set_title(size, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
