"""Shared fixtures. Every test has a hang guard: pytest-timeout (pyproject default 600 s)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time

import jax
import pytest

# One persistent compilation cache for the whole test session, shared by its child processes
# (subprocess tests, the Ray child pytest inherit the variable), so a config compiled in one
# process is loaded from disk in the next. Fresh per session (not ~/.cache/tianji_jax/xla): a test
# run neither reads a warm cache left by an earlier one nor fills the user's. An explicit
# TIANJI_COMPILATION_CACHE_DIR / JAX_COMPILATION_CACHE_DIR / TIANJI_COMPILATION_CACHE=0 wins.
# No size bound for this throw-away directory: with a bound, JAX's LRUCache lists the whole
# directory and reads every entry's access time on each write (O(entries) per compilation, ~0.1 s
# at 2000 entries here, quadratic over a suite). Set before tianji_jax is imported: it reads the
# variables once, at import.
if not any(os.environ.get(v) for v in ("TIANJI_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="tianji-test-xla-")
    os.environ["TIANJI_COMPILATION_CACHE_DIR"] = _SESSION_CACHE
    os.environ.setdefault("TIANJI_COMPILATION_CACHE_MAX_BYTES", "-1")
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)

# Compile faster in the whole test session (and its child processes, which inherit XLA_FLAGS):
# LLVM's expensive optimisation passes off. Measured here: the final params of PPO (discrete,
# continuous, LSTM) and DQN runs are bit-identical with and without it (an XLA backend
# optimisation level of 0 is faster still but changes the numerics, so it is not used), a
# compile-bound test file took 18% less time and a run-bound one the same. Read when the CPU
# backend starts, i.e. after this line.
if "xla_llvm_disable_expensive_passes" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_llvm_disable_expensive_passes=true").strip()

_CONFIG = None
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_count = 0
_lock = threading.Lock()


def _listener(event: str, duration: float, **kwargs) -> None:
    global _count
    if event == _COMPILE_EVENT:
        with _lock:
            _count += 1


jax.monitoring.register_event_duration_secs_listener(_listener)
# Two CPU devices, as the CLI provides: async actors and learner get different devices.
jax.config.update("jax_num_cpu_devices", 2)


class CompileCounter:
    """Counts XLA backend compilations seen by jax.monitoring since the fixture started."""

    def __init__(self) -> None:
        self.start = _count

    @property
    def count(self) -> int:
        return _count - self.start

    def reset(self) -> None:
        self.start = _count


@pytest.fixture
def compile_counter() -> CompileCounter:
    return CompileCounter()


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_code():
    """After each test module, drop every compiled function (tianji_jax.caches.clear_caches).
    Each XLA CPU executable holds memory mappings; over the whole suite one process went past
    Linux's vm.max_map_count (65530) and the next compilation segfaulted inside LLVM (CI, twice)."""
    yield
    from tianji_jax.caches import clear_caches

    clear_caches()


_SESSION_T0 = time.monotonic()
_SLOW_LINE_S = 45.0
"""A test whose call phase takes at least this long (seconds) is named on the terminal as it ends,
with the session's elapsed minutes, so a CI log cut off by its time limit still shows where the
time went (``--durations`` prints only at the end)."""


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config


def pytest_runtest_logreport(report):
    """Runs in the main process (also for xdist workers' reports): the slow-test line above."""
    if report.when != "call" or report.duration < _SLOW_LINE_S or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    reporter = _CONFIG.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"[{(time.monotonic() - _SESSION_T0) / 60:.1f} min] {report.duration:.0f} s "
                            f"{report.outcome}: {report.nodeid}")


def pytest_collection_modifyitems(config, items):
    """Ray's driver runtime stays in a process after ``ray.shutdown()`` and was seen to segfault
    later, unrelated tests in CI; the Ray tests therefore run only in a child pytest process
    (``tests/runtime/test_ray_isolated.py`` sets ``TIANJI_RAY_CHILD=1``)."""
    import os

    if os.environ.get("TIANJI_RAY_CHILD") != "1":
        items[:] = [i for i in items if "test_ray_actors.py" not in str(i.fspath)]
    # The longest files first, so that with two workers (pyproject's ``-n 2 --dist loadfile``) the
    # last file to finish is a short one; files keep their own test order.
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))  # stable


# Roughly longest first (summed test durations per file in a two-worker run, pytest --durations);
# a scheduling hint only. The two files that start many processes (test_distributed, test_experiments)
# are apart so that each overlaps in-process tests on the other worker.
LONGEST_FILES = ("test_distributed.py", "test_recurrent.py", "test_experiments.py", "test_suites.py", "test_ray_isolated.py",
                 "test_recurrent_pqn.py",
                 "test_capabilities.py", "test_checkpoint.py", "test_learning.py",
                 "test_sweep.py", "test_sac.py", "test_pqn.py", "test_notebooks.py", "test_dqn_distributional.py",
                 "test_dqn_anakin.py", "test_custom_torso.py", "test_faults.py", "test_dqn_atari.py", "test_nonfinite.py")
