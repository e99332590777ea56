"""TailCompile: the last, shorter chunk of an Anakin run compiled in a background thread."""

import jax
import jax.numpy as jnp
import numpy as np

import tianji_jax as tj
from tianji_jax.runtime import tail_compile
from tianji_jax.runtime.tail_compile import TailCompile


def _chunk(state):
    return jax.tree.map(lambda x: x * 2 + 1, state), {"loss": state["a"].sum()}


def test_starts_only_when_full_chunks_left_take_about_the_compile_time():
    tj.clear_caches()
    jitted = jax.jit(_chunk, donate_argnums=0)
    tail = TailCompile(jitted)
    state = {"a": jnp.arange(4.0), "b": jnp.ones((2, 3), jnp.int32)}
    tail.after_chunk(state, seconds=3.0, full_chunks_left=100)  # the first chunk: the estimate
    assert tail.compile_s == 3.0 and tail._thread is None
    tail.after_chunk(state, seconds=0.1, full_chunks_left=31)  # 3.1 s of chunks left > 3.0 s
    assert tail._thread is None
    tail.after_chunk(state, seconds=0.1, full_chunks_left=30)
    assert tail._thread is not None
    tail.close()
    assert len(tail_compile._COMPILED) == 1
    expect = {"a": np.arange(4.0) * 2 + 1, "b": np.full((2, 3), 3)}
    out, metrics = tail(state)  # the ahead-of-time executable (donates ``state``)
    np.testing.assert_array_equal(out["a"], expect["a"])
    np.testing.assert_array_equal(out["b"], expect["b"])
    assert float(metrics["loss"]) == 6.0
    # a second run in the process finds the executable and starts no thread
    again = TailCompile(jitted)
    again.after_chunk(out, 3.0, 0)
    again.after_chunk(out, 0.1, 0)
    assert again._thread is None
    tj.clear_caches()
    assert not tail_compile._COMPILED


def test_call_without_compilation_ahead_compiles_in_line():
    tail = TailCompile(jax.jit(_chunk))
    out, _ = tail({"a": jnp.ones(2), "b": jnp.zeros((), jnp.int32)})
    np.testing.assert_array_equal(out["a"], [3.0, 3.0])
    tail.close()  # nothing in flight: returns at once


def test_failed_compilation_is_raised_by_the_call():
    def bad(state):
        return state["a"] @ state["b"], {}  # (4,) @ (2, 3): shape error at trace time

    tail = TailCompile(jax.jit(bad))
    state = {"a": jnp.ones(4), "b": jnp.ones((2, 3))}
    tail.after_chunk(state, 1.0, 5)
    tail.after_chunk(state, 1.0, 0)
    tail.close()
    try:
        tail(state)
    except TypeError as err:
        assert "dot_general" in str(err) or "shape" in str(err).lower()
    else:
        raise AssertionError("the call did not raise")


def test_anakin_run_with_a_tail_chunk_matches_one_chunk_per_update(tmp_path):
    """A PPO run whose last chunk is shorter (compiled ahead) ends with the same params as the
    same run in chunks of one update each."""
    base = dict(total_env_steps=5 * 4 * 16, num_envs=4, num_steps=16, num_minibatches=2, update_epochs=1,
                eval_episodes=0)
    a = tj.train(tj.PPOConfig(**base, eval_every_env_steps=2 * 64), progress=False)  # chunks 2, 2, 1
    b = tj.train(tj.PPOConfig(**base, eval_every_env_steps=64), progress=False)  # chunks 1 x 5
    assert len(a.curve["env_steps"]) == 3 and list(a.curve["env_steps"])[-1] == 320
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
