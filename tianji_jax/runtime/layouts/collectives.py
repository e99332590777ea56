"""Collectives over the processes of a ``jax.distributed`` job that carry host values (not
device state): the telemetry sum and the exchange of host-side statistics. Each builds a global
array over the learner mesh's ``"data"`` axis from every process's local rows and reduces it in
one compiled ``shard_map``; a call is a collective, so every process must make it in lockstep
(the multi-host learners call them right after each update; :mod:`tianji_jax.runtime.layouts.distributed`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["make_counter_sum", "make_process_gather"]

_SUMMED = ("produced", "consumed", "inserted", "dropped_stale", "dropped_partial", "depth", "sampled",
           "limiter_inserted", "limiter_error", "stop_requests")
"""Snapshot keys that are counts (summed over processes; the other numbers are averaged)."""


def make_counter_sum(mesh: Any, local_devices: list) -> Any:
    """``f(snapshot) -> snapshot``: the runner's telemetry snapshot made global. Counts (items
    produced/consumed/inserted/dropped, queue depth, limiter counters) are summed over processes;
    seconds (waits, busy time, per-phase timers) are averaged over processes, so wait fractions stay
    per-process fractions; ``time`` stays local. A collective: call it in lockstep only."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n_dev = len(local_devices)
    nproc = jax.process_count()
    fn = jax.jit(jax.shard_map(lambda i, f: (jax.lax.psum(i, "data"), jax.lax.psum(f, "data")), mesh=mesh,
                               in_specs=(P("data"), P("data")), out_specs=(P(), P()), check_vma=False))
    sharding = NamedSharding(mesh, P("data"))

    def total(snap: dict) -> dict:
        ikeys = [k for k in _SUMMED if k in snap]
        fkeys = [k for k in snap if k not in ikeys and k != "time" and isinstance(snap[k], (int, float))]
        ints = np.zeros((n_dev, max(len(ikeys), 1)), np.int32)
        flts = np.zeros((n_dev, max(len(fkeys), 1)), np.float32)
        ints[0, :len(ikeys)] = [int(round(snap[k])) for k in ikeys]   # counted once per process
        flts[0, :len(fkeys)] = [float(snap[k]) for k in fkeys]
        gi = jax.make_array_from_process_local_data(sharding, ints, (n_dev * nproc, ints.shape[1]))
        gf = jax.make_array_from_process_local_data(sharding, flts, (n_dev * nproc, flts.shape[1]))
        si, sf = fn(gi, gf)
        si, sf = np.asarray(si.addressable_data(0)).reshape(-1), np.asarray(sf.addressable_data(0)).reshape(-1)
        out = dict(snap)
        out.update({k: int(si[j]) for j, k in enumerate(ikeys)})
        out.update({k: float(sf[j]) / nproc for j, k in enumerate(fkeys)})
        return out
    return total


def make_process_gather(mesh: Any, local_devices: list) -> Callable[[np.ndarray], np.ndarray]:
    """``f(values) -> rows``: every process's ``values`` (a 1-D float64 array, the same length on
    every process), gathered as ``rows`` ``(num_processes, len(values))`` float64 in process order,
    bit for bit: each float64 travels as two int32 words in its process's own slot, and the sum over
    the ``"data"`` axis adds only zeros to it. A collective: call it in lockstep only.

    Raises:
        ValueError: ``values`` is not one-dimensional.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n_dev, nproc, me = len(local_devices), jax.process_count(), jax.process_index()
    fn = jax.jit(jax.shard_map(lambda w: jax.lax.psum(w, "data"), mesh=mesh, in_specs=P("data"), out_specs=P(),
                               check_vma=False))
    sharding = NamedSharding(mesh, P("data"))

    def gather(values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, np.float64)
        if values.ndim != 1:
            raise ValueError(f"make_process_gather: values must be 1-D, got shape {values.shape}")
        words = np.zeros((n_dev, nproc, 2 * len(values)), np.int32)
        words[0, me] = values.view(np.int32)  # counted once per process, in its own slot
        glob = jax.make_array_from_process_local_data(sharding, words, (n_dev * nproc, nproc, 2 * len(values)))
        total = np.asarray(fn(glob).addressable_data(0)).reshape(nproc, 2 * len(values))
        return np.ascontiguousarray(total).view(np.float64)
    return gather
