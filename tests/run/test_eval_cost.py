"""Evaluation cost is visible: ``eval_env_steps`` (the env steps of every evaluation episode so far)
is a metrics column, continues across a resume, is empty without evaluation, and the summary line
at the end of ``tj.train`` says how many env steps evaluation took against training's."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.run import host_loop
from tianji_jax.run.run_status import eval_cost

pytestmark = pytest.mark.timeout(300)

PPO = dict(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=256,
           eval_every_env_steps=64, eval_episodes=2)
DQN = dict(num_envs=4, num_steps=4, replay_ratio=0.0625, learning_starts=64, buffer_capacity=512, batch_size=16, total_env_steps=256,
           eval_every_env_steps=128, eval_episodes=1)


@pytest.fixture
def eval_lengths(monkeypatch):
    """The episode lengths of every evaluation ``emit`` runs, in order (the evaluator handed to
    ``host_loop.make_emit`` is wrapped to record what it returns)."""
    calls: list[np.ndarray] = []
    make_emit = host_loop.make_emit

    def recording_make_emit(config, files, display, start, evaluator):
        def recording(params, obs_rms, key):
            returns, lengths = evaluator(params, obs_rms, key)
            calls.append(np.asarray(lengths, np.int64))
            return returns, lengths

        return make_emit(config, files, display, start, recording if evaluator is not None else None)

    monkeypatch.setattr(host_loop, "make_emit", recording_make_emit)
    return calls


def _summary(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("tianji_jax.train:")]
    assert len(lines) == 1, err
    return lines[0]


def test_column_sits_after_eval_return_std_and_is_documented():
    import inspect

    import tianji_jax.run.results as results

    cols = tj.METRIC_COLUMNS
    assert cols[cols.index("eval_return_std") + 1] == "eval_env_steps"
    assert "``eval_env_steps`` counts the env steps spent in evaluation" in inspect.getsource(results)


def test_ppo_counts_every_evaluation_episode(tmp_path, eval_lengths, capsys):
    run_dir = tmp_path / "ppo"
    result = tj.train(tj.PPOConfig(**PPO), run_dir=run_dir, progress=False, tensorboard=False)
    curve = result.curve
    n = len(curve["env_steps"])
    assert n == 4 and len(eval_lengths) == n  # one evaluation of 2 episodes per row
    assert all(len(x) == 2 for x in eval_lengths)
    expected = np.cumsum([int(x.sum()) for x in eval_lengths])
    np.testing.assert_array_equal(curve["eval_env_steps"], expected)
    assert np.all(np.diff(curve["eval_env_steps"]) > 0)
    # independently of the wrapper: a CartPole episode's return is its length (reward 1 per step)
    np.testing.assert_array_equal(curve["eval_env_steps"], np.cumsum(2 * curve["eval_return_mean"]))
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0])
    assert header[header.index("eval_return_std") + 1] == "eval_env_steps"
    assert [int(r["eval_env_steps"]) for r in rows] == list(expected)
    line = _summary(capsys.readouterr().err)
    spent = int(expected[-1])
    pct = 100 * spent / 256
    assert f"; evaluation: {spent:,} env steps (" in line, line
    assert f"% of training's); run dir {run_dir}" in line, line
    assert f"({pct:.0f}% of training's)" in line or pct < 1, line


def test_resume_continues_the_count(tmp_path, eval_lengths, capsys):
    config = tj.PPOConfig(**PPO)
    full = tj.train(config, progress=False)
    assert len(eval_lengths) == 4

    class Stop(Exception):
        pass

    def stop_after_two(row):
        if row["env_steps"] >= 128:
            raise Stop

    run_dir = tmp_path / "cut"
    with pytest.raises(Stop):
        tj.train(config, run_dir=run_dir, progress=False, tensorboard=False, callback=stop_after_two)
    resumed = tj.train(config, run_dir=run_dir, progress=False, tensorboard=False, resume=True)
    assert list(resumed.curve["env_steps"]) == [64, 128, 192, 256]
    # evaluation keys come from the seed and the row index: the same episodes, the same count
    np.testing.assert_array_equal(resumed.curve["eval_env_steps"], full.curve["eval_env_steps"])
    capsys.readouterr()


def test_without_evaluation_the_column_is_empty(tmp_path, capsys):
    result = tj.train(tj.PPOConfig(**{**PPO, "eval_episodes": 0}), run_dir=tmp_path / "r", progress=False,
                      tensorboard=False)
    assert np.all(np.isnan(result.curve["eval_env_steps"]))
    with open(tmp_path / "r" / "metrics.csv", newline="") as f:
        assert all(r["eval_env_steps"] == "" for r in csv.DictReader(f))
    line = _summary(capsys.readouterr().err)
    assert "no evaluation" in line and "evaluation:" not in line, line


def test_dqn_has_the_column(eval_lengths, capsys):
    result = tj.train(tj.DQNConfig(**DQN), progress=False)
    curve = result.curve
    assert len(curve["env_steps"]) == len(eval_lengths) == 2
    np.testing.assert_array_equal(curve["eval_env_steps"], np.cumsum([int(x.sum()) for x in eval_lengths]))
    line = _summary(capsys.readouterr().err)
    assert f"; evaluation: {int(curve['eval_env_steps'][-1]):,} env steps (" in line, line


def test_eval_steps_so_far_and_the_summary_text():
    nan = math.nan
    assert host_loop.eval_steps_so_far([]) == 0
    assert host_loop.eval_steps_so_far([{"env_steps": 64}]) == 0  # rows written before the column existed
    assert host_loop.eval_steps_so_far([{"eval_env_steps": 40}, {"eval_env_steps": nan}]) == 40
    assert host_loop.eval_steps_so_far([{"eval_env_steps": 40.0}, {"eval_env_steps": 95}]) == 95
    curve = {"env_steps": np.array([100_000.0, 137_000.0]), "eval_env_steps": np.array([5_000.0, 12_345.0])}
    assert eval_cost(curve) == "; evaluation: 12,345 env steps (9% of training's)"
    assert eval_cost({"env_steps": np.array([1e6]), "eval_env_steps": np.array([500.0])}) == (
        "; evaluation: 500 env steps (0.05% of training's)")
    assert eval_cost({"env_steps": np.array([100.0]), "eval_env_steps": np.array([nan])}) == ""
    assert eval_cost({"env_steps": np.array([100.0])}) == ""
