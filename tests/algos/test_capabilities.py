"""The capability table: its docs page (docs/concepts/capabilities.md) shows it as generated, every
unsupported cell a config can express is refused with the table's reason, and every supported cell
runs a few updates (in this process, or for multi-host and Ray cells in the tests named by
``_ELSEWHERE``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.algos import capabilities
from tianji_jax.algos.capabilities import Cell

ROOT = Path(__file__).resolve().parents[2]
_ENV_ID = {"gymnax": "gymnax:CartPole-v1", "envpool": "envpool:CartPole-v1", "gymnasium": "gymnasium:CartPole-v1"}
_CONTINUOUS = ("sac",)  # algorithms on Box actions: Pendulum-v1 on every backend
_LAYOUT = {"single": {}, "data_parallel": {"num_learner_devices": 2, "num_envs": 4},
           "groups": {"num_learner_groups": 2, "num_actors": 2}, "multi_host": {"num_processes": 2, "coordinator": "h:1"}}
_ELSEWHERE = {  # supported cells that need other processes: the test that runs them
    ("ppo", "async", "threads", "multi_host", "gymnax"): "tests/runtime/test_distributed.py::test_two_process_sync_run_resumes_bit_exactly_from_its_consistent_cut",
    ("ppo", "async", "threads", "multi_host", "envpool"): "tests/runtime/test_distributed.py::test_two_processes_on_host_envs_keep_identical_replicas",
    ("ppo", "async", "threads", "multi_host", "gymnasium"): "tests/runtime/test_distributed.py::test_two_processes_on_host_envs_keep_identical_replicas",
    ("ppo", "async", "ray", "single", "envpool"): "tests/runtime/test_ray_actors.py::test_two_remote_actors_solve_cartpole",
    **{("ppo", "async", "ray", layout, env): "tests/runtime/test_ray_actors.py::test_ray_cells_of_the_capability_table_run"
       for layout, env in (("single", "gymnasium"), ("data_parallel", "envpool"), ("data_parallel", "gymnasium"),
                           ("groups", "envpool"), ("groups", "gymnasium"))},
    **{("pqn", "async", "threads", "multi_host", env): "tests/runtime/test_distributed.py::test_two_pqn_processes_keep_identical_replicas"
       for env in ("gymnax", "envpool", "gymnasium")},
    **{("pqn", "async", "ray", layout, env): "tests/runtime/test_ray_actors.py::test_pqn_ray_cells_of_the_capability_table_run"
       for layout in ("single", "data_parallel", "groups") for env in ("envpool", "gymnasium")},
    **{(algo, "async", "threads", "multi_host", env): "tests/runtime/test_distributed.py::test_two_replay_processes_keep_identical_replicas"
       for algo in ("dqn", "sac") for env in ("gymnax", "envpool", "gymnasium")},
    ("dqn", "async", "ray", "single", "envpool"): "tests/runtime/test_ray_actors.py::test_dqn_with_two_remote_actors_solves_cartpole",
    **{("sac", "async", "ray", layout, env): "tests/runtime/test_ray_actors.py::test_sac_ray_cells_of_the_capability_table_run"
       for layout in ("single", "data_parallel", "groups") for env in ("envpool", "gymnasium")},
    **{("dqn", "async", "ray", layout, env): "tests/runtime/test_ray_actors.py::test_dqn_ray_cells_of_the_capability_table_run"
       for layout, env in (("single", "gymnasium"), ("data_parallel", "envpool"), ("data_parallel", "gymnasium"),
                           ("groups", "envpool"), ("groups", "gymnasium"))},
    **{(algo, "async", "ray", layout, "gymnax"): "tests/runtime/test_ray_actors.py::test_device_env_cells_on_ray_actors_run"
       for algo in ("ppo", "pqn", "dqn", "sac") for layout in ("single", "data_parallel", "groups")},
}


_CONFIG = {"ppo": tj.PPOConfig, "pqn": tj.PQNConfig, "dqn": tj.DQNConfig, "sac": tj.SACConfig}
_ON_POLICY = ("ppo", "pqn")


def _kwargs(cell: Cell) -> dict:
    env = _ENV_ID[cell.env].replace("CartPole", "Pendulum") if cell.algo in _CONTINUOUS else _ENV_ID[cell.env]
    kw = dict(env=env, runtime=cell.runtime, seed=0)
    if cell.algo in _ON_POLICY:
        kw.update(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1)
        if cell.actors != "threads":
            kw["actor_backend"] = cell.actors
        kw.update(_LAYOUT[cell.layout])
    else:
        kw.update(num_envs=4, num_steps=4, learning_starts=64, buffer_capacity=512, batch_size=16, replay_ratio=0.25)
        if cell.algo in _CONTINUOUS:
            kw["hidden_sizes"] = (32, 32)
        if cell.actors != "threads":
            kw["actor_backend"] = cell.actors
        if cell.layout == "data_parallel":
            kw["num_learner_devices"] = 2
        if cell.layout == "groups":
            kw.update(num_learner_groups=2, num_actors=2)
        if cell.layout == "multi_host":
            kw.update(_LAYOUT["multi_host"])
    return kw


def _expressible(cell: Cell) -> bool:
    """Cells a config can ask for (every cell since the replay configs have multi-host fields)."""
    return True


def test_docs_page_shows_the_generated_table():
    assert capabilities.markdown() in (ROOT / "docs" / "concepts" / "capabilities.md").read_text()


@pytest.mark.parametrize("cell", [c for c, why in capabilities.table() if why is not None and _expressible(c)],
                         ids=lambda c: "-".join(vars(c).values()))
def test_unsupported_cells_are_refused_with_the_tables_reason(cell):
    config_cls = _CONFIG[cell.algo]
    with pytest.raises(ValueError) as info:
        config_cls(**_kwargs(cell))
    rule = next(r for r in capabilities.RULES if r.when(cell))
    message = str(info.value)
    assert "\n" not in message
    field = {"layout": capabilities._LAYOUT_FIELD.get(cell.layout), "runtime": "runtime",
             "actor_backend": "actor_backend"}[rule.field]
    assert message.startswith(f"{field}=") or f"{field}=" in message.split(":")[0], message


_IN_PROCESS = [c for c, why in capabilities.table() if why is None and c.layout != "multi_host" and c.actors != "ray"]


@pytest.mark.slow
@pytest.mark.parametrize("cell", _IN_PROCESS, ids=lambda c: "-".join(vars(c).values()))
def test_supported_cell_runs_a_few_updates(cell):
    """Budget: 3-15 s per cell (compilation of a tiny network dominates)."""
    config_cls = _CONFIG[cell.algo]
    kw = _kwargs(cell)
    on_policy = cell.algo in _ON_POLICY
    per_update = kw["num_envs"] * kw["num_steps"] * kw.get("num_actors", 1) if on_policy else 4 * 4
    total = per_update * 4 if on_policy else 256
    config = config_cls(**kw, total_env_steps=total, eval_every_env_steps=total // 2, eval_episodes=1)
    result = tj.train(config, progress=False)
    assert result.curve["env_steps"][-1] >= total // 2
    assert np.all(np.isfinite(result.curve["eval_return_mean"]))
    assert math.isfinite(float(result.curve["episode_return_mean"][-1])) or not on_policy


def test_every_supported_cell_is_run_somewhere():
    supported = {tuple(vars(c).values()) for c, why in capabilities.table() if why is None}
    in_process = {tuple(vars(c).values()) for c in _IN_PROCESS}
    missing = supported - in_process - set(_ELSEWHERE)
    assert not missing, f"supported cells no test runs: {sorted(missing)}"
    for node in _ELSEWHERE.values():
        path, name = node.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), node
