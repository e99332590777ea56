"""Hyper-parameter sweeps in one compiled program: :func:`sweep` trains every member of a grid of an
algorithm's traced hyper-parameters and seeds with the Anakin runtime, vmapped over the members.

A registered algorithm declares which of its config fields may be traced
(``Algorithm.traced_hyperparameters``: fields used only arithmetically in its math, never for a
shape, a loop bound or a Python branch). For a sweep the agent is built inside the vmapped,
jitted program from a copy of the config whose traced fields are the member's values (tracers), so
one compilation serves every member; every other field is the config's and is shared. Each member
runs what a single ``tj.train(config.replace(**member))`` Anakin run computes, equal up to float
rounding (the single run folds its hyper-parameters into constants): the tests find PPO, PQN, DQN
and SAC members within 1e-5 of their single runs over short runs; over long ones the rounding
differences grow as training amplifies them (SAC: 0.014 in params after 1500 updates).

``stop_at_return`` applies per member: after each chunk every active member is evaluated; one
that reached the threshold stops learning (its later chunks run with no active units, leaving its
state as it was) and the program ends when all have stopped or the budget is spent.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.caches import register

__all__ = ["sweep", "SweepResult", "traced_hyperparameters"]

_PROGRAMS: dict[Any, tuple[Any, Any]] = register({})
"""(compile key, swept names, chunk size) -> the jitted, vmapped (init, chunk): a second sweep of
the same shape compiles nothing."""
_LOCK = threading.Lock()


def traced_hyperparameters(config: Any) -> tuple[str, ...]:
    """The fields of ``config`` its registered algorithm declares traced (sweepable in one program).

    Raises:
        TypeError: ``config`` is not the config of a registered algorithm.
    """
    from tianji_jax.algos.registry import algorithm_for

    return tuple(algorithm_for(config).traced_hyperparameters)


@dataclass
class SweepResult:
    """What :func:`sweep` returns.

    Attributes:
        config: the base config (its traced fields replaced member by member).
        members: one dict per member, in order: the swept fields' values and ``"seed"``.
        curves: column -> ``(M, rows)`` float64 array, one row per chunk (NaN where a member had
            stopped): ``env_steps``, ``episode_return_mean``, ``eval_return_mean``,
            ``eval_return_std`` and the algorithm's loss columns (names of
            :data:`~tianji_jax.run.results.METRIC_COLUMNS`).
        params: the members' final params, stacked on a leading axis ``M``.
        state: the members' final train states, stacked on a leading axis ``M``.
        stopped: ``(M,)`` bool, members that reached ``stop_at_return``.
        wall_s: seconds the sweep took (compilation included).
    """

    config: Any
    members: list[dict[str, Any]]
    curves: dict[str, np.ndarray]
    params: Any
    state: Any
    stopped: np.ndarray
    wall_s: float
    _env_steps_to: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]

    def table(self) -> list[dict[str, Any]]:
        """One dict per member: its values and seed, ``final_eval_return``, ``best_eval_return``,
        ``env_steps`` (trained), ``stopped`` and ``env_steps_to_threshold`` (NaN if not reached
        or no ``stop_at_return``)."""
        rows = []
        for i, member in enumerate(self.members):
            evals = self.curves["eval_return_mean"][i]
            finite = evals[np.isfinite(evals)]
            steps = self.curves["env_steps"][i]
            rows.append({**member,
                         "final_eval_return": float(finite[-1]) if finite.size else math.nan,
                         "best_eval_return": float(finite.max()) if finite.size else math.nan,
                         "env_steps": int(np.nanmax(steps)) if np.isfinite(steps).any() else 0,
                         "stopped": bool(self.stopped[i]),
                         "env_steps_to_threshold": float(self._env_steps_to[i])})
        return rows

    def to_csv(self, path: str | Path) -> Path:
        """Write :meth:`table` to ``path`` (CSV with a header); returns the path."""
        path = Path(path)
        rows = self.table()
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return path

    def to_pandas(self) -> Any:
        """:meth:`table` as a ``pandas.DataFrame`` (needs pandas installed)."""
        import pandas as pd

        return pd.DataFrame(self.table())


def _check(config: Any, grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]) -> tuple[list[str], list[tuple]]:
    """Validate the arguments before anything compiles; returns the swept names and the members."""
    allowed = traced_hyperparameters(config)
    if getattr(config, "runtime", "anakin") != "anakin":
        raise ValueError(f"sweep runs the Anakin runtime only; got runtime={config.runtime!r}. Allowed: runtime='anakin'")
    if getattr(config, "num_learner_devices", 1) > 1:  # the vmapped program is built on one device
        raise ValueError(f"num_learner_devices={config.num_learner_devices}: sweep vmaps its members on one device; "
                         "allowed: num_learner_devices=1 (tj.train runs one config data-parallel)")
    if getattr(config, "recurrent", "none") != "none":
        # Seen with jaxlib 0.10.2 on CPU, 1 or 2 devices, with or without the compilation cache or
        # async dispatch: the vmapped recurrent chunk (64-unit LSTM; a 16-unit one ran) waits forever
        # on an input buffer (no thread runs, no error). Refused until that is understood; tj.train
        # runs it fine.
        raise ValueError(f"sweep does not run recurrent policies yet (recurrent={config.recurrent!r}): its vmapped "
                         f"program stalls in XLA's CPU runtime; train each member with tj.train. Allowed: recurrent='none'")
    if not isinstance(grid, Mapping):
        raise TypeError(f"grid must be a dict of field -> list of values, got {type(grid).__name__}")
    names = list(grid)
    fields = {f.name for f in dataclasses.fields(config)}
    if "seed" in names:
        raise ValueError("grid['seed']: seeds are not a grid field; pass them as sweep(config, grid, seeds=[...])")
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise ValueError(f"grid fields {unknown} are not fields of {type(config).__name__}; "
                         f"allowed: {list(allowed)}")
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"grid fields {bad} cannot be swept in one program (they change shapes or compiled code); "
                         f"allowed for {type(config).__name__}: {list(allowed)}")
    for name in names:
        if not isinstance(grid[name], (list, tuple, np.ndarray)) or len(grid[name]) == 0:
            raise ValueError(f"grid[{name!r}] must be a non-empty list of values, got {grid[name]!r}")
        checked = [getattr(config.replace(**{name: v}), name) for v in grid[name]]  # the config's own check
        _refuse_repeats(f"grid[{name!r}]", checked)
    if seeds is None:
        seeds = [config.seed]
    if not isinstance(seeds, (list, tuple, np.ndarray)) or len(seeds) == 0:
        raise ValueError(f"seeds must be a non-empty list of ints in [0, 2**32), got {seeds!r}")
    seeds = [config.replace(seed=s).seed for s in seeds]  # checked; a whole float becomes an int
    _refuse_repeats("seeds", seeds)
    members = [(*values, seed) for values in itertools.product(*(list(grid[n]) for n in names)) for seed in seeds]
    return names, members


def _refuse_repeats(what: str, values: list) -> None:
    """One line naming the values given more than once (each would train an identical member again)."""
    seen, repeated = set(), []
    for v in values:
        if v in seen and v not in repeated:
            repeated.append(v)
        seen.add(v)
    if repeated:
        raise ValueError(f"{what} gives {repeated} more than once (an identical member, trained twice); "
                         "allowed: distinct values")


def _traced_config(config: Any, values: Mapping[str, jax.Array]) -> Any:
    """A copy of the validated ``config`` whose fields ``values`` hold tracers (not validated again:
    each value was checked by :func:`_check`)."""
    traced = copy.copy(config)
    for name, value in values.items():
        object.__setattr__(traced, name, value)
    return traced


def sweep(config: Any, grid: Mapping[str, Sequence[Any]], seeds: Sequence[int] | None = None, *,
          progress: bool = False) -> SweepResult:
    """Train every member of ``grid`` x ``seeds`` in one compiled, vmapped Anakin program.

    Args:
        config: a validated config of a registered algorithm with ``runtime='anakin'`` (gymnax
            env); its ``total_env_steps``, ``eval_every_env_steps`` (one chunk per row),
            ``eval_episodes`` and ``stop_at_return`` (per member) apply to every member.
        grid: field -> values, every field one of the algorithm's traced hyper-parameters
            (:func:`traced_hyperparameters`); members are the Cartesian product, then seeds.
        seeds: run seeds (distinct); every grid point runs once per seed. None: the config's
            ``seed`` alone.
        progress: print one line per chunk to stderr.

    Returns:
        A :class:`SweepResult` (curves per member, final params and states, a results table).
        Each member computes what its single run computes up to float rounding, which training
        amplifies over long runs (PPO on CartPole: 1e-3 in params after 16k env steps). On a GPU, JAX's
        default float32 matmul precision (TF32) rounds the batched and the unbatched programs
        differently (1.4e-4 in params over a short run on an H200, against 1e-5 on the CPU); set
        ``JAX_DEFAULT_MATMUL_PRECISION=highest`` for the CPU's agreement.

    Raises:
        ValueError: a runtime other than Anakin, a field that is not the config's or cannot be
            traced (the message lists the allowed ones), ``seed`` in the grid, an empty or scalar
            value list, a value or seed given twice, ``num_learner_devices > 1``, a recurrent policy (its vmapped program stalls in XLA's CPU runtime), or a
            value or seed the config refuses (its one-line message).
        TypeError: ``grid`` is not a dict, or ``config`` is not a registered algorithm's.

    Example::

        result = tj.sweep(tj.PPOConfig(total_env_steps=200_000), {"learning_rate": [1e-4, 3e-4, 1e-3]},
                          seeds=[0, 1])          # 6 members, one compilation
        result.to_pandas().groupby("learning_rate").final_eval_return.mean()
    """
    import sys

    from tianji_jax.algos.registry import agent_class_for, algorithm_for
    from tianji_jax.run.host_on_policy import on_policy_row
    from tianji_jax.run.host_replay import replay_row
    from tianji_jax.runtime.anakin import OnPolicyAnakin, ReplayAnakin, compile_key, host_metrics, shared_train

    names, members = _check(config, grid, seeds)
    start = time.perf_counter()
    on_policy = algorithm_for(config).data_path == "on_policy"
    base = compile_key(config)
    runtime_cls = OnPolicyAnakin if on_policy else ReplayAnakin
    agent_cls = agent_class_for(config)
    unit = config.global_batch_size if on_policy else config.iteration_env_steps
    total = config.num_updates if on_policy else config.num_iterations
    chunk_u = config.updates_per_chunk if on_policy else config.iterations_per_chunk
    m_count = len(members)
    hp = {n: jnp.asarray([m[i] for m in members], jnp.float32) for i, n in enumerate(names)}
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray([m[-1] for m in members], jnp.uint32))

    program_key = (base, tuple(names), chunk_u)
    with _LOCK:
        if program_key not in _PROGRAMS:
            def trainer(values: dict) -> Any:
                return runtime_cls(agent_cls(_traced_config(base, values)), chunk_u)

            _PROGRAMS[program_key] = (
                jax.jit(jax.vmap(lambda values, key: trainer(values)._init(key))),
                jax.jit(jax.vmap(lambda values, state, active: trainer(values)._chunk(state, active)),
                        donate_argnums=(1,) if not on_policy else ()))
        init, chunk = _PROGRAMS[program_key]
    single = shared_train(config)  # the members' evaluator (the policy's form does not depend on traced fields)
    if on_policy:
        from tianji_jax.run.host_on_policy import on_policy_evaluator

        evaluate = on_policy_evaluator(config, single, config.eval_episodes) if config.eval_episodes else None
    else:
        from tianji_jax.run.host_replay import replay_evaluator

        evaluate = replay_evaluator(config, config.eval_episodes) if config.eval_episodes else None
    batched_eval = None
    if evaluate is not None:
        with _LOCK:
            eval_key = ("eval", base, config.eval_episodes)
            if eval_key not in _PROGRAMS:
                _PROGRAMS[eval_key] = jax.jit(jax.vmap(evaluate))
            batched_eval = _PROGRAMS[eval_key]
    # the single run's evaluation keys: fold_in(PRNGKey(seed ^ 0x5EED), row index)
    eval_base = jax.vmap(jax.random.PRNGKey)(jnp.asarray([m[-1] ^ 0x5EED for m in members], jnp.uint32))

    state = init(hp, keys)
    done, stopped = 0, np.zeros(m_count, bool)
    steps_to = np.full(m_count, np.nan)
    rows: list[list[dict[str, float] | None]] = []
    while done < total and not stopped.all():
        k = min(chunk_u, total - done)
        active = np.where(stopped, 0, k).astype(np.int32)
        t0 = time.perf_counter()
        state, metrics = chunk(hp, state, active)
        m = host_metrics(metrics)
        done += k
        sps = k * unit * int((~stopped).sum()) / (time.perf_counter() - t0)
        evals = None
        if batched_eval is not None:
            row_keys = jax.vmap(jax.random.fold_in)(eval_base, jnp.full((m_count,), len(rows), jnp.uint32))
            returns, _lengths = jax.device_get(batched_eval(state.params, getattr(state, "obs_rms", None), row_keys))
            evals = np.asarray(returns, np.float64)
        chunk_rows: list[dict[str, float] | None] = []
        for i in range(m_count):
            if stopped[i]:
                chunk_rows.append(None)
                continue
            mi = {name: v[i][:k] for name, v in m.items()}
            row = on_policy_row(config, mi, done, sps) if on_policy else replay_row(config, mi, sps)
            if evals is not None:
                row["eval_return_mean"], row["eval_return_std"] = float(evals[i].mean()), float(evals[i].std())
                if config.stop_at_return is not None and row["eval_return_mean"] >= config.stop_at_return:
                    stopped[i] = True
                    steps_to[i] = done * unit
            chunk_rows.append(row)
        rows.append(chunk_rows)
        if progress:
            best = float(np.nanmax(evals.mean(axis=1))) if evals is not None else math.nan  # the best member's mean
            print(f"tianji_jax.sweep: {done * unit} env steps per member, {m_count} member{'s' * (m_count != 1)} "
                  f"({int(stopped.sum())} stopped), best eval {best:.2f}", file=sys.stderr, flush=True)
    columns = sorted({c for chunk_rows in rows for r in chunk_rows if r for c in r})
    curves = {c: np.asarray([[(r or {}).get(c, math.nan) for r in chunk_rows] for chunk_rows in rows],
                            np.float64).T for c in columns}
    result_members = [{**{n: m[i] for i, n in enumerate(names)}, "seed": int(m[-1])} for m in members]  # as given
    return SweepResult(config=config, members=result_members, curves=curves, params=state.params, state=state,
                       stopped=stopped, wall_s=time.perf_counter() - start, _env_steps_to=steps_to)
