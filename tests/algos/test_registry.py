"""The algorithm registry: built-ins, a user's registration (in code and by entry point), and that
train(), evaluate(), config.json loading and ``tianji train --algo`` dispatch through it."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
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
    from tianji_jax.run.host_on_policy import train_on_policy

    return train_on_policy(config, **kw)


USER = tj.Algorithm(name="logged_ppo", config=LoggedPPOConfig, data_path="on_policy", train=_train,
                    evaluate="tianji_jax.run.host_on_policy:evaluate_on_policy", description="PPO, logged")


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
    from tianji_jax.cli.commands import main

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


# ---- a user's on-policy algorithm with only a config and an agent --------------------------------
@dataclasses.dataclass(frozen=True)
class SoftPQNConfig(tj.PQNConfig):
    """A user variant of PQN: a Boltzmann (softmax) behaviour policy instead of epsilon-greedy."""

    ALGO = "soft_pqn"
    temperature: float = 1.0
    """Softmax temperature of the behaviour policy, > 0."""

    def _check_fields(self) -> None:
        super()._check_fields()
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def _soft_agent():
    import jax
    import jax.numpy as jnp

    from tianji_jax.algos.pqn.agent import PQNAgent

    class SoftPQNAgent(PQNAgent):
        """Acts by sampling softmax(Q / temperature); learns as PQN."""

        def policy(self, params, obs, key, version):
            q = self.q_values(params, obs)
            logits = q / self.config.temperature
            action = jax.random.categorical(key, logits).astype(jnp.int32)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
            return action, action, log_prob, jnp.max(q, axis=-1)

    return SoftPQNAgent


def test_a_user_on_policy_algorithm_is_one_registration(tmp_path):
    """A config subclass and an agent subclass, registered with ``agent=``: train (Anakin and async),
    load, evaluate and config.json all come from the generic on-policy runtime."""
    algo = tj.Algorithm(name="soft_pqn", config=SoftPQNConfig, data_path="on_policy", agent=_soft_agent(),
                        description="PQN with a softmax behaviour policy")
    tj.register_algorithm(algo)
    try:
        assert algo.train == "tianji_jax.run.host_on_policy:train_on_policy"
        config = SoftPQNConfig(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1, total_env_steps=256,
                               eval_every_env_steps=128, eval_episodes=2, temperature=0.5)
        result = tj.train(config, run_dir=tmp_path / "run", progress=False)
        assert result.curve["env_steps"][-1] == 256 and np.all(np.isfinite(result.curve["td_loss"]))
        assert json.loads((tmp_path / "run" / "config.json").read_text())["algo"] == "soft_pqn"
        loaded = tj.load(tmp_path / "run")
        assert isinstance(loaded.config, SoftPQNConfig) and loaded.config.temperature == 0.5
        ev = tj.evaluate(loaded.config, loaded.state, num_episodes=2, seed=0)
        assert ev["returns"].shape == (2,)
        sync = tj.train(config.replace(runtime="async", schedule="sync"), progress=False)
        for x, y in zip(jax.tree.leaves(result.state.learner), jax.tree.leaves(sync.state.learner)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        with pytest.raises(ValueError, match="temperature must be > 0"):
            SoftPQNConfig(temperature=0.0)
    finally:
        registry._REGISTRY.pop("soft_pqn", None)
