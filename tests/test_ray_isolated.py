"""Runs tests/test_ray_actors.py (Ray remote actors: validation, two-node cluster learning, fault
and restart tests) in child pytest processes, so that Ray's driver runtime never lives in the
main test process (it was seen to segfault later tests there).

Two children, both ``serial`` (alone, after the parallel part): the kill/restart tests (marked
``serial`` in that file: their timings failed beside another worker), and the rest (validation,
the capability table's Ray cells, the learning runs). The second one was tried inside the parallel
part: it took 447-504 s there against about 190 s alone, more worker time than its wall time alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _child(marker: str, expected: int, timeout_s: float) -> None:
    """``pytest -m MARKER tests/test_ray_actors.py`` in a child process; exactly ``expected`` pass."""
    env = dict(os.environ, TIANJI_RAY_CHILD="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rA",
                           "-m", marker, str(ROOT / "tests" / "test_ray_actors.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    out = proc.stdout + proc.stderr
    print(out[-4000:])
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s", out, re.M)
    assert summary, out[-4000:]
    assert "failed" not in summary[-1] and "error" not in summary[-1], out[-4000:]
    assert re.search(rf"\b{expected} passed\b", summary[-1]), summary[-1]
    assert proc.returncode == 0, f"child pytest exited {proc.returncode} after: {summary[-1]}"


@pytest.mark.slow  # about 3-4 minutes alone on 2 cores (two learning runs on a two-node cluster, 19 tests)
@pytest.mark.serial  # alone, after the parallel part: see the module docstring
@pytest.mark.timeout(1800)
def test_ray_actor_tests_in_a_child_process():
    _child("not serial", 19, 1740)


@pytest.mark.slow  # about 1 minute alone on 2 cores (3 tests)
@pytest.mark.serial  # alone, after the parallel part: its kill/restart timings failed beside another worker
@pytest.mark.timeout(900)
def test_ray_kill_and_restart_tests_in_a_child_process():
    _child("serial", 3, 840)
