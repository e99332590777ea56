"""PPOConfig validation: every validated field has a test that its bad value raises, naming the
field, before anything is compiled; plus derived sizes, ``replace``, equality and hashing."""

from __future__ import annotations

import ast
import dataclasses
import re

import gymnax.environments.spaces as gspaces
import jax
import jax.numpy as jnp
import pytest
from gymnax.environments.classic_control.cartpole import CartPole

from tianji_jax import PPOConfig

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def _warm_env_resolution():
    """Resolve CartPole once: gymnax's ``observation_space`` runs a few eager jnp ops, which JAX
    compiles once per process. Warming them here means the counters below see only new work."""
    PPOConfig()


@pytest.fixture
def compilations(compile_counter):
    """Number of XLA backend compilations since the test started (``compile_counter`` from
    conftest.py counts ``/jax/core/compile/backend_compile_duration`` events)."""
    return lambda: compile_counter.count


# Small valid config every bad value is applied on top of.
BASE = dict(total_env_steps=1024, num_envs=4, num_steps=16, num_minibatches=4, update_epochs=2,
            eval_every_env_steps=256, eval_episodes=2)


class TupleActionCartPole(CartPole):
    """CartPole whose action space is a gymnax Tuple (PPO handles Discrete and 1-D Box only)."""

    def action_space(self, params=None):
        return gspaces.Tuple([gspaces.Discrete(2), gspaces.Discrete(3)])


class DictActionCartPole(CartPole):
    def action_space(self, params=None):
        return gspaces.Dict({"a": gspaces.Discrete(2)})


class MatrixBoxActionCartPole(CartPole):
    """A Box action space of rank 2: resolvable, but not a 1-D Box PPO can handle."""

    def action_space(self, params=None):
        return gspaces.Box(-1.0, 1.0, (2, 2), jnp.float32)


class NotAnEnv:
    def reset(self, key, params=None):
        return None


NAN, INF = float("nan"), float("inf")

# (field, bad value, exception type, regex the message must match)
BAD_VALUES = [
    # recurrent networks (Anakin, gymnax)
    ("recurrent", "rnn", ValueError, "recurrent"),
    ("rnn_hidden_size", 0, ValueError, "rnn_hidden_size"),
    # sizes: positive ints
    *[(f, v, ValueError, f) for f in ("total_env_steps", "num_envs", "num_steps", "update_epochs",
                                       "num_minibatches", "eval_every_env_steps") for v in (0, -1)],
    ("eval_episodes", -1, ValueError, "eval_episodes"),
    # a non-whole float given for an int field (a whole one, 8.0, is taken as 8) / other wrong types
    *[(f, 8.5, TypeError, f) for f in ("total_env_steps", "num_envs", "num_steps", "update_epochs",
                                        "num_minibatches", "eval_every_env_steps", "eval_episodes", "seed")],
    ("num_envs", True, TypeError, "num_envs"),
    ("num_envs", "8", TypeError, "num_envs"),
    # seed in [0, 2**32)
    ("seed", -1, ValueError, "seed"),
    ("seed", 2**32, ValueError, "seed"),
    ("seed", 2**40, ValueError, "seed"),
    # learning rate > 0 and finite
    ("learning_rate", 0.0, ValueError, "learning_rate"),
    ("learning_rate", -1e-3, ValueError, "learning_rate"),
    ("learning_rate", NAN, ValueError, "learning_rate"),
    ("learning_rate", INF, ValueError, "learning_rate"),
    ("learning_rate", "3e-4", TypeError, "learning_rate"),
    # gamma, gae_lambda in [0, 1]
    ("gamma", -0.01, ValueError, "gamma"),
    ("gamma", 1.01, ValueError, "gamma"),
    ("gamma", NAN, ValueError, "gamma"),
    ("gamma", INF, ValueError, "gamma"),
    ("gae_lambda", -0.5, ValueError, "gae_lambda"),
    ("gae_lambda", 1.5, ValueError, "gae_lambda"),
    ("gae_lambda", NAN, ValueError, "gae_lambda"),
    ("advantage_estimator", "retrace", ValueError, r"advantage_estimator must be one of \('gae', 'vtrace'\)"),
    # clip_eps > 0
    ("clip_eps", 0.0, ValueError, "clip_eps"),
    ("clip_eps", -0.2, ValueError, "clip_eps"),
    ("clip_eps", NAN, ValueError, "clip_eps"),
    # coefficients >= 0
    ("vf_coef", -0.5, ValueError, "vf_coef"),
    ("vf_coef", NAN, ValueError, "vf_coef"),
    ("ent_coef", -0.01, ValueError, "ent_coef"),
    ("ent_coef", INF, ValueError, "ent_coef"),
    ("log_std_init", -21.0, ValueError, "log_std_init"),
    ("log_std_init", 2.5, ValueError, "log_std_init"),
    ("log_std_init", NAN, ValueError, "log_std_init"),
    ("log_std_init", -2.0, ValueError, r"log_std_init=-2.0 .*allowed: 0.0"),  # CartPole: categorical
    # max_grad_norm > 0
    ("max_grad_norm", 0.0, ValueError, "max_grad_norm"),
    ("max_grad_norm", -1.0, ValueError, "max_grad_norm"),
    ("max_grad_norm", INF, ValueError, "max_grad_norm"),
    # bools must be bools
    *[(f, v, TypeError, f) for f in ("anneal_lr", "clip_value_loss", "normalize_advantages",
                                      "normalize_observations", "scale_rewards") for v in (1, "yes")],
    # network
    ("hidden_sizes", (), ValueError, "hidden_sizes"),
    ("hidden_sizes", (64, 0), ValueError, "hidden_sizes"),
    ("hidden_sizes", (64, -8), ValueError, "hidden_sizes"),
    ("hidden_sizes", [64, 0], ValueError, "hidden_sizes"),  # a list is taken as a tuple, then checked
    ("hidden_sizes", 64, ValueError, "hidden_sizes"),
    ("hidden_sizes", (64, 32.0), ValueError, "hidden_sizes"),
    ("hidden_sizes", (True,), ValueError, "hidden_sizes"),
    ("activation", "gelu", ValueError, "activation"),
    ("activation", "Tanh", ValueError, "activation"),
    # stop_at_return must be a finite number
    ("stop_at_return", NAN, ValueError, "stop_at_return"),
    ("stop_at_return", INF, ValueError, "stop_at_return"),
    ("stop_at_return", "500", TypeError, "stop_at_return"),
    ("runtime", "sebulba", ValueError, "runtime"),
    ("schedule", "lockstep", ValueError, "schedule"),
    ("max_policy_lag", -1, ValueError, "max_policy_lag"),
    ("max_policy_lag", 1.5, TypeError, "max_policy_lag"),
    ("num_actors", 0, ValueError, "num_actors"),
    ("queue_batches", 1, ValueError, "queue_batches"),
    ("stall_timeout_s", 0.0, ValueError, "stall_timeout_s"),
    ("record_schedule", "yes", TypeError, "record_schedule"),
    ("replay_schedule", "/nonexistent/schedule.jsonl", ValueError, "replay_schedule"),
    ("max_nonfinite_updates", 0, ValueError, "max_nonfinite_updates"),
    ("stall_timeout_s", NAN, ValueError, "stall_timeout_s"),
    # env
    ("env", "gymnax:CartPol-v1", ValueError, r"env=.*CartPol-v1"),
    ("env", "foo:CartPole-v1", ValueError, r"env=.*backend 'foo'"),
    ("env", "gymnasium:CartPole-v1", ValueError, r"runtime='anakin'.*gymnasium.*allowed: runtime='async'"),
    ("env", "envpool:CartPole-v1", ValueError, r"runtime='anakin'.*envpool.*allowed: runtime='async'"),
    ("env_batch_size", 2, ValueError, r"env_batch_size=2: only the envpool backend"),
    ("env_batch_size", 0, ValueError, "env_batch_size"),
    ("num_learner_devices", 0, ValueError, "num_learner_devices"),
    ("num_learner_devices", 3, ValueError, r"num_learner_devices=3 must divide num_envs=4"),
    ("num_learner_groups", 0, ValueError, "num_learner_groups"),
    ("num_learner_groups", 2, ValueError, r"num_learner_groups=2 needs runtime='async'"),
    ("sync_every", 0, ValueError, "sync_every"),
    ("sync_every", 4, ValueError, r"sync_every=4 needs num_learner_groups > 1"),
    ("num_processes", 0, ValueError, "num_processes"),
    ("num_processes", 2, ValueError, r"num_processes=2 needs runtime='async'"),
    ("process_id", -1, ValueError, "process_id"),
    ("coordinator", "127.0.0.1:1234", ValueError, r"coordinator=.* needs num_processes > 1"),
    ("heartbeat_timeout_s", 0, ValueError, "heartbeat_timeout_s"),
    ("actor_backend", "processes", ValueError, "actor_backend"),
    ("ray_address", "auto", ValueError, r"ray_address='auto' needs actor_backend='ray'"),
    ("ray_max_restarts", -1, ValueError, "ray_max_restarts"),
    ("burn_in_steps", 4, ValueError, r"burn_in_steps=4 needs a recurrent core"),
    ("burn_in_steps", -1, ValueError, r"burn_in_steps must be >= 0, got -1"),
    ("burn_in_steps", 1.5, TypeError, r"burn_in_steps must be an int"),
    ("torso", "resnet", ValueError, r"torso must be one of \('auto', 'mlp', 'nature_cnn', 'small_cnn'\)"),
    ("torso", "no_such_pkg_q:factory", ValueError, r"torso='no_such_pkg_q:factory': cannot import it"),
    ("env", NotAnEnv(), ValueError, r"env: .*NotAnEnv.*not a gymnax-style"),
    ("env", object(), ValueError, r"env: .*not a gymnax-style"),
    ("env", TupleActionCartPole(), ValueError, r"env=.*TupleActionCartPole.*Tuple"),
    ("env", DictActionCartPole(), ValueError, r"env=.*DictActionCartPole.*Dict"),
    ("env", MatrixBoxActionCartPole(), ValueError, r"env: PPO handles Discrete, MultiDiscrete and 1-D Box"),
]


def _id(case):
    field, value = case[0], case[1]
    text = type(value).__name__ if field == "env" and not isinstance(value, str) else repr(value)
    return f"{field}={text}"


@pytest.mark.parametrize("changes, field", [
    (dict(schedule="sync", max_policy_lag=1), "max_policy_lag"),
    (dict(schedule="one_step", max_policy_lag=0), "max_policy_lag"),
    (dict(runtime="async", schedule="sync", num_actors=2), "num_actors"),
])
def test_incompatible_async_combinations(changes, field):
    with pytest.raises(ValueError, match=field):
        PPOConfig(**{**BASE, **changes})


def test_every_validated_field_has_a_bad_value():
    """The table above covers every field of PPOConfig (a new field needs a bad-value case)."""
    covered = {case[0] for case in BAD_VALUES}
    fields = {f.name for f in dataclasses.fields(PPOConfig)}
    assert fields - covered == set()


@pytest.mark.parametrize("case", BAD_VALUES, ids=[_id(c) for c in BAD_VALUES])
def test_bad_value_raises_naming_field_before_compilation(case, compilations):
    field, value, exc_type, pattern = case
    with pytest.raises(exc_type, match=pattern) as info:
        PPOConfig(**{**BASE, field: value})
    assert field in str(info.value)
    assert compilations() == 0, f"constructing PPOConfig({field}={value!r}) compiled something"
    # the same bad value through replace() of a valid config raises the same way
    good = PPOConfig(**BASE)
    with pytest.raises(exc_type, match=pattern):
        good.replace(**{field: value})
    assert compilations() == 0


def test_compile_counter_sees_compilations(compilations):
    """Guard: the listener used above really counts compilations."""
    assert compilations() == 0
    jax.jit(lambda x: x * 3 + 0.123)(jnp.arange(7.0)).block_until_ready()
    assert compilations() >= 1


def test_unknown_env_id_lists_closest_ids():
    with pytest.raises(ValueError) as info:
        PPOConfig(**{**BASE, "env": "CartPol-v1"})
    msg = str(info.value)
    assert "'CartPol-v1'" in msg
    listed = re.search(r"closest known ids: (\[[^\]]*\])", msg)
    assert listed, msg
    closest = ast.literal_eval(listed.group(1))
    assert closest[0] == "CartPole-v1"  # the closest id comes first


def test_unknown_backend_lists_allowed_backends():
    with pytest.raises(ValueError, match=r"allowed backends: \['gymnax', 'craftax', 'jumanji', 'xminigrid', 'brax', 'envpool', 'gymnasium'\]"):
        PPOConfig(**{**BASE, "env": "foo:CartPole-v1"})


def test_float_int_field_message_gives_value_and_type():
    with pytest.raises(TypeError, match=r"num_envs must be an int, got 4\.5 \(float\)"):
        PPOConfig(**{**BASE, "num_envs": 4.5})


@pytest.mark.parametrize("field, value", [("gamma", 1.5), ("seed", 2**32), ("clip_eps", 0.0)])
def test_message_gives_the_bad_value(field, value):
    with pytest.raises(ValueError) as info:
        PPOConfig(**{**BASE, field: value})
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_stop_at_return_needs_evaluation(compilations):
    with pytest.raises(ValueError, match="stop_at_return.*eval_episodes"):
        PPOConfig(**{**BASE, "stop_at_return": 475.0, "eval_episodes": 0})
    assert compilations() == 0
    # both on their own are fine
    assert PPOConfig(**{**BASE, "stop_at_return": 475.0}).stop_at_return == 475.0
    assert PPOConfig(**{**BASE, "eval_episodes": 0}).eval_episodes == 0


def test_num_minibatches_must_divide_batch(compilations):
    with pytest.raises(ValueError, match=r"num_minibatches=3 must divide .* = 64") as info:
        PPOConfig(**{**BASE, "num_minibatches": 3})  # 4 * 16 = 64
    assert "[1, 2, 4, 8, 16, 32, 64]" in str(info.value)  # allowed values are listed
    assert compilations() == 0
    # a divisor that is not a power of two is fine
    assert PPOConfig(**{**BASE, "num_envs": 3, "num_steps": 10, "num_minibatches": 5}).minibatch_size == 6


def test_total_env_steps_at_least_one_update(compilations):
    with pytest.raises(ValueError, match=r"total_env_steps=63 must be >= .* 64"):
        PPOConfig(**{**BASE, "total_env_steps": 63})
    assert compilations() == 0
    assert PPOConfig(**{**BASE, "total_env_steps": 64}).num_updates == 1


@pytest.mark.parametrize("field, value", [
    ("seed", 0), ("seed", 2**32 - 1), ("gamma", 0.0), ("gamma", 1.0), ("gae_lambda", 0), ("gae_lambda", 1),
    ("vf_coef", 0.0), ("ent_coef", 0), ("learning_rate", 1), ("eval_episodes", 0), ("activation", "relu"),
    ("hidden_sizes", (1,)), ("stop_at_return", -3), ("env", "gymnax:Pendulum-v1"),
])
def test_boundary_values_are_accepted(field, value):
    config = PPOConfig(**{**BASE, field: value})
    assert getattr(config, field) == value


def test_bare_env_id_is_normalised_to_one_spelling():
    bare, prefixed = PPOConfig(**{**BASE, "env": "CartPole-v1"}), PPOConfig(**{**BASE, "env": "gymnax:CartPole-v1"})
    assert bare.env == "gymnax:CartPole-v1" and bare == prefixed and hash(bare) == hash(prefixed)


def test_derived_sizes():
    c = PPOConfig(env="gymnax:CartPole-v1", total_env_steps=1000, num_envs=4, num_steps=16,
                  num_minibatches=8, update_epochs=3, eval_every_env_steps=200)
    assert c.batch_size == 64
    assert c.minibatch_size == 8
    assert c.num_updates == 15  # 1000 // 64
    assert c.env_steps == 960
    assert c.num_gradient_steps == 15 * 3 * 8
    assert c.updates_per_chunk == 3  # 200 // 64
    # eval interval below one batch: one update per chunk
    assert c.replace(eval_every_env_steps=10).updates_per_chunk == 1
    # eval interval beyond the budget: at most num_updates per chunk
    assert c.replace(eval_every_env_steps=10**9).updates_per_chunk == 15


def test_describe_mentions_the_numbers():
    c = PPOConfig(env="gymnax:CartPole-v1", total_env_steps=1000, num_envs=4, num_steps=16,
                  num_minibatches=8, update_epochs=3, eval_every_env_steps=200, eval_episodes=7)
    text = c.describe()
    for piece in ("CartPole-v1", "gymnax", "15 updates", "64 env steps", "num_envs=4", "num_steps=16",
                  "960 env steps", "3 epochs", "8 minibatches of 8", "360 gradient steps", "chunks of 3",
                  "7 episodes", "Discrete(2)", "(4,)"):
        assert piece in text, (piece, text)
    assert "episodes" not in c.replace(eval_episodes=0).describe()


def test_env_spec_is_resolved():
    c = PPOConfig(**{**BASE, "env": "gymnax:Pendulum-v1"})
    assert c.env_spec.backend == "gymnax"
    assert c.env_spec.name == "Pendulum-v1"
    assert c.env_spec.action_kind == "continuous"
    assert PPOConfig(**BASE).env_spec.action_kind == "discrete"


def test_replace_round_trip():
    c = PPOConfig(**BASE)
    assert c.replace() == c
    d = c.replace(gamma=0.9, num_envs=8, hidden_sizes=(32,))
    assert (d.gamma, d.num_envs, d.hidden_sizes) == (0.9, 8, (32,))
    assert d.batch_size == 8 * 16
    assert d != c
    assert d.replace(gamma=c.gamma, num_envs=c.num_envs, hidden_sizes=c.hidden_sizes) == c
    assert c.gamma == 0.99  # the original is unchanged
    # the resolved env follows the env field
    assert c.replace(env="gymnax:Pendulum-v1").env_spec.name == "Pendulum-v1"


def test_frozen():
    c = PPOConfig(**BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.gamma = 0.5  # type: ignore[misc]


def test_hashable_and_equal():
    a, b = PPOConfig(**BASE), PPOConfig(**BASE)
    assert a is not b
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    c = a.replace(seed=1)
    assert c != a
    assert len({a, b, c}) == 2
    # an env object config is hashable too, and equal only for the same object
    env = CartPole()
    e1, e2 = PPOConfig(**{**BASE, "env": env}), PPOConfig(**{**BASE, "env": env})
    assert e1 == e2 and hash(e1) == hash(e2)
    assert e1 != PPOConfig(**{**BASE, "env": CartPole()})


def test_to_dict_is_json_friendly():
    import json

    d = PPOConfig(**{**BASE, "env": CartPole()}).to_dict()
    assert d["env"].startswith("object:") and d["env"].endswith("CartPole")
    assert d["hidden_sizes"] == [64, 64]
    assert json.loads(json.dumps(d))["num_envs"] == 4
    assert set(d) == {f.name for f in dataclasses.fields(PPOConfig)}


def test_gymnax_is_not_stepped_by_validation(compilations):
    """Constructing a config only reads spaces; it never resets or steps the env."""
    calls = []

    class Spy(CartPole):
        def reset(self, key, params=None):
            calls.append("reset")
            return super().reset(key, params)

        def step(self, key, state, action, params=None):
            calls.append("step")
            return super().step(key, state, action, params)

    PPOConfig(**{**BASE, "env": Spy()})
    assert calls == []
    assert compilations() == 0


def test_numpy_scalars_from_a_sweep_are_accepted_as_plain_numbers():
    import numpy as np

    cfg = PPOConfig(**{**BASE, "num_envs": np.int64(4), "learning_rate": np.float32(1e-3), "anneal_lr": np.bool_(False)})
    assert type(cfg.num_envs) is int and type(cfg.learning_rate) is float and cfg.anneal_lr is False
    assert cfg == PPOConfig(**{**BASE, "num_envs": 4, "learning_rate": float(np.float32(1e-3)), "anneal_lr": False})


DQN_BASE = dict(num_envs=4, num_steps=2, buffer_capacity=512, batch_size=16, learning_starts=48, replay_ratio=0.25,
                total_env_steps=160, eval_every_env_steps=80, eval_episodes=2, hidden_sizes=(16,))


def _int_fields(cls):
    return [f.name for f in dataclasses.fields(cls) if f.type in ("int", "int | None")]


def test_what_users_write_is_accepted_whole_floats_and_lists():
    """``total_env_steps=1e6`` and ``hidden_sizes=[64, 64]``: every int field of both configs takes a
    whole float as its int, a list becomes a tuple; the configs equal (and hash as) the int/tuple ones."""
    from tianji_jax import DQNConfig

    big = PPOConfig(**{**BASE, "total_env_steps": 1e6, "hidden_sizes": [64, 64]})
    assert type(big.total_env_steps) is int and big.total_env_steps == 1_000_000 and big.hidden_sizes == (64, 64)
    assert big == PPOConfig(**{**BASE, "total_env_steps": 1_000_000}) and hash(big) == hash(big.replace())
    for cls, base in ((PPOConfig, BASE), (DQNConfig, DQN_BASE)):
        good = cls(**base)
        names = [n for n in _int_fields(cls) if getattr(good, n) is not None]
        assert {"total_env_steps", "num_envs", "seed", "eval_every_env_steps"} <= set(names)
        for name in names:
            as_float = cls(**{**base, name: float(getattr(good, name))})
            assert as_float == good and type(getattr(as_float, name)) is int, name
        assert cls(**{**base, "hidden_sizes": list(good.hidden_sizes)}) == good
        assert good.replace(hidden_sizes=[32, 32]).hidden_sizes == (32, 32)


@pytest.mark.parametrize("cls_name", ["PPOConfig", "DQNConfig"])
def test_non_whole_floats_in_int_fields_are_still_refused(cls_name):
    import tianji_jax

    cls = getattr(tianji_jax, cls_name)
    base = BASE if cls is PPOConfig else DQN_BASE
    for name in _int_fields(cls):
        with pytest.raises(TypeError, match=rf"^{name} must be an int, got 1\.5 \(float\)$"):
            cls(**{**base, name: 1.5})


def test_minibatches_of_one_step_with_advantage_normalisation_are_rejected():
    with pytest.raises(ValueError, match=r"num_minibatches=64 leaves minibatches of 1 step"):
        PPOConfig(**{**BASE, "num_minibatches": 64})
    PPOConfig(**{**BASE, "num_minibatches": 64, "normalize_advantages": False})


@pytest.mark.parametrize("field, value", [("schedule", "sync"), ("max_policy_lag", 1), ("num_actors", 2),
                                          ("queue_batches", 3), ("stall_timeout_s", 5.0)])
def test_async_only_fields_are_refused_under_anakin(field, value):
    """A value that Anakin would silently ignore is an error naming the field and what is allowed."""
    with pytest.raises(ValueError, match=rf"{field}={value!r} only applies to runtime='async'.*Allowed: "
                                         rf"runtime='async', or {field}="):
        PPOConfig(**{**BASE, field: value})
    PPOConfig(**{**BASE, "runtime": "async", field: value, **({"max_policy_lag": 0} if value == "sync" else {})})
    if field != "queue_batches":  # DQN has no queue_batches
        from tianji_jax import DQNConfig

        with pytest.raises(ValueError, match=rf"{field}={value!r} only applies to runtime='async'"):
            DQNConfig(env="gymnax:CartPole-v1", **{field: value})


@pytest.mark.parametrize("cls", ["ppo", "pqn", "dqn", "sac"])
def test_compile_keys_are_derived_from_the_field_groups(cls):
    """Every field of the run / tianji / layout groups is reset by the compile key (one for every
    algorithm), every other field enters it; the async-only check covers exactly the tianji group."""
    from tianji_jax.algos.config_base import FIELD_GROUPS, fields_in, not_compiled
    from tianji_jax.runtime.anakin import compile_key as key

    import tianji_jax as tj

    cls = {"ppo": PPOConfig, "pqn": tj.PQNConfig, "dqn": tj.DQNConfig, "sac": tj.SACConfig}[cls]
    config = cls()
    grouped = fields_in(config, *FIELD_GROUPS)
    assert set(not_compiled(config)) == set(grouped)
    assert {"seed", "stop_at_return", "schedule", "num_actors", "stall_timeout_s", "actor_backend",
            "num_learner_devices", "num_learner_groups"} <= set(grouped)
    assert not {"env", "total_env_steps", "learning_rate", "gamma", "hidden_sizes", "num_envs"} & set(grouped)
    changed = config.replace(seed=7, stop_at_return=100.0, max_nonfinite_updates=9, runtime="async", num_actors=2,
                             schedule="relaxed", stall_timeout_s=5.0)
    assert key(changed) == key(config)
    assert key(config.replace(learning_rate=1e-3)) != key(config)
    with pytest.raises(ValueError, match="only applies to runtime='async'"):
        cls(stall_timeout_s=5.0)
    assert fields_in(config, "tianji")[0] in ("schedule", "max_policy_lag")
