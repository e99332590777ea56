"""``tianji train --profile`` / ``train(profile=True)``: a jax.profiler trace and timers.json in
RUN_DIR/profile/, clear errors before any work, nothing recorded when profiling is off."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time

import pytest

import tianji_jax as tj
from tianji_jax.run import profiling
from tianji_jax.cli.commands import main

pytestmark = pytest.mark.timeout(300)

SMALL = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2",
         "--total-env-steps", "512", "--eval-every-env-steps", "256", "--eval-episodes", "2",
         "--progress", "False", "--tensorboard", "False"]


def _finite_numbers(obj, path="timers"):
    """Every number in a JSON tree, with its path; asserts each is finite."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _finite_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _finite_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        assert math.isfinite(obj), f"{path} = {obj}"
        yield path, obj


@pytest.mark.slow  # ~35 s on 2 cores, mostly compilation
def test_cli_profile_writes_trace_and_timers(tmp_path):
    # in a child process: the profiler session's native state (its gRPC/abseil runtime) must not
    # stay in the test process, which later hosts a Ray driver (a segfault was seen in CI)
    run_dir = tmp_path / "run"
    code = "import sys; from tianji_jax.cli.commands import main; sys.exit(main(sys.argv[1:]))"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, "train", *SMALL, "--run-dir", str(run_dir),
                           "--profile", "True"], capture_output=True, text=True, timeout=400)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "timers.json" in proc.stdout
    prof = run_dir / "profile"
    traces = [p for p in prof.glob("plugins/profile/*/*") if p.name.endswith((".xplane.pb", ".trace.json.gz"))]
    assert any(p.name.endswith(".xplane.pb") for p in traces), sorted(prof.rglob("*"))
    assert all(p.stat().st_size > 0 for p in traces)

    timers = json.loads((prof / "timers.json").read_text())
    assert timers["units"] == "seconds" and timers["completed"] is True
    assert (prof / timers["trace_dir"]).is_dir()
    numbers = dict(_finite_numbers(timers))
    assert all(v >= 0 for k, v in numbers.items() if not k.endswith("other_s")), numbers
    phases = timers["phases"]
    assert set(phases) == set(profiling.PHASES)
    total = sum(p["total_s"] for p in phases.values())
    assert total == pytest.approx(timers["phases_total_s"])
    assert 0 < total <= timers["wall_s"] <= elapsed
    assert timers["other_s"] == pytest.approx(timers["wall_s"] - total) and timers["other_s"] >= 0
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2  # 512 env steps, a row every 256
    # one compiled chunk per row, one evaluation per row, final params saved once, checkpoints written
    assert phases["chunk"]["count"] == 2 and len(timers["chunk_s"]) == 2
    assert sum(timers["chunk_s"]) == pytest.approx(phases["chunk"]["total_s"])
    assert phases["chunk"]["first_s"] == timers["chunk_s"][0]
    assert phases["eval"]["count"] == 2 and phases["log"]["count"] == 2 and phases["final_params"]["count"] == 1
    assert phases["checkpoint"]["count"] >= 2 and phases["checkpoint"]["total_s"] > 0
    assert float(rows[-1]["wall_time_s"]) <= timers["wall_s"]
    assert timers["compile_s"]["total"] == pytest.approx(sum(v for k, v in timers["compile_s"].items()
                                                             if k != "total"))
    assert timers["runtime"] == {}  # Anakin: no actor/learner threads
    # the trace covered the first TRACE_WINDOW_S seconds, or the whole (shorter) run
    assert 0 < timers["trace_window_s"] <= min(timers["wall_s"], profiling.TRACE_WINDOW_S + 1.0)


_WINDOW_CHILD = """
import json, sys, time
import jax, jax.numpy as jnp
from tianji_jax.run.profiling import profile_run
f = jax.jit(lambda x: jnp.tanh(x @ x))
with profile_run(sys.argv[1], trace_window_s=0.5) as timers:
    x = jnp.ones((64, 64))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        x = f(x).block_until_ready()
"""


@pytest.mark.timeout(120)
def test_trace_stops_at_its_window_while_the_run_goes_on(tmp_path):
    # a child process, as above: the profiler's native state stays out of the test process
    proc = subprocess.run([sys.executable, "-c", _WINDOW_CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    timers = json.loads((tmp_path / "profile" / "timers.json").read_text())
    assert 0.5 <= timers["trace_window_s"] < 1.5  # stopped by the window's timer thread...
    assert timers["wall_s"] >= 2.0  # ...while the body ran on; the timers cover all of it
    assert timers["completed"] is True and (tmp_path / "profile" / timers["trace_dir"]).is_dir()
    assert any(p.name.endswith(".xplane.pb") for p in (tmp_path / "profile").rglob("*"))


def test_trace_window_must_be_positive(tmp_path):
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(ValueError, match="trace_window_s must be a number of seconds > 0"):
            with profiling.profile_run(tmp_path, trace_window_s=bad):
                pass
    assert not (tmp_path / "profile").exists()


def test_profile_needs_run_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *SMALL, "--profile", "True"]) == 2
    assert "--profile needs --run-dir" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="profile=True needs run_dir"):
        tj.train(tj.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, total_env_steps=128), profile=True)


def test_profile_never_touches_an_existing_run(tmp_path):
    # a run with a row (a header-only metrics.csv, left by a run stopped before its first row, is reusable)
    (tmp_path / "metrics.csv").write_text("env_steps\n128\n")
    with pytest.raises(FileExistsError, match="already holds a run"):
        tj.train(tj.PPOConfig(num_envs=4, num_steps=32, num_minibatches=2, total_env_steps=128),
                 run_dir=tmp_path, profile=True)
    assert not (tmp_path / "profile").exists()


def test_phases_are_free_when_not_profiling():
    assert profiling._CURRENT.get() is None
    fn = lambda x: x  # noqa: E731
    assert profiling.timed("eval", fn) is fn  # no wrapper, no block_until_ready in a normal run
    with profiling.phase("chunk"):
        pass
    timers = profiling.PhaseTimers()
    with pytest.raises(ValueError, match="unknown phase 'nope'"):
        timers.add("nope", 1.0)
