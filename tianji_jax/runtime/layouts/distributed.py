"""Multi-host learners on ``jax.distributed`` (the Sebulba multi-controller pattern).

Every process runs the same program: its own actors on its first local device, its own
trajectory queue, and a learner shard on its last ``num_learner_devices`` local devices. The
learner update is one ``shard_map`` over a *global* ``Mesh`` (axis ``"data"``) spanning the
learner devices of all processes, so gradients are averaged over every learner device of every
process and the replicas stay identical everywhere.

Lockstep (the rule that keeps collectives matched): every process runs exactly
``num_updates`` updates, in the same order, from its learner thread only, and each global update
takes exactly **one local trajectory per process** (``num_envs`` env columns of ``num_steps``
steps; the global batch is ``num_processes * num_envs * num_steps``). A process's trajectory queue,
lag gate and rate limiter work as on one host, against the global policy version: version ``v`` =
number of global updates published, identical on every process because every process publishes
once per collective update. A process whose queue is empty simply makes the others wait inside the
collective (the slowest process sets the pace); the lag gate still applies per process.

Nothing else issues collectives during a run except the telemetry sum (:func:`make_counter_sum`),
which is called from the learner thread right after each update (and once by the main thread
before the threads start), so it is in lockstep too. Evaluation, logging and checkpoints run on
each process's *local* replica of the params (process 0 writes the run directory). Checkpoints
coordinate through the job's key-value store (:func:`kv_set` / :func:`kv_get`), never through a
collective: they are written from the host loop's thread while the learner thread issues the
lockstep collectives (a resumable multi-host run: :class:`~tianji_jax.run.run_files.RunFiles`).

Failures: a process that dies closes its sockets; jax's coordination service notices (at once,
or after ``heartbeat_timeout_s`` for a hung peer) and terminates every survivor. jax's hook for
that (``missed_heartbeat_callback``) cannot take a Python callable in this jaxlib, so the
``tianji train`` launcher runs training in a child process under a small supervisor
(:func:`supervise`): it forwards the child's output, recognises the coordination service's fatal
report, prints a ``tianji:`` line naming the dead process *before* jax's lines and exits
non-zero. A :class:`Watchdog` in the learner additionally ends a process whose collective update
makes no progress for ``collective_timeout_s`` (a peer that is alive but stuck).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from tianji_jax.algos.config_checks import check_coordinator, loopback_ip  # re-exported: the config validates it too
from tianji_jax.runtime.layouts.collectives import make_counter_sum, make_process_gather  # noqa: F401 - re-exported

__all__ = ["initialize", "is_initialized", "process_count", "process_index", "check_coordinator", "placement",
           "replicate", "to_global", "local_replica", "params_digest", "make_counter_sum", "make_process_gather", "Lockstep", "Watchdog", "supervise",
           "kv_set", "kv_get", "kv_delete", "leave_job", "CHILD_ENV", "EXIT_PEER_DEAD"]

CHILD_ENV = "TIANJI_DISTRIBUTED_CHILD"
"""Set in the environment of the training child that :func:`supervise` starts."""
EXIT_PEER_DEAD = 3
"""Exit status of a survivor whose peer process died (or stopped responding)."""

_LOG_PREFIX = "tianji"


def log(msg: str) -> None:
    """One ``tianji[pI]:`` line on stderr, flushed."""
    pid = os.environ.get("TIANJI_PROCESS_ID", "?")
    print(f"{_LOG_PREFIX}[p{pid}]: {msg}", file=sys.stderr, flush=True)


def is_initialized() -> bool:
    """Whether ``jax.distributed`` has been initialised in this process."""
    import jax

    return jax.distributed.is_initialized()


def process_count() -> int:
    """Number of processes in the job (``jax.process_count()``; 1 without ``jax.distributed``)."""
    import jax

    return jax.process_count()


def process_index() -> int:
    """This process's index in ``[0, process_count())`` (``jax.process_index()``)."""
    import jax

    return jax.process_index()


def _gloo_on(ip: str) -> None:
    """Make the gloo collectives this process creates listen on ``ip`` (jax calls
    ``make_gloo_tcp_collectives`` without an address: gloo then takes the hostname's)."""
    import functools

    from jax._src.lib import _jax

    make = getattr(_jax, "make_gloo_tcp_collectives", None)
    if make is None or isinstance(make, functools.partial):
        return
    _jax.make_gloo_tcp_collectives = functools.partial(make, hostname=ip)


def initialize(coordinator: str, num_processes: int, process_id: int, *, heartbeat_timeout_s: int = 60,
               initialization_timeout_s: int = 300, local_device_ids: Sequence[int] | None = None) -> None:
    """Join the job: ``jax.distributed.initialize`` with the CPU collectives set to gloo (the CPU
    backend has no cross-process collectives otherwise). Must run before JAX's backend starts
    (before any array is created, a config resolving a gymnax env included). A second call with
    the same ``(num_processes, process_id)`` does nothing.

    Ports: process 0 runs jax's coordination service (gRPC) on ``coordinator``'s port; every
    process's gloo collectives listen on one ephemeral TCP port each. With a loopback coordinator
    (``127.0.0.1``, ``localhost``, ``::1``: every process on this machine) both listen on the
    loopback interface only; otherwise the coordination service listens on every interface (jax's
    default, ``[::]:PORT``; ``JAX_COORDINATOR_BIND_ADDRESS`` narrows it) and gloo on the address
    this machine's hostname resolves to, which the other hosts must reach.

    Args:
        coordinator: ``"HOST:PORT"`` of process 0's coordination service.
        num_processes: processes in the job, ``>= 1``.
        process_id: this process's index in ``[0, num_processes)``.
        heartbeat_timeout_s: seconds without a peer's heartbeat before jax declares it dead.
        initialization_timeout_s: seconds to wait for every process to join.
        local_device_ids: this process's devices (default: all local devices).

    Raises:
        ValueError: ``coordinator`` not ``HOST:PORT`` (see :func:`check_coordinator`),
            ``num_processes`` not an int ``>= 1`` or ``process_id`` not an int in
            ``[0, num_processes)``.
        RuntimeError: JAX's backend has already started, ``jax.distributed`` is already initialised
            as another process, or the coordinator is unreachable within ``initialization_timeout_s``.
    """
    import jax
    from jax._src import xla_bridge

    host, port = check_coordinator(coordinator)
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in 0..{num_processes - 1}, got {process_id!r}")
    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (num_processes, process_id):
            raise RuntimeError(f"jax.distributed is already initialised as process {jax.process_index()} of "
                               f"{jax.process_count()}, not {process_id} of {num_processes}")
        return
    if xla_bridge.backends_are_initialized():
        raise RuntimeError("jax.distributed must be initialised before JAX's backend starts (before any array or "
                           "config with a gymnax env is created): call tianji_jax.runtime.layouts.distributed.initialize(...) "
                           "first, or launch with `tianji train --num-processes P --process-id I --coordinator H:P`")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    os.environ["TIANJI_PROCESS_ID"] = str(process_id)
    os.environ["TIANJI_HEARTBEAT_S"] = str(int(heartbeat_timeout_s))
    bind = None
    loopback = loopback_ip(host)
    if loopback is not None:  # every process on this machine: nothing listens beyond the loopback interface
        _gloo_on(loopback)
        if "JAX_COORDINATOR_BIND_ADDRESS" not in os.environ:  # jax's own override wins
            bind = f"[{loopback}]:{port}" if ":" in loopback else f"{loopback}:{port}"
    jax.distributed.initialize(coordinator, num_processes, process_id, local_device_ids=local_device_ids,
                               initialization_timeout=int(initialization_timeout_s),
                               heartbeat_timeout_seconds=int(heartbeat_timeout_s), coordinator_bind_address=bind)
    log(f"joined {coordinator} as process {process_id} of {num_processes}; local devices {jax.local_devices()}, "
        f"{jax.device_count()} devices in all")


def placement(num_learner_devices: int) -> tuple[Any, list, list]:
    """``(actor_device, local_learner_devices, global_learner_devices)``: actors on the first
    local device, the local learner shard on the last ``num_learner_devices`` local devices; the
    global learner devices are every process's local learner devices, ordered by process index
    (so the global env axis is process 0's columns, then process 1's, ...).

    Raises:
        ValueError: a process has fewer devices than ``num_learner_devices``.
    """
    import jax

    by_proc: dict[int, list] = {}
    for d in jax.devices():
        by_proc.setdefault(d.process_index, []).append(d)
    glob: list = []
    for p in sorted(by_proc):
        devs = sorted(by_proc[p], key=lambda d: d.id)
        if num_learner_devices > len(devs):
            raise ValueError(f"num_learner_devices={num_learner_devices}: process {p} has only {len(devs)} "
                             f"{devs[0].platform} device(s)")
        glob += devs[len(devs) - num_learner_devices:]
    local = sorted(jax.local_devices(), key=lambda d: d.id)
    return local[0], local[len(local) - num_learner_devices:], glob


def replicate(tree: Any, sharding: Any) -> Any:
    """A pytree of identical-everywhere values (same seed on every process) as global arrays
    replicated over ``sharding`` (``NamedSharding(mesh, P())``); no communication."""
    import jax

    def one(x):
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
    return jax.tree.map(one, tree)


def to_global(traj: dict, mesh: Any, spec_of: Any, num_processes: int) -> dict:
    """This process's trajectory as its part of the global trajectory: each leaf's env axis (axis
    1 of ``(T, N, ...)``, axis 0 of ``last_obs``) becomes ``num_processes * N`` wide, this process
    holding its ``N`` columns split over its local learner devices
    (``jax.make_array_from_process_local_data``)."""
    import jax
    from jax.sharding import NamedSharding

    out = {}
    for k, v in traj.items():
        axis = 0 if k == "last_obs" else 1
        shape = list(v.shape)
        shape[axis] *= num_processes
        out[k] = jax.make_array_from_process_local_data(NamedSharding(mesh, spec_of(k)), v, tuple(shape))
    return out


def local_replica(tree: Any) -> Any:
    """The replica on this process's first addressable device of every (replicated) leaf: plain
    single-device arrays that local code (actors, evaluation, checkpoints) can use."""
    import jax

    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) and
                        not x.is_fully_addressable else x, tree)


def _kv_client() -> Any:
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialised in this process")
    return client


def kv_set(key: str, value: str) -> None:
    """Set ``key`` in the job's key-value store (jax.distributed's coordination service, hosted
    by process 0; not an XLA collective, so any thread may call it at any time)."""
    _kv_client().key_value_set(key, value, allow_overwrite=True)


def kv_get(key: str, timeout_s: float, what: str) -> str:
    """The value of ``key`` in the job's key-value store, waiting up to ``timeout_s`` for another
    process to set it (in short polls, so Ctrl-C still interrupts the wait).

    Raises:
        TimeoutError: not set within ``timeout_s`` (the message names ``what`` was awaited).
    """
    client, deadline = _kv_client(), time.monotonic() + float(timeout_s)
    last: Exception | None = None
    while True:
        t0 = time.monotonic()
        try:
            return client.blocking_key_value_get(key, 250)
        except Exception as err:  # noqa: BLE001 - jaxlib raises its runtime error type (deadline / unavailable)
            last = err
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for {what} (key-value store key {key!r}): "
                               f"{str(last).splitlines()[0] if last else 'not set'}")
        if time.monotonic() - t0 < 0.2:  # an immediate failure (service unreachable): do not spin
            time.sleep(0.2)


def kv_delete(key: str) -> None:
    """Delete ``key`` from the job's key-value store (missing keys ignored)."""
    try:
        _kv_client().key_value_delete(key)
    except Exception:  # noqa: BLE001
        pass


def params_digest(tree: Any) -> str:
    """sha256 (16 hex digits) over the bytes of every leaf of ``tree`` (host copies, in tree order)."""
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(local_replica(tree))):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


class Lockstep:
    """A runner's (an :class:`~tianji_jax.runtime.tianji.async_runtime.AsyncRunner`'s) telemetry made
    global and its stops agreed, as its ``hooks.lockstep``: every snapshot its learner takes after
    an update is summed over the processes (:func:`make_counter_sum`, inside a ``watchdog``
    section like the update itself), together with the number of processes whose caller asked to
    stop (``runner.stop_request``). When that number is > 0, every process's learner sets
    ``runner.stop`` after this same update, so none is left waiting in a collective the others
    never enter; a process that did not ask records the update in ``runner.stopped_by_peer`` (its
    ``run`` raises :class:`~tianji_jax.runtime.tianji.async_runtime.PeerStoppedError`). A collective:
    snapshots are taken in lockstep (after each update, at the start and at the end of the run).

    Args:
        mesh: the global mesh of the learner devices.
        local_devices: this process's learner devices.
        watchdog: the :class:`Watchdog` that times every collective.
    """

    def __init__(self, mesh: Any, local_devices: list, watchdog: "Watchdog"):
        self.total, self.watchdog = make_counter_sum(mesh, local_devices), watchdog
        self.first = True  # the run's first sum (before the threads start) waits for the slowest process's set-up

    def __call__(self, runner: Any, local: Callable[[], dict]) -> dict:
        """The global snapshot of ``runner`` from its ``local`` snapshot function; the local one
        alone once the runner is stopping (an agreed stop, or a local thread failed)."""
        if runner.stop.is_set():
            return local()
        asked = runner.stop_request.is_set()
        with self.watchdog.section("telemetry sum", extra_s=300.0 if self.first else 0.0):
            snap = self.total({**local(), "stop_requests": int(asked)})
        self.first = False
        if snap.pop("stop_requests") > 0:
            runner.stop_agreed(by_peer=not asked)
        return snap




class Watchdog:
    """Ends the process (status :data:`EXIT_PEER_DEAD`) when a collective section stays open
    longer than ``timeout_s`` (a peer alive but stuck; a dead peer is caught by jax's heartbeats).
    ``with watchdog.section("update 3"): ...`` around each collective call. A daemon thread checks
    every 0.5 s.

    Args:
        timeout_s: seconds a section may stay open (plus its ``extra_s``).
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._open: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tianji-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                cur = self._open
            if cur is not None and time.monotonic() - cur[1] > self.timeout_s:
                log(f"collective {cur[0]} made no progress for {self.timeout_s:g} s: a peer process is stuck or "
                    "gone; exiting")
                os._exit(EXIT_PEER_DEAD)

    def section(self, name: str, extra_s: float = 0.0):
        """A context manager timing one collective call (``extra_s`` more allowed, e.g. compilation)."""
        wd = self

        class _Section:
            def __enter__(self):
                with wd._lock:
                    wd._open = (name, time.monotonic() + extra_s)

            def __exit__(self, *exc):
                with wd._lock:
                    wd._open = None
                return False
        return _Section()

    def close(self) -> None:
        """Stop the checking thread (it exits within 0.5 s; idempotent)."""
        self._stop.set()


# -- the launcher's supervisor ----------------------------------------------------------------------
_UNHEALTHY = re.compile(r"following tasks are unhealthy")
_TRANSPORT = re.compile(r"(Gloo .*failed|Connection closed by peer|Connection reset by peer|Read error)", re.IGNORECASE)
_FATAL = re.compile(r"(JAX distributed service detected fatal errors|Polled an error from coordination service|"
                    r"coordination service.*(unavailable|Socket closed)|" + _TRANSPORT.pattern[1:-1] + ")",
                    re.IGNORECASE)


def leave_job(timeout_s: float = 20.0) -> bool:
    """Leave the jax.distributed job through its shutdown barrier, waiting at most ``timeout_s``
    (in a daemon thread: a peer stuck in a collective must not hold this process). When every
    process leaves together (an agreed stop, or one error every process reports), the coordinator
    (process 0) then ends only after the others have left, so none sees it vanish mid-way. Returns
    whether the barrier completed."""
    import jax

    done = threading.Event()

    def shutdown() -> None:
        try:
            jax.distributed.shutdown()
            done.set()
        except Exception:  # noqa: BLE001 - a peer already gone: nothing to wait for
            pass

    t = threading.Thread(target=shutdown, name="tianji-leave-job", daemon=True)
    t.start()
    t.join(timeout_s)
    return done.is_set()


def child_failed(exc: BaseException) -> int:
    """Exit status for a multi-host training child that raised ``exc``. A collective that failed
    because a peer went away: wait (up to the heartbeat timeout + 5 s) for jax's coordination
    service to terminate this process with its report naming the dead process (the supervisor
    turns that into the tianji line), then give up with :data:`EXIT_PEER_DEAD`; otherwise 1."""
    text = f"{exc!r} {getattr(exc, '__notes__', '')}"
    if not _TRANSPORT.search(text):
        return 1
    time.sleep(float(os.environ.get("TIANJI_HEARTBEAT_S", "60")) + 5)
    return EXIT_PEER_DEAD


def _dead_from(lines: list[str], me: int, num_processes: int) -> str:
    """Which process died, from the coordination service's report (``...unhealthy...:`` followed
    by task ids); a survivor that lost the coordinator itself (process 0) says so."""
    text = "\n".join(lines)
    m = re.search(r"unhealthy \(stopped sending heartbeats\):\s*([\d,\s]+)", text)
    if m:
        ids = sorted({int(x) for x in re.findall(r"\d+", m.group(1))})
        return ", ".join(f"process {i}" for i in ids)
    if me != 0 and re.search(r"Socket closed|coordination service|UNAVAILABLE", text):
        return "process 0 (the coordinator)"
    tasks = sorted({int(t) for t in re.findall(r"/task:(\d+)", text)} - {me})
    if tasks:  # other reports (a failed collective, a barrier) name the task they lost
        return ", ".join(f"process {i}" for i in tasks)
    if num_processes == 2:  # a survivor of two lost its only peer
        return f"process {1 - me}"
    return "a peer process"


def supervise(argv: list[str], *, num_processes: int, process_id: int, heartbeat_timeout_s: float) -> int:
    """Run ``tianji train argv`` in a child process and forward its output. When the child reports
    that the distributed job lost a process, print ``tianji[pI]: process J died ...`` before the
    report and return :data:`EXIT_PEER_DEAD`; otherwise return the child's exit status. The child
    dies with the supervisor (``PR_SET_PDEATHSIG``); SIGINT/SIGTERM are forwarded.

    Args:
        argv: the ``tianji train`` arguments for the child.
        num_processes, process_id: the job's size and this process's index (for the report).
        heartbeat_timeout_s: jax's heartbeat timeout in seconds (only quoted in the report).
    """
    os.environ["TIANJI_PROCESS_ID"] = str(process_id)
    env = dict(os.environ, **{CHILD_ENV: "1", "PYTHONUNBUFFERED": "1"})
    code = "import sys; from tianji_jax.cli.commands import main; sys.exit(main(sys.argv[1:]))"

    def _pdeathsig() -> None:
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 - best effort (non-Linux)
            pass

    child = subprocess.Popen([sys.executable, "-c", code, "train", *argv], env=env, stdout=None,
                             stderr=subprocess.PIPE, preexec_fn=_pdeathsig, text=True, errors="replace",
                             bufsize=1)

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    held: list[str] = []
    fatal = False
    try:
        assert child.stderr is not None
        for line in child.stderr:
            if not fatal and (_FATAL.search(line) or _UNHEALTHY.search(line)):
                fatal = True
            if fatal or held or line.startswith("Traceback"):
                held.append(line)  # a traceback or jax's report: printed after our line
                if len(held) > 400:
                    held.pop(0)
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
        rc = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if child.poll() is None:
            child.kill()
            child.wait()
    if fatal and rc != 0:
        who = _dead_from(held, process_id, num_processes)
        log(f"{who} died or stopped responding (jax.distributed heartbeat timeout {heartbeat_timeout_s:g} s); "
            f"this process (process {process_id} of {num_processes}) is exiting with status {EXIT_PEER_DEAD}; "
            f"jax's report follows")
        sys.stderr.writelines(held)
        sys.stderr.flush()
        return EXIT_PEER_DEAD
    sys.stderr.writelines(held)
    sys.stderr.flush()
    return rc
