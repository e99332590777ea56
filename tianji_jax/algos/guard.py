"""The non-finite guard of every gradient step (pure functions, no runtime).

A gradient step whose loss or gradient holds a NaN or an infinity is skipped: params and optimizer
state keep their previous values (so they are never silently non-finite), and the step is counted
in the ``nonfinite_skips`` metric. The decision is taken on quantities that are already identical
on every learner replica (the loss and gradients after their ``pmean`` over the data-parallel
axis, or the single learner's), so all replicas skip the same steps and stay bitwise identical.
The host side (:class:`tianji_jax.runtime.nonfinite.NonFiniteMonitor`) stops a run after
``max_nonfinite_updates`` consecutive updates with a skipped step.

With finite values, :func:`guarded_apply` returns exactly what ``tx.update`` + ``apply_updates``
return (``jnp.where`` selects the new values bit for bit).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = ["all_finite", "guarded_apply", "SKIP_METRIC"]

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
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    return keep(new_params, params), keep(new_opt_state, opt_state)
