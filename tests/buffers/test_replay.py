"""Replay buffer (tianji_jax.buffers.replay): layout, stamps, sampling laws, donation, memory checks.

Observers are independent of the mechanism: every inserted item carries its own insert counter
and version in its payload (written by the test), and a plain-Python model of a circular buffer
says what must be resident.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tianji_jax.buffers import replay, sum_tree

pytestmark = pytest.mark.timeout(120)

CAP = 5  # not a power of two
EXAMPLE = {"id": jnp.int32(0), "obs": jnp.zeros((2,), jnp.float32)}

add_j = jax.jit(replay.add, donate_argnums=0)
sample_j = jax.jit(replay.sample, static_argnames="batch_size")
sample_p_j = jax.jit(replay.sample_prioritised, static_argnames="batch_size")
update_j = jax.jit(replay.update_priorities, donate_argnums=0)


def items(ids):
    ids = np.asarray(ids, np.int32)
    return {"id": jnp.asarray(ids), "obs": jnp.asarray(np.stack([ids, -ids], -1).astype(np.float32))}


def test_wraparound_with_capacity_five():
    state = replay.init(EXAMPLE, CAP)
    assert state.capacity == CAP
    assert not bool(replay.can_sample(state, 1))
    state = add_j(state, items([0, 1, 2]), 0)
    np.testing.assert_array_equal(state.data["id"][:3], [0, 1, 2])
    np.testing.assert_array_equal(state.insert_index, [0, 1, 2, -1, -1])
    assert int(state.size) == 3 and int(state.write_pos) == 3
    state = add_j(state, items([3, 4, 5, 6]), 1)  # wraps: 3, 4 -> slots 3, 4; 5, 6 -> slots 0, 1
    np.testing.assert_array_equal(state.data["id"], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(state.data["obs"][:, 1], [-5, -6, -2, -3, -4])
    np.testing.assert_array_equal(state.insert_index, [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(state.policy_version, [1, 1, 0, 1, 1])
    assert (int(state.size), int(state.write_pos), int(state.num_inserted)) == (5, 2, 7)
    assert bool(replay.can_sample(state, 5)) and not bool(replay.can_sample(state, 6))


def test_batch_larger_than_capacity_keeps_the_last_items_and_mask_skips():
    state = replay.init(EXAMPLE, CAP)
    state = add_j(state, items(np.arange(12)), jnp.arange(12, dtype=jnp.int32) + 100)
    # 12 items from slot 0: item j would go to slot j % 5; only the last five (7..11) stay
    np.testing.assert_array_equal(state.data["id"], [10, 11, 7, 8, 9])
    np.testing.assert_array_equal(state.policy_version, [110, 111, 107, 108, 109])
    assert (int(state.size), int(state.write_pos), int(state.num_inserted)) == (5, 2, 12)

    state = replay.init(EXAMPLE, CAP)
    mask = jnp.array([True, False, True, False])
    state = add_j(state, items([0, 99, 1, 98]), 3, mask)
    np.testing.assert_array_equal(state.data["id"][:2], [0, 1])
    np.testing.assert_array_equal(state.insert_index, [0, 1, -1, -1, -1])
    assert (int(state.size), int(state.write_pos), int(state.num_inserted)) == (2, 2, 2)


@settings(max_examples=25, deadline=None)
@given(masks=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), max_size=6),
       versions=st.lists(st.integers(0, 50), min_size=6, max_size=6),
       td=st.lists(st.sampled_from([0.0, 0.5, 3.0]), min_size=8, max_size=8),
       seed=st.integers(0, 2**31 - 1))
def test_never_samples_unwritten_slots_and_keeps_stamps(masks, versions, td, seed):
    cap = 7
    state = replay.init(EXAMPLE, cap)
    model = collections.deque(maxlen=cap)  # (id, version, insert counter) of resident items
    next_id = counter = 0
    for step, mask in enumerate(masks):
        ids = np.arange(next_id, next_id + 3)  # unique payload ids; masked-out ones are skipped
        state = add_j(state, items(ids), versions[step], jnp.array(mask))
        for i in ids[np.array(mask, bool)]:
            model.append((int(i), versions[step], counter))
            counter += 1
        next_id += 3
    resident = {i: (v, c) for i, v, c in model}
    size = int(state.size)
    assert size == len(model) and int(state.num_inserted) == counter
    written = np.asarray(state.insert_index) >= 0
    assert written.sum() == size and written[:size].all()
    stored = {int(i): (int(v), int(c)) for i, v, c, w in zip(np.asarray(state.data["id"]),
                                                             np.asarray(state.policy_version),
                                                             np.asarray(state.insert_index), written) if w}
    assert stored == resident  # every resident item, with its stamps, and nothing else

    key_u, key_p = jax.random.split(jax.random.key(seed))
    s = sample_j(state, key_u, batch_size=16)
    if size == 0:
        np.testing.assert_array_equal(s.weights, 0.0)
        return
    idx = np.asarray(s.indices)
    assert ((0 <= idx) & (idx < size)).all()
    for i, v, c in zip(np.asarray(s.item["id"]), np.asarray(s.policy_version), np.asarray(s.insert_index)):
        assert resident[int(i)] == (int(v), int(c))
    np.testing.assert_allclose(s.probs, 1.0 / size)
    np.testing.assert_array_equal(s.weights, 1.0)

    # prioritised, including written slots whose priority became 0 (eps = 0)
    s0 = sample_p_j(state, key_u, batch_size=8, beta=0.5)
    state = update_j(state, s0.indices, jnp.array(td), 1.0, 0.0)
    s = sample_p_j(state, key_p, batch_size=16, beta=0.5)
    idx = np.asarray(s.indices)
    prio = np.asarray(state.priority)
    assert (prio[size:] == 0).all()
    if prio.sum() > 0:
        assert ((idx < size) & (prio[idx] > 0)).all()
        for i, v, c in zip(np.asarray(s.item["id"]), np.asarray(s.policy_version), np.asarray(s.insert_index)):
            assert resident[int(i)] == (int(v), int(c))
        assert ((np.asarray(s.weights) > 0) & (np.asarray(s.weights) <= 1 + 1e-6)).all()


def _filled(cap, n, version=0):
    state = replay.init(EXAMPLE, cap)
    return add_j(state, items(np.arange(n)), version)


def test_prioritised_frequencies_are_proportional():
    state = _filled(CAP, 4)  # slot 4 never written
    td = jnp.array([0.5, 1.0, 2.0, 4.0])
    state = update_j(state, jnp.arange(4), td, 1.0, 0.0)  # alpha 1, eps 0: p = |td|
    np.testing.assert_allclose(state.priority, [0.5, 1.0, 2.0, 4.0, 0.0])
    n = 40_000
    s = sample_p_j(state, jax.random.key(0), batch_size=n, beta=0.0)
    counts = np.bincount(np.asarray(s.indices), minlength=CAP)
    assert counts[4] == 0
    p = np.array([0.5, 1.0, 2.0, 4.0]) / 7.5
    # stratified draws (one per 1/n segment of the total): each count is within 2 of n P(i), a
    # deterministic bound; across independent small batches the counts also pass a chi-square
    # goodness-of-fit test at p > 1e-3 (stratification only lowers the variance)
    assert (np.abs(counts[:4] - p * n) < 2).all(), (counts, p * n)
    many = jax.vmap(lambda k: sample_p_j(state, k, batch_size=3, beta=0.0).indices)(
        jax.random.split(jax.random.key(5), 5000))
    counts_many = np.bincount(np.asarray(many).ravel(), minlength=CAP)
    assert counts_many[4] == 0
    chi = stats.chisquare(counts_many[:4], p * 15_000)
    assert chi.pvalue > 1e-3, (counts_many, p * 15_000)
    np.testing.assert_allclose(s.probs, p[np.asarray(s.indices)], rtol=1e-5)
    np.testing.assert_array_equal(s.weights, 1.0)  # beta = 0

    # alpha = 0.5 and eps > 0: p = (|td| + eps)^0.5
    state = update_j(state, jnp.arange(4), jnp.array([0.0, 0.99, 3.99, 8.99]), 0.5, 0.01)
    np.testing.assert_allclose(state.priority[:4], [0.1, 1.0, 2.0, 3.0], rtol=1e-5)
    s = sample_p_j(state, jax.random.key(1), batch_size=n, beta=0.0)
    counts = np.bincount(np.asarray(s.indices), minlength=CAP)
    assert stats.chisquare(counts[:4], np.array([0.1, 1, 2, 3]) / 6.1 * n).pvalue > 1e-3
    assert counts[4] == 0


def test_importance_weights_formula():
    state = _filled(CAP, 4)
    state = update_j(state, jnp.arange(4), jnp.array([1.0, 2.0, 3.0, 4.0]), 1.0, 0.0)
    beta = 0.4
    s = sample_p_j(state, jax.random.key(3), batch_size=256, beta=beta)
    p = np.array([1.0, 2.0, 3.0, 4.0])
    P = p / p.sum()
    N = 4  # stored items, not capacity
    w_all = (N * P) ** -beta
    want = w_all / w_all.max()
    idx = np.asarray(s.indices)
    assert set(idx) == {0, 1, 2, 3}
    np.testing.assert_allclose(s.weights, want[idx], rtol=1e-5)
    np.testing.assert_allclose(s.probs, P[idx], rtol=1e-5)
    np.testing.assert_allclose(want, [1.0, 2 ** -0.4, 3 ** -0.4, 4 ** -0.4], rtol=1e-6)
    # beta = 1: full correction, w = p_min / p_i
    s = sample_p_j(state, jax.random.key(3), batch_size=64, beta=1.0)
    np.testing.assert_allclose(s.weights, 1.0 / p[np.asarray(s.indices)], rtol=1e-5)


def test_new_items_get_the_max_priority_seen_so_far():
    state = _filled(CAP, 2)
    np.testing.assert_allclose(state.priority, [1.0, 1.0, 0, 0, 0])
    state = update_j(state, jnp.array([0, 1]), jnp.array([3.0, 0.5]), 1.0, 0.0)
    state = add_j(state, items([2]), 0)
    np.testing.assert_allclose(state.priority, [3.0, 0.5, 3.0, 0, 0])
    state = update_j(state, jnp.array([0, 1, 2]), jnp.array([0.1, 0.1, 0.1]), 1.0, 0.0)
    state = add_j(state, items([3]), 0)  # the max seen so far, not the current max
    np.testing.assert_allclose(state.priority, [0.1, 0.1, 0.1, 3.0, 0], rtol=1e-6)


def test_update_priorities_skips_overwritten_and_unwritten_slots():
    state = _filled(3, 3)
    s = sample_p_j(state, jax.random.key(0), batch_size=4, beta=0.5)
    state = add_j(state, items([3]), 1)  # overwrites slot 0 with a newer item
    state = update_j(state, s.indices, jnp.full((4,), 9.0), 1.0, 0.0, s.insert_index)
    prio = np.asarray(state.priority)
    for i in set(np.asarray(s.indices)):
        assert prio[i] == (1.0 if i == 0 else 9.0)
    # an index outside [0, size) never gets a priority, so it can never be drawn
    state = _filled(CAP, 2)
    state = update_j(state, jnp.array([3, 4]), jnp.array([5.0, 5.0]), 1.0, 0.0)
    np.testing.assert_allclose(state.priority, [1.0, 1.0, 0.0, 0.0, 0.0])


def test_state_lives_on_its_device_and_donation_deletes_the_old_state():
    dev = jax.devices()[-1]
    state = replay.init(EXAMPLE, CAP, device=dev)
    for leaf in jax.tree.leaves(state):
        assert isinstance(leaf, jax.Array) and leaf.devices() == {dev}
    new = add_j(state, jax.device_put(items([0, 1]), dev), 0)
    for leaf in jax.tree.leaves(new):
        assert leaf.devices() == {dev}
    deleted = [leaf.is_deleted() for leaf in jax.tree.leaves(state)]
    if not any(deleted) and jax.devices()[0].platform == "cpu":
        pytest.skip("buffer donation is a no-op on this CPU backend")
    # all donated buffers except ones XLA could not alias (e.g. the unchanged max_priority scalar)
    assert state.data["obs"].is_deleted() and state.data["id"].is_deleted()
    assert state.tree.sums.is_deleted() and state.insert_index.is_deleted()
    new = update_j(new, jnp.array([0]), jnp.array([2.0]))
    assert new.data["obs"].shape == (CAP, 2)


def test_replay_bytes_and_memory_checks():
    item = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "a": jnp.int32(0), "r": np.float64(0.0)}
    # float64 is stored as float32 (x64 off): 28224 + 4 + 4 per item, + 8 bytes of stamps per slot,
    # + the sum and min trees: 2 x (2 x 1024 padded leaves) float32
    assert replay.replay_bytes(item, 1000) == 1000 * (28224 + 8 + 8) + 2 * 2 * 1024 * 4 + 16
    small = replay.init(EXAMPLE, 3)
    used = sum(leaf.nbytes for leaf in jax.tree.leaves(small))
    assert replay.replay_bytes(EXAMPLE, 3) == used

    free = replay.check_fits(1024)
    assert free is not None and free > 1024
    with pytest.raises(MemoryError, match=r"needs 1000000000000000000 bytes .* only \d+ bytes"):
        replay.check_fits(10**18)
    # a huge buffer raises before anything is allocated
    with pytest.raises(MemoryError, match="needs"):
        replay.init({"x": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}, capacity=10**7)

    class FakeAccelerator:
        platform = "gpu"

        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

        def __str__(self):
            return "FakeAccelerator"

    dev = FakeAccelerator({"bytes_limit": 1000, "bytes_in_use": 300})
    assert replay.check_fits(700, dev) == 700
    with pytest.raises(MemoryError, match=r"needs 701 bytes .* only 700 bytes"):
        replay.check_fits(701, dev)
    with pytest.raises(MemoryError, match=r"max_fraction=0.5 .*350 bytes"):
        replay.check_fits(400, dev, max_fraction=0.5)
    with pytest.warns(RuntimeWarning, match="no memory statistics"):
        assert replay.check_fits(10, FakeAccelerator(None)) is None
    with pytest.raises(ValueError, match="nbytes"):
        replay.check_fits(-1)


def test_argument_validation_names_the_field():
    with pytest.raises(ValueError, match=r"capacity must be .* got 0"):
        replay.init(EXAMPLE, 0)
    with pytest.raises(ValueError, match=r"capacity must be .* got 2.5"):
        replay.replay_bytes(EXAMPLE, 2.5)
    state = _filled(CAP, 3)
    with pytest.raises(ValueError, match=r"batch_size must be .* got 0"):
        replay.sample(state, jax.random.key(0), 0)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\].* got 1.5"):
        replay.sample_prioritised(state, jax.random.key(0), 4, beta=1.5)
    with pytest.raises(ValueError, match=r"alpha must be >= 0.* got -1"):
        replay.update_priorities(state, jnp.array([0]), jnp.array([1.0]), alpha=-1.0)
    with pytest.raises(ValueError, match=r"min_size must be an int >= 1, got 0"):
        replay.can_sample(state, 0)
    with pytest.raises(ValueError, match="item leaf must have shape"):
        replay.add(state, {"id": jnp.zeros((2,), jnp.int32), "obs": jnp.zeros((2, 3))}, 0)
    with pytest.raises(ValueError, match="cannot be stored"):
        replay.add(state, {"id": jnp.zeros((2,), jnp.float32), "obs": jnp.zeros((2, 2))}, 0)
    with pytest.raises(ValueError, match="structure"):
        replay.add(state, {"obs": jnp.zeros((2, 2))}, 0)


# ------------------------------------------------------------------------------------------------
# sum-tree (tianji_jax.buffers.sum_tree): exactness, duplicates, inverse CDF, stratification
# ------------------------------------------------------------------------------------------------
_tree_update_j = jax.jit(sum_tree.update)
_tree_find_j = jax.jit(sum_tree.find)
_tree_sample_j = jax.jit(sum_tree.sample_stratified, static_argnums=2)


def _rebuild(leaf_values, num_leaves):
    """Reference: the float32 sum/min trees built bottom-up from scratch in numpy."""
    sums = np.zeros(2 * num_leaves, np.float32)
    mins = np.full(2 * num_leaves, np.inf, np.float32)
    sums[num_leaves:num_leaves + len(leaf_values)] = leaf_values
    mins[num_leaves:num_leaves + len(leaf_values)] = np.where(leaf_values > 0, leaf_values, np.inf)
    for node in range(num_leaves - 1, 0, -1):
        sums[node] = np.float32(sums[2 * node] + sums[2 * node + 1])
        mins[node] = min(mins[2 * node], mins[2 * node + 1])
    return sums, mins


def test_sum_tree_million_float32_updates_stay_exact():
    """1e6 priority updates (1000 jitted batches of 1000, duplicates included, values over six
    decades) on a non-power-of-two tree: every node equals a from-scratch float32 rebuild bit for
    bit (ancestors are recomputed from children, so nothing accumulates), and the total matches a
    float64 recomputation of the leaves within rel 1e-4 (pairwise float32: about D * 6e-8)."""
    cap, n_batches, b = 100_003, 1000, 1000
    tree = sum_tree.init(cap)
    assert tree.num_leaves == 131_072 and tree.depth == 17

    @jax.jit
    def run(tree, key):
        def body(tree, k):
            k_i, k_v = jax.random.split(k)
            idx = jax.random.randint(k_i, (b,), 0, cap)
            vals = jnp.exp(jax.random.uniform(k_v, (b,), minval=-7.0, maxval=7.0))
            return sum_tree.update(tree, idx, vals), None
        return jax.lax.scan(body, tree, jax.random.split(key, n_batches))[0]

    tree = run(tree, jax.random.key(0))
    leaves = np.asarray(sum_tree.leaves(tree))
    assert (leaves > 0).mean() > 0.99  # most slots were written at least once
    sums, mins = _rebuild(leaves, tree.num_leaves)
    np.testing.assert_array_equal(np.asarray(tree.sums)[1:], sums[1:])
    np.testing.assert_array_equal(np.asarray(tree.mins)[1:], mins[1:])
    exact = leaves.astype(np.float64).sum()
    assert abs(float(sum_tree.total(tree)) - exact) <= 1e-4 * exact
    assert float(sum_tree.min_positive(tree)) == leaves[leaves > 0].min()


def test_sum_tree_duplicate_indices_last_write_wins():
    tree = sum_tree.init(3)
    tree = _tree_update_j(tree, jnp.array([2, 0, 2, 2, 1]), jnp.array([1.0, 4.0, 5.0, 3.0, 2.0]))
    np.testing.assert_array_equal(sum_tree.leaves(tree), [4.0, 2.0, 3.0])  # slot 2: last of 1, 5, 3
    # an invalid later duplicate does not hide the valid earlier one; out-of-range indices are ignored
    tree = _tree_update_j(tree, jnp.array([1, 1, 7, -1]), jnp.array([6.0, 9.0, 9.0, 9.0]),
                          jnp.array([True, False, True, True]))
    np.testing.assert_array_equal(sum_tree.leaves(tree), [4.0, 6.0, 3.0])
    assert float(sum_tree.total(tree)) == 13.0 and float(sum_tree.min_positive(tree)) == 3.0
    tree = _tree_update_j(tree, jnp.array([2, 0, 1]), jnp.zeros(3))
    assert float(sum_tree.total(tree)) == 0.0 and float(sum_tree.min_positive(tree)) == np.inf
    np.testing.assert_array_equal(_tree_sample_j(tree, jax.random.key(0), 4), 0)


@settings(max_examples=25, deadline=None)
@given(cap=st.sampled_from([1, 2, 3, 5, 8, 13]),
       updates=st.lists(st.tuples(st.integers(0, 12), st.sampled_from([0.0, 0.25, 1.0, 3.0, 100.0])),
                        min_size=1, max_size=30),
       seed=st.integers(0, 2**31 - 1))
def test_sum_tree_matches_a_numpy_model(cap, updates, seed):
    """Any capacity (padded leaf level): leaves, every internal node and inverse-CDF search agree
    with a numpy model (cumsum + searchsorted in float64) after arbitrary batched updates."""
    tree = sum_tree.init(cap)
    model = np.zeros(cap, np.float32)
    pad = 30 - len(updates)  # one batch shape (padding entries invalid): one compile per capacity
    idx = np.array([i for i, _ in updates] + [0] * pad, np.int32)
    val = np.array([v for _, v in updates] + [7.0] * pad, np.float32)
    valid = np.arange(30) < len(updates)
    tree = _tree_update_j(tree, jnp.asarray(idx), jnp.asarray(val), jnp.asarray(valid))
    for i, v in updates:  # one at a time, in order
        if i < cap:
            model[i] = v
    np.testing.assert_array_equal(sum_tree.leaves(tree), model)
    sums, mins = _rebuild(model, tree.num_leaves)
    np.testing.assert_array_equal(np.asarray(tree.sums)[1:], sums[1:])
    np.testing.assert_array_equal(np.asarray(tree.mins)[1:], mins[1:])
    if model.sum() == 0:
        return
    cdf = np.cumsum(model.astype(np.float64))
    u = np.random.default_rng(seed).uniform(0, cdf[-1], 64).astype(np.float32)
    u = u[np.min(np.abs(u[:, None] - cdf[None, :]), axis=1) > 1e-3]  # away from bin edges
    got = np.asarray(_tree_find_j(tree, jnp.asarray(np.resize(u, 64))))[:len(u)]
    np.testing.assert_array_equal(got, np.searchsorted(cdf, u, side="right"))
    # mass exactly at the total (float rounding's worst case) lands on the last positive slot
    assert int(_tree_find_j(tree, jnp.full((64,), cdf[-1], jnp.float32))[0]) == np.flatnonzero(model).max()
    drawn = np.asarray(_tree_sample_j(tree, jax.random.key(seed), 32))
    assert (model[drawn] > 0).all() and (np.diff(drawn) >= 0).all()


@settings(max_examples=8, deadline=None)
@given(cap=st.sampled_from([1, 3, 12]), seed=st.integers(0, 2**31 - 1))
def test_buffer_filled_exactly_to_capacity_returns_all_items(cap, seed):
    """Single-item replay: a buffer filled exactly to capacity (3 included) samples every item it
    holds, uniformly and prioritised (stratified: each count is within 2 of B P(i), so with
    B P(i) > 2 every item appears). The buffer samples single transitions only (n-step items are
    built by the actor), so there are no sequences that could straddle the write position; the
    frame store's stacks are tested for that in tests/buffers/test_frame_replay.py."""
    state = _filled(cap, cap)
    assert int(state.size) == cap and int(state.write_pos) == 0
    k_u, k_p = jax.random.split(jax.random.key(seed))
    b = 256
    s = sample_j(state, k_u, batch_size=b)
    assert set(np.asarray(s.item["id"]).tolist()) == set(range(cap))
    td = jnp.asarray(np.random.default_rng(seed).uniform(0.5, 2.0, cap), jnp.float32)
    state = update_j(state, jnp.arange(cap), td, 1.0, 0.0)
    s = sample_p_j(state, k_p, batch_size=b, beta=1.0)
    counts = np.bincount(np.asarray(s.item["id"]), minlength=cap)
    expect = b * np.asarray(td) / np.asarray(td).sum()
    assert (np.abs(counts - expect) < 2).all(), (counts, expect)
