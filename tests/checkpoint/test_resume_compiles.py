"""A resume in the same process compiles nothing new (issue 39, item 7): the restored train state
has the avals and the placement of a fresh one -- every leaf with the template's dtype and weak
type (a gymnax env state's ``time`` is weakly typed, made from a Python int; orbax gave it back
strongly typed), uncommitted on the default device (orbax gave committed arrays) -- so the train
chunk, the evaluator and the checkpoint checksums hit the jit caches that the uninterrupted run
filled, and the restore's own verification runs in numpy."""

from __future__ import annotations

import pytest

import tianji_jax as tj
from resume_check import Stop, assert_same_leaves

pytestmark = pytest.mark.timeout(300)

# 4 chunks of 2 x 8 env steps (an evaluation after every 2nd): tiny networks, a few seconds each
_ON_POLICY = dict(num_envs=2, num_steps=8, num_minibatches=1, update_epochs=1, total_env_steps=64,
                  eval_every_env_steps=32, eval_episodes=1, hidden_sizes=(8,))
_REPLAY = dict(num_envs=2, num_steps=4, buffer_capacity=64, batch_size=8, learning_starts=16, replay_ratio=0.25,
               total_env_steps=64, eval_every_env_steps=32, eval_episodes=1, hidden_sizes=(8,))
CONFIGS = {
    "ppo": lambda: tj.PPOConfig(**_ON_POLICY),
    "pqn": lambda: tj.PQNConfig(**_ON_POLICY),
    "dqn": lambda: tj.DQNConfig(**_REPLAY),
    "sac": lambda: tj.SACConfig(**_REPLAY, env="gymnax:Pendulum-v1"),
}


@pytest.mark.parametrize("runtime", ["anakin", "async"])
@pytest.mark.parametrize("algo", sorted(CONFIGS))
def test_a_resume_in_the_same_process_compiles_nothing(tmp_path, compile_counter, algo, runtime):
    """The uninterrupted run comes first and compiles every program of the whole run (its chunks,
    the shorter last one included, the evaluator, the checksums of each save); then the same
    config runs to its first row and stops, and is resumed. What the resumed part runs is the
    same programs on arrays of the same avals and placement, and the restore verifies its
    checksums in numpy: nothing is legitimately new, so the count is 0 (it was 1 to 3, e.g. 3
    for Anakin PPO: the chunk, the evaluator and the checksums)."""
    config = CONFIGS[algo]()
    if runtime == "async":
        config = config.replace(runtime="async", schedule="sync")
    full = tj.train(config, run_dir=tmp_path / "full", progress=False)

    def stop_after_first(row):
        raise Stop

    with pytest.raises(Stop):
        tj.train(config, run_dir=tmp_path / "cut", progress=False, callback=stop_after_first)
    compile_counter.reset()
    resumed = tj.train(config, run_dir=tmp_path / "cut", progress=False, resume=True)
    assert compile_counter.count == 0
    assert list(resumed.curve["env_steps"]) == list(full.curve["env_steps"])  # it went on from the checkpoint
    assert_same_leaves(full.state, resumed.state)  # and exactly so
