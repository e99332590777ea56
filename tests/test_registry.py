"""The algorithm registry: built-ins, a user's registration (in code and by entry point), and that
train(), evaluate(), config.json loading and ``tianji train --algo`` dispatch through it."""

from __future__ import annotations

import dataclasses
import json

import pytest

import tianji_jax as tj
from tianji_jax.algos import registry
from tianji_jax.config import config_from_dict


@dataclasses.dataclass(frozen=True)
class LoggedPPOConfig(tj.PPOConfig):
    """PPO under another name: a user algorithm that reuses PPO's config and runtime."""


CALLS: list[str] = []


def _train(config, **kw):
    CALLS.append("train")
    from tianji_jax.host_on_policy import train_on_policy

    return train_on_policy(config, **kw)


USER = tj.Algorithm(name="logged_ppo", config=LoggedPPOConfig, data_path="on_policy", train=_train,
                    evaluate="tianji_jax.host_on_policy:evaluate_on_policy", description="PPO, logged")


@pytest.fixture
def user_algo():
    tj.register_algorithm(USER)
    yield USER
    registry._REGISTRY.pop(USER.name, None)


def test_built_ins_and_their_data_paths():
    assert tj.algorithm_names()[:3] == ("ppo", "pqn", "dqn")
    assert registry.get_algorithm("pqn").data_path == "on_policy"
    assert registry.get_algorithm("ppo").data_path == "on_policy"
    assert registry.get_algorithm("dqn").data_path == "replay"
    assert registry.algorithm_for(tj.DQNConfig()).name == "dqn"
    with pytest.raises(ValueError, match=r"algo must be one of \('ppo', 'pqn', 'dqn'.*got 'nope'"):
        registry.get_algorithm("nope")


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="PPO 2"), "lower-case identifier"),
    (dict(data_path="offline"), r"data_path must be one of \('on_policy', 'replay'\)"),
])
def test_bad_registrations_are_named(kwargs, match):
    base = dict(name="x", config=tj.PPOConfig, data_path="on_policy", train=_train, evaluate=_train)
    with pytest.raises(ValueError, match=match):
        tj.Algorithm(**{**base, **kwargs})


def test_a_name_cannot_be_taken_twice(user_algo):
    other = dataclasses.replace(USER, description="another")
    with pytest.raises(ValueError, match="'logged_ppo' is already registered"):
        tj.register_algorithm(other)
    tj.register_algorithm(other, replace=True)
    assert registry.get_algorithm("logged_ppo").description == "another"


def test_user_algorithm_trains_evaluates_and_round_trips_its_config(user_algo, tmp_path):
    config = LoggedPPOConfig(env="gymnax:CartPole-v1", total_env_steps=2048, num_envs=4, eval_every_env_steps=1024,
                             eval_episodes=1)
    # PPO's subclass is an instance of PPOConfig too: the most specific registration must win
    assert registry.algorithm_for(config).name == "logged_ppo"
    CALLS.clear()
    result = tj.train(config, progress=False)
    assert CALLS == ["train"] and result.curve["env_steps"][-1] == 2048
    assert len(tj.evaluate(config, result.state, num_episodes=2)["lengths"]) == 2
    restored = config_from_dict({**config.to_dict(), "algo": "logged_ppo"})
    assert isinstance(restored, LoggedPPOConfig) and restored == config


def test_cli_lists_a_registered_algorithms_options(user_algo, capsys):
    from tianji_jax.cli import main

    assert main(["train", "--algo", "logged_ppo", "--help"]) == 0
    assert "--clip-eps" in capsys.readouterr().out


def test_entry_points_register_on_first_lookup(monkeypatch):
    class EP:
        name = "logged_ppo"

        @staticmethod
        def load():
            return USER

    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [EP()] if group == "tianji_jax.algorithms" else [])
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", [False])
    try:
        assert registry.get_algorithm("logged_ppo") is USER
        assert "logged_ppo" in tj.algorithm_names()
    finally:
        registry._REGISTRY.pop("logged_ppo", None)


def test_a_broken_plugin_is_skipped_with_a_warning(monkeypatch):
    class Broken:
        name = "broken"

        @staticmethod
        def load():
            raise ImportError("No module named 'nothere'")

    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Broken()])
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", [False])
    with pytest.warns(RuntimeWarning, match=r"entry point 'broken' skipped: ImportError: No module named 'nothere'"):
        names = tj.algorithm_names()
    assert names[:3] == ("ppo", "pqn", "dqn") and "broken" not in names
    assert registry.algorithm_for(tj.PPOConfig()).name == "ppo"
