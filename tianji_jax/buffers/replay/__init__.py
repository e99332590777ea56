"""Device-resident replay buffer (uniform and prioritised) as a small pure API over a pytree state.

In the style of flashbax's item buffer: the state is a :class:`ReplayState` pytree whose leaves
are ``jax.Array``s with a leading ``capacity`` axis; every function is pure, so the learner jits
them and donates the state, and XLA updates the storage in place::

    state = replay.init(example_item, capacity=100_000)         # eager: checks memory, allocates
    add = jax.jit(replay.add, donate_argnums=0)
    sample = jax.jit(replay.sample_prioritised, static_argnames="batch_size")
    update = jax.jit(replay.update_priorities, donate_argnums=0)

    state = add(state, items, version)                          # items: leaves (B, ...)
    if replay.can_sample(state, min_size=10_000):
        s = sample(state, key, batch_size=256, beta=beta)       # ReplaySample
        loss, td = ...                                          # weights = s.weights
        state = update(state, s.indices, td, alpha=0.6, insert_index=s.insert_index)

Layout and invariants (capacity ``C``, any ``C >= 1``, not only powers of two):

- items are written to consecutive slots ``write_pos, write_pos + 1, ... (mod C)``; once the
  buffer is full the oldest item is overwritten (circular FIFO);
- the filled slots are always exactly ``[0, size)`` (writes start at slot 0 and ``size`` only
  stops growing at ``C``), so sampling draws only from slots that were written;
- every slot carries ``policy_version`` (int32, the version the actor acted with;
  docs/runtime.md, "The lag contract") and ``insert_index`` (int32, the global insert counter of the item it holds);
  both are ``-1`` in slots never written;
- ``priority`` holds ``p_i^alpha`` (``0`` in unwritten slots); new items get the largest
  ``p^alpha`` seen so far (``max_priority``, initially 1), as Schaul et al. 2016 (Algorithm 1).

Prioritised replay (Schaul et al. 2016, "Prioritized Experience Replay", ICLR, section 3.3,
proportional variant, and section 3.4): ``p_i = (|delta_i| + eps)^alpha``,
``P(i) = p_i / sum_k p_k``, importance weights ``w_i = (N * P(i))^-beta / max_k w_k`` with ``N``
the number of stored items and the max taken over the whole buffer (as OpenAI baselines), so
``w_i = (p_i / p_min)^-beta`` lies in ``(0, 1]``; ``beta`` is annealed towards 1 by the caller.

Sampling cost: uniform is ``O(B)``. Prioritised sampling and priority updates go through a
sum-tree (:mod:`tianji_jax.buffers.sum_tree`, Schaul et al. 2016 appendix B.2.1): ``O(B log C)`` each,
stratified draws (one per ``1/B`` segment of the total), duplicate indices in an update resolved
by "last write wins", and ancestors recomputed from their children so the float32 tree never
drifts from its leaves. Adding ``B`` items also costs ``O(B log C)`` (their leaves get the max
priority).

Counters are int32: the insert counter wraps after 2^31 - 1 items (2.1e9 env steps).
"""
from tianji_jax.buffers.replay.sampling import (ReplaySample, can_sample, sample, sample_prioritised,
                                                update_priorities)
from tianji_jax.buffers.replay.state import ReplayState, add, check_fits, init, replay_bytes

__all__ = ["ReplayState", "ReplaySample", "init", "add", "can_sample", "sample", "sample_prioritised",
           "update_priorities", "replay_bytes", "check_fits"]
