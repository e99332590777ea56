"""Host env backends (envpool sync/async, gymnasium) and the TrajectoryChunker.

The host envs are checked against an observer of the *raw* backend stream (a proxy around the
envpool/gymnasium object that records every array it returns), from which the test recounts
validity, final observations and episode statistics itself. The chunker is checked against a
scripted fake env that logs the true transition sequence of every env, and an actor log of the
policy version each action was taken with.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tianji_jax.envs.host import (EnvpoolVecEnv, GymnasiumVecEnv, HostStep, envpool_ids,
                                  from_gymnasium_space)
from tianji_jax.envs.spaces import Box, Discrete
from tianji_jax.runtime.actors.chunker import CHUNK_KEYS, TrajectoryChunker

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:.*precision lowered.*:UserWarning")]

LIMIT = 20  # short time limit so truncations happen quickly


# ---- a recorder of the raw backend stream ----------------------------------------------------------
class RawRecorder:
    """Wraps an envpool or gymnasium vector env and records what it returns (deep copies)."""

    def __init__(self, env, num_envs):
        self._env = env
        self._n = num_envs
        self.log: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._env, name)

    def _record(self, out, reset: bool):
        if reset:
            obs, info = out
            rew = np.zeros(len(obs), np.float32)
            term = trunc = np.zeros(len(obs), bool)
        else:
            obs, rew, term, trunc, info = out
        ids = np.asarray(info["env_id"]) if "env_id" in info else np.arange(self._n)
        self.log.append(dict(obs=np.array(obs, copy=True), reward=np.array(rew, np.float64),
                             terminated=np.array(term, bool), truncated=np.array(trunc, bool),
                             env_id=ids.copy(), info=copy.deepcopy(info)))
        return out

    def reset(self, *a, **k):
        return self._record(self._env.reset(*a, **k), reset=True)

    def step(self, *a, **k):
        return self._record(self._env.step(*a, **k), reset=False)

    def recv(self, *a, **k):
        return self._record(self._env.recv(*a, **k), reset=False)


def cartpole_policy(step: HostStep) -> np.ndarray:
    """Even env ids balance the pole (reach the time limit), odd ones push left (terminate)."""
    balance = (step.obs[:, 2] + 0.5 * step.obs[:, 3] > 0).astype(np.int32)
    return np.where(step.env_id % 2 == 0, balance, 0).astype(np.int32)


def run_host(env, recorder: RawRecorder, num_calls: int, policy=cartpole_policy):
    steps = [env.reset()]
    for _ in range(num_calls):
        prev = steps[-1]
        steps.append(env.step(policy(prev), prev.env_id))
    assert len(recorder.log) == len(steps)
    return steps


def check_stream(steps: list[HostStep], raw: list[dict], num_envs: int, *, atari: bool = False):
    """Recount validity, final obs, flags and statistics per env from the raw stream."""
    expect_reset = np.ones(num_envs, bool)      # first obs of every env is a reset step
    ret = np.zeros(num_envs)
    length = np.zeros(num_envs, int)
    counts = dict(invalid=0, done=0, terminated=0, truncated=0, episodes=0)
    for hs, r in zip(steps, raw):
        assert isinstance(hs, HostStep)
        np.testing.assert_array_equal(hs.env_id, r["env_id"])
        assert hs.obs.shape[0] == hs.reward.shape[0] == len(hs)
        assert hs.reward.dtype == np.float32 and hs.episode_return.dtype == np.float32
        assert hs.episode_length.dtype == np.int32 and hs.env_id.dtype == np.int32
        assert hs.valid.dtype == hs.terminated.dtype == hs.truncated.dtype == np.dtype(bool)
        np.testing.assert_array_equal(hs.obs, r["obs"])
        np.testing.assert_array_equal(hs.final_obs, r["obs"])      # envpool's terminal obs on done
        np.testing.assert_array_equal(hs.terminated, r["terminated"])
        np.testing.assert_array_equal(hs.truncated, r["truncated"])
        stat_reward = r["info"].get("reward", r["reward"]) if atari else r["reward"]
        for i, e in enumerate(hs.env_id):
            done = bool(r["terminated"][i] or r["truncated"][i])
            assert hs.valid[i] == (not expect_reset[e]), (e, hs.valid[i])
            if not hs.valid[i]:
                counts["invalid"] += 1
                assert r["reward"][i] == 0 and not done       # a reset step: no reward, no flags
                if "elapsed_step" in r["info"] and not atari:
                    assert r["info"]["elapsed_step"][i] == 0
            else:
                ret[e] += stat_reward[i]
                length[e] += 1
            if "elapsed_step" in r["info"] and not atari:
                # the time limit is flagged as truncation, never as termination
                at_limit = r["info"]["elapsed_step"][i] == LIMIT
                assert bool(hs.truncated[i]) == at_limit
                if at_limit:
                    assert not hs.terminated[i]
            game_over = done and (not atari or bool(r["truncated"][i])
                                  or bool(r["info"]["terminated"][i]))
            if hs.valid[i] and game_over:
                counts["episodes"] += 1
                assert hs.episode_return[i] == np.float32(ret[e]), (e, hs.episode_return[i], ret[e])
                assert hs.episode_length[i] == length[e]
                if r["truncated"][i] and not atari:
                    assert length[e] == LIMIT
                ret[e], length[e] = 0.0, 0
            else:
                assert hs.episode_return[i] == 0 and hs.episode_length[i] == 0
            if done:
                counts["done"] += 1
                counts["terminated"] += int(r["terminated"][i])
                counts["truncated"] += int(r["truncated"][i])
            expect_reset[e] = done
    return counts


# ---- envpool ---------------------------------------------------------------------------------------
def make_envpool(num_envs, batch_size=None, **kw):
    env = EnvpoolVecEnv("CartPole-v1", num_envs, batch_size=batch_size, seed=3,
                        max_episode_steps=LIMIT, num_threads=1, **kw)
    rec = RawRecorder(env._env, num_envs)
    env._env = rec
    return env, rec


def test_envpool_sync_cartpole_stream():
    env, rec = make_envpool(4)
    with env:
        assert env.observation_space == Box((4,), np.float32, env.observation_space.low,
                                            env.observation_space.high)
        assert env.action_space == Discrete(2) and not env.is_async and env.batch_size == 4
        steps = run_host(env, rec, 120)
    counts = check_stream(steps, rec.log, 4)
    assert counts["terminated"] >= 4 and counts["truncated"] >= 4
    # exactly one invalid (reset) step per done step, plus the first obs of each env
    assert counts["invalid"] == counts["done"] - sum(steps[-1].done) + 4
    assert counts["episodes"] == counts["done"]
    for hs in steps:
        np.testing.assert_array_equal(hs.env_id, np.arange(4))


def test_envpool_sync_env_id_permutation_orders_actions():
    """In sync mode ``actions[i]`` goes to env ``env_id[i]``: permuted ids give the same envs' result."""
    outs = []
    for actions, ids in ((np.array([1, 0], np.int32), np.array([1, 0])),
                         (np.array([0, 1], np.int32), None)):
        env, _ = make_envpool(2)
        with env:
            env.reset()
            outs.append(env.step(actions, ids))
    np.testing.assert_array_equal(outs[0].obs, outs[1].obs)
    np.testing.assert_array_equal(outs[0].env_id, [0, 1])


def test_envpool_async_cartpole_stream():
    env, rec = make_envpool(8, batch_size=4)
    with env:
        assert env.is_async and env.batch_size == 4
        steps = run_host(env, rec, 240)
    counts = check_stream(steps, rec.log, 8)
    assert all(len(hs) == 4 for hs in steps)
    assert counts["terminated"] >= 8 and counts["truncated"] >= 8
    assert counts["episodes"] == counts["done"]
    seen = np.concatenate([hs.env_id for hs in steps])
    assert set(seen.tolist()) == set(range(8))
    for hs in steps:
        assert np.unique(hs.env_id).size == len(hs)


def test_envpool_atari_episodic_life_counts_games():
    """SpaceInvaders with episodic_life: a lost life is terminal for learning, but statistics are
    per game, and sum the unclipped score ``info["reward"]`` while ``reward`` is clipped."""
    env = EnvpoolVecEnv("SpaceInvaders-v5", 2, seed=0, episodic_life=True, reward_clip=True,
                        num_threads=1)
    rec = RawRecorder(env._env, 2)
    env._env = rec
    rng = np.random.default_rng(0)
    with env:
        assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
        steps = [env.reset()]
        games = 0
        while games < 2 and len(steps) < 3000:
            steps.append(env.step(rng.integers(0, env.action_space.n, 2).astype(np.int32),
                                  steps[-1].env_id))
            games += int((steps[-1].episode_length > 0).sum())
    counts = check_stream(steps, rec.log, 2, atari=True)
    assert counts["episodes"] >= 2
    assert counts["terminated"] > counts["episodes"]       # lives lost before the game ended
    life_losses = sum(int((r["terminated"] & (r["info"]["terminated"] == 0)).sum()) for r in rec.log)
    assert life_losses >= 4
    assert any((r["info"]["reward"] != r["reward"]).any() for r in rec.log)   # clipping happened
    assert all(np.all(np.abs(hs.reward) <= 1) for hs in steps)
    games = np.concatenate([hs.episode_return[hs.episode_length > 0] for hs in steps])
    assert games.max() > 1


# ---- gymnasium -------------------------------------------------------------------------------------
def test_gymnasium_cartpole_stream():
    env = GymnasiumVecEnv("CartPole-v1", 4, seed=1, max_episode_steps=LIMIT)
    rec = RawRecorder(env._env, 4)
    env._env = rec
    with env:
        assert env.action_space == Discrete(2) and env.observation_space.shape == (4,)
        steps = run_host(env, rec, 120)
    # gymnasium has no elapsed_step: recount the time limit from valid steps instead
    counts = check_stream(steps, rec.log, 4)
    assert counts["terminated"] >= 4 and counts["truncated"] >= 4
    assert counts["invalid"] == counts["done"] - sum(steps[-1].done) + 4
    for hs in steps:
        trunc_rows = hs.truncated & hs.valid
        assert np.all(hs.episode_length[trunc_rows] == LIMIT)
        assert not np.any(hs.terminated & hs.truncated)


# ---- bad input -------------------------------------------------------------------------------------
def test_envpool_bad_construction():
    with pytest.raises(ValueError, match=r"env_id='CartPol-v1'.*CartPole-v1"):
        EnvpoolVecEnv("CartPol-v1", 2)
    with pytest.raises(ValueError, match=r"num_envs=0"):
        EnvpoolVecEnv("CartPole-v1", 0)
    with pytest.raises(ValueError, match=r"batch_size=5.*\[1, num_envs=4\]"):
        EnvpoolVecEnv("CartPole-v1", 4, batch_size=5)
    with pytest.raises(ValueError, match=r"batch_size=0"):
        EnvpoolVecEnv("CartPole-v1", 4, batch_size=0)
    with pytest.raises(ValueError, match=r"envpool_kwargs.*\['bogus'\].*max_episode_steps"):
        EnvpoolVecEnv("CartPole-v1", 2, bogus=1)
    assert "CartPole-v1" in envpool_ids() and "Pong-v5" in envpool_ids()


def test_envpool_bad_step_input():
    env, _ = make_envpool(4)
    with env:
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(4, np.int32))
        env.reset()
        with pytest.raises(ValueError, match=r"actions: expected shape \(4,\) and integer"):
            env.step(np.zeros(3, np.int32))
        with pytest.raises(ValueError, match=r"actions: expected shape \(4,\) and integer.*float32"):
            env.step(np.zeros(4, np.float32))
        with pytest.raises(ValueError, match=r"actions: Discrete\(2\) indices must lie in \[0, 2\)"):
            env.step(np.array([0, 1, 2, 0], np.int32))
        with pytest.raises(ValueError, match=r"env_id: .*\[0, 1, 2, 3\]"):
            env.step(np.zeros(4, np.int32), np.array([0, 1, 2, 2]))
        env.step(np.zeros(4, np.int32))          # still usable after rejected input
    with pytest.raises(RuntimeError, match="closed"):
        env.step(np.zeros(4, np.int32))


def test_envpool_async_bad_env_id():
    env, _ = make_envpool(8, batch_size=4)
    with env:
        first = env.reset()
        others = np.setdiff1d(np.arange(8), first.env_id)
        with pytest.raises(ValueError, match=r"env_id: required in async mode"):
            env.step(np.zeros(4, np.int32))
        with pytest.raises(ValueError, match=r"env_id: .*awaiting an action"):
            env.step(np.zeros(4, np.int32), others)
        with pytest.raises(RuntimeError, match="reset\\(\\) may be called only once"):
            env.reset()
        nxt = env.step(np.zeros(4, np.int32), first.env_id[::-1])
        assert len(nxt) == 4


def test_gymnasium_bad_input():
    with pytest.raises(ValueError, match=r"env_id='CartPol-v1'.*CartPole-v1"):
        GymnasiumVecEnv("CartPol-v1", 2)
    with pytest.raises(ValueError, match=r"num_envs=-1"):
        GymnasiumVecEnv("CartPole-v1", -1)
    with pytest.raises(ValueError, match=r"kwargs: .*bogus"):
        GymnasiumVecEnv("CartPole-v1", 2, bogus=1)
    with GymnasiumVecEnv("CartPole-v1", 2) as env:
        env.reset()
        with pytest.raises(ValueError, match=r"actions: expected shape \(2,\)"):
            env.step(np.zeros((2, 1), np.int64))
        with pytest.raises(ValueError, match=r"env_id: .*\[0, 1\]"):
            env.step(np.zeros(2, np.int64), np.array([0]))
    with pytest.raises(ValueError, match="Dict"):
        import gymnasium.spaces as gs
        from_gymnasium_space(gs.Dict({"a": gs.Discrete(2)}))


# ---- chunker: a scripted async env -----------------------------------------------------------------
class FakeAsyncEnv:
    """``n`` envs, ``b`` per batch, random arrival order, next-step auto-reset, ground-truth log.

    Obs of env ``e`` is ``[e, serial, episode]`` with ``serial`` counting every step of that env, so
    each obs identifies its step. Episodes last 1..max_len steps and end by termination or
    truncation at random. ``truth[e]`` lists env ``e``'s valid transitions in order.
    """

    def __init__(self, n, b, max_len, rng, weights=None):
        self.n, self.b, self.max_len, self.rng = n, b, max_len, rng
        self.weights = np.ones(n) if weights is None else np.asarray(weights, float)
        self.serial = np.zeros(n, int)
        self.ep = np.zeros(n, int) - 1
        self.t = np.zeros(n, int)
        self.length = np.zeros(n, int)
        self.need_reset = np.ones(n, bool)
        self.ret = np.zeros(n)
        self.cur = {}
        self.ready = {}
        self.ready_ignored = {}     # env -> its in-flight row is a reset step that ignored an action
        self.truth = [[] for _ in range(n)]
        self.ignored_actions = 0

    def _obs(self, e):
        return np.array([e, self.serial[e], self.ep[e]], np.float32)

    def _advance(self, e, action):
        self.serial[e] += 1
        if self.need_reset[e]:
            self.ignored_actions += action is not None
            ignored = action is not None
            self.ep[e] += 1
            self.t[e] = 0
            self.ret[e] = 0.0
            self.length[e] = self.rng.integers(1, self.max_len + 1)
            self.need_reset[e] = False
            obs = self._obs(e)
            row = (obs, 0.0, False, False, False, 0.0, 0)
        else:
            self.t[e] += 1
            obs = self._obs(e)
            reward = float(self.serial[e] % 7) - 2.0
            self.ret[e] += reward
            end = self.t[e] == self.length[e]
            term = bool(end and self.rng.random() < 0.5)
            trunc = bool(end and not term)
            self.truth[e].append(dict(obs=self.cur[e], action=action, reward=reward,
                                      terminated=term, truncated=trunc, final_obs=obs))
            row = (obs, reward, term, trunc, True, self.ret[e] if end else 0.0,
                   int(self.t[e]) if end else 0)
            ignored = False
            self.need_reset[e] = end
        self.cur[e] = obs
        self.ready[e] = row
        self.ready_ignored[e] = ignored

    def _recv(self):
        keys = np.array(sorted(self.ready))
        p = self.weights[keys] / self.weights[keys].sum()
        chosen = self.rng.choice(keys, size=min(self.b, len(keys)), replace=False, p=p)
        rows = [self.ready.pop(int(e)) for e in chosen]
        for e in chosen:
            del self.ready_ignored[int(e)]
        col = lambda i, dt: np.array([r[i] for r in rows], dt)  # noqa: E731
        obs = np.stack([r[0] for r in rows])
        return HostStep(env_id=chosen.astype(np.int32), obs=obs, reward=col(1, np.float32),
                        terminated=col(2, bool), truncated=col(3, bool), final_obs=obs,
                        valid=col(4, bool), episode_return=col(5, np.float32),
                        episode_length=col(6, np.int32))

    def reset(self):
        for e in range(self.n):
            self._advance(e, None)
        return self._recv()

    def step(self, actions, env_id):
        for e, a in zip(env_id, actions):
            assert int(e) not in self.ready
            self._advance(int(e), int(a))
        return self._recv()


def run_chunker(n, b, t, max_len, iters, seed, weights=None, capacity=None, version_every=3):
    rng = np.random.default_rng(seed)
    env = FakeAsyncEnv(n, b, max_len, rng, weights)
    chunker = TrajectoryChunker(n, t, (3,), np.float32, initial_capacity=capacity)
    acted = {}     # actor's own log: (env, serial) -> version it acted with
    version, chunks = 0, []
    hs = env.reset()
    chunker.record_step(hs)                     # all invalid, nothing pending: a no-op
    for it in range(iters):
        actions = rng.integers(0, 5, len(hs)).astype(np.int32)
        for e, o in zip(hs.env_id, hs.obs):
            acted[(int(e), int(o[1]))] = version
        chunker.record_action(hs.env_id, hs.obs, actions, -hs.obs[:, 1], 0.5 * hs.obs[:, 1], version)
        hs = env.step(actions, hs.env_id)
        chunker.record_step(hs)
        assert chunker.transitions_in == chunker.transitions_out + chunker.resident
        assert chunker.actions_recorded == (chunker.transitions_in + chunker.actions_discarded
                                            + chunker.pending)
        while chunker.ready():
            chunks.append(chunker.pop())
        if it % version_every == 0:
            version += 1
    return env, chunker, chunks, acted


def check_chunks(env, chunker, chunks, acted, n, t):
    assert chunker.actions_discarded == env.ignored_actions - sum(env.ready_ignored.values())
    assert chunker.transitions_out == len(chunks) * t * n
    # transitions the env made but the actor has not received yet (in flight) are not in it
    in_flight = np.zeros(n, int)
    for e, row in env.ready.items():
        in_flight[e] += int(row[4])
    received = np.array([len(tr) for tr in env.truth]) - in_flight
    assert chunker.transitions_in == received.sum()
    for k, c in enumerate(chunks):
        assert tuple(c) == CHUNK_KEYS
        for key in CHUNK_KEYS:
            want = (n, 3) if key == "last_obs" else (t, n, 3) if key in ("obs", "final_obs") else (t, n)
            assert c[key].shape == want, key
        assert c["policy_version"].dtype == np.int32 and c["action"].dtype == np.int32
        np.testing.assert_array_equal(c["done"], c["terminated"] | c["truncated"])
        np.testing.assert_array_equal(c["last_obs"], c["final_obs"][-1])
        for e in range(n):
            np.testing.assert_array_equal(c["obs"][:, e, 0], e)           # column e is env e
            truth = env.truth[e][k * t:(k + 1) * t]                       # T consecutive transitions
            assert len(truth) == t
            for row, tr in enumerate(truth):
                np.testing.assert_array_equal(c["obs"][row, e], tr["obs"])
                np.testing.assert_array_equal(c["final_obs"][row, e], tr["final_obs"])
                assert c["action"][row, e] == tr["action"]
                assert c["reward"][row, e] == np.float32(tr["reward"])
                assert c["terminated"][row, e] == tr["terminated"]
                assert c["truncated"][row, e] == tr["truncated"]
                assert c["policy_version"][row, e] == acted[(e, int(tr["obs"][1]))]
                assert c["log_prob"][row, e] == -tr["obs"][1]
                assert c["value"][row, e] == np.float32(0.5 * tr["obs"][1])
            # consecutive within a column: successor is the next obs unless the episode ended
            nd = ~c["done"][:-1, e]
            np.testing.assert_array_equal(c["final_obs"][:-1, e][nd], c["obs"][1:, e][nd])
            d = c["done"][:-1, e]
            assert np.all(c["obs"][1:, e, 1][d] > c["final_obs"][:-1, e, 1][d])   # a new episode
            # episode statistics: only where an episode ended, and then its return
            ended = c["done"][:, e]
            assert np.all(c["episode_length"][~ended, e] == 0)
            assert np.all(c["episode_length"][ended, e] >= 1)
    # leftovers: what is resident is exactly the truth not yet popped
    np.testing.assert_array_equal(chunker.counts, received - len(chunks) * t)


def test_chunker_scripted_async_stream():
    n, b, t = 4, 2, 5
    env, chunker, chunks, acted = run_chunker(n, b, t, max_len=4, iters=150, seed=0,
                                              weights=[0.3, 1, 1, 2], capacity=t)
    assert len(chunks) >= 3 and chunker.capacity > t           # a straggler made the ring grow
    assert chunker.actions_discarded > 0
    assert len({int(v) for c in chunks for v in c["policy_version"].ravel()}) > 3
    check_chunks(env, chunker, chunks, acted, n, t)


def test_chunker_sync_stream_and_leftovers():
    n, t = 3, 4
    env, chunker, chunks, acted = run_chunker(n, n, t, max_len=3, iters=30, seed=1)
    check_chunks(env, chunker, chunks, acted, n, t)
    assert chunker.resident > 0 or chunker.pending > 0


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 4), b_frac=st.floats(0.0, 1.0), t=st.integers(1, 5),
       max_len=st.integers(1, 6), seed=st.integers(0, 2**16),
       weights=st.lists(st.floats(0.1, 3.0), min_size=4, max_size=4),
       grow=st.booleans())
def test_chunker_property_random_dones_and_arrivals(n, b_frac, t, max_len, seed, weights, grow):
    b = max(1, int(round(b_frac * n)))
    env, chunker, chunks, acted = run_chunker(n, b, t, max_len, iters=40, seed=seed,
                                              weights=weights[:n], capacity=t if grow else None)
    check_chunks(env, chunker, chunks, acted, n, t)


def test_chunker_bad_input():
    with pytest.raises(ValueError, match=r"num_steps=0"):
        TrajectoryChunker(2, 0, (3,))
    with pytest.raises(ValueError, match=r"initial_capacity=2"):
        TrajectoryChunker(2, 4, (3,), initial_capacity=2)
    c = TrajectoryChunker(2, 2, (3,))
    obs = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"obs: expected shape \(2, 3\)"):
        c.record_action([0, 1], np.zeros((2, 4), np.float32), [0, 1], [0.0, 0.0], [0.0, 0.0], 0)
    with pytest.raises(ValueError, match=r"obs: .*float32"):
        c.record_action([0, 1], np.zeros((2, 3), np.complex64), [0, 1], [0.0, 0.0], [0.0, 0.0], 0)
    with pytest.raises(ValueError, match=r"env_id must be .*distinct ids in \[0, 2\)"):
        c.record_action([0, 0], obs, [0, 1], [0.0, 0.0], [0.0, 0.0], 0)
    with pytest.raises(ValueError, match=r"version: expected an integer"):
        c.record_action([0, 1], obs, [0, 1], [0.0, 0.0], [0.0, 0.0], 1.5)
    c.record_action([0, 1], obs, [0, 1], [0.0, 0.0], [0.0, 0.0], 0)
    with pytest.raises(ValueError, match=r"already have a pending action"):
        c.record_action([1], obs[:1], [0], [0.0], [0.0], 0)
    step = HostStep(env_id=np.array([0, 1], np.int32), obs=obs, reward=np.zeros(2, np.float32),
                    terminated=np.zeros(2, bool), truncated=np.zeros(2, bool), final_obs=obs,
                    valid=np.ones(2, bool), episode_return=np.zeros(2, np.float32),
                    episode_length=np.zeros(2, np.int32))
    assert c.record_step(step) == 2
    with pytest.raises(ValueError, match=r"no pending action"):
        c.record_step(step)
    with pytest.raises(RuntimeError, match=r"num_steps=2 transitions, have \[1, 1\]"):
        c.pop()
    spec_c = TrajectoryChunker.from_spaces(2, 3, Box((4,), np.float32, np.zeros(4), np.ones(4)),
                                           Box((2,), np.float32, -np.ones(2), np.ones(2)))
    assert spec_c.action_shape == (2,) and spec_c.action_dtype == np.float32


def test_chunker_extra_columns_travel_with_their_transitions():
    """The actor's extra columns (a recurrent core's state and reset flag) are stored with the
    transition they were recorded with, across ring growth, and validated like the others."""
    with pytest.raises(ValueError, match=r"extra: column names \['obs'\] are taken"):
        TrajectoryChunker(2, 2, (3,), extra={"obs": ((1,), np.float32)})
    c = TrajectoryChunker(2, 2, (3,), extra={"carry_0": ((4,), np.float32), "reset": ((), np.bool_)},
                          initial_capacity=2)
    obs = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"extra must name the columns \['carry_0', 'reset'\], got \[\]"):
        c.record_action([0, 1], obs, [0, 1], [0.0, 0.0], [0.0, 0.0], 0)
    with pytest.raises(ValueError, match=r"carry_0: expected shape \(2, 4\)"):
        c.record_action([0, 1], obs, [0, 1], [0.0, 0.0], [0.0, 0.0], 0,
                        {"carry_0": np.zeros((2, 5), np.float32), "reset": np.zeros(2, bool)})
    for t in range(5):  # env 1 runs ahead: the ring grows past its 2 slots
        ids = [0, 1] if t < 2 else [1]
        c.record_action(ids, obs[:len(ids)], ids, [0.0] * len(ids), [0.0] * len(ids), 0,
                        {"carry_0": np.full((len(ids), 4), 10 * t + np.asarray(ids, np.float32)[:, None]),
                         "reset": np.asarray(ids) == t})
        n = len(ids)
        c.record_step(HostStep(env_id=np.asarray(ids, np.int32), obs=obs[:n], reward=np.zeros(n, np.float32),
                               terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), final_obs=obs[:n],
                               valid=np.ones(n, bool), episode_return=np.zeros(n, np.float32),
                               episode_length=np.zeros(n, np.int32)))
    out = c.pop()
    np.testing.assert_array_equal(out["carry_0"][:, :, 0], [[0, 1], [10, 11]])
    np.testing.assert_array_equal(out["reset"], [[True, False], [False, True]])
    assert c.capacity >= 4 and c.counts.tolist() == [0, 3]
    c.record_action([0], obs[:1], [0], [0.0], [0.0], 0, {"carry_0": np.ones((1, 4), np.float32),
                                                            "reset": np.zeros(1, bool)})


# ---- the two together: envpool async + chunker --------------------------------------------------
def test_envpool_async_into_chunker():
    n, t = 8, 6
    env, _ = make_envpool(n, batch_size=4)
    chunker = TrajectoryChunker.from_spaces(n, t, env.observation_space, env.action_space)
    chunks, version = [], 0
    with env:
        hs = env.reset()
        for it in range(100):
            actions = cartpole_policy(hs)
            chunker.record_action(hs.env_id, hs.obs, actions, np.zeros(len(hs)), np.zeros(len(hs)),
                                  version)
            hs = env.step(actions, hs.env_id)
            chunker.record_step(hs)
            while chunker.ready():
                chunks.append(chunker.pop())
            version += it % 10 == 0
    assert len(chunks) >= 3
    assert chunker.transitions_in == chunker.transitions_out + chunker.resident
    for c in chunks:
        nd = ~c["done"][:-1]
        np.testing.assert_array_equal(c["final_obs"][:-1][nd], c["obs"][1:][nd])
        assert np.all(c["reward"] == 1.0)                 # CartPole: reset steps (reward 0) never appear
        assert np.all(np.diff(c["policy_version"], axis=0) >= 0)
    assert any(c["truncated"].any() for c in chunks) and any(c["terminated"].any() for c in chunks)


def test_dict_observations_are_flattened_in_key_order():
    """envpool's DeepMind Control tasks observe a Dict (position, velocity): the host env and the
    env spec flatten it into one float32 vector, components in the Dict's key order."""
    import envpool
    import gymnasium.spaces as gs

    from tianji_jax.envs.host import EnvpoolVecEnv, flatten_observation, observation_space
    from tianji_jax.envs.registry import resolve_env

    spec = resolve_env("envpool:CheetahRun-v1")
    assert spec.observation_space.shape == (17,) and spec.observation_space.dtype == np.float32
    with EnvpoolVecEnv("CheetahRun-v1", num_envs=2, seed=3) as env:
        assert env.obs_keys == ("position", "velocity") and env.observation_space == spec.observation_space
        step = env.reset()
    raw = envpool.make("CheetahRun-v1", env_type="gymnasium", num_envs=2, seed=3)
    obs, _ = raw.reset()
    raw.close()
    expected = np.concatenate([obs["position"], obs["velocity"]], axis=1).astype(np.float32)
    np.testing.assert_array_equal(step.obs, expected)
    nested = {"a": np.arange(12).reshape(2, 2, 3), "b": np.ones((2, 1))}
    np.testing.assert_array_equal(flatten_observation(nested, ("b", "a"), 2),
                                  [[1, 0, 1, 2, 3, 4, 5], [1, 6, 7, 8, 9, 10, 11]])
    with pytest.raises(ValueError, match=r"Dict observation component 'k' is a Discrete; allowed: Dict observations"):
        observation_space(gs.Dict({"k": gs.Discrete(3)}))
