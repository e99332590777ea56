"""Multi-host learners on jax.distributed, tested with two local processes on 127.0.0.1 (gloo CPU
collectives, 2 CPU devices per process): replicas identical on every process after every update,
the global update equals the single-process update on the concatenated batch, each process is fed
only its half, and a dead process makes the survivor exit non-zero with a tianji line first;
resume of a two-process run from its consistent cut (bit for bit under sync on gymnax; host envs
resume and continue). Every child is killed by its pid at the end."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.runtime.async_on_policy import AsyncOnPolicy

pytestmark = pytest.mark.timeout(240)

CLI = "import sys; from tianji_jax.cli.commands import main; sys.exit(main(sys.argv[1:]))"
SMALL = ["--runtime", "async", "--num-envs", "4", "--num-steps", "16", "--update-epochs", "2", "--num-minibatches",
         "1", "--eval-episodes", "0", "--progress", "False", "--tensorboard", "False"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Proc:
    """A child process whose stderr lines are collected (with arrival times) by a thread."""

    def __init__(self, args: list[str], cwd: Path):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("TIANJI_DISTRIBUTED_CHILD", None)
        self.p = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, errors="replace")
        self.lines: list[tuple[float, str]] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait(self, timeout: float) -> int:
        rc = self.p.wait(timeout)
        self.t.join(5)
        return rc

    def kill(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(10)


def _launch(tmp_path: Path, extra: list[str], heartbeat: int = 30) -> list[_Proc]:
    # heartbeat 30 s: 10 s timed out once under the parallel suite's load on 2 cores (both exit 3)
    port = _free_port()
    return [_Proc(["-c", CLI, "train", *SMALL, *extra, "--num-processes", "2", "--process-id", str(i),
                   "--coordinator", f"127.0.0.1:{port}", "--heartbeat-timeout-s", str(heartbeat),
                   "--run-dir", str(tmp_path / f"run{i}")], tmp_path) for i in range(2)]


def _run_workers(tmp_path: Path, source: str, suffix: str, extra: list[str], timeout: float) -> None:
    """Run ``source`` as two worker processes (argv: process id, port, ``tmp_path/p<i><suffix>``, *extra)
    until both exit 0 (else their stderr tails are shown); the children are killed by pid whatever happens."""
    script = tmp_path / "worker.py"
    script.write_text(source)
    port = _free_port()
    procs = [_Proc([str(script), str(i), str(port), str(tmp_path / f"p{i}{suffix}"), *extra], tmp_path)
             for i in range(2)]
    try:
        rcs = [p.wait(timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert rcs == [0, 0], [p.text[-3000:] for p in procs]


def _digests(text: str) -> dict[int, str]:
    return {int(u): h for u, h in re.findall(r"update (\d+) params_sha256 ([0-9a-f]+)", text)}


def _train_pair(tmp_path: Path, extra: list[str]) -> tuple[dict[int, str], dict[int, str]]:
    """Two processes train to the end (both exit 0, else their stderr tails are shown); each
    one's ``{update: params digest}``. The children are killed by pid whatever happens."""
    procs = _launch(tmp_path, extra)
    try:
        rcs = [p.wait(200) for p in procs]
    finally:
        for p in procs:
            p.kill()
    # on failure: each child's own tianji lines (why it exited) and its stderr tail
    assert rcs == [0, 0], [(rc, [line for _, line in p.lines if line.startswith("tianji")][-20:], p.text[-3000:])
                           for rc, p in zip(rcs, procs)]
    d0, d1 = _digests(procs[0].text), _digests(procs[1].text)
    return d0, d1


@pytest.mark.slow  # two jax.distributed processes on host envs: about 50 s each on 2 cores
@pytest.mark.parametrize("env", ["envpool:CartPole-v1", "gymnasium:CartPole-v1"])
def test_two_processes_on_host_envs_keep_identical_replicas(tmp_path, env):
    """The capability table's multi-host cells on host env backends: each process's actors step
    their own host envs; the replicas stay identical after every update."""
    d0, d1 = _train_pair(tmp_path, ["--env", env, "--total-env-steps", str(2 * 64 * 3), "--eval-every-env-steps", "128"])
    assert sorted(d0) == [1, 2, 3] and d0 == d1 and len(set(d0.values())) == 3


@pytest.mark.slow  # two jax.distributed processes per env backend: about 40-50 s each on 2 cores
@pytest.mark.parametrize("env", ["gymnax:CartPole-v1", "envpool:CartPole-v1"])
def test_two_pqn_processes_keep_identical_replicas(tmp_path, env):
    """PQN's multi-host cells, through the generic on-policy wiring (PQN registers only its agent):
    each process acts on its own envs, the global update keeps the replicas identical; rows count
    both processes' env steps and process 0 owns the run directory. Device and host actors once
    each; PPO's device-actor cell runs in the resume test below (run A: identical digests after
    every update), its host cells above (the host actor and the wiring are the same for every
    on-policy algorithm)."""
    d0, d1 = _train_pair(tmp_path, ["--algo", "pqn", "--env", env, "--total-env-steps", str(2 * 64 * 3),
                                    "--eval-every-env-steps", "128"])
    assert sorted(d0) == [1, 2, 3] and d0 == d1   # identical replicas after every update
    assert len(set(d0.values())) == 3             # and the params did change every update
    import csv

    rows = list(csv.DictReader(open(tmp_path / "run0" / "metrics.csv")))
    assert [int(r["env_steps"]) for r in rows] == [128, 256, 384]  # global env steps, 2 x 64 per update
    assert not (tmp_path / "run1").exists()       # process 0 owns the run directory
    assert (tmp_path / "run0" / "final_params").is_dir()


_WORKER = textwrap.dedent('''
    import sys, numpy as np
    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    from tianji_jax.runtime.layouts import distributed as dist
    dist.initialize(f"127.0.0.1:{port}", 2, pid, heartbeat_timeout_s=10)
    import tianji_jax as tj
    from tianji_jax.runtime.async_on_policy import AsyncOnPolicy
    cfg = tj.PPOConfig(num_envs=4, num_steps=16, total_env_steps=2 * 64 * 4, eval_episodes=0, runtime="async",
                       update_epochs=3, num_minibatches=1, num_processes=2, process_id=pid,
                       coordinator=f"127.0.0.1:{port}")
    ppo = AsyncOnPolicy(cfg)
    _, traj = ppo._rollout(jax.device_put(ppo.local_learner_state.params, ppo.actor_device),
                           jax.numpy.asarray(0, jax.numpy.int32), ppo._actor_states[0])
    placed = ppo.to_learner(traj)
    shards = placed["obs"].addressable_shards
    info = dict(global_shape=np.asarray(placed["obs"].shape), shard_shapes=np.asarray([s.data.shape for s in shards]),
                shard_on_local_learner=np.asarray([s.device in ppo.learner_devices for s in shards]),
                shard_is_mine=np.asarray([np.array_equal(np.asarray(s.data), np.asarray(traj["obs"])) for s in shards]),
                global_devices=np.asarray(len(ppo.global_learner_devices)))
    new, metrics = ppo._learn(ppo.learner_state, placed)
    local = dist.local_replica(new)
    leaves = {f"param_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(local.params))}
    m = {f"metric_{k}": np.asarray(v) for k, v in jax.device_get(dist.local_replica(metrics)).items()}
    t = {f"traj_{k}": np.asarray(v) for k, v in traj.items()}
    np.savez(out, version=np.asarray(local.version), **info, **leaves, **m, **t)
    print("worker done", flush=True)
''')


@pytest.mark.slow  # two jax.distributed processes: about 40 s each on 2 cores
def test_global_update_equals_single_process_update_and_each_process_gets_its_half(tmp_path):
    _run_workers(tmp_path, _WORKER, ".npz", [], timeout=200)
    out = [dict(np.load(tmp_path / f"p{i}.npz")) for i in range(2)]
    for o in out:  # (c): global (T, 2N) batch; this process holds only its own N columns, on its learner device
        assert tuple(o["global_shape"]) == (16, 8, 4) and int(o["global_devices"]) == 2
        assert o["shard_shapes"].tolist() == [[16, 4, 4]]
        assert o["shard_on_local_learner"].all() and o["shard_is_mine"].all()
        assert int(o["version"]) == 1
    assert not np.array_equal(out[0]["traj_obs"], out[1]["traj_obs"])  # different actor streams
    n = len([k for k in out[0] if k.startswith("param_")])
    for i in range(n):  # (a) replicas identical bitwise
        np.testing.assert_array_equal(out[0][f"param_{i}"], out[1][f"param_{i}"])
    # (b) the single-process update on the concatenated batch (process 0's columns first)
    keys = [k[5:] for k in out[0] if k.startswith("traj_")]
    concat = {k: np.concatenate([out[0]["traj_" + k], out[1]["traj_" + k]], axis=0 if k == "last_obs" else 1)
              for k in keys}
    single = AsyncOnPolicy(tj.PPOConfig(num_envs=8, num_steps=16, total_env_steps=2 * 64 * 4, eval_episodes=0,
                                   runtime="async", update_epochs=3, num_minibatches=1))
    ref, ref_m = single._learn(single.learner_state, single.to_learner(concat))
    for i, leaf in enumerate(jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(out[0][f"param_{i}"], np.asarray(leaf), rtol=2e-5, atol=2e-6)
    ref_m = jax.device_get(ref_m)
    for k in ("episode_return_sum", "episode_count", "policy_lag_max"):
        np.testing.assert_allclose(out[0][f"metric_{k}"], ref_m[k], rtol=1e-6)
    for k in ("policy_loss", "value_loss", "entropy", "grad_norm"):
        np.testing.assert_allclose(out[0][f"metric_{k}"], ref_m[k], rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # two jax.distributed processes: about 40 s each on 2 cores
def test_survivor_exits_nonzero_with_a_tianji_line_naming_the_dead_process(tmp_path):
    heartbeat = 5
    procs = _launch(tmp_path, ["--total-env-steps", str(2 * 64 * 100_000), "--eval-every-env-steps", "128"],
                    heartbeat=heartbeat)
    try:
        deadline = time.monotonic() + 150
        while 2 not in _digests(procs[1].text) and time.monotonic() < deadline:
            assert procs[0].p.poll() is None and procs[1].p.poll() is None, [p.text[-3000:] for p in procs]
            time.sleep(0.2)
        assert 2 in _digests(procs[1].text), procs[1].text[-3000:]
        # and process 0 has saved a checkpoint of update 2 or later (orbax renames a step's
        # directory when it is complete), so that what survives is known whatever the kill interrupts
        ckpts = tmp_path / "run0" / "checkpoints"

        def saved() -> bool:
            return ckpts.is_dir() and any(p.name.isdigit() and int(p.name) >= 2 * 2 * 64 for p in ckpts.iterdir())

        while not saved() and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        assert saved(), procs[0].text[-3000:]
        t_kill = time.monotonic()
        procs[1].kill()  # SIGKILL the launcher of process 1; its training child dies with it
        rc = procs[0].wait(heartbeat + 30 + 10)
        elapsed = time.monotonic() - t_kill
    finally:
        for p in procs:
            p.kill()
    assert rc != 0 and elapsed <= heartbeat + 30, (rc, elapsed)
    lines = [line for _, line in procs[0].lines]
    assert any("died" in line for line in lines), (rc, elapsed, "\n".join(lines[-25:]))
    idx = next(i for i, line in enumerate(lines) if "died" in line)
    assert lines[idx].startswith("tianji[p0]: process 1 died"), lines[idx]
    after_training = [i for i, line in enumerate(lines) if "params_sha256" in line][-1]
    # nothing but the tianji line between the last update and it (jax's report comes after)
    assert idx == after_training + 1 or all(not line.strip() or "params_sha256" in line
                                            for line in lines[after_training + 1: idx]), lines[after_training:idx + 3]
    # what survives: the survivor's newest complete checkpoint, the replicas' state at its update
    # (the digest both processes logged for it), with whole counters: every env step of the
    # cut consumed once (one 4 x 16 chunk per process and update), inserted or in flight
    from tianji_jax.runtime.layouts.distributed import params_digest

    loaded = tj.load(tmp_path / "run0")
    version = int(loaded.state.learner.version)
    assert version >= 2 and loaded.step == version * 2 * 64
    digest = params_digest(loaded.state.learner.params)
    assert digest == _digests(procs[0].text)[version] == _digests(procs[1].text).get(version, digest)
    c = loaded.meta["async_counters"]
    assert c["taken"] == version * 64 and c["sampled"] == c["taken"] and c["dropped_stale"] == 0, c
    assert c["in_flight"] >= 0 and c["dropped_partial"] >= 0, c
    rows = loaded.rows
    assert [int(r["update"]) for r in rows] == list(range(1, version + 1))
    assert all(int(r["env_steps"]) == int(r["update"]) * 2 * 64 for r in rows)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_processes=2, process_id=2, coordinator="h:1"), "process_id must be <= 1"),
    (dict(num_processes=2), "needs coordinator='HOST:PORT'"),
    (dict(num_processes=2, coordinator="nohost"), "coordinator must be 'HOST:PORT'"),
    (dict(num_processes=2, coordinator="h:99999"), "port in 1..65535"),
    (dict(num_processes=2, coordinator="h:1", runtime="anakin"), "needs runtime='async'"),
    (dict(num_processes=2, coordinator="h:1", eval_episodes=1, stop_at_return=100.0), "stop_at_return"),
    (dict(coordinator="h:1"), "needs num_processes > 1"),
    (dict(num_processes=0), "num_processes must be >= 1"),
])
def test_bad_multi_host_fields_are_named(kwargs, match):
    base = dict(num_envs=4, num_steps=16, total_env_steps=1024, eval_episodes=0, runtime="async")
    with pytest.raises(ValueError, match=match):
        tj.PPOConfig(**{**base, **kwargs})


def test_global_batch_sets_the_number_of_updates():
    c = tj.PPOConfig(num_envs=4, num_steps=16, total_env_steps=1024, eval_episodes=0, runtime="async",
                     num_processes=2, coordinator="127.0.0.1:1234")
    assert (c.batch_size, c.global_batch_size, c.num_updates, c.env_steps) == (64, 128, 8, 1024)


def test_async_ppo_refuses_a_job_it_has_not_joined():
    c = tj.PPOConfig(num_envs=4, num_steps=16, total_env_steps=1024, eval_episodes=0, runtime="async",
                     num_processes=2, coordinator="127.0.0.1:1234")
    with pytest.raises(ValueError, match="has not joined"):
        AsyncOnPolicy(c)


def test_cli_rejects_bad_launch_flags(capsys):
    from tianji_jax.cli.commands import main

    assert main(["train", "--runtime", "async", "--num-processes", "2", "--process-id", "0"]) == 2
    assert "needs --coordinator" in capsys.readouterr().err
    assert main(["train", "--num-processes", "2", "--process-id", "5", "--coordinator", "h:1"]) == 2
    assert "--process-id must be in 0..1" in capsys.readouterr().err


def test_a_lone_process_reports_a_bad_flag_before_waiting_for_its_peers(tmp_path):
    """Every flag is validated before the job is joined: a bad value in one process is reported at
    once, not after all processes have joined (or never, when the peers never come)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CLI, "train", "--runtime", "async", "--num-actors", "2",
                           "--num-learner-groups", "2", "--num-processes", "2", "--process-id", "0",
                           "--coordinator", f"127.0.0.1:{_free_port()}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "num_learner_groups=2 is not supported with num_processes=2" in proc.stderr
    assert time.monotonic() - t0 < 60


# ---- resume of multi-host runs ----------------------------------------------------------------------
_TRAIN_WORKER = textwrap.dedent('''
    import sys
    pid, port, run_dir, env, stop_after = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    algo, who = sys.argv[6], sys.argv[7]  # who: the processes whose callback interrupts ("both" or "0")
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    from tianji_jax.runtime.layouts import distributed as dist
    dist.initialize(f"127.0.0.1:{port}", 2, pid, heartbeat_timeout_s=10)
    import tianji_jax as tj
    job = dict(env=env, runtime="async", schedule="sync", eval_episodes=0, num_processes=2, process_id=pid,
               coordinator=f"127.0.0.1:{port}")
    if algo == "ppo":
        cfg = tj.PPOConfig(num_envs=4, num_steps=16, update_epochs=2, num_minibatches=1, total_env_steps=2 * 64 * 6,
                           eval_every_env_steps=256, **job)
    else:  # 32 iterations of 2 x 16 env steps; blocks from iteration 9 (learning_starts 256): 24 blocks
        cfg = tj.DQNConfig(num_envs=4, num_steps=4, learning_starts=256, batch_size=32, buffer_capacity=2048,
                           replay_ratio=0.125, total_env_steps=1024, eval_every_env_steps=256, **job)

    class Interrupt(Exception):
        pass

    rows = []

    def stop(row):
        rows.append(row)
        if len(rows) == stop_after:
            raise Interrupt

    from tianji_jax.runtime.tianji.async_runtime import PeerStoppedError
    interrupts = stop_after and (who == "both" or who == str(pid))
    try:  # the learners of both processes stop after the same update, whoever interrupts: a clean exit
        tj.train(cfg, run_dir=run_dir, progress=False, tensorboard=False, callback=stop if interrupts else None)
    except Interrupt:
        print("worker interrupted", file=sys.stderr, flush=True)
    except PeerStoppedError as err:
        print(f"worker stopped by its peer: {err}", file=sys.stderr, flush=True)
    else:
        print("worker finished", file=sys.stderr, flush=True)
''')


def _run_pair(procs: list[_Proc], timeout: float = 300) -> list[_Proc]:
    try:
        rcs = [p.wait(timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert rcs == [0, 0], [p.text[-3000:] for p in procs]
    return procs


def _train_workers(tmp_path: Path, run_dir: Path, env: str, stop_after: int, algo: str = "ppo",
                   who: str = "both") -> list[_Proc]:
    """Two processes of ``_TRAIN_WORKER`` (PPO: a 6-update sync run, a row and a checkpoint every
    2 updates; DQN: 24 sync learner blocks, a row and a checkpoint every 256 env steps), both given
    ``run_dir``; ``stop_after`` rows > 0: interrupted from the callback of both processes
    (``who="both"``) or of process 0 only (``who="0"``)."""
    script = tmp_path / "train_worker.py"
    script.write_text(_TRAIN_WORKER)
    port = _free_port()
    return _run_pair([_Proc([str(script), str(i), str(port), str(run_dir), env, str(stop_after), algo, who],
                            tmp_path) for i in range(2)])


def _resume_pair(tmp_path: Path, run_dir: Path) -> list[_Proc]:
    """Both processes launched again through the CLI with ``--resume RUN_DIR`` (the shared directory)."""
    port = _free_port()
    return _run_pair([_Proc(["-c", CLI, "train", "--resume", str(run_dir), "--progress", "False", "--tensorboard",
                             "False", "--num-processes", "2", "--process-id", str(i), "--coordinator",
                             f"127.0.0.1:{port}", "--heartbeat-timeout-s", "10"], tmp_path) for i in range(2)])


def _rows(run_dir: Path) -> list[dict]:
    import csv

    timing = {"wall_time_s", "sps", "production_sps", "consumed_sps", "actor_wait_frac", "learner_wait_frac",
              "queue_depth", "inference_s", "env_step_s", "rollout_s", "h2d_s", "update_s"}
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k not in timing} for r in csv.DictReader(f)]


@pytest.mark.slow  # three launches of two jax.distributed processes: about 2-3 min on 2 cores
@pytest.mark.timeout(900)
def test_two_process_sync_run_resumes_bit_exactly_from_its_consistent_cut(tmp_path):
    """Run A: two processes train 6 updates uninterrupted. Run B: the same, interrupted from the
    callback after the first row (a checkpoint at update 2: process 0's checkpoint with the learner,
    process 1's part with its own actors), then both processes resumed through the CLI. Every
    update's params digest, the final params, the final cut (learner, both processes' actors and
    counters) and the metrics rows equal run A's."""
    import tianji_jax.checkpoint.core  # noqa: F401 - loads checkpoint_io (which imports it)
    from tianji_jax.checkpoint.io import load_process_part, part_path

    full, cut = tmp_path / "A", tmp_path / "B"
    a = _train_workers(tmp_path, full, "CartPole-v1", 0)
    b = _train_workers(tmp_path, cut, "CartPole-v1", 1)
    assert all("worker interrupted" in p.text for p in b)
    assert sorted(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit()) == [256]
    assert part_path(cut, 256, 1).is_file()
    assert not (cut / "process_parts" / "0").exists()
    r = _resume_pair(tmp_path, cut)
    assert all("resuming the async run at policy version 2 (256 env steps)" in p.text for p in r)
    want = _digests(a[0].text)
    assert sorted(want) == [1, 2, 3, 4, 5, 6] and _digests(a[1].text) == want and len(set(want.values())) == 6
    for p in b:  # before the interruption (the learner may have run ahead of the row)
        got = _digests(p.text)
        assert {1, 2} <= set(got) and got == {u: want[u] for u in got}
    for p in r:  # after the resume: updates 3..6, bit for bit
        assert _digests(p.text) == {u: want[u] for u in (3, 4, 5, 6)}
    for x, y in zip(jax.tree.leaves(tj.load_params(full)), jax.tree.leaves(tj.load_params(cut))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    la, lb = tj.load(full), tj.load(cut)
    assert la.step == lb.step == 768 and la.meta["async_counters"] == lb.meta["async_counters"]
    for x, y in zip(jax.tree.leaves(la.state), jax.tree.leaves(lb.state)):  # learner + process 0's actors
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    (pa, ia), (pb, ib) = (load_process_part(d, 768, 1, lb.state.actor) for d in (full, cut))
    assert ia == ib and ia["async_counters"]["taken"] == 6 * 64  # process 1's own queue: 64 env steps an update
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):  # process 1's actors
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(pa.obs), np.asarray(lb.state.actor.obs))  # its own, not process 0's
    assert _rows(full) == _rows(cut) and [int(r_["env_steps"]) for r_ in _rows(cut)] == [256, 512, 768]
    assert sorted(p.name for p in (cut / "process_parts").iterdir()) == sorted(
        p.name for p in (cut / "checkpoints").iterdir() if p.name.isdigit())  # parts pruned with their checkpoints


@pytest.mark.slow  # two launches of two jax.distributed processes on host envs: about 2 min on 2 cores
@pytest.mark.timeout(600)
def test_two_process_host_env_run_resumes_and_continues(tmp_path):
    """Host (envpool) actors keep no state: each process re-seeds its envs on resume (its own seed),
    restores its own queue counters from its part and the run continues to the end with identical
    replicas."""
    import tianji_jax.checkpoint.core  # noqa: F401 - loads checkpoint_io (which imports it)
    from tianji_jax.checkpoint.io import load_process_part

    run = tmp_path / "run"
    _train_workers(tmp_path, run, "envpool:CartPole-v1", 1)
    r = _resume_pair(tmp_path, run)
    assert all("host envs are re-seeded" in p.text for p in r)
    d0, d1 = _digests(r[0].text), _digests(r[1].text)
    assert sorted(d0) == [3, 4, 5, 6] and d0 == d1 and len(set(d0.values())) == 4
    loaded = tj.load(run)
    assert loaded.step == 768 and int(loaded.state.learner.version) == 6 and loaded.state.actor is None
    actor, info = load_process_part(run, 768, 1, None)
    assert actor is None and info["async_counters"]["taken"] == 6 * 64 and info["has_actor"] is False
    assert [int(r_["env_steps"]) for r_ in _rows(run)] == [256, 512, 768]


@pytest.mark.slow  # three launches of two jax.distributed processes: about 2-3 min on 2 cores
@pytest.mark.timeout(900)
def test_two_process_replay_run_resumes_bit_exactly_with_every_process_replay(tmp_path):
    """The replay data path (DQN, gymnax, ``sync``): each process keeps its own replay shards, so
    process 1's part of the cut holds its actors and its replay shards next to process 0's
    checkpoint. Run A trains 24 learner blocks uninterrupted; run B is interrupted after its first
    row by process 0's callback alone (process 1's learner stops after the same update and its
    ``train`` raises ``PeerStoppedError``; neither process hangs) and resumed through the CLI. Every block's params digest after the resume, the final
    params, the final cut (learner, both processes' actors and replay shards and counters) and the
    rows equal run A's."""
    import tianji_jax.checkpoint.core  # noqa: F401 - loads checkpoint_io (which imports it)
    from tianji_jax.checkpoint.io import load_process_part, part_path

    full, cut = tmp_path / "A", tmp_path / "B"
    a = _train_workers(tmp_path, full, "CartPole-v1", 0, "dqn")
    b = _train_workers(tmp_path, cut, "CartPole-v1", 1, "dqn", who="0")  # process 1 stops with it
    assert "worker interrupted" in b[0].text
    assert re.search(r"worker stopped by its peer: another process of this multi-host job stopped the run after "
                     r"update \d+", b[1].text), b[1].text[-2000:]
    first = sorted(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit())
    assert len(first) == 1 and part_path(cut, first[0], 1).is_file()
    r = _resume_pair(tmp_path, cut)
    assert all(f"({first[0]} env steps)" in p.text for p in r)
    want = _digests(a[0].text)
    assert sorted(want) == list(range(1, 25)) and _digests(a[1].text) == want and len(set(want.values())) == 24
    resumed = [_digests(p.text) for p in r]
    assert resumed[0] == resumed[1] and resumed[0] and max(resumed[0]) == 24
    assert resumed[0] == {u: want[u] for u in resumed[0]}  # the blocks after the cut, bit for bit
    for x, y in zip(jax.tree.leaves(tj.load_params(full)), jax.tree.leaves(tj.load_params(cut))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    la, lb = tj.load(full), tj.load(cut)
    assert la.step == lb.step == 1024 and la.meta["async_counters"] == lb.meta["async_counters"]
    assert lb.meta["resumable"] is True and lb.meta["includes_replay"] is True
    for x, y in zip(jax.tree.leaves(la.state), jax.tree.leaves(lb.state)):  # learner + process 0's actors and replay
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    own = {"actor": lb.state.actor, "replay": lb.state.replay}
    (pa, ia), (pb, ib) = (load_process_part(d, 1024, 1, own) for d in (full, cut))
    assert ia == ib
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):  # process 1's actors and replay shards
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # its own transitions, not process 0's (each process inserts only its actors' env columns)
    assert not all(np.array_equal(np.asarray(x), np.asarray(y))
                   for x, y in zip(jax.tree.leaves(pa["replay"].data), jax.tree.leaves(lb.state.replay.data)))
    assert _rows(full) == _rows(cut)


# ---- the replay data path on several processes (DQN, SAC): local replay shards, one global learner block ----
REPLAY_SMALL = ["--runtime", "async", "--num-envs", "4", "--num-steps", "4", "--learning-starts", "256",
                "--batch-size", "32", "--buffer-capacity", "2048", "--replay-ratio", "0.125",
                "--eval-episodes", "0", "--progress", "False", "--tensorboard", "False"]


def _replay_pair(tmp_path: Path, extra: list[str], timeout: float = 240) -> tuple[list[_Proc], dict, dict]:
    port = _free_port()
    procs = [_Proc(["-c", CLI, "train", *REPLAY_SMALL, *extra, "--num-processes", "2", "--process-id", str(i),
                    "--coordinator", f"127.0.0.1:{port}", "--heartbeat-timeout-s", "30",
                    "--run-dir", str(tmp_path / f"run{i}")], tmp_path) for i in range(2)]
    try:
        rcs = [p.wait(timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert rcs == [0, 0], [p.text[-3000:] for p in procs]
    return procs, _digests(procs[0].text), _digests(procs[1].text)


@pytest.mark.slow  # two jax.distributed processes: about 40-60 s each on 2 cores
@pytest.mark.parametrize("algo, env", [("dqn", "gymnax:CartPole-v1"), ("sac", "envpool:Pendulum-v1")])
def test_two_replay_processes_keep_identical_replicas(tmp_path, algo, env):
    """The replay data path's multi-host cells: each process's actors fill its own replay shard;
    every learner block is one collective (gradients averaged over both processes), so the
    replicas agree after every block; rows count both processes' env steps; process 0 owns the
    run directory. 64 iterations of 2 x 16 env steps, learning after 256 (from iteration 9): 56
    blocks (``sync``). Two cells stand for the six (both algorithms; device envs and host envs:
    gymnasium's host actor is envpool's code path with another env factory), to keep the suite's
    time budget."""
    procs, d0, d1 = _replay_pair(tmp_path, ["--algo", algo, "--env", env, "--schedule", "sync",
                                            "--total-env-steps", "2048", "--eval-every-env-steps", "512"])
    assert sorted(d0) == list(range(1, 57)) and d0 == d1
    assert len(set(d0.values())) == 56  # the params changed every block
    import csv

    rows = list(csv.DictReader(open(tmp_path / "run0" / "metrics.csv")))
    # a row every 16 blocks (512 env steps); block k follows iteration 8 + k: env steps inserted by both processes
    assert [int(r["update"]) for r in rows] == [16, 32, 48, 56]
    assert [int(r["env_steps"]) for r in rows] == [768, 1280, 1792, 2048]
    assert not (tmp_path / "run1").exists()
    assert (tmp_path / "run0" / "final_params").is_dir()
    assert "placement: process 1 of 2" in procs[1].text


@pytest.mark.slow  # two jax.distributed processes through the CLI: about 40 s on 2 cores
def test_ctrl_c_on_one_process_stops_both_with_one_line_each(tmp_path):
    """Ctrl-C on process 0 of a two-process CLI run: both learners stop after the same update;
    process 0 says it was interrupted (status 130), process 1 that its peer stopped the run
    (status 4), one line each, and both leave the job together (process 1 never reports process 0
    as dead)."""
    port = _free_port()
    procs = [_Proc(["-c", CLI, "train", *REPLAY_SMALL, "--algo", "dqn", "--schedule", "sync", "--total-env-steps",
                    "65536", "--eval-every-env-steps", "512", "--num-processes", "2", "--process-id", str(i),
                    "--coordinator", f"127.0.0.1:{port}", "--heartbeat-timeout-s", "30",
                    "--run-dir", str(tmp_path / "run")], tmp_path) for i in range(2)]
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not any("update 40 params" in line for _, line in procs[0].lines):
            assert all(p.p.poll() is None for p in procs), [p.text[-2000:] for p in procs]
            time.sleep(0.5)
        os.kill(procs[0].p.pid, signal.SIGINT)
        rcs = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert rcs == [130, 4], [p.text[-3000:] for p in procs]
    assert procs[0].lines[-1][1].startswith("tianji train: interrupted; "), procs[0].text[-2000:]
    assert re.match(r"tianji train: stopped: another process of this multi-host job stopped the run after update "
                    r"\d+ .*continue the run with: tianji train --resume .* --num-processes 2 --process-id I "
                    r"--coordinator HOST:PORT", procs[1].lines[-1][1]), procs[1].text[-2000:]
    assert not any("died" in p.text or "Traceback" in p.text for p in procs)


def test_replay_multi_host_fields_are_checked():
    base = dict(runtime="async", num_envs=4, num_steps=4, total_env_steps=4096, learning_starts=256, batch_size=32,
                buffer_capacity=2048, replay_ratio=0.125, eval_episodes=0, num_processes=2,
                coordinator="127.0.0.1:1234")
    c = tj.DQNConfig(**base)
    # an iteration is both processes' env steps: 4096 / 32 = 128 iterations of 4 updates
    assert (c.global_iteration_env_steps, c.num_iterations, c.updates_per_step) == (32, 128, 4)
    with pytest.raises(ValueError, match=r"num_processes=2 x num_learner_devices=1 = 2 replay shards must divide "
                                         r"batch_size and buffer_capacity .* batch_size=33"):
        tj.DQNConfig(**{**base, "batch_size": 33})
    with pytest.raises(ValueError, match="needs coordinator='HOST:PORT'"):
        tj.SACConfig(env="gymnax:Pendulum-v1", runtime="async", num_processes=2)
    with pytest.raises(ValueError, match="stop_at_return"):
        tj.DQNConfig(**{**base, "eval_episodes": 2, "stop_at_return": 100.0})
    from tianji_jax.runtime.async_replay import AsyncReplay

    with pytest.raises(ValueError, match="has not joined"):
        AsyncReplay(c)


_REPLAY_WORKER = textwrap.dedent('''
    import sys, numpy as np
    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    from tianji_jax.runtime.layouts import distributed as dist
    dist.initialize(f"127.0.0.1:{port}", 2, pid, heartbeat_timeout_s=10)
    import jax.numpy as jnp
    import tianji_jax as tj
    from tianji_jax.runtime.async_replay import AsyncReplay
    cfg = tj.DQNConfig(runtime="async", num_envs=4, num_steps=16, learning_starts=128, batch_size=32,
                       buffer_capacity=512, replay_ratio=1 / 32, total_env_steps=4096, eval_episodes=0,
                       num_processes=2, process_id=pid, coordinator=f"127.0.0.1:{port}")
    rt = AsyncReplay(cfg)
    params = jax.device_put(rt.local_learner_state.params, rt.actor_device)
    state, items, item_version, mask, _ = rt._rollout(params, jnp.asarray(0, jnp.int32), rt._actor_states[0], None)
    placed = rt._place(items, item_version, mask)
    rt.replay_state = rt._insert(rt.replay_state, *placed)
    learner, rt.replay_state, metrics = rt._learn(rt.learner_state, rt.replay_state, 1234)
    local = dist.local_replica(learner)
    leaves = {f"param_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(local.params))}
    chunk = {f"chunk_{k}": np.asarray(v) for k, v in jax.device_get(dict(items=items, item_version=item_version,
                                                                           mask=mask)).items() if k != "items"}
    chunk.update({f"item_{i}": np.asarray(v) for i, v in enumerate(jax.tree.leaves(jax.device_get(items)))})
    np.savez(out, version=np.asarray(local.version),
             size=np.asarray(int(jnp.sum(rt.agent.replay_size(rt.replay_state)))), **leaves, **chunk)
    print("worker done", flush=True)
''')


@pytest.mark.slow  # two jax.distributed processes: about 40 s each on 2 cores
def test_global_replay_block_equals_the_single_process_data_parallel_block(tmp_path):
    """Two processes, each inserting its own actor's chunk into its own replay shard, then one
    global learner block, give the params of one process with two data-parallel learner devices
    whose sharded replay holds the same chunks (process 0's env columns on device 0): the same
    samples, the same averaged gradients."""
    script = tmp_path / "worker.py"
    script.write_text(_REPLAY_WORKER)
    port = _free_port()
    procs = [_Proc([str(script), str(i), str(port), str(tmp_path / f"p{i}.npz")], tmp_path) for i in range(2)]
    try:
        rcs = [p.wait(200) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert rcs == [0, 0], [p.text[-3000:] for p in procs]
    out = [dict(np.load(tmp_path / f"p{i}.npz")) for i in range(2)]
    assert all(int(o["version"]) == 1 and int(o["size"]) > 0 for o in out)
    assert not np.array_equal(out[0]["item_0"], out[1]["item_0"])  # different actor streams
    n = len([k for k in out[0] if k.startswith("param_")])
    for i in range(n):
        np.testing.assert_array_equal(out[0][f"param_{i}"], out[1][f"param_{i}"])
    import jax.numpy as jnp

    from tianji_jax.runtime.async_replay import AsyncReplay

    single = AsyncReplay(tj.DQNConfig(runtime="async", num_envs=8, num_steps=16, learning_starts=128, batch_size=32,
                                      buffer_capacity=512, replay_ratio=1 / 32, total_env_steps=4096,
                                      eval_episodes=0, num_learner_devices=2))

    merged = {}  # (T * 4, ...) time-major items of each process -> (T * 8, ...), process 0's env columns first
    for key in [k for k in out[0] if k.startswith("item_")] + ["chunk_item_version", "chunk_mask"]:
        a, b = (out[p][key].reshape((16, 4, *out[p][key].shape[1:])) for p in range(2))
        merged[key] = np.concatenate([a, b], axis=1).reshape((16 * 8, *a.shape[2:]))
    _, like, _, _, _ = single._rollout(jax.device_put(single.learner_state.params, single.actor_device),
                                       jnp.asarray(0, jnp.int32), single._actor_states[0], None)
    n_items = len(jax.tree.leaves(like))
    items = jax.tree.unflatten(jax.tree.structure(like), [merged[f"item_{i}"] for i in range(n_items)])
    placed = single._place(items, merged["chunk_item_version"], merged["chunk_mask"])
    single.replay_state = single._insert(single.replay_state, *placed)
    ref, _, _ = single._learn(single.learner_state, single.replay_state, jnp.asarray(1234, jnp.int32))
    for i, leaf in enumerate(jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(out[0][f"param_{i}"], np.asarray(leaf), rtol=2e-5, atol=2e-6)


_LISTEN_WORKER = textwrap.dedent('''
    import json, sys
    import numpy as np, psutil
    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    from tianji_jax.runtime.layouts import distributed as dist
    dist.initialize(f"{sys.argv[4]}:{port}", 2, pid, heartbeat_timeout_s=30)
    from jax.experimental import multihost_utils
    got = multihost_utils.process_allgather(np.array([pid]))  # a collective: gloo's sockets are open
    listening = [c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    json.dump({"gathered": np.asarray(got).ravel().tolist(), "listening": listening}, open(out, "w"))
    multihost_utils.sync_global_devices("done")
''')


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_job_on_one_machine_listens_on_the_loopback_interface_only(tmp_path, host):
    """Budget: about 10 s (two processes that join, gather once and exit). jax's coordination
    service would listen on every interface (``[::]:PORT``) and gloo on the hostname's address."""
    import ipaddress
    import json

    _run_workers(tmp_path, _LISTEN_WORKER, ".json", [host], timeout=120)
    out = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
    assert all(o["gathered"] == [0, 1] for o in out), out
    assert len(out[0]["listening"]) >= 2, out  # the coordination service and process 0's gloo port
    for o in out:
        for ip in o["listening"]:
            addr = ipaddress.ip_address(ip)
            assert (getattr(addr, "ipv4_mapped", None) or addr).is_loopback, (ip, out)


def test_loopback_coordinators_are_recognised():
    from tianji_jax.algos.config_checks import loopback_ip

    assert [loopback_ip(h) for h in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]")] == \
        ["127.0.0.1", "127.1.2.3", "127.0.0.1", "::1", "::1"]
    assert [loopback_ip(h) for h in ("10.0.0.1", "0.0.0.0", "node-3", "::")] == [None] * 4
