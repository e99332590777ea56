"""The latency wrapper of host envs (``"envpool:<id>|latency_ms=d"``): a slow external simulator.

Timing is checked with a fake clock and sleep (no wall-clock bounds), except one real smoke test
that bounds the time of real steps from below only.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.config import config_from_dict
from tianji_jax.envs import resolve_env
from tianji_jax.envs.host import EnvpoolVecEnv, GymnasiumVecEnv, HostStep
from tianji_jax.envs.latency import HOST_WRAPPER_SYNTAX, MAX_LATENCY_MS, LatencyVecEnv, parse_host_modifiers

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:.*precision lowered.*:UserWarning")]


# ---- fakes: a clock, a sleep that advances it, an inner env whose calls cost clock time ---------
class FakeClock:
    """Seconds; ``sleep`` advances it and logs what was asked."""

    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept.append(seconds)
        self.t += seconds


def _step(ids) -> HostStep:
    ids = np.asarray(ids, np.int32)
    b = len(ids)
    z = np.zeros(b, np.float32)
    return HostStep(env_id=ids, obs=np.zeros((b, 1), np.float32), reward=z, terminated=np.zeros(b, bool),
                    truncated=np.zeros(b, bool), final_obs=np.zeros((b, 1), np.float32), valid=np.ones(b, bool),
                    episode_return=z, episode_length=np.zeros(b, np.int32))


class FakeVecEnv:
    """Sync (``batch_size=None``) or a scripted async env: each call costs ``cost_s`` of the clock;
    async calls return the batches in ``order`` one after the other."""

    def __init__(self, clock: FakeClock, num_envs: int = 4, cost_s: float = 0.0, order=None):
        self.clock, self.num_envs, self.cost_s = clock, num_envs, cost_s
        self.order = list(order or [])
        self.batch_size = len(self.order[0]) if self.order else num_envs
        self.is_async = self.batch_size < num_envs
        self.observation_space, self.action_space = "obs-space", "act-space"
        self.closed = 0
        self.calls: list = []

    def _out(self):
        self.clock.t += self.cost_s
        return _step(self.order.pop(0) if self.order else np.arange(self.num_envs))

    def reset(self):
        self.calls.append("reset")
        return self._out()

    def step(self, actions, env_id=None):
        self.calls.append(("step", None if env_id is None else list(env_id)))
        return self._out()

    def close(self):
        self.closed += 1


def _wrapped(latency_ms: float, cost_ms: float, **kw):
    clock = FakeClock()
    inner = FakeVecEnv(clock, cost_s=cost_ms / 1000, **kw)
    return LatencyVecEnv(inner, latency_ms, clock=clock, sleep=clock.sleep), inner, clock


# ---- the wait ------------------------------------------------------------------------------------
def test_a_fast_inner_step_sleeps_the_remainder():
    env, inner, clock = _wrapped(5, cost_ms=1)
    env.reset()
    assert clock.slept == pytest.approx([0.004])
    t0 = clock.t
    env.step(np.zeros(4, np.int32))
    assert clock.slept == pytest.approx([0.004, 0.004])
    assert clock.t - t0 == pytest.approx(0.005)  # the step took max(inner, d) = d
    assert env.waited_s == pytest.approx(0.008)


def test_a_slow_inner_step_sleeps_nothing():
    env, inner, clock = _wrapped(5, cost_ms=7)
    env.reset()
    t0 = clock.t
    for _ in range(3):
        env.step(np.zeros(4, np.int32))
    assert clock.slept == [] and env.waited_s == 0.0
    assert clock.t - t0 == pytest.approx(0.021)  # inner time only


@pytest.mark.parametrize("cost_ms", [0.0, 1.0])
def test_zero_latency_never_sleeps(cost_ms):
    env, inner, clock = _wrapped(0, cost_ms=cost_ms)
    env.reset()
    for _ in range(3):
        env.step(np.zeros(4, np.int32), np.arange(4))
    assert clock.slept == []


def test_async_mode_waits_per_env_from_when_its_action_was_sent():
    """envpool async mode: a batch returns no earlier than d after its envs' actions were sent;
    envs sent by an earlier call have been stepping since then."""
    order = [[0, 1], [2, 3], [0, 1], [2, 3]]
    env, inner, clock = _wrapped(10, cost_ms=1, num_envs=4, order=order)
    t_reset = clock.t
    first = env.reset()                      # all 4 resets asked for at t_reset
    assert first.env_id.tolist() == [0, 1] and clock.t == pytest.approx(t_reset + 0.010)
    second = env.step(np.zeros(2, np.int32), first.env_id)  # envs 2, 3 were reset at t_reset: done already
    assert second.env_id.tolist() == [2, 3] and len(clock.slept) == 1
    t_sent01 = clock.t - 0.001               # envs 0, 1 were sent when that step began
    env.step(np.zeros(2, np.int32), second.env_id)  # returns 0, 1: wait until t_sent01 + d
    assert clock.t == pytest.approx(t_sent01 + 0.010)


def test_inner_errors_pass_through_before_any_wait():
    clock = FakeClock()

    class Broken(FakeVecEnv):
        def step(self, actions, env_id=None):
            raise ValueError("actions: bad")

    env = LatencyVecEnv(Broken(clock), 5, clock=clock, sleep=clock.sleep)
    with pytest.raises(ValueError, match="actions: bad"):
        env.step(np.zeros(4, np.int32))
    assert clock.slept == []


def test_attributes_are_forwarded_and_close_reaches_the_inner_env():
    env, inner, _ = _wrapped(5, cost_ms=0)
    assert (env.num_envs, env.batch_size, env.is_async) == (4, 4, False)
    assert (env.observation_space, env.action_space) == ("obs-space", "act-space")
    assert env.env is inner and env.unwrapped is inner and env.latency_ms == 5.0
    with env as same:
        assert same is env
    assert inner.closed == 1
    with pytest.raises(AttributeError):
        env.no_such_attribute


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "5", None, True])
def test_bad_latency_values_are_refused(bad):
    with pytest.raises(ValueError, match=r"latency_ms=.*allowed: a finite number of milliseconds >= 0"):
        LatencyVecEnv(FakeVecEnv(FakeClock()), bad)


# ---- real envs -----------------------------------------------------------------------------------
def _roll(env, steps: int = 6) -> list[HostStep]:
    out = [env.reset()]
    for i in range(steps):
        out.append(env.step(np.full(len(out[-1]), i % 2, np.int32), out[-1].env_id))
    return out


def test_outputs_identical_to_the_unwrapped_envpool_env():
    with EnvpoolVecEnv("CartPole-v1", 3, seed=7) as plain, \
            LatencyVecEnv(EnvpoolVecEnv("CartPole-v1", 3, seed=7), 0.5) as slow:
        a, b = _roll(plain), _roll(slow)
    for x, y in zip(a, b):
        for field in ("env_id", "obs", "reward", "terminated", "truncated", "final_obs", "valid",
                      "episode_return", "episode_length"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))


def test_real_latency_is_a_lower_bound_on_step_time():
    """Three steps of a ``latency_ms=20`` env take at least 60 ms (no upper bound: shared CPUs)."""
    spec = resolve_env("envpool:CartPole-v1|latency_ms=20")
    with spec.make_host_env(4, seed=0) as env:
        assert isinstance(env, LatencyVecEnv)
        step = env.reset()
        t0 = time.perf_counter()
        for _ in range(3):
            step = env.step(np.zeros(4, np.int32), step.env_id)
        assert time.perf_counter() - t0 >= 0.060


@pytest.mark.parametrize("env_text, inner", [("envpool:CartPole-v1|latency_ms=5", EnvpoolVecEnv),
                                             ("gymnasium:CartPole-v1|latency_ms=2.5", GymnasiumVecEnv)])
def test_training_envs_are_wrapped_evaluation_envs_are_not(env_text, inner):
    spec = resolve_env(env_text)
    with spec.make_host_env(2, seed=0) as train_env, spec.make_host_env(2, seed=0, evaluation=True) as eval_env:
        assert isinstance(train_env, LatencyVecEnv) and isinstance(train_env.env, inner)
        assert train_env.latency_ms == spec.latency_ms
        assert isinstance(eval_env, inner)
        assert train_env.env.env_id == "CartPole-v1"  # the backend gets the id without the modifier


def test_zero_latency_builds_the_plain_env():
    with resolve_env("envpool:CartPole-v1|latency_ms=0").make_host_env(2, seed=0) as env:
        assert isinstance(env, EnvpoolVecEnv)


def test_envpool_async_mode_through_the_wrapper():
    spec = resolve_env("envpool:CartPole-v1|latency_ms=1")
    with spec.make_host_env(4, seed=0, batch_size=2) as env:
        assert env.is_async and env.batch_size == 2
        steps = _roll(env, 8)
        assert all(len(s) == 2 for s in steps)


# ---- the id syntax -------------------------------------------------------------------------------
@pytest.mark.parametrize("env_text, name, latency", [
    ("envpool:CartPole-v1|latency_ms=5", "CartPole-v1|latency_ms=5", 5.0),
    ("gymnasium:CartPole-v1|latency_ms=2.5", "CartPole-v1|latency_ms=2.5", 2.5),
    ("envpool:CartPole-v1| latency_ms = 05.0 ", "CartPole-v1|latency_ms=5", 5.0),
    ("envpool:CartPole-v1|latency_ms=0", "CartPole-v1|latency_ms=0", 0.0),
    ("envpool:CartPole-v1|latency_ms=1e-1", "CartPole-v1|latency_ms=0.1", 0.1),
    ("envpool:CartPole-v1", "CartPole-v1", 0.0),
])
def test_latency_id_parses_into_the_spec(env_text, name, latency):
    spec = resolve_env(env_text)
    assert spec.name == name and spec.latency_ms == latency and spec.base_id == "CartPole-v1"
    assert spec.on_host and spec.episode_limit == 500 and spec.observation_shape == (4,)


@pytest.mark.parametrize("env_text, pattern", [
    ("envpool:CartPole-v1|latency_ms=-1", r"modifier 'latency_ms' got value '-1'; allowed: a finite number"),
    ("envpool:CartPole-v1|latency_ms=abc", r"modifier 'latency_ms' got value 'abc'; allowed: a finite number"),
    ("envpool:CartPole-v1|latency_ms=nan", r"modifier 'latency_ms' got value 'nan'; allowed: a finite number"),
    ("envpool:CartPole-v1|latency_ms=inf", r"modifier 'latency_ms' got value 'inf'; allowed: a finite number"),
    ("envpool:CartPole-v1|latency_ms=1e999", r"modifier 'latency_ms' got value '1e999'"),
    ("gymnasium:CartPole-v1|latency_ms", r"modifier 'latency_ms' got no value"),
    ("envpool:CartPole-v1|latency_ms=1|latency_ms=2", r"'latency_ms' given twice"),
    ("envpool:CartPole-v1|foo=1", r"unknown host env modifier 'foo'.*allowed on host envs \(envpool\): "
                                  r"modifiers \['latency_ms'\] and wrappers \['mask', 'frame_stack', 'clip_action'\]"),
    ("gymnasium:CartPole-v1|", r"unknown host env modifier ''.*\['latency_ms'\]"),
    ("gymnax:CartPole-v1|latency_ms=5", r"'latency_ms' applies to host envs \(envpool:, gymnasium:\) only"),
    ("CartPole-v1|latency_ms=5", r"'latency_ms' applies to host envs \(envpool:, gymnasium:\) only"),
    ("gymnax:CartPole-v1|mask=0|latency_ms=5", r"'latency_ms' applies to host envs"),
])
def test_bad_latency_ids_refused_in_one_line(env_text, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        resolve_env(env_text)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"env={env_text!r}")


def test_parse_host_modifiers_alone():
    assert parse_host_modifiers([]) == ({}, "")
    assert parse_host_modifiers(["latency_ms=2.50"]) == ({"latency_ms": 2.5}, "|latency_ms=2.5")
    assert list(HOST_WRAPPER_SYNTAX) == ["latency_ms"]


# ---- the upper bound: at most MAX_LATENCY_MS (10 s) a step -----------------------------------------
def test_latency_bound_is_ten_seconds_and_named_in_the_syntax():
    assert MAX_LATENCY_MS == 10_000.0
    assert ">= 0 and <= 10000" in HOST_WRAPPER_SYNTAX["latency_ms"]
    assert parse_host_modifiers(["latency_ms=10000"]) == ({"latency_ms": 10_000.0}, "|latency_ms=10000")
    assert parse_host_modifiers(["latency_ms=1e4"]) == ({"latency_ms": 10_000.0}, "|latency_ms=10000")
    assert LatencyVecEnv(FakeVecEnv(FakeClock()), 10_000).latency_ms == 10_000.0


@pytest.mark.parametrize("value", ["10000.5", "10001", "1e5", "36000000"])
def test_latency_above_the_bound_refused_in_one_line(value):
    env_text = f"envpool:CartPole-v1|latency_ms={value}"
    with pytest.raises(ValueError, match=rf"modifier 'latency_ms' got value '{value}'; allowed: a finite number "
                                         r"of milliseconds >= 0 and <= 10000") as info:
        resolve_env(env_text)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"env={env_text!r}")


@pytest.mark.parametrize("bad", [10_000.001, 10_001, np.float32(2e4), 1e9])
def test_wrapper_refuses_latency_above_the_bound(bad):
    with pytest.raises(ValueError, match=r"latency_ms=.*allowed: a finite number of milliseconds >= 0 and <= 10000"):
        LatencyVecEnv(FakeVecEnv(FakeClock()), bad)


def test_config_validation_refuses_latency_above_the_bound_before_any_work(monkeypatch):
    """The bound is checked where the config resolves its env id: no env is built."""
    import tianji_jax.envs.host as host

    def no_env(*args, **kwargs):
        raise AssertionError("an env was built")

    monkeypatch.setattr(host.EnvpoolVecEnv, "__init__", no_env)
    for make in (lambda env: tj.PPOConfig(env=env, **SMALL), lambda env: tj.DQNConfig(env=env, runtime="async")):
        with pytest.raises(ValueError, match=r"latency_ms.*got value '20000'.*<= 10000") as info:
            make("envpool:CartPole-v1|latency_ms=20000")
        assert "\n" not in str(info.value)


# ---- configs -------------------------------------------------------------------------------------
SMALL = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, total_env_steps=4 * 32 * 4,
             eval_every_env_steps=4 * 32 * 2, eval_episodes=2, runtime="async")


def test_configs_accept_the_latency_id_and_compare_by_their_env_string():
    env = "envpool:CartPole-v1|latency_ms=1"
    ppo = tj.PPOConfig(env=env, **SMALL)
    assert ppo.env == env and ppo.env_spec.latency_ms == 1.0 and ppo.env_spec.name == "CartPole-v1|latency_ms=1"
    assert ppo == tj.PPOConfig(env=env, **SMALL)
    assert ppo != tj.PPOConfig(env="envpool:CartPole-v1|latency_ms=2", **SMALL)
    assert ppo != tj.PPOConfig(env="envpool:CartPole-v1", **SMALL)
    again = config_from_dict(json.loads(json.dumps({**ppo.to_dict(), "algo": "ppo"})))
    assert again == ppo and again.env_spec.latency_ms == 1.0
    dqn = tj.DQNConfig(env=env, runtime="async")
    assert dqn.env_spec.latency_ms == 1.0 and not dqn.env_spec.is_atari
    gym = tj.PPOConfig(env="gymnasium:CartPole-v1|latency_ms=2.5", **SMALL)
    assert gym.env_spec.latency_ms == 2.5
    with pytest.raises(ValueError, match=r"applies to host envs"):
        tj.PPOConfig(env="gymnax:CartPole-v1|latency_ms=1", **{**SMALL, "runtime": "anakin"})


def test_async_ppo_trains_on_a_slow_env(tmp_path):
    """The runtime's actors step the wrapped env: every env step of the run waited."""
    config = tj.PPOConfig(env="envpool:CartPole-v1|latency_ms=1", **SMALL)
    result = tj.train(config, run_dir=tmp_path, progress=False)
    c = result.curve
    assert c["env_steps"][-1] == config.env_steps
    steps_per_env = config.env_steps // config.num_envs  # each a batched step of >= 1 ms
    assert np.nansum(c["env_step_s"]) >= 0.001 * steps_per_env
    assert np.all(np.isfinite(c["eval_return_mean"]))
