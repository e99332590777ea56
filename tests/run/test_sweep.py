"""``tj.sweep``: a grid of traced hyper-parameters x seeds in one compiled, vmapped Anakin program,
for every registered algorithm (the generic runtimes): each member equals the single run of its
config, a repeated sweep compiles nothing and is bit-identical, bad grids are refused in one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tianji_jax as tj

PPO = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 5,
           eval_every_env_steps=256, eval_episodes=2, seed=0)  # 5 updates: chunks of 2, 2 and 1
REPLAY = dict(num_envs=4, num_steps=2, learning_starts=64, buffer_capacity=512, batch_size=16, replay_ratio=0.25,
              total_env_steps=320, eval_every_env_steps=128, eval_episodes=2, seed=0)


def _max_diff(stacked, index, single) -> float:
    leaves = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a[index], np.float64)
                                                                           - np.asarray(b, np.float64)))),
                                          stacked, single))
    return max(leaves)


def test_ppo_members_equal_single_runs_and_a_second_sweep_compiles_nothing(compile_counter):
    config = tj.PPOConfig(**PPO)
    result = tj.sweep(config, {"learning_rate": [1e-3, 3e-4], "ent_coef": [0.0, 0.01]}, seeds=[0, 1])
    assert len(result.members) == 8 and result.members[5] == {"learning_rate": pytest.approx(3e-4), "ent_coef": 0.0,
                                                             "seed": 1}
    single = tj.train(config.replace(learning_rate=3e-4, ent_coef=0.0, seed=1), progress=False)
    assert _max_diff(result.params, 5, single.params) < 1e-5
    np.testing.assert_array_equal(result.curves["eval_return_mean"][5], single.curve["eval_return_mean"])
    np.testing.assert_array_equal(result.curves["env_steps"][5], single.curve["env_steps"])
    compile_counter.reset()
    again = tj.sweep(config, {"learning_rate": [1e-3, 3e-4], "ent_coef": [0.0, 0.01]}, seeds=[0, 1])
    assert compile_counter.count == 0
    for x, y in zip(jax.tree.leaves(result.params), jax.tree.leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    table = result.table()
    assert [r["seed"] for r in table] == [0, 1] * 4 and all(np.isfinite(r["final_eval_return"]) for r in table)
    assert {"learning_rate", "ent_coef", "seed", "final_eval_return", "best_eval_return", "env_steps"} <= set(table[0])


@pytest.mark.parametrize("cls, kwargs, grid", [
    ("PQNConfig", dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=4 * 16 * 3,
                       eval_every_env_steps=128, eval_episodes=1, seed=0), {"q_lambda": [0.5, 0.9]}),
    ("DQNConfig", REPLAY, {"learning_rate": [1e-3, 1e-4], "gamma": [0.9]}),
    ("SACConfig", {**REPLAY, "env": "gymnax:Pendulum-v1", "hidden_sizes": (32, 32)}, {"tau": [0.01, 0.05]}),
], ids=["pqn", "dqn", "sac"])
def test_other_algorithms_sweep_through_the_same_program(cls, kwargs, grid):
    config = getattr(tj, cls)(**kwargs)
    result = tj.sweep(config, grid, seeds=[3])
    name = next(iter(grid))
    last = len(result.members) - 1 if name != "learning_rate" else 1
    values = {k: v for k, v in result.members[last].items() if k != "seed"}
    single = tj.train(config.replace(**values, seed=3), progress=False)
    assert _max_diff(result.params, last, single.params) < 1e-5
    np.testing.assert_array_equal(result.curves["env_steps"][last], single.curve["env_steps"])


def test_stop_at_return_stops_members_one_by_one():
    """Each member stops at its own first evaluation >= the threshold (no rows after it, its state
    frozen: equal to the single run that stopped there); the others run the whole budget."""
    budget = 4 * 32 * 8
    config = tj.PPOConfig(**{**PPO, "total_env_steps": budget, "eval_every_env_steps": 128, "stop_at_return": 70.0})
    result = tj.sweep(config, {"learning_rate": [1e-2, 1e-6]}, seeds=[0])
    early = 0
    for i, row in enumerate(result.table()):
        evals, steps = result.curves["eval_return_mean"][i], result.curves["env_steps"][i]
        reached = np.flatnonzero(evals >= 70.0)
        assert row["stopped"] == bool(reached.size)
        if reached.size:
            first = int(reached[0])
            assert row["env_steps_to_threshold"] == steps[first] == row["env_steps"]
            assert np.all(np.isnan(steps[first + 1:]))
            early += steps[first] < budget
            single = tj.train(config.replace(learning_rate=result.members[i]["learning_rate"]), progress=False)
            assert single.stopped_early and single.curve["env_steps"][-1] == steps[first]
            assert _max_diff(result.params, i, single.params) < 1e-5
        else:
            assert row["env_steps"] == budget and np.isnan(row["env_steps_to_threshold"])
    assert early >= 1  # seed 0: lr 1e-6 keeps the initial policy's 76.5 and stops after the first chunk


@pytest.mark.parametrize("grid, seeds, match", [
    ({"num_envs": [4, 8]}, [0], r"grid fields \['num_envs'\] cannot be swept in one program .* allowed for PPOConfig: "
                                r"\['learning_rate'"),
    ({"gamma": [0.9, 1.5]}, [0], r"gamma must be in \[0.0, 1.0\], got 1.5"),
    ({"gamma": []}, [0], r"grid\['gamma'\] must be a non-empty list"),
    ({"gamma": [0.9]}, [], r"seeds must be a non-empty list"),
    ({"gamma": [0.9]}, [-1], r"seed must be >= 0"),
    ({"gamma": [0.9, 0.99, 0.9]}, [0], r"grid\['gamma'\] gives \[0.9\] more than once \(an identical member"),
    ({"gamma": [0.9]}, [1, 2, 1], r"seeds gives \[1\] more than once"),
])
def test_bad_grids_are_refused_in_one_line_before_compiling(grid, seeds, match, compile_counter):
    config = tj.PPOConfig(**PPO)
    compile_counter.reset()
    with pytest.raises(ValueError, match=match) as info:
        tj.sweep(config, grid, seeds=seeds)
    assert "\n" not in str(info.value) and compile_counter.count == 0


def test_without_seeds_the_config_seed_is_the_one_member_seed():
    from tianji_jax.sweep import _check

    assert _check(tj.PPOConfig(**PPO).replace(seed=5), {"gamma": [0.9, 0.99]}, None)[1] == [(0.9, 5), (0.99, 5)]


def test_async_configs_and_unregistered_fields_are_refused():
    with pytest.raises(ValueError, match=r"sweep runs the Anakin runtime only; got runtime='async'"):
        tj.sweep(tj.PPOConfig(**PPO, runtime="async"), {"gamma": [0.9]})
    with pytest.raises(ValueError, match=r"sweep does not run recurrent policies yet \(recurrent='lstm'\)"):
        tj.sweep(tj.PPOConfig(**PPO, recurrent="lstm"), {"gamma": [0.9]})
    assert tj.traced_hyperparameters(tj.SACConfig()) == ("learning_rate", "max_grad_norm", "gamma", "tau",
                                                         "init_alpha")


def test_cli_sweep_writes_the_table_and_refuses_bad_grids(tmp_path, capsys):
    from tianji_jax.cli.commands import main

    out = tmp_path / "new" / "sweep.csv"  # its directory is made (before training), as tianji plot does
    assert main(["sweep", "--grid", "learning_rate=1e-3,3e-4", "--seeds", "0,1", "--num-envs", "4", "--num-steps",
                 "32", "--num-minibatches", "2", "--update-epochs", "2", "--total-env-steps", "640",
                 "--eval-every-env-steps", "256", "--eval-episodes", "2", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("learning_rate,seed,final_eval_return") and len(lines) == 5
    assert lines[3].startswith("0.0003,0,")
    capsys.readouterr()
    for argv, match in ((["--grid", "num_envs=4,8"], "grid fields ['num_envs'] cannot be swept"),
                        (["--grid", "gamma=0.9,x"], "--grid gamma: 'x' is not a number"),
                        (["--grid", "gamma"], "expected NAME=V1,V2"),
                        (["--seeds", "0"], "--grid NAME=V1,V2,... is required"),
                        (["--grid", "gamma=0.9", "--seeds", "a"], "--seeds: 'a' is not an integer"),
                        (["--grid", "recurrent=lstm,gru"], "grid fields ['recurrent'] cannot be swept"),
                        (["--grid", "gamma=0.9", "--num-envs", "4.5"], "--num-envs: '4.5' is not an integer"),
                        (["--grid", "gamma=0.9", "--seeds", "0,1", "--seed", "5"], "--seed and --seeds are both given"),
                        (["--grid", "gamma=0.9", "--out", str(tmp_path)], "is a directory; allowed: a CSV file path"),
                        (["--grid", "gamma=0.9", "--env", "envpool:CartPole-v1"],
                         "runs on the host (envpool), which only the async runtime drives; sweep trains in the "
                         "Anakin runtime only: allowed: a device env"),
                        (["--algo", "dqn", "--recurrent", "lstm", "--grid", "learning_rate=1e-3"],
                         "--recurrent is not an option of --algo dqn (it is one of ppo, pqn): the replay data path")):
        assert main(["sweep", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tianji sweep: error: ") and match in err and err.count("\n") == 1, err


@pytest.mark.parametrize("grid, seeds, match", [
    ({"seed": [0, 1]}, [0], r"grid\['seed'\]: seeds are not a grid field; pass them as sweep\(config, grid, seeds="),
    ({"lr": [0.1]}, [0], r"grid fields \['lr'\] are not fields of PPOConfig; allowed: \['learning_rate'"),
    ({"gamma": 0.9}, [0], r"grid\['gamma'\] must be a non-empty list of values, got 0.9"),
    ({"gamma": [0.9]}, 3, r"seeds must be a non-empty list of ints in \[0, 2\*\*32\), got 3"),
])
def test_misplaced_grid_entries_are_named(grid, seeds, match):
    with pytest.raises(ValueError, match=match) as info:
        tj.sweep(tj.PPOConfig(**PPO), grid, seeds=seeds)
    assert "\n" not in str(info.value)


def test_cli_sweep_names_a_bad_choice_in_one_line(capsys):
    from tianji_jax.cli.commands import main

    assert main(["sweep", "--algo", "dqn", "--grid", "learning_rate=1e-3", "--distributional", "foo"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "tianji sweep: error: --distributional: 'foo' is not one of 'none', 'c51', 'qr'"]
