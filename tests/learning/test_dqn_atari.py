"""DQN on envpool Atari: the host actor's frame chunks -> frame-deduplicated replay wiring (sampled
obs / next_obs / n-step targets equal the transitions envpool produced, also across a chunk the
lag gate dropped), per-game episode statistics with episodic life, evaluation settings, the
Nature CNN Q-network, config errors and a checkpoint of the frame replay."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest

import tianji_jax as tj
from tianji_jax.buffers import frame_replay
from tianji_jax.envs.host import EnvpoolVecEnv
from tianji_jax.runtime.actors.replay_host import ReplayHostActor, HostNStep, chunk_episode_stats
from tianji_jax.algos.dqn.agent import DQNAgent

pytestmark = pytest.mark.timeout(300)

SMALL = dict(total_env_steps=4_000, num_envs=2, num_steps=8, buffer_capacity=2_000, learning_starts=64,
             batch_size=8, replay_ratio=1 / 16, eval_episodes=0, eval_every_env_steps=64)


def _key(obs, action, reward, discount, next_obs) -> tuple:
    return (hashlib.sha1(np.ascontiguousarray(obs).tobytes()).hexdigest(), int(action), round(float(reward), 4),
            round(float(discount), 4), hashlib.sha1(np.ascontiguousarray(next_obs).tobytes()).hexdigest())


def test_frame_chunks_rebuild_envpool_transitions_and_count_games():
    """Breakout with episodic life (lost lives: terminated, the stack carries on) and a 60-step game
    limit (truncations), 3-step targets: every transition sampled from the frame replay equals an
    n-step transition built by HostNStep from the raw chunks envpool produced (obs stacks, action,
    n-step return, discount, next_obs), the replay holds all of them, and no transition reaches
    across a chunk the lag gate dropped. Episode statistics count games, not lives."""
    cfg = tj.DQNConfig.atari("envpool:Breakout-v5", n_step=3, gamma=0.9, **SMALL)
    assert cfg.frame_replay and cfg.atari_settings["episodic_life"]
    parts = DQNAgent(cfg)
    assert parts.network.torso == "nature_cnn"
    params = parts.init_learner(jax.random.PRNGKey(0)).params
    actor = ReplayHostActor(cfg, parts, jax.jit(parts.host_act), None, 0, jax.random.PRNGKey(1), None, None,
                         lambda: 0, lambda *_: None)
    actor.env.close()  # short games so truncations, lost lives and game overs all occur
    actor.env = EnvpoolVecEnv("Breakout-v5", 2, seed=5, episodic_life=True, reward_clip=True, max_episode_steps=60)
    raw = []
    frame_chunk = actor._frame_chunk
    actor._frame_chunk = lambda chunk: (raw.append(jax.tree.map(np.array, chunk)), frame_chunk(chunk))[1]
    chunks = [actor(params, 0)[0][0] for _ in range(30)]
    actor.close()
    assert [c[1] for c in chunks] == list(range(30))  # sequence numbers

    reference = HostNStep(parts)  # exact n-step transitions of the whole stream (tested in test_dqn_host)
    ref, n_ref, n_ref_before_gap = set(), 0, 0
    for i, c in enumerate(raw):
        items, _, mask = jax.device_get(reference(c))
        ref |= {_key(*(np.asarray(x)[j] for x in (items.obs, items.action, items.reward, items.discount,
                                                   items.next_obs))) for j in np.flatnonzero(mask)}
        n_ref += int(mask.sum())
        n_ref_before_gap += int(mask.sum()) if i < 14 else 0
    # per-game statistics: a lost life (terminated, the game goes on) is not an episode
    term = np.concatenate([np.asarray(c["terminated"]).ravel() for c in raw])
    trunc = np.concatenate([np.asarray(c["truncated"]).ravel() for c in raw])
    length = np.concatenate([np.asarray(c["episode_length"]).ravel() for c in raw])
    games = sum(chunk_episode_stats(c)["episode_count"] for c in raw)
    assert games == int((length > 0).sum()) > 0 and trunc.any()
    assert (term & (length == 0)).any()  # lives lost without an episode ending
    assert ((length > 0) <= (term | trunc)).all()

    insert = jax.jit(parts.insert_frames, donate_argnums=0)
    sample = jax.jit(frame_replay.sample, static_argnames="batch_size")

    def sampled(rs, n=4096):
        """Keys of n sampled transitions, except the newest n - 1 starts of each env (the reference
        holds those back; the replay has them where their episode already ended)."""
        s = jax.device_get(sample(rs, jax.random.PRNGKey(0), batch_size=n))
        t, count = s.transition, np.asarray(rs.count)
        return {_key(t.obs[j], t.action[j], t.reward[j], t.discount[j], t.next_obs[j]) for j in range(n)
                if s.step[j] < count[s.env_id[j]] - 3}

    rs = parts.init_replay()
    for i in range(14):
        rs = insert(rs, chunks[i][0], np.int32(0), np.bool_(False))
    got = sampled(rs)
    assert got <= ref and len(got) > 100
    # the valid starts are the reference's, plus at most n - 1 per env whose episode ended within the held-back steps
    assert n_ref_before_gap <= int(rs.num_valid) <= n_ref_before_gap + 2 * 2
    # chunk 14 dropped by the gate: the next chunk restarts every env's stack (gap); nothing spans the gap
    for i in range(15, 30):
        rs = insert(rs, chunks[i][0], np.int32(0), np.bool_(i == 15))
    got = sampled(rs)
    assert got <= ref
    # loses the starts of chunk 14 and the n - 1 per env before it whose lookahead the gap cut
    assert n_ref - 16 - 2 * 2 <= int(rs.num_valid) <= n_ref + 2 * 2


def test_atari_config_defaults_and_errors():
    cfg = tj.DQNConfig.atari()
    assert (cfg.buffer_capacity, cfg.batch_size, cfg.learning_starts, cfg.target_update_period,
            cfg.epsilon_end, cfg.epsilon_decay_fraction) == (1_000_000, 32, 80_000, 250, 0.01, 0.1)
    assert cfg.replay_bytes == frame_replay.frame_replay_bytes(8, 1_000_000) < 24 * 2**30 < cfg.stacked_replay_bytes
    text = cfg.describe()
    assert "frames stored once: 6.61 GiB" in text and "52.61 GiB" in text
    # non-Atari defaults untouched, Atari settings refused there
    assert not tj.DQNConfig().frame_replay and tj.DQNConfig().hidden_sizes == (120, 84)
    with pytest.raises(ValueError, match="repeat_action_probability=0.25: Atari settings apply to envpool Atari"):
        tj.DQNConfig(repeat_action_probability=0.25)
    with pytest.raises(ValueError, match="repeat_action_probability must be in"):
        tj.DQNConfig.atari(repeat_action_probability=1.5)
    with pytest.raises(TypeError, match="episodic_life must be a bool"):
        tj.DQNConfig.atari(episodic_life=1)
    with pytest.raises(ValueError, match=r"buffer_capacity=16 must be >= num_actors \* num_envs \* \(frame stack \+ n_step\) = 4 \* \(4 \+ 1\) = 20"):
        tj.DQNConfig.atari(**{**SMALL, "buffer_capacity": 16, "num_envs": 4, "replay_ratio": 1 / 32})
    with pytest.raises(MemoryError, match="buffer_capacity=1000000000"):
        tj.DQNConfig.atari(buffer_capacity=1_000_000_000, total_env_steps=2_000_000_000)
    # training envs get the settings, evaluation envs play whole games with raw scores and the same stickiness
    sticky = tj.DQNConfig.atari(repeat_action_probability=0.25, reward_clip=False)
    with sticky.env_spec.make_host_env(1, 0, atari=sticky.atari_settings) as env:
        c = env._env.spec.config
        assert c.episodic_life and not c.reward_clip and c.repeat_action_probability == 0.25 and c.stack_num == 4
    with sticky.env_spec.make_host_env(1, 0, evaluation=True, atari=sticky.atari_settings) as env:
        c = env._env.spec.config
        assert not c.episodic_life and not c.reward_clip and c.repeat_action_probability == 0.25
    with pytest.raises(ValueError, match="unknown settings"):
        sticky.env_spec.make_host_env(1, 0, atari={"frame_skip": 2})


@pytest.mark.slow
def test_async_pong_dqn_prioritised_checkpoint_roundtrip(tmp_path):
    """A short prioritised async run on Pong: learner blocks run, the frame replay fills, and the
    checkpoint holds the frame replay (loaded back equal to what was saved)."""
    cfg = tj.DQNConfig.atari(prioritized=True, n_step=3, total_env_steps=480, num_envs=4, num_steps=1,
                             buffer_capacity=2_000, learning_starts=160, batch_size=16, replay_ratio=0.25,
                             eval_every_env_steps=160, eval_episodes=1)  # one game per row: evaluation is not tested here
    res = tj.train(cfg, run_dir=tmp_path / "run", progress=False)
    c = res.curve
    assert len(c["env_steps"]) >= 2 and np.isfinite(c["td_loss"]).all()
    assert abs(c["replay_ratio_observed"][-1] - 0.25) < 0.1
    loaded = tj.load(tmp_path / "run")
    rs = loaded.state.replay
    assert isinstance(rs, frame_replay.FrameReplayState) and rs.prioritised
    assert int(rs.num_valid) > 0 and int(rs.count.sum()) >= int(c["env_steps"][-1]) - 16
    assert float(rs.max_priority) != 1.0  # priorities were updated by the learner
