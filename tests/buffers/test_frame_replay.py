"""Frame-deduplicated replay (tianji_jax.buffers.frame_replay): stacks rebuilt exactly, boundaries, memory.

Observers are independent of the mechanism: a synthetic frame-stacking env (numpy) gives every
frame a unique id (env, step) encoded in its bytes and keeps, per step, the stacked observation it
showed the agent (repeating the reset frame at an episode start, as envpool does) together with
the absolute step of every frame in it. A transition is expected to be sampleable exactly when
all frames of its obs stack, its n-step lookahead and its next_obs stack are still in the ring;
every sampled transition must equal the one the env produced.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianji_jax.buffers import frame_replay, replay
from tianji_jax.algos.dqn import Transition

pytestmark = pytest.mark.timeout(180)

FRAME = (2, 2)  # 4 uint8 bytes hold a frame's uint32 id
DUMMY = dict(frame_id=0, action=0, reward=0.0, terminated=False, truncated=False, first=False, stack_reset=False,
             done=False)


def encode(ids):
    return np.asarray(ids, "<u4").view(np.uint8).reshape(-1, *FRAME)


def decode(frames):
    frames = np.ascontiguousarray(np.asarray(frames, np.uint8))
    return frames.reshape(*frames.shape[:-2], 4).view("<u4")[..., 0]


class StackingEnvs:
    """E synthetic envs with random episode lengths, ending by termination or truncation.

    A third of the terminations are "lost lives" (envpool's ``episodic_life``): the next episode
    keeps stacking onto the old frames instead of repeating its reset frame (``stack_reset``
    False). ``history[e]`` lists, per absolute step t of env e: dict(frame_id, first,
    stack_reset, done, terminated, action, reward, version, stack (S frame ids, oldest first),
    stack_steps (their absolute steps)).
    """

    def __init__(self, num_envs, stack, seed):
        self.e, self.s = num_envs, stack
        self.rng = np.random.default_rng(seed)
        self.history = [[] for _ in range(num_envs)]
        self.deques = [None] * num_envs
        self.left = np.zeros(num_envs, int)  # steps left in the episode; 0 = must reset next
        self.life_lost = np.zeros(num_envs, bool)

    def _frame_id(self, e):
        return e * 1_000_000 + len(self.history[e]) + 1

    def tick(self, e, version):
        """Advance env e by one (reset step if its episode ended); returns its history record."""
        t = len(self.history[e])
        fid = self._frame_id(e)
        if self.left[e] == 0:
            if self.life_lost[e]:
                self.deques[e].append((fid, t))  # the stack continues over a lost life
            else:
                self.deques[e] = collections.deque([(fid, t)] * self.s, maxlen=self.s)  # repeat reset frame
            self.left[e] = self.rng.integers(1, 9)
            rec = dict(first=True, stack_reset=not self.life_lost[e], terminated=False, truncated=False,
                       action=0, reward=0.0)
        else:
            self.deques[e].append((fid, t))
            self.left[e] -= 1
            end = self.left[e] == 0
            term = bool(end and self.rng.random() < 0.5)
            self.life_lost[e] = term and self.rng.random() < 1 / 3
            rec = dict(first=False, stack_reset=False, terminated=term, truncated=bool(end and not term),
                       action=int(self.rng.integers(0, 6)), reward=float(self.rng.integers(-2, 3)))
        rec.update(frame_id=fid, version=version, stack=[f for f, _ in self.deques[e]],
                   stack_steps=[s for _, s in self.deques[e]])
        rec["done"] = rec["terminated"] or rec["truncated"]
        self.history[e].append(rec)
        return rec

    def expected(self, f, n, gamma):
        """{(e, t): Transition fields} of every transition sampleable from rings of F frames."""
        out = {}
        for e, hist in enumerate(self.history):
            w = len(hist)
            for t, rec in enumerate(hist):
                if rec["done"]:
                    continue
                ret, disc, m = 0.0, 1.0, None
                for j in range(1, n + 1):
                    if t + j >= w or hist[t + j]["first"]:
                        break
                    ret += disc * hist[t + j]["reward"]
                    disc *= gamma
                    m = j
                    if hist[t + j]["done"]:
                        break
                if m is None or (m < n and not hist[t + m]["done"]):
                    continue  # lookahead incomplete
                needed = rec["stack_steps"] + hist[t + m]["stack_steps"]
                if min(needed) < w - f:
                    continue  # a frame was overwritten
                out[(e, t)] = dict(obs=rec["stack"], next_obs=hist[t + m]["stack"], action=hist[t + 1]["action"],
                                   reward=ret, discount=0.0 if hist[t + m]["terminated"] else disc,
                                   version=hist[t + 1]["version"])
        return out


def check_sample(s, expected, batch):
    keys = list(zip(np.asarray(s.env_id).tolist(), np.asarray(s.step).tolist()))
    assert set(keys) == set(expected)  # every sampleable transition and nothing else
    obs, nxt = decode(s.transition.obs), decode(s.transition.next_obs)
    for i, key in enumerate(keys):
        want = expected[key]
        assert obs[i].tolist() == want["obs"], (key, obs[i], want)
        assert nxt[i].tolist() == want["next_obs"], (key, nxt[i], want)
        assert int(s.transition.action[i]) == want["action"]
        assert float(s.transition.reward[i]) == pytest.approx(want["reward"], abs=1e-5)
        assert float(s.transition.discount[i]) == pytest.approx(want["discount"], abs=1e-6)
        assert int(s.policy_version[i]) == want["version"]
    np.testing.assert_allclose(s.probs, 1.0 / len(expected), rtol=1e-5)
    np.testing.assert_array_equal(s.weights, 1.0)


@pytest.mark.parametrize("auto_reset,s_n,n,f", [("next_step", 4, 3, 11), ("same_step", 4, 3, 11),
                                                 ("next_step", 1, 1, 2), ("next_step", 2, 2, 4)])
def test_stacks_match_the_env_across_wraparound_and_episode_boundaries(auto_reset, s_n, n, f):
    """Rings of 11 frames (S=4, n=3; also the smallest rings F = S + n) wrap ~10 times over random episodes (lengths 1-8, ending by
    termination, a lost life or truncation), with random envs skipping steps (async batches,
    permuted env_id).
    Next-step auto-reset (envpool): the reset step is its own row with first=True. Same-step
    (gymnax): the done row passes the final frame and the new first frame together."""
    e_n, gamma, batch = 3, 0.9, 512
    envs = StackingEnvs(e_n, s_n, seed=1)
    state = frame_replay.init(e_n, e_n * f, FRAME, stack=s_n, n_step=n, gamma=gamma)
    add = jax.jit(frame_replay.add, donate_argnums=0)
    sample = jax.jit(frame_replay.sample, static_argnames="batch_size")
    rng = np.random.default_rng(2)
    for tick in range(120):
        order = rng.permutation(e_n)
        mask = rng.random(e_n) < 0.8
        rows = {k: [] for k in ("frame", "final", "action", "reward", "term", "trunc", "first", "stack_reset")}
        for e, m in zip(order, mask):
            rec = envs.tick(e, tick) if m else dict(envs.history[e][-1] if envs.history[e] else DUMMY)
            if m and auto_reset == "same_step" and rec["done"]:
                rec_reset = envs.tick(e, tick)  # the env resets in the same step
                frame_id, final_id, stack_reset = rec_reset["frame_id"], rec["frame_id"], rec_reset["stack_reset"]
            else:
                frame_id = final_id = rec["frame_id"]
                stack_reset = rec["stack_reset"]
            rows["stack_reset"].append(stack_reset)
            rows["frame"].append(frame_id)
            rows["final"].append(final_id)
            rows["action"].append(rec["action"])
            rows["reward"].append(rec["reward"])
            rows["term"].append(rec["terminated"])
            rows["trunc"].append(rec["truncated"])
            rows["first"].append(rec["first"])
        kw = dict(env_id=jnp.asarray(order, jnp.int32), mask=jnp.asarray(mask), stack_reset=jnp.asarray(rows["stack_reset"]))
        if auto_reset == "same_step":
            kw["final_frame"] = jnp.asarray(encode(rows["final"]))
        state = add(state, jnp.asarray(encode(rows["frame"])), jnp.asarray(rows["action"], jnp.int32),
                    jnp.asarray(rows["reward"], jnp.float32), jnp.asarray(rows["term"]), jnp.asarray(rows["trunc"]),
                    jnp.asarray(rows["first"]), tick, **kw)
        if tick in (5, 40, 77, 119):
            expected = envs.expected(f, n, gamma)
            assert int(state.num_valid) == len(expected) == int(np.asarray(state.valid).sum())
            assert bool(frame_replay.can_sample(state, max(1, len(expected))))
            if expected:
                assert batch >= 3 * len(expected)  # stratified: every valid item is drawn
                check_sample(sample(state, jax.random.key(tick), batch_size=batch), expected, batch)
    assert min(len(h) for h in envs.history) > 8 * f  # the rings wrapped many times
    # both kinds of boundary occurred: stacks restarted, and stacks continued over a lost life
    recs = [r for h in envs.history for r in h if r["first"]]
    assert sum(r["stack_reset"] for r in recs) > 5 and sum(not r["stack_reset"] for r in recs) > 5


def test_envpool_pong_frame_stacking_is_reproduced():
    """Real envpool Pong-v5 (stack_num=4, time limit 40 so episodes get truncated and reset): the
    reset observation repeats the reset frame 4 times (checked here), and every sampled obs /
    next_obs equals the stacked observation envpool returned at those steps."""
    from tianji_jax.envs.host import EnvpoolVecEnv

    e_n, n, gamma = 2, 3, 0.99
    env = EnvpoolVecEnv("Pong-v5", e_n, seed=3, max_episode_steps=40, stack_num=4, episodic_life=False)
    state = frame_replay.init(e_n, e_n * 200, (84, 84), stack=4, n_step=n, gamma=gamma)
    add = jax.jit(frame_replay.add, donate_argnums=0)
    seen = [[] for _ in range(e_n)]  # per env, per absolute step: (stacked obs, first, done, terminated, reward)
    rng = np.random.default_rng(0)
    step = env.reset()
    actions = np.zeros(e_n, np.int32)
    try:
        for _ in range(130):
            ids = step.env_id
            for row, e in enumerate(ids):
                seen[e].append((step.obs[row].copy(), not step.valid[row], bool(step.done[row]),
                                bool(step.terminated[row]), float(step.reward[row]), int(actions[e])))
                if not step.valid[row]:
                    first = step.obs[row]
                    assert all(np.array_equal(first[i], first[3]) for i in range(3))  # reset frame x4
                    assert first[3].any()
            state = add(state, jnp.asarray(step.obs[:, -1]), jnp.asarray(actions[ids]), jnp.asarray(step.reward),
                        jnp.asarray(step.terminated), jnp.asarray(step.truncated), jnp.asarray(~step.valid), 0,
                        env_id=jnp.asarray(ids))
            actions = rng.integers(0, env.action_space.n, e_n).astype(np.int32)
            step = env.step(actions[step.env_id], step.env_id)
    finally:
        env.close()
    assert sum(r[1] for h in seen for r in h) >= 2 * e_n  # episodes were truncated and reset
    s = jax.jit(frame_replay.sample, static_argnames="batch_size")(state, jax.random.key(0), batch_size=64)
    for i in range(64):
        e, t = int(s.env_id[i]), int(s.step[i])
        m = next(j for j in range(1, n + 1) if j == n or seen[e][t + j][2])
        np.testing.assert_array_equal(np.asarray(s.transition.obs[i]), seen[e][t][0])
        np.testing.assert_array_equal(np.asarray(s.transition.next_obs[i]), seen[e][t + m][0])
        assert int(s.transition.action[i]) == seen[e][t + 1][5]
        want_r = sum(gamma ** (j - 1) * seen[e][t + j][4] for j in range(1, m + 1))
        assert float(s.transition.reward[i]) == pytest.approx(want_r, abs=1e-5)


_sample_j = jax.jit(frame_replay.sample, static_argnames="batch_size")
_update_j = jax.jit(frame_replay.update_priorities)


def _fill_linear(e_n=2, f=10, steps=10, prioritised=True):
    """One long episode per env (no boundaries): frame ids = step + 1."""
    state = frame_replay.init(e_n, e_n * f, FRAME, stack=2, n_step=1, gamma=0.5, prioritised=prioritised)
    add = jax.jit(frame_replay.add, donate_argnums=0)
    for t in range(steps):
        ids = [e * 1000 + t + 1 for e in range(e_n)]
        state = add(state, jnp.asarray(encode(ids)), jnp.full((e_n,), t % 3, jnp.int32), jnp.ones((e_n,)),
                    jnp.zeros((e_n,), bool), jnp.zeros((e_n,), bool), jnp.full((e_n,), t == 0), t)
    return state


def test_prioritised_sampling_and_stale_updates():
    """Counts follow the priorities (stratified: each within 2 of B P(i)); importance weights are
    (p_i / p_min)^-beta; an update for a start overwritten since sampling is ignored."""
    state = _fill_linear()
    assert int(state.num_valid) == 2 * 9  # starts 0..8 of each env (start 9 has no successor yet)
    s = _sample_j(state, jax.random.key(0), 64)
    starts_idx = np.unique(np.asarray(s.indices))
    assert len(starts_idx) == 18
    step_of = {int(i): int(t) for i, t in zip(np.asarray(s.indices), np.asarray(s.step))}
    td = np.arange(1, 19, dtype=np.float32)
    state = _update_j(state, jnp.asarray(starts_idx), jnp.asarray([step_of[int(i)] for i in starts_idx]),
                      jnp.asarray(td), alpha=1.0, eps=0.0)
    b = 4096
    s = _sample_j(state, jax.random.key(1), b, beta=0.5)
    counts = np.array([(np.asarray(s.indices) == i).sum() for i in starts_idx])
    p = td / td.sum()
    assert (np.abs(counts - b * p) < 2).all(), (counts, b * p)
    pos = np.searchsorted(starts_idx, np.asarray(s.indices))
    np.testing.assert_allclose(s.weights, (td[pos] / td.min()) ** -0.5, rtol=1e-5)
    np.testing.assert_allclose(s.probs, p[pos], rtol=1e-5)

    # a stale update (wrong step for that slot) changes nothing
    before = np.asarray(state.tree.sums).copy()
    state = _update_j(state, jnp.asarray(starts_idx[:1]), jnp.asarray([12345]), jnp.asarray([100.0]),
                      alpha=1.0, eps=0.0)
    np.testing.assert_array_equal(state.tree.sums, before)
    with pytest.raises(ValueError, match="prioritised=True"):
        frame_replay.update_priorities(_fill_linear(prioritised=False), jnp.zeros(1, jnp.int32),
                                       jnp.zeros(1, jnp.int32), jnp.ones(1))


def test_memory_is_an_eighth_of_naive_storage_and_matches_allocation():
    pong = frame_replay.frame_replay_bytes(8, 1_000_000, (84, 84))
    naive_item = Transition(obs=jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), action=jnp.int32(0),
                            reward=jnp.float32(0), discount=jnp.float32(0),
                            next_obs=jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8))
    naive = replay.replay_bytes(naive_item, 1_000_000)
    assert pong < 7.2e9 and naive > 56e9
    assert 1 / 8.2 < pong / naive < 1 / 7.8
    small = frame_replay.init(3, 40, FRAME, stack=4, n_step=3)
    assert small.slots_per_env == 14  # ceil(40 / 3)
    assert frame_replay.frame_replay_bytes(3, 40, FRAME) == sum(x.nbytes for x in jax.tree.leaves(small))
    with pytest.raises(MemoryError, match="needs"):
        frame_replay.init(8, 10**9, (84, 84))


def test_argument_validation_names_the_field():
    with pytest.raises(ValueError, match=r"capacity must be >= num_envs \* \(stack \+ n_step\)"):
        frame_replay.init(2, 10, FRAME, stack=4, n_step=3)
    with pytest.raises(ValueError, match="num_envs must be"):
        frame_replay.init(0, 10, FRAME)
    with pytest.raises(ValueError, match="frame_shape"):
        frame_replay.init(1, 10, ())
    with pytest.raises(ValueError, match="gamma"):
        frame_replay.init(1, 10, FRAME, gamma=1.5)
    state = frame_replay.init(2, 20, FRAME)
    z = jnp.zeros((2,), bool)
    with pytest.raises(ValueError, match=r"frame must have shape \(B, 2, 2\)"):
        frame_replay.add(state, jnp.zeros((2, 3, 3), jnp.uint8), jnp.zeros(2, jnp.int32), jnp.zeros(2), z, z, z, 0)
    with pytest.raises(ValueError, match="frame dtype float32 cannot be stored in a uint8 buffer"):
        frame_replay.add(state, jnp.zeros((2, 2, 2)), jnp.zeros(2, jnp.int32), jnp.zeros(2), z, z, z, 0)
    with pytest.raises(ValueError, match="action must be integer"):
        frame_replay.add(state, jnp.zeros((2, 2, 2), jnp.uint8), jnp.zeros(2), jnp.zeros(2), z, z, z, 0)
    with pytest.raises(ValueError, match=r"reward must have shape \(2,\)"):
        frame_replay.add(state, jnp.zeros((2, 2, 2), jnp.uint8), jnp.zeros(2, jnp.int32), jnp.zeros(3), z, z, z, 0)
    with pytest.raises(ValueError, match="batch_size"):
        frame_replay.sample(state, jax.random.key(0), 0)
    with pytest.raises(ValueError, match="min_size"):
        frame_replay.can_sample(state, 0)
