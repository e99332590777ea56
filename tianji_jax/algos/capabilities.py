"""The capability table: which (algorithm, runtime, actor backend, learner layout, env backend)
cells tianji_jax supports, and for every other cell the reason, which the config error repeats.

Dimensions of a cell (:class:`Cell`):

* ``algo``: ``"ppo"``, ``"pqn"`` (on-policy data path), ``"dqn"`` or ``"sac"`` (replay data path);
* ``runtime``: ``"anakin"`` (act, env step and learn fused in one compiled program on one device,
  or data-parallel over ``num_learner_devices`` devices of one process)
  or ``"async"`` (the TianJi runtime: actors and learners run concurrently);
* ``actors``: ``"threads"`` (actor threads in the learner's process) or ``"ray"`` (remote actor
  processes on Ray Core); Anakin has no separate actors and is listed under ``"threads"``;
* ``layout`` of the learners: ``"single"`` (one device), ``"data_parallel"``
  (``num_learner_devices > 1``), ``"groups"`` (``num_learner_groups > 1``) or ``"multi_host"``
  (``num_processes > 1``, ``jax.distributed``);
* ``env``: ``"gymnax"`` (on the device: gymnax, the JAX suites craftax, jumanji, xminigrid, and brax),
  ``"envpool"`` or ``"gymnasium"`` (on the host).

Rules are checked in order; the first that matches a cell gives its reason. A cell no rule
matches is supported. :func:`table` enumerates every cell, :func:`markdown` renders it (the
docs/concepts/capabilities.md is this output), :func:`check` is what the configs call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ALGOS", "RUNTIMES", "ACTORS", "LAYOUTS", "ENVS", "Cell", "RULES", "FIELD_REASONS", "reason", "table",
           "markdown", "field_reason", "cell_of", "check", "UnsupportedCell", "SCHEDULE_LOG_RULES", "check_schedule_log",
           "MULTI_DISCRETE_ALGOS", "MULTI_DISCRETE_REASONS",
           "MULTI_DISCRETE_REFUSED", "check_action_space"]

ALGOS = ("ppo", "pqn", "dqn", "sac")
DATA_PATH = {"ppo": "on_policy", "pqn": "on_policy", "dqn": "replay", "sac": "replay"}
"""Each built-in algorithm's data path: rules about a data path apply to every algorithm on it
(an algorithm registered by another package is checked as its data path's)."""
RUNTIMES = ("anakin", "async")
ACTORS = ("threads", "ray")
LAYOUTS = ("single", "data_parallel", "groups", "multi_host")
ENVS = ("gymnax", "envpool", "gymnasium")

_LAYOUT_FIELD = {"data_parallel": "num_learner_devices", "groups": "num_learner_groups", "multi_host": "num_processes"}
"""The config field that selects each learner layout other than ``single``."""


@dataclass(frozen=True)
class Cell:
    """One combination of the five dimensions (see the module docstring)."""

    algo: str
    runtime: str
    actors: str
    layout: str
    env: str


@dataclass(frozen=True)
class _Rule:
    """``when(cell)`` true -> the cell is unsupported for ``reason`` (the table's text); the config
    error names ``field`` (``"layout"``: the field that selects the cell's learner layout) and says
    ``message`` (a format string over ``field``, ``value``, ``env``, ``backend``; default: the field,
    its value and the reason)."""

    when: Callable[[Cell], bool]
    field: str
    reason: str
    message: str = "{field}={value!r} is not supported for this cell: {reason}"


_HOST = ("envpool", "gymnasium")

RULES: tuple[_Rule, ...] = (
    # meaningless cells: what Anakin is rules them out
    _Rule(lambda c: c.runtime == "anakin" and c.env in _HOST, "runtime",
          "Anakin's compiled program holds the env state as values (vmapped over seeds, checkpointed); host envs keep theirs in place (gymnasium in Python, envpool in C++, whose XLA step only host actors' compiled blocks use)",
          "runtime={value!r}: env {env!r} runs on the host ({backend}), which only the async runtime drives; "
          "allowed: runtime='async' (Anakin needs gymnax)"),
    _Rule(lambda c: c.runtime == "anakin" and c.actors == "ray", "actor_backend",
          "Anakin has no separate actors (acting is fused with learning)",
          "actor_backend='ray' needs runtime='async' (Anakin has no separate actors: acting is fused with learning)"),
    _Rule(lambda c: c.runtime == "anakin" and c.layout not in ("single", "data_parallel"), "layout",
          "Anakin runs one learner in one process (data-parallel over that process's devices)",
          "{field}={value} needs runtime='async' (Anakin runs one learner in one process, data-parallel over "
          "num_learner_devices of its devices); got runtime='anakin'"),
    # not built yet
    _Rule(lambda c: c.actors == "ray" and c.layout == "multi_host", "actor_backend",
          "Ray actors feed one learner process; several learner processes with Ray actors are not built yet",
          "actor_backend='ray' is not supported with {layout_field}={layout_value} yet (Ray actors feed one "
          "learner process); allowed: actor_backend='threads'"),
)
"""The rules, in order (first match wins)."""


_NO_SEQUENCE_REPLAY = ("the replay data path stores and samples single transitions; a recurrent core needs "
                       "sequence replay (stored states and burn-in, as R2D2), which is not built yet; recurrent "
                       "policies: ppo, pqn")
FIELD_REASONS: dict[tuple[str, str], str] = {
    ("dqn", "recurrent"): _NO_SEQUENCE_REPLAY,
    ("sac", "recurrent"): _NO_SEQUENCE_REPLAY,
    ("dqn", "rnn_hidden_size"): _NO_SEQUENCE_REPLAY,
    ("sac", "rnn_hidden_size"): _NO_SEQUENCE_REPLAY,
    ("dqn", "burn_in_steps"): _NO_SEQUENCE_REPLAY,
    ("sac", "burn_in_steps"): _NO_SEQUENCE_REPLAY,
    ("pqn", "burn_in_steps"): ("burn-in is built into PPO's recurrent loss only; PQN's recurrent learner re-runs "
                               "whole columns without it"),
}
"""Network and loss options that some algorithms take and others do not, with the reason for the
others (``(algo, field) -> reason``); ``tianji train`` repeats it for such a flag."""


_NO_SCHEDULE_LOG = ("the replay data path samples replay in an order no schedule of rollouts fixes (the sampling "
                    "keys follow the learner's blocks, which the rate limiter times); schedules: ppo, pqn")
FIELD_REASONS.update({(a, f): _NO_SCHEDULE_LOG for a in ("dqn", "sac") for f in ("record_schedule", "replay_schedule")})

SCHEDULE_LOG_RULES: tuple[tuple[Callable[[Cell, Any], bool], str], ...] = (
    (lambda c, cfg: cfg.schedule not in ("relaxed", "auto"),
     "schedules 'sync' and 'one_step' are deterministic already (one actor, a fixed hand-off); a schedule "
     "records what 'relaxed' (and 'auto') leave to thread timing"),
    (lambda c, cfg: c.layout == "groups",
     "learner groups average their params in the order the groups arrive, which a schedule of rollouts does not fix"),
    (lambda c, cfg: c.layout == "multi_host",
     "several processes' learners each consume their own actors' rollouts; recording them is not built"),
    (lambda c, cfg: c.actors == "ray",
     "Ray actor processes are not driven by the runner's actor threads, which replay the recorded versions"),
    (lambda c, cfg: c.env == "envpool" and cfg.env_batch_size not in (None, cfg.num_envs),
     "envpool's async mode (env_batch_size < num_envs) steps whichever envs finished first, a timing-dependent order"),
    (lambda c, cfg: c.env != "gymnax" and (cfg.normalize_observations or cfg.scale_rewards),
     "host actors' running statistics (observation normalisation, reward scaling) are merged at each "
     "publication from what every actor had seen by then, a timing-dependent amount"),
)
"""Where ``record_schedule`` / ``replay_schedule`` apply (async runtime, on-policy algorithms):
``(when(cell, config), reason)``; the first that matches refuses the config."""


def check_schedule_log(config: Any, env_backend: str) -> None:
    """Refuse ``record_schedule`` / ``replay_schedule`` where a schedule cannot fix the run
    (:data:`SCHEDULE_LOG_RULES`), both at once, or a ``replay_schedule`` file that is not a schedule
    or was recorded with another actor count or rollout size; nothing to do when neither is set.

    Raises:
        ValueError: one line naming the field and the reason (or the file's problem).
    """
    record, replay = getattr(config, "record_schedule", False), getattr(config, "replay_schedule", None)
    if not record and replay is None:
        return
    field = "record_schedule" if record else "replay_schedule"
    if record and replay is not None:
        raise ValueError(f"record_schedule=True and replay_schedule={replay!r}: choose one (a replayed run's "
                         "schedule is the file it replays)")
    cell = cell_of(config.ALGO, config, env_backend)
    for when, why in SCHEDULE_LOG_RULES:
        if when(cell, config):
            raise ValueError(f"{field}={getattr(config, field)!r} is not supported here: {why}; allowed: schedule "
                             "'relaxed' or 'auto' with one learner group, one process, actor threads, gymnax or "
                             "envpool sync mode, and no host statistics (or leave it unset)")
    if replay is None:
        return
    if not isinstance(replay, str) or not replay:
        raise ValueError(f"replay_schedule must be the path of a schedule.jsonl or None, got {replay!r}")
    from tianji_jax.buffers.schedule_file import load_schedule

    try:
        schedule = load_schedule(replay)
    except OSError as exc:
        raise ValueError(f"replay_schedule={replay!r}: cannot read it ({exc.strerror or exc})") from None
    for name, recorded, here in (("num_actors", schedule.num_actors, config.num_actors),
                                 ("num_envs * num_steps", schedule.item_steps, config.batch_size)):
        if recorded != here:
            raise ValueError(f"replay_schedule={replay!r} was recorded with {name}={recorded}; this config has "
                             f"{name}={here} (replay it with the config it was recorded with)")
    _check_replayed_config(replay, schedule, config)


_REPLAY_FREE_FIELDS = frozenset({"stop_at_return", "stall_timeout_s", "max_nonfinite_updates", "record_schedule",
                                 "replay_schedule"})
"""Fields a replay may set otherwise than its recording (they do not change what is computed)."""


def _replayed_value(field: str, value: Any) -> Any:
    """What a config value computes under a replay: ``schedule='auto'`` is ``relaxed`` with a
    controller of its admission knobs, and a replay runs no knob (the recorded interleaving is the
    schedule), so the two replay each other's recordings; every other value stands for itself."""
    return "relaxed" if field == "schedule" and value == "auto" else value


def _check_replayed_config(replay: str, schedule: Any, config: Any) -> None:
    """A replay must compute what its recording computed: the same config (but
    :data:`_REPLAY_FREE_FIELDS`), the same lag bound in force (``max_policy_lag``, or the schedule's
    default when unset: 'auto' defaults to 4 and 'relaxed' to 2, so an 'auto' recording replays
    under 'relaxed' with ``max_policy_lag=4``) which the schedule keeps, and no updates past the
    schedule's end except after an early stop at a metrics row."""
    if schedule.config is not None:
        import json

        mine = json.loads(json.dumps(config.to_dict(), default=str))  # as the header holds it
        diffs = [f"{k}: recorded {schedule.config.get(k, '<absent>')!r}, given {mine.get(k, '<absent>')!r}"
                 for k in sorted(set(mine) | set(schedule.config))
                 if k not in _REPLAY_FREE_FIELDS and k != "max_policy_lag"  # compared as the bound in force, below
                 and _replayed_value(k, schedule.config.get(k, "<absent>")) != _replayed_value(k, mine.get(k, "<absent>"))]
        if diffs:
            raise ValueError(f"replay_schedule={replay!r} was recorded with another config: " + "; ".join(diffs)
                             + " (replay it with the recorded config, in the file's header; fields that may "
                             f"differ: {sorted(_REPLAY_FREE_FIELDS)}, and schedule between 'auto' and 'relaxed')")
    if schedule.max_policy_lag != config.policy_lag_bound:  # None stands for the schedule's default bound
        raise ValueError(f"replay_schedule={replay!r} was recorded under the lag bound max_policy_lag="
                         f"{schedule.max_policy_lag}; this config's bound is {config.policy_lag_bound} (schedule="
                         f"{config.schedule!r}, max_policy_lag={config.max_policy_lag}); allowed: max_policy_lag="
                         f"{schedule.max_policy_lag}")
    if schedule.max_lag > config.policy_lag_bound:
        raise ValueError(f"replay_schedule={replay!r} consumes rollouts of lag {schedule.max_lag}, above this config's "
                         f"max_policy_lag={config.policy_lag_bound}; allowed: max_policy_lag >= {schedule.max_lag}")
    held, runs, chunk = len(schedule.consumed), config.updates_per_group, config.updates_per_chunk
    if held < runs and (held % chunk or config.stop_at_return is None):
        raise ValueError(f"replay_schedule={replay!r} holds {held} updates; this config runs {runs} (metrics rows every "
                         f"{chunk}): its recording was cut short, and a replay cannot go past its end (allowed: a "
                         "schedule of a run that finished, or stopped early at a row with stop_at_return)")


MULTI_DISCRETE_ALGOS = ("ppo",)
"""The algorithms that take a MultiDiscrete action space (PPO's factored categorical policy)."""

_NO_FACTORED_Q = ("learns one Q-value per action of a Discrete space; a factored action would need a Q-value "
                  "for each of the prod(nvec) joint actions or a decomposition over the factors (action "
                  "branching), which is not built")
MULTI_DISCRETE_REASONS: dict[str, str] = {
    "pqn": "PQN " + _NO_FACTORED_Q,
    "dqn": "the DQN family (DQN, C51, QR-DQN) " + _NO_FACTORED_Q,
    "sac": "SAC's actor is a squashed Gaussian over a Box action space",
}
"""Why each algorithm outside :data:`MULTI_DISCRETE_ALGOS` refuses a MultiDiscrete env (others:
only PPO has a factored categorical policy)."""

MULTI_DISCRETE_REFUSED: tuple[tuple[str, str], ...] = (
    ("host backends (`envpool:`, `gymnasium:`)", "their resolver reads Discrete and Box action spaces only; a "
     "gymnasium MultiDiscrete env is refused when the env is resolved (MultiDiscrete: the device suites)"),
    ("`|clip_action`", "it clips a Box action; a MultiDiscrete env is refused when the wrapper is applied"),
    ("`actor_backend='ray'`", "Ray actor processes step every env through the host env API (a device env "
     "through GymnaxHostVecEnv), which takes Discrete and Box actions; MultiDiscrete envs run on actor threads"),
    ("an action mask", "a joint mask over the factors cannot be split into per-factor masks: a Jumanji task with "
     "one (Minesweeper-v0, Tetris-v0) is flattened to Discrete(prod(nvec)), mask included, and runs as Discrete"),
)
"""What else cannot take a MultiDiscrete action space: ``(what, reason)`` (refused where it is built)."""


def check_action_space(algo: str, config: Any, spec: Any) -> None:
    """Refuse a MultiDiscrete env (``spec.action_kind == "multi_discrete"``) for an algorithm outside
    :data:`MULTI_DISCRETE_ALGOS`, before anything is built; nothing to do for other action spaces.

    Raises:
        ValueError: one line naming the field ``env``, the space, the reason
            (:data:`MULTI_DISCRETE_REASONS`) and what is allowed.
    """
    if spec.action_kind != "multi_discrete" or algo in MULTI_DISCRETE_ALGOS:
        return
    why = MULTI_DISCRETE_REASONS.get(algo, "only PPO has a factored categorical policy")
    raise ValueError(f"env={config.env!r} has a {spec.action_space!r} action space, which algo {algo!r} does not "
                     f"take: {why}; allowed: algo 'ppo' (a factored categorical policy) or a Discrete env (Jumanji "
                     "tasks with a joint action mask, Minesweeper-v0 and Tetris-v0, are Discrete)")


def field_reason(algo: str, field: str) -> str | None:
    """Why ``algo`` does not take the config field ``field`` that another algorithm takes, or None."""
    return FIELD_REASONS.get((algo, field))


def reason(cell: Cell) -> str | None:
    """Why ``cell`` is not supported, or None when it is."""
    for rule in RULES:
        if rule.when(cell):
            return rule.reason
    return None


def table() -> list[tuple[Cell, str | None]]:
    """Every cell with its reason (None: supported), in the order of the dimension tuples."""
    return [(cell, reason(cell)) for cell in itertools.starmap(Cell, itertools.product(
        ALGOS, RUNTIMES, ACTORS, LAYOUTS, ENVS))]


def markdown() -> str:
    """The table as markdown: one line per (algo, runtime, actors, layout) with a column per env
    backend: ``yes`` or the reason's number, reasons listed below."""
    reasons: list[str] = []
    lines = ["| algo | runtime | actors | learners | " + " | ".join(ENVS) + " |",
             "|---|---|---|---|" + "---|" * len(ENVS)]
    for algo, runtime, actors, layout in itertools.product(ALGOS, RUNTIMES, ACTORS, LAYOUTS):
        cells = []
        for env in ENVS:
            why = reason(Cell(algo, runtime, actors, layout, env))
            if why is None:
                cells.append("yes")
            else:
                if why not in reasons:
                    reasons.append(why)
                cells.append(f"no ({reasons.index(why) + 1})")
        lines.append(f"| {algo} | {runtime} | {actors} | {layout} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{i + 1}. {r}" for i, r in enumerate(reasons)]
    lines += ["", "Options some algorithms do not take (`tianji train` names the reason):", ""]
    by_reason: dict[str, tuple[list[str], list[str]]] = {}  # reason -> (fields, algorithms)
    for (algo, field), why in FIELD_REASONS.items():
        fields, algos = by_reason.setdefault(why, ([], []))
        fields += [field] if field not in fields else []
        algos += [algo] if algo not in algos else []
    lines += [f"- {', '.join(f'`{f}`' for f in fields)}: not {', '.join(algos)}: {why}"
              for why, (fields, algos) in by_reason.items()]
    lines += ["", "MultiDiscrete action spaces (`jumanji:RubiksCube-v0`): "
              + ", ".join(MULTI_DISCRETE_ALGOS) + " only (a factored categorical policy); refused:", ""]
    lines += [f"- {algo}: {why}" for algo, why in MULTI_DISCRETE_REASONS.items()]
    lines += [f"- {what}: {why}" for what, why in MULTI_DISCRETE_REFUSED]
    lines += ["", "`record_schedule` / `replay_schedule` (async, on-policy) are refused where:", ""]
    lines += [f"- {why}" for _, why in SCHEDULE_LOG_RULES]
    return "\n".join(lines) + "\n"


def cell_of(algo: str, config: Any, env_backend: str) -> Cell:
    """The cell a config asks for (fields an algorithm's config lacks take their single value)."""
    layout = "single"
    if getattr(config, "num_learner_groups", 1) > 1:
        layout = "groups"
    elif getattr(config, "num_processes", 1) > 1:
        layout = "multi_host"
    elif getattr(config, "num_learner_devices", 1) > 1:
        layout = "data_parallel"
    env = env_backend if env_backend in _HOST else "gymnax"  # every device env runs as gymnax's do
    return Cell(algo, config.runtime, getattr(config, "actor_backend", "threads"), layout, env)


class UnsupportedCell(ValueError):
    """A config asking for a cell the table does not support (raised by :func:`check`).

    Attributes:
        cell: the :class:`Cell` asked for.
        field: the config field the message names.
    """

    def __init__(self, message: str, cell: Cell, field: str):
        super().__init__(message)
        self.cell, self.field = cell, field


def check(algo: str, config: Any, env_backend: str) -> None:
    """Refuse a config whose cell is not supported, in one line naming the field and the reason.

    Args:
        algo: the registered algorithm name (``"ppo"``, ``"pqn"``, ``"dqn"``).
        config: its validated-so-far config (``runtime``, ``env`` and the layout fields it has).
        env_backend: the resolved env's backend (``"gymnax"``, ``"envpool"``, ``"gymnasium"``).

    Raises:
        UnsupportedCell: a ``ValueError``, e.g. ``"runtime='anakin': env 'envpool:CartPole-v1' runs on the host
            (envpool), which only the async runtime drives; allowed: runtime='async' (Anakin needs
            gymnax)"``.
    """
    cell = cell_of(algo, config, env_backend)
    for rule in RULES:
        if rule.when(cell):
            layout_field = _LAYOUT_FIELD.get(cell.layout, "num_learner_devices")
            field = layout_field if rule.field == "layout" else rule.field
            raise UnsupportedCell(rule.message.format(
                field=field, value=getattr(config, field), env=config.env, backend=env_backend, reason=rule.reason,
                layout_field=layout_field, layout_value=getattr(config, layout_field, 1)), cell, field)
