"""Runs tests/runtime/test_ray_actors.py (Ray remote actors: validation, two-node cluster learning, fault
and restart tests) in a child pytest process, so that Ray's driver runtime never lives in the
main test process (it was seen to segfault later tests there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


FAULT_TESTS = "killed or dying_past_max_restarts"
"""The kill/restart tests: their timings failed beside another worker, so they run alone (serial)."""


def _collected(select: str, env: dict) -> int:
    """How many tests of tests/runtime/test_ray_actors.py `-k select` picks (so the pass count below is
    checked against the file as it is, not a number written by hand)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           "-k", select, str(ROOT / "tests" / "runtime" / "test_ray_actors.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    found = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout + proc.stderr)
    assert found, (proc.stdout + proc.stderr)[-4000:]
    return int(found.group(1))


def _child_pytest(select: str, min_expected: int) -> None:
    env = dict(os.environ, TIANJI_RAY_CHILD="1")
    expect_passed = _collected(select, env)
    assert expect_passed >= min_expected, f"only {expect_passed} tests selected by {select!r}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rA",
                           "-k", select, str(ROOT / "tests" / "runtime" / "test_ray_actors.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1740)
    out = proc.stdout + proc.stderr
    print(out[-4000:])
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s", out, re.M)
    assert summary, out[-4000:]
    assert "failed" not in summary[-1] and "error" not in summary[-1], out[-4000:]
    assert re.search(rf"\b{expect_passed} passed\b", summary[-1]), summary[-1]
    assert proc.returncode == 0, f"child pytest exited {proc.returncode} after: {summary[-1]}"


@pytest.mark.slow  # about 4-5 minutes alone on 2 cores (two learning runs on a two-node cluster, 19 tests)
@pytest.mark.timeout(1800)
def test_ray_actor_tests_in_a_child_process():
    """Everything in tests/runtime/test_ray_actors.py but the kill/restart tests, beside the other worker."""
    _child_pytest(f"not ({FAULT_TESTS})", 19)  # at least 19; the file has more


@pytest.mark.slow  # about 1-1.5 minutes (3 tests and a two-node cluster's start)
@pytest.mark.serial  # alone, after the parallel part: its kill/restart timings failed beside another worker
@pytest.mark.timeout(900)
def test_ray_fault_tests_in_a_child_process():
    """The kill/restart tests of tests/runtime/test_ray_actors.py, alone."""
    _child_pytest(FAULT_TESTS, 3)  # at least 3
