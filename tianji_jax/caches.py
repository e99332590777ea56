"""One switch for every compiled-function cache: tianji's per-config caches, JAX's own, and JAX's
persistent (on-disk) compilation cache.

tianji_jax keeps compiled trainers, learners and evaluators per config so that a second
``train`` with the same config compiles nothing. Every XLA CPU executable also holds a few
memory mappings, and Linux caps mappings per process (``vm.max_map_count``, 65530 by default):
a long-lived process that compiles thousands of different configs (a sweep in one Jupyter
kernel, a test session) can reach the cap, after which the next compilation crashes the process
with a segmentation fault inside LLVM. :func:`clear_caches` frees them.

Compile once per machine: importing ``tianji_jax`` calls :func:`enable_persistent_cache`, which
points JAX's persistent compilation cache at a per-user directory, so a second *process* (the
next ``tianji train``, a sweep's next run, a notebook restart) loads each executable from disk
instead of compiling it again. Environment variables (read once, when ``tianji_jax`` is imported):

* ``TIANJI_COMPILATION_CACHE=0`` -- off (also ``false``/``off``/``no``).
* ``TIANJI_COMPILATION_CACHE_DIR`` -- the directory; default ``$XDG_CACHE_HOME/tianji_jax/xla``,
  else ``~/.cache/tianji_jax/xla``.
* ``TIANJI_COMPILATION_CACHE_MAX_BYTES`` -- size bound in bytes, least recently used entries
  evicted first; default 256 MiB (JAX lists every entry at each write, so the bound is kept
  small: about 8,000 small entries); ``-1`` for no bound.
* A user's own JAX setting wins: with ``JAX_COMPILATION_CACHE_DIR`` set (or
  ``jax.config.update("jax_compilation_cache_dir", ...)`` called before the import) tianji_jax
  changes none of JAX's cache options.

A corrupt entry in tianji_jax's directory (truncated, or bytes that do not deserialise) is
repaired: JAX never overwrites an existing entry, so left alone it would be recompiled with a
warning in every later process; tianji_jax deletes it when its read fails, JAX's one-line warning
says so, the fresh compilation is written in its place and the next process loads it.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, MutableMapping

__all__ = ["clear_caches", "register", "enable_persistent_cache", "cache_dir", "default_cache_dir",
           "pin_cpu_collective_schedule", "guard_cpu_collectives", "CorruptCacheEntryError"]

_REGISTERED: list[MutableMapping[Any, Any]] = []

ENV_SWITCH = "TIANJI_COMPILATION_CACHE"
ENV_DIR = "TIANJI_COMPILATION_CACHE_DIR"
ENV_MAX_BYTES = "TIANJI_COMPILATION_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 256 * 1024**2
_OFF = ("0", "false", "off", "no")
# The directory enable_persistent_cache set (None: off, or the user's own JAX setting is in use).
_TIANJI_DIR: Path | None = None
# XLA CPU option that keeps executables with cross-device collectives correct when they are
# loaded from the persistent cache (see pin_cpu_collective_schedule).
CPU_SCHEDULER_OPTION = "xla_cpu_enable_concurrency_optimized_scheduler"
# Why cached multi-device CPU programs are unsafe as decided at import (None: safe, or not decided yet)
_CPU_COLLECTIVES_UNSAFE: str | None = None  # set by pin_cpu_collective_schedule


def register(cache: MutableMapping[Any, Any]) -> MutableMapping[Any, Any]:
    """Register a module-level compiled-function cache (a dict) so :func:`clear_caches` empties
    it; returns ``cache``."""
    _REGISTERED.append(cache)
    return cache


def clear_caches(disk: bool = False) -> None:
    """Drop every compiled function tianji_jax and JAX hold in memory (``jax.clear_caches()``), so
    their executables and memory mappings are freed. The next ``train``/``make_train`` recompiles
    -- or, with the persistent cache on (:func:`cache_dir`), loads the executables from disk.

    The on-disk cache is left alone unless ``disk=True``: then every entry of the persistent
    cache directory is deleted too, but only when that directory is tianji_jax's own (set by
    :func:`enable_persistent_cache`); a directory the user gave JAX (``JAX_COMPILATION_CACHE_DIR``)
    is never deleted from (a ``RuntimeWarning`` says so). Do not call it while a run is in
    progress in another thread."""
    import jax

    for cache in _REGISTERED:
        cache.clear()
    jax.clear_caches()
    gc.collect()
    if disk:
        _clear_disk()


def default_cache_dir() -> Path:
    """The default persistent-cache directory: ``$XDG_CACHE_HOME/tianji_jax/xla``, or
    ``~/.cache/tianji_jax/xla`` when ``XDG_CACHE_HOME`` is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tianji_jax" / "xla"


def cache_dir() -> Path | None:
    """The directory JAX's persistent compilation cache uses in this process (tianji_jax's or the
    user's own ``JAX_COMPILATION_CACHE_DIR``), or None when the cache is off."""
    import jax

    path = jax.config.jax_compilation_cache_dir
    if not path or not jax.config.jax_enable_compilation_cache:
        return None
    return Path(path)


def enable_persistent_cache() -> Path | None:
    """Turn JAX's persistent compilation cache on in a per-user directory; returns the active
    directory (:func:`cache_dir`), None when off. Called once by ``import tianji_jax``; starts no
    JAX backend (it only sets ``jax.config`` options). See the module docstring for the
    environment variables.

    Sets ``jax_compilation_cache_dir``; ``jax_persistent_cache_min_compile_time_secs=0`` and
    ``jax_persistent_cache_min_entry_size_bytes=-1`` (JAX: "disable the size restriction"), so
    every compilation is cached, the small ones too; ``jax_compilation_cache_max_size``
    (least-recently-used eviction). Each of these is left as it is when the user set it through
    its ``JAX_...`` environment variable, and none is touched when the user already chose a
    cache directory for JAX.

    When the directory cannot be created or written: one ``RuntimeWarning`` naming it and
    ``TIANJI_COMPILATION_CACHE_DIR``, and the cache stays off -- never an exception.

    Several processes may share the directory at once (JAX >= 0.10): one file per entry, keyed
    by a hash of the program, jaxlib version, platform, XLA flags, compile options and devices;
    with a size bound, JAX's ``LRUCache`` takes an inter-process file lock (``filelock``, on
    ``<dir>/.lockfile``) around every read, write and eviction, so no process reads a half-written
    entry. Entry writes themselves are not atomic renames: without the ``filelock`` package (or
    with ``TIANJI_COMPILATION_CACHE_MAX_BYTES=-1``) there is no lock and no bound, and a read
    racing a write fails its zlib/zstd check, which JAX turns into a warning and a recompilation,
    never a wrong executable; an entry whose read fails that way (or whose executable does not
    deserialise) is deleted (under the lock when there is one), so that recompilation is written
    in its place (JAX's warning then names :class:`CorruptCacheEntryError`). Cost of the bound:
    on every write JAX lists the directory and reads each entry's access-time file (about 50 us
    per entry here: ~0.1 s per new compilation at 2000 entries), so a cache of many thousands of
    entries makes each *new* compilation slower; loads stay cheap. Only trust a directory no one else can write to: JAX loads executables from it."""
    global _TIANJI_DIR
    import jax

    if jax.config.jax_compilation_cache_dir:  # the user's own JAX configuration: leave it alone
        return cache_dir()
    if os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF:
        return None
    path = Path(os.environ.get(ENV_DIR) or default_cache_dir()).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        warnings.warn(f"tianji_jax: the compilation cache directory {path} cannot be created or written "
                      f"({type(e).__name__}: {e}); compiled code is not cached on disk. Set {ENV_DIR} to a "
                      f"writable directory, or {ENV_SWITCH}=0 to turn the cache off.", RuntimeWarning, stacklevel=2)
        return None
    max_bytes = _max_bytes()
    if max_bytes != -1 and importlib.util.find_spec("filelock") is None:
        max_bytes = -1  # JAX's LRU eviction needs filelock; without it an unbounded cache
    options = {
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
        "jax_compilation_cache_max_size": max_bytes,
    }
    for name, value in options.items():
        if name.upper() not in os.environ:
            jax.config.update(name, value)
    jax.config.update("jax_compilation_cache_dir", str(path))
    _TIANJI_DIR = path
    _drop_corrupt_entries()
    return cache_dir()


class CorruptCacheEntryError(RuntimeError):
    """An entry of tianji_jax's persistent compilation cache could not be read back (its bytes do
    not decompress, or its executable does not deserialise) and was deleted. Raised from inside
    JAX's cache read, which turns it into its one-line ``Error reading persistent compilation cache
    entry`` warning and compiles the program again (or re-raises it with
    ``jax_raise_persistent_cache_errors``)."""


def _drop_corrupt_entries() -> None:
    """Wrap JAX's ``compilation_cache.get_executable_and_time`` (once) so that an entry of
    tianji_jax's directory whose read fails after its bytes were read is deleted and the failure
    re-raised as one line (:class:`CorruptCacheEntryError`): JAX's ``LRUCache.put`` never replaces
    an existing key, so the recompilation JAX then does is written in its place only because the
    broken entry is gone. An ``OSError`` (the file unreadable, the lock's timeout) is not a
    corrupt entry and passes through unchanged, as does any failure in another directory."""
    from jax._src import compilation_cache

    read = compilation_cache.get_executable_and_time
    if getattr(read, "_tianji_repairs", False):
        return

    def get_executable_and_time(cache_key, *args, **kwargs):
        try:
            return read(cache_key, *args, **kwargs)
        except Exception as e:
            if isinstance(e, OSError) or not _delete_entry(compilation_cache._cache, cache_key):
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            raise CorruptCacheEntryError(f"{type(e).__name__}: {first}; tianji_jax deleted the corrupt entry, so the "
                                         "program compiled now is cached in its place") from e

    get_executable_and_time._tianji_repairs = True  # type: ignore[attr-defined]
    compilation_cache.get_executable_and_time = get_executable_and_time


def _delete_entry(cache: Any, key: str) -> bool:
    """Delete entry ``key`` (its ``-cache`` file, then its ``-atime`` file) of JAX's file cache
    ``cache`` when that cache lives in tianji_jax's own directory, holding the cache's lock when it
    has one; returns whether the entry is gone (False: another directory, the lock not acquired
    or the file not deletable)."""
    base = getattr(cache, "_base_cache", cache)  # jax_compilation_cache_check_contents wraps the LRU cache
    path = getattr(base, "_path", None)
    if path is None or _TIANJI_DIR is None or Path(str(path)) != _TIANJI_DIR:
        return False
    lock = base.lock if getattr(base, "eviction_enabled", False) else None
    try:
        if lock is not None:
            lock.acquire(timeout=base.lock_timeout_secs)
        try:
            for suffix in ("-cache", "-atime"):  # the entry first: an access time alone is never listed
                (_TIANJI_DIR / f"{key}{suffix}").unlink(missing_ok=True)
        finally:
            if lock is not None:
                lock.release()
    except OSError:
        return False
    return True


def pin_cpu_collective_schedule() -> bool:
    """Append ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` to ``XLA_FLAGS`` before
    JAX's backend starts (called once by ``import tianji_jax``); returns whether programs with
    cross-device collectives are safe to load from the persistent cache in this process.

    Why: with this jaxlib, a CPU executable holding all-reduces over several devices (a
    data-parallel learner's ``pmean``) that is *loaded from the persistent cache* and run from a
    thread other than the main one (the async runtime's learner thread) lets the devices enter
    different all-reduces at once; the in-process rendezvous pairs them up wrongly and the process
    dies with a segmentation fault (or ``rendezvous.h Check failed id < num_threads``) on the
    second and later runs of the same config. Freshly compiled executables and executables
    compiled with the concurrency-optimised scheduler off run correctly (measured on
    CartPole PPO: no throughput loss). The option is part of the cache key, so entries written
    without it are never read with it.

    Left alone when the user's ``XLA_FLAGS`` already names the option (safe only if it is
    ``false``), and when the backend already started (too late: :func:`guard_cpu_collectives`
    then turns the persistent cache off before a run that needs collectives)."""
    global _CPU_COLLECTIVES_UNSAFE
    flags = os.environ.get("XLA_FLAGS", "")
    setting = _scheduler_setting(flags)
    if setting is not None:
        _CPU_COLLECTIVES_UNSAFE = None if _is_false(setting) else (
            f"XLA_FLAGS sets --{CPU_SCHEDULER_OPTION}={setting}")
    else:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            _CPU_COLLECTIVES_UNSAFE = ("JAX's CPU backend started before `import tianji_jax`, so the option "
                                       f"--{CPU_SCHEDULER_OPTION}=false could not be set")
        else:
            os.environ["XLA_FLAGS"] = f"{flags} --{CPU_SCHEDULER_OPTION}=false".strip()
            _CPU_COLLECTIVES_UNSAFE = None
    return _CPU_COLLECTIVES_UNSAFE is None


def _scheduler_setting(flags: str) -> str | None:
    """The value ``XLA_FLAGS`` gives the scheduler option (XLA keeps the last occurrence; any
    whitespace separates flags), or None when it is not named."""
    given = [f for f in flags.split() if f.lstrip("-").partition("=")[0] == CPU_SCHEDULER_OPTION]
    return given[-1].partition("=")[2].strip() if given else None


def _is_false(setting: str) -> bool:
    return setting.lower() in ("false", "0")


def _collectives_unsafe_reason() -> str | None:
    """Why a cached multi-device CPU program may crash this process, or None when it is safe.
    ``XLA_FLAGS`` is read again: a user who replaced it after ``import tianji_jax`` (and before
    JAX's backend started) dropped the option that import appended."""
    if _CPU_COLLECTIVES_UNSAFE is not None:
        return _CPU_COLLECTIVES_UNSAFE
    setting = _scheduler_setting(os.environ.get("XLA_FLAGS", ""))
    if setting is None:
        return f"XLA_FLAGS no longer holds --{CPU_SCHEDULER_OPTION}=false (it was replaced after `import tianji_jax`)"
    if not _is_false(setting):
        return f"XLA_FLAGS now sets --{CPU_SCHEDULER_OPTION}={setting}"
    return None


def guard_cpu_collectives(devices: Any) -> None:
    """Before compiling a program with collectives over ``devices`` (a data-parallel learner's
    mesh): when they are CPU devices, the persistent cache is on and the scheduler option is not
    in force (JAX's backend started before ``import tianji_jax``; the user's ``XLA_FLAGS`` sets it
    to true, or was replaced after the import), turn the persistent cache off for this process,
    with one ``RuntimeWarning`` giving that reason and how to keep the cache (import tianji_jax
    before using JAX, and keep ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` in
    ``XLA_FLAGS``). A no-op otherwise."""
    devices = list(devices)
    if len(devices) < 2 or devices[0].platform != "cpu" or cache_dir() is None:
        return
    reason = _collectives_unsafe_reason()
    if reason is None:
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    warnings.warn(f"tianji_jax: the persistent compilation cache is now off in this process: {reason}, and "
                  "loading a multi-device CPU program from the cache can crash the process. To keep the cache, "
                  f"import tianji_jax before using JAX and keep --{CPU_SCHEDULER_OPTION}=false in XLA_FLAGS.",
                  RuntimeWarning, stacklevel=3)


def _max_bytes() -> int:
    raw = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
        if value > 0 or value == -1:
            return value
    except ValueError:
        pass
    warnings.warn(f"tianji_jax: {ENV_MAX_BYTES}={raw!r} is not a positive number of bytes or -1 (no bound); "
                  f"using {DEFAULT_MAX_BYTES}.", RuntimeWarning, stacklevel=3)
    return DEFAULT_MAX_BYTES


def _clear_disk() -> None:
    """Delete every entry of tianji_jax's persistent-cache directory (not the directory itself,
    nor its lock file), holding JAX's lock when ``filelock`` is installed."""
    active = cache_dir()
    if active is None:
        return
    if _TIANJI_DIR is None or active != _TIANJI_DIR:
        warnings.warn(f"tianji_jax: clear_caches(disk=True) left the compilation cache directory {active} "
                      "alone: it is the user's own JAX setting, not tianji_jax's.", RuntimeWarning, stacklevel=3)
        return
    try:
        import filelock

        lock: Any = filelock.FileLock(str(active / ".lockfile"), timeout=30)
    except ImportError:
        import contextlib

        lock = contextlib.nullcontext()
    with lock:
        for entry in active.iterdir():
            if entry.name == ".lockfile":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
