"""JAX's persistent compilation cache, on by default (tianji_jax.caches.enable_persistent_cache):
a second process with the same config compiles nothing from scratch; the off switch, an unwritable
directory and a user's own ``JAX_COMPILATION_CACHE_DIR`` are honoured. Each case runs in a child
process: the cache directory is fixed once per process, when ``tianji_jax`` is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_COUNT = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import jax
    counts = {"hits": 0, "misses": 0, "compiles": 0}
    def _event(name, **kwargs):
        if name == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1
        elif name == "/jax/compilation_cache/cache_misses":  # recorded when an entry is written
            counts["misses"] += 1
    def _duration(name, secs, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":  # a compilation or a disk load
            counts["compiles"] += 1
    jax.monitoring.register_event_listener(_event)
    jax.monitoring.register_event_duration_secs_listener(_duration)
    PRE
    import tianji_jax as tj
    WORK
counts["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
counts["read_errors"] = [str(w.message) for w in caught if "Error reading persistent compilation" in str(w.message)]
counts["cache_dir"] = None if tj.cache_dir() is None else str(tj.cache_dir())
print("COUNTS" + json.dumps(counts))
"""

TRAIN = ("tj.train(tj.PPOConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=128, "
         "eval_every_env_steps=64, eval_episodes=1), progress=False)")
JIT = "jax.block_until_ready(jax.jit(lambda x: x * 2 + 1)(jax.numpy.arange(3.0)))"


def _run(work: str, pre: str = "", **env: str) -> dict:
    """Run ``work`` in a child process with the given environment overrides (the test session's
    cache variables removed); returns its counts, RuntimeWarnings and ``tj.cache_dir()``."""
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("TIANJI_COMPILATION_CACHE", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    # the test session's own import of tianji_jax appended its XLA option: children decide for themselves
    child_env["XLA_FLAGS"] = " ".join(f for f in child_env.get("XLA_FLAGS", "").split()
                                      if "xla_cpu_enable_concurrency_optimized_scheduler" not in f)
    child_env.update(env)
    code = _COUNT.replace("PRE", pre.replace("\n", "\n    ") or "pass").replace("WORK", work.replace("\n", "\n    "))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("COUNTS")][-1]
    return json.loads(line[len("COUNTS"):])


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.rglob("*") if p.name != ".lockfile") if path.exists() else []


def test_second_process_compiles_nothing_from_scratch(tmp_path):
    cache = tmp_path / "xla"
    first = _run(TRAIN, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    assert first["cache_dir"] == str(cache)
    assert first["misses"] > 0 and first["hits"] == 0, first
    assert any(name.endswith("-cache") for name in _entries(cache))
    second = _run(TRAIN, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    assert second["misses"] == 0 and second["hits"] > 0, second
    assert second["compiles"] == second["hits"], second  # every executable came from the disk
    assert first["warnings"] == [] and second["warnings"] == []


def test_a_corrupt_entry_is_replaced_and_the_next_process_loads_it(tmp_path):
    """Budget ~12 s (three child processes). JAX never overwrites an existing entry: a truncated
    entry (or one whose executable does not deserialise) used to be recompiled, with a warning,
    in every later process and never loaded again. The process that finds it warns in one line
    per entry and writes its fresh compilation in its place; the next one loads everything."""
    from jax._src import compilation_cache

    cache = tmp_path / "xla"
    first = _run(JIT, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    entries = sorted(cache.glob("*-cache"))
    assert first["misses"] == len(entries) >= 2 and first["read_errors"] == [], first
    entries[0].write_bytes(entries[0].read_bytes()[:len(entries[0].read_bytes()) // 2])  # truncated
    for entry in entries[1:]:  # decompresses, but is no executable
        entry.write_bytes(compilation_cache.compress_executable(b"\0\0\0\1" + b"not an executable" * 8))
    second = _run(JIT, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    assert second["hits"] == 0 and second["misses"] == len(entries), second
    assert len(second["read_errors"]) == len(entries), second
    for message in second["read_errors"]:
        assert "\n" not in message and "Traceback" not in message, message
        assert "CorruptCacheEntryError" in message and "deleted the corrupt entry" in message, message
    third = _run(JIT, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    assert third["misses"] == 0 and third["hits"] == len(entries) == third["compiles"], third
    assert third["read_errors"] == [] and third["warnings"] == [], third


def test_off_switch_leaves_the_directory_empty(tmp_path):
    cache = tmp_path / "xla"
    got = _run(JIT, TIANJI_COMPILATION_CACHE_DIR=str(cache), TIANJI_COMPILATION_CACHE="0")
    assert got["cache_dir"] is None and got["compiles"] >= 1 and got["misses"] == 0
    assert _entries(cache) == []


def test_unwritable_directory_warns_once_and_training_still_works(tmp_path):
    if os.geteuid() == 0:  # root ignores permission bits: a path under a regular file can never be created
        (tmp_path / "afile").write_text("")
        cache = tmp_path / "afile" / "sub"
    else:
        cache = tmp_path / "read_only"
        cache.mkdir()
        cache.chmod(0o500)
    try:
        got = _run(TRAIN, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    finally:
        if cache.name == "read_only":
            cache.chmod(0o700)
    assert got["cache_dir"] is None and got["misses"] == 0 and got["compiles"] >= 1
    warned = [w for w in got["warnings"] if "compilation cache" in w]
    assert len(warned) == 1, got["warnings"]
    assert str(cache) in warned[0] and "TIANJI_COMPILATION_CACHE_DIR" in warned[0]


def test_users_own_jax_cache_dir_is_respected(tmp_path):
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    work = (f"{JIT}\nimport warnings as w2\nwith w2.catch_warnings(record=True) as c2:\n"
            "    w2.simplefilter('always')\n    tj.clear_caches(disk=True)\n"
            "counts['clear_warned'] = [str(x.message) for x in c2]\n"
            "counts['min_time'] = jax.config.jax_persistent_cache_min_compile_time_secs")
    got = _run(work, JAX_COMPILATION_CACHE_DIR=str(theirs), TIANJI_COMPILATION_CACHE_DIR=str(ours))
    assert got["cache_dir"] == str(theirs)
    assert not ours.exists()
    assert got["min_time"] == 1.0  # JAX's default: tianji_jax changed none of the user's options
    assert any("left the compilation cache directory" in w for w in got["clear_warned"]), got


def test_clear_caches_disk_deletes_the_entries(tmp_path):
    cache = tmp_path / "xla"
    work = f"{JIT}\ncounts['before'] = len(list(tj.cache_dir().iterdir()))\ntj.clear_caches(disk=True)"
    got = _run(work, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    assert got["before"] >= 2 and got["misses"] >= 1  # an entry and its access time (and the lock file)
    assert _entries(cache) == [] and cache.is_dir()


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_bad_max_bytes_warns_and_uses_the_default(tmp_path, value):
    work = "counts['max'] = jax.config.jax_compilation_cache_max_size"
    got = _run(work, TIANJI_COMPILATION_CACHE_DIR=str(tmp_path / "xla"), TIANJI_COMPILATION_CACHE_MAX_BYTES=value)
    assert got["max"] == 256 * 1024**2
    assert len(got["warnings"]) == 1 and "TIANJI_COMPILATION_CACHE_MAX_BYTES" in got["warnings"][0]


# An async data-parallel learner (a pmean over two CPU devices) run from the learner thread.
ASYNC_DATA_PARALLEL = ("tj.train(tj.PPOConfig(runtime='async', schedule='sync', num_learner_devices=2, "
                       "total_env_steps=2048, eval_episodes=0), progress=False)")
THREE_CPUS = "jax.config.update('jax_num_cpu_devices', 3)"


def test_cached_multi_device_learner_runs_in_later_processes(tmp_path):
    """Budget ~45 s (four child processes). Without the scheduler option tianji_jax sets at import,
    the second and later processes loaded the data-parallel learner from the cache and crashed
    (a segmentation fault in XLA's CPU all-reduce) in most runs."""
    cache = tmp_path / "xla"
    first = _run(ASYNC_DATA_PARALLEL, pre=THREE_CPUS, TIANJI_COMPILATION_CACHE_DIR=str(cache))
    for _ in range(3):  # each a fresh process that loads every executable from the disk
        again = _run(ASYNC_DATA_PARALLEL, pre=THREE_CPUS, TIANJI_COMPILATION_CACHE_DIR=str(cache))
        assert again["misses"] == 0 and again["hits"] > 0, again
    assert first["warnings"] == [] and again["warnings"] == []


def test_backend_started_before_import_turns_the_cache_off_for_collectives(tmp_path):
    """Too late to set the option: the cache goes off (one warning) before the first program with
    collectives, and the run then compiles instead of loading. Budget ~30 s."""
    cache = tmp_path / "xla"
    pre = THREE_CPUS + "\njax.devices()"
    _run(ASYNC_DATA_PARALLEL, TIANJI_COMPILATION_CACHE_DIR=str(cache), pre=pre)
    got = _run(ASYNC_DATA_PARALLEL + "\ncounts['after'] = None if tj.cache_dir() is None else 1",
               TIANJI_COMPILATION_CACHE_DIR=str(cache), pre=pre)
    warned = [w for w in got["warnings"] if "persistent compilation cache is now off" in w]
    assert len(warned) == 1 and "xla_cpu_enable_concurrency_optimized_scheduler=false" in warned[0], got
    assert got["after"] is None and got["cache_dir"] is None


GUARD = "tj.caches.guard_cpu_collectives(jax.devices())\ncounts['after'] = None if tj.cache_dir() is None else 1"


@pytest.mark.parametrize("pre, work, env, reason", [
    (THREE_CPUS + "\njax.devices()", GUARD, {}, "backend started before `import tianji_jax`"),
    (THREE_CPUS, GUARD, {"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"},
     "XLA_FLAGS sets --xla_cpu_enable_concurrency_optimized_scheduler=true"),
    (THREE_CPUS, "import os\nos.environ['XLA_FLAGS'] = ''\n" + GUARD, {}, "replaced after `import tianji_jax`"),
    (THREE_CPUS, GUARD, {}, None),
], ids=["backend-first", "user-true", "replaced-after-import", "safe"])
def test_collectives_guard_names_its_reason(tmp_path, pre, work, env, reason):
    """Budget ~5 s each (one child process, no training): the guard turns the cache off exactly when
    the scheduler option is not in force, and its one warning says which way it was lost."""
    got = _run(work, pre=pre, TIANJI_COMPILATION_CACHE_DIR=str(tmp_path / "xla"), **env)
    warned = [w for w in got["warnings"] if "persistent compilation cache is now off" in w]
    if reason is None:
        assert warned == [] and got["after"] == 1, got
    else:
        assert len(warned) == 1 and reason in warned[0], got
        assert got["after"] is None, got
