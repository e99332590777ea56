"""The one generic gradient step of every learner, and its non-finite guard (pure functions).

Every algorithm's gradient update goes through :func:`gradient_step`: ``jax.value_and_grad`` of
its loss, the ``pmean`` over the data-parallel axis (when ``axis_name`` is given), the finiteness
decision, the optimizer step and the guard, so the guard is written once.

A gradient step whose loss or gradient holds a NaN or an infinity is skipped: params and optimizer
state keep their previous values (so they are never silently non-finite), and the step is counted
in the ``nonfinite_skips`` metric (:func:`skip_count`). The decision is taken on quantities that
are already identical on every learner replica (the loss and gradients after their ``pmean`` over
the data-parallel axis, or the single learner's), so all replicas skip the same steps and stay
bitwise identical. An update made of several optimizer steps (SAC's critic, actor and temperature)
takes ONE decision for all of them: each step is taken with ``guard=False`` and the caller keeps
their results with :func:`keep_if` on the AND of their ``finite``. A replay learner's update also
moves its target networks: :meth:`tianji_jax.algos.replay_agent.ReplayAgent.learn` applies
:func:`keep_if` to its whole learner state (params, targets, optimizer states), so a skipped update
changes nothing but the PRNG key and the counters, for every replay algorithm. The host side
(:class:`tianji_jax.runtime.nonfinite.NonFiniteMonitor`) stops a run after
``max_nonfinite_updates`` consecutive updates with a skipped step.

With finite values, the guarded step returns exactly what ``tx.update`` + ``apply_updates``
return (``jnp.where`` selects the new values bit for bit).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["all_finite", "gradient_step", "guarded_apply", "keep_if", "skip_count", "minibatch_epochs", "GradientStep",
           "SKIP_METRIC"]

SKIP_METRIC = "nonfinite_skips"
"""Metric key: gradient steps skipped because their loss or gradient was not finite (int32)."""


def all_finite(*trees: Any) -> jax.Array:
    """``True`` (bool scalar) when every element of every leaf of ``trees`` is finite.

    Args:
        trees: pytrees of float arrays (losses, gradients); integer leaves count as finite.
    """
    ok = jnp.asarray(True)
    for leaf in jax.tree.leaves(trees):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            ok = ok & jnp.all(jnp.isfinite(leaf))
    return ok


def skip_count(finite: jax.Array) -> jax.Array:
    """The :data:`SKIP_METRIC` value of one step: int32 scalar, 1 when ``finite`` (bool) is False, else 0."""
    return (~finite).astype(jnp.int32)


def keep_if(finite: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``finite`` (bool scalar) is True, else ``old``, leaf by leaf (bit for bit).

    Args:
        finite: bool scalar; must be the same on every replica of a data-parallel learner.
        new, old: pytrees of the same structure, shapes and dtypes.

    Raises:
        ValueError: the two trees' structures differ (from ``jax.tree.map``).
    """
    return jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)


def guarded_apply(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any,
                  finite: jax.Array) -> tuple[Any, Any]:
    """One optimizer step, or none when ``finite`` is False.

    Args:
        tx: the optax optimizer.
        grads: gradient pytree (same structure as ``params``).
        opt_state: ``tx``'s state.
        params: current params.
        finite: bool scalar, from :func:`all_finite` of the loss and ``grads``; must be the same
            on every replica of a data-parallel learner.

    Returns:
        ``(params, opt_state)``: updated when ``finite``, else the inputs unchanged.
    """
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    return keep_if(finite, new_params, params), keep_if(finite, new_opt_state, opt_state)


class GradientStep(NamedTuple):
    """What :func:`gradient_step` returns.

    Attributes:
        params: the new params (same structure, shapes and dtypes as the input params): the
            inputs unchanged when the step was skipped (``guard=True``), or the unguarded update
            (``guard=False``: the caller decides with :func:`keep_if`).
        opt_state: the new optimizer state, guarded like ``params``.
        loss: float scalar loss (``pmean`` over ``axis_name`` when given).
        aux: the loss function's auxiliary output (``pmean``-ed when ``pmean_aux``), or None
            without ``has_aux``.
        grads: gradients (``pmean``-ed), structured like ``params``.
        grad_norm: float32 scalar, the global L2 norm of ``grads`` (before any clipping in ``tx``).
        finite: bool scalar, :func:`all_finite` of ``loss`` and ``grads`` (equal on every replica).
    """

    params: Any
    opt_state: Any
    loss: jax.Array
    aux: Any
    grads: Any
    grad_norm: jax.Array
    finite: jax.Array


def gradient_step(loss_fn: Callable, tx: optax.GradientTransformation, params: Any, opt_state: Any, *args: Any,
                  axis_name: str | None = None, has_aux: bool = True, pmean_aux: bool = False,
                  guard: bool = True) -> GradientStep:
    """One guarded gradient step: ``value_and_grad``, ``pmean``, finiteness, optimizer step, guard.

    In order: ``(loss, aux), grads = jax.value_and_grad(loss_fn, has_aux)(params, *args)``; with
    ``axis_name`` the gradients, then ``aux`` (only with ``pmean_aux``), then the loss are averaged
    over that mapped axis (``lax.pmean``; data-parallel learners under ``shard_map``/``pmap``);
    ``finite = all_finite(loss, grads)``; ``tx.update`` + ``optax.apply_updates``; with ``guard``
    the new params and optimizer state are kept only when ``finite`` (else the inputs are returned
    unchanged, bit for bit). Pure; trace it inside ``jit``/``scan``.

    Args:
        loss_fn: ``loss_fn(params, *args) -> loss`` (float scalar), or ``-> (loss, aux)`` with
            ``has_aux``; differentiated with respect to its first argument.
        tx: the optax optimizer.
        params: the pytree of float arrays to differentiate and update.
        opt_state: ``tx``'s state for ``params``.
        args: the loss function's other arguments (not differentiated).
        axis_name: the data-parallel axis to average over, or None (a single learner).
        has_aux: ``loss_fn`` returns ``(loss, aux)``.
        pmean_aux: also average ``aux`` over ``axis_name`` (every leaf must be float).
        guard: apply the guard here (True), or return the unguarded update with its ``finite`` so
            that the caller takes one decision over several steps (:func:`keep_if`).

    Returns:
        A :class:`GradientStep`.

    Raises:
        TypeError: from ``jax.value_and_grad`` when the loss is not a float scalar or ``params``
            holds non-float leaves; NameError: ``axis_name`` is not a mapped axis here.
    """
    if has_aux:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *args)
    else:
        loss, grads = jax.value_and_grad(loss_fn)(params, *args)
        aux = None
    if axis_name is not None:
        grads = jax.lax.pmean(grads, axis_name)
        if pmean_aux:
            aux = jax.lax.pmean(aux, axis_name)
        loss = jax.lax.pmean(loss, axis_name)
    finite = all_finite(loss, grads)  # global: taken on averaged values, equal on every replica
    if guard:
        new_params, new_opt_state = guarded_apply(tx, grads, opt_state, params, finite)
    else:
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
    return GradientStep(new_params, new_opt_state, loss, aux, grads, optax.tree.norm(grads), finite)


def minibatch_epochs(loss_fn: Callable[[Any, Any], tuple[jax.Array, dict]], tx: optax.GradientTransformation,
                     params: Any, opt_state: Any, batch: Any, key: jax.Array, *, update_epochs: int,
                     num_minibatches: int, axis_name: str | None = None) -> tuple[Any, Any, dict[str, jax.Array]]:
    """``update_epochs`` passes of shuffled minibatch SGD over a flat batch, each step a guarded
    :func:`gradient_step` (the epochs/minibatches loop of PPO, Schulman et al. 2017, Algorithm 1,
    and PQN, Gallici et al. 2024, Algorithm 1).

    Args:
        loss_fn: ``loss_fn(params, minibatch) -> (loss, aux)``, ``aux`` a dict of float scalars.
        tx, params, opt_state: the optimizer, its params and state.
        batch: a pytree whose leaves share a leading axis ``B`` divisible by ``num_minibatches``.
        key: PRNG key of the per-epoch permutations (one fresh permutation of ``B`` per epoch).
        update_epochs, num_minibatches: static ints; minibatches hold ``B // num_minibatches`` rows.
        axis_name: data-parallel axis (each replica permutes its own shard locally); gradients,
            loss and ``aux`` are averaged over it, so every replica applies the same steps.

    Returns:
        ``(params, opt_state, metrics)``: ``aux`` and ``grad_norm`` (global norm before clipping)
        averaged over the ``update_epochs * num_minibatches`` steps (float32 scalars), and int32
        ``nonfinite_skips``, the steps skipped because their loss or gradient was not finite.
    """
    b = jax.tree.leaves(batch)[0].shape[0]

    def minibatch_step(carry, mb):
        p, o = carry
        step = gradient_step(loss_fn, tx, p, o, mb, axis_name=axis_name, pmean_aux=True)
        return (step.params, step.opt_state), {**step.aux, "grad_norm": step.grad_norm,
                                               SKIP_METRIC: skip_count(step.finite)}

    def epoch(carry, epoch_key):
        perm = jax.random.permutation(epoch_key, b)
        shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0), batch)
        minibatches = jax.tree.map(lambda x: x.reshape((num_minibatches, -1, *x.shape[1:])), shuffled)
        return jax.lax.scan(minibatch_step, carry, minibatches)

    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, update_epochs))
    skips = jnp.sum(metrics.pop(SKIP_METRIC))
    return params, opt_state, {**jax.tree.map(jnp.mean, metrics), SKIP_METRIC: skips}
