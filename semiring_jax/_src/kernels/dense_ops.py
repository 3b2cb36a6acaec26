"""Dense intersection with a general graph through the compiled CPU kernel
(traced).

The kernel (`kernels/dense.cc`) runs the forward (and, for the gradient,
the backward) recursion over frames for each utterance in one call, with
the graph's arcs grouped by destination and by source: no scan steps, no
per-state slot tables. Batches split between XLA's CPU threads; a graph
shared by the batch is grouped once per call.

The gradient call is a `derivatives.kernel`: its own derivative is the
portable scan's (`reference`), so second derivatives agree with the scan's.
An utterance that reads a weight or emission beyond 2^20 in magnitude is
recomputed by `reference` (the kernel flags it): double precision cannot
keep O(1) differences between paths next to such numbers, and the scan's
compensated scores can.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from semiring_jax._src.core import derivatives
from semiring_jax._src.kernels import loader

__all__ = [
    "Arcs",
    "log_total",
    "log_total_and_grads",
    "tropical_total",
    "tropical_total_and_grads",
]


class Arcs(NamedTuple):
    """A graph's structure as the kernel reads it, [G, ...] with G = 1 (shared
    by the batch) or B. The leak (Kaldi's leaky HMM, epsilon times the
    initial probabilities; zeros for none) is a constant."""

    src: jax.Array  # int32 [G, A]
    dst: jax.Array  # int32 [G, A]
    column: jax.Array  # int32 [G, A]: the arc's emission column, -1 for padding
    leak: jax.Array  # float [G, S]


# (weight [B, A], final weight [B, S], emissions [B, T, V]): -inf on padding
# arcs and non-final states. Weights enter per batch entry (a shared
# graph's broadcast), so that each entry's gradient is its own.
Diff = tuple[jax.Array, jax.Array, jax.Array]
# (the structure, lengths int32 [B], then anything else the reference reads)
Aux = tuple[Any, ...]
ValueFn = Callable[[Diff, Aux], jax.Array]


def _operands(diff: Diff, aux: Aux) -> tuple[jax.Array, ...]:
    weight, final_weight, emissions = diff
    arcs, lengths = aux[:2]
    dtype = emissions.dtype
    if arcs.src.shape[0] == 1:  # shared: every row of the broadcast is the same
        weight, final_weight = weight[:1], final_weight[:1]
    return (
        emissions,
        jnp.asarray(lengths, jnp.int32),
        arcs.src,
        arcs.dst,
        arcs.column,
        weight.astype(dtype),
        final_weight.astype(dtype),
        arcs.leak.astype(dtype),
    )


def _call(
    name: str, diff: Diff, aux: Aux, results: tuple[jax.ShapeDtypeStruct, ...], **attrs: Any
) -> tuple[jax.Array, ...]:
    emissions = diff[2]
    call = loader.ffi(name, emissions.dtype, results, vmap_method="sequential")
    return tuple(call(*_operands(diff, aux), **attrs))


def _shapes(diff: Diff, with_flag: bool, with_grads: bool) -> tuple[jax.ShapeDtypeStruct, ...]:
    weight, final_weight, emissions = diff
    dtype = emissions.dtype
    shapes = [jax.ShapeDtypeStruct(emissions.shape[:1], dtype)]
    if with_flag:
        shapes.append(jax.ShapeDtypeStruct(emissions.shape[:1], jnp.int32))
    if with_grads:
        shapes += [
            jax.ShapeDtypeStruct(emissions.shape, dtype),
            jax.ShapeDtypeStruct(weight.shape, dtype),
            jax.ShapeDtypeStruct(final_weight.shape, dtype),
        ]
    return tuple(shapes)


def _by_entry(flag: jax.Array, fallback: jax.Array, value: jax.Array) -> jax.Array:
    where = jnp.reshape(flag, flag.shape + (1,) * (value.ndim - 1))
    return jnp.where(where, fallback, value)


def log_total(reference_value: ValueFn, diff: Diff, aux: Aux) -> jax.Array:
    """log Z [B] by the forward kernel (-inf without a path); entries the
    kernel flags come from `reference_value(diff, aux)`, which runs only
    when one is flagged. Not differentiable by JAX (callers wrap it)."""
    total, large = _call("dense_log_total", diff, aux, _shapes(diff, True, False))
    flagged = large != 0
    return jax.lax.cond(
        jnp.any(flagged),
        lambda: _by_entry(flagged, reference_value(diff, aux), total),
        lambda: total,
    )


@functools.cache
def _log_op(reference: derivatives.ValueAndGrad, weights: bool) -> derivatives.KernelOp:
    def drop_weights(result: tuple[jax.Array, Diff]) -> tuple[jax.Array, Any]:
        total, (weight_grad, final_grad, emission_grad) = result
        return total, (weight_grad if weights else None, final_grad, emission_grad)

    def kernel(diff: Diff, aux: Aux) -> tuple[jax.Array, Any]:
        total, large, emission_grad, weight_grad, final_grad = _call(
            "dense_log_grad", diff, aux, _shapes(diff, True, True), weight_grads=int(weights)
        )
        result = drop_weights((total, (weight_grad, final_grad, emission_grad)))
        flagged = large != 0

        def recompute() -> tuple[jax.Array, Any]:
            exact = drop_weights(reference(diff, aux))
            return jax.tree_util.tree_map(functools.partial(_by_entry, flagged), exact, result)

        return jax.lax.cond(jnp.any(flagged), recompute, lambda: result)

    return derivatives.KernelOp(kernel, lambda diff, aux: drop_weights(reference(diff, aux)))


def log_total_and_grads(
    reference: derivatives.ValueAndGrad, diff: Diff, aux: Aux, *, weights: bool = True
) -> tuple[jax.Array, Any]:
    """(log Z [B], its gradient: the arc posteriors by weight [B, A], final
    weight [B, S] and emission [B, T, V]) by the kernel; differentiable
    through `reference`, the scan's (log Z, gradient). `weights=False`
    skips the weights' gradient (None in its place), which costs a load
    and a store per arc and frame."""
    result: tuple[jax.Array, Any] = derivatives.kernel(_log_op(reference, weights), diff, aux)
    return result


def tropical_total(diff: Diff, aux: Aux) -> jax.Array:
    """The best path's score [B] (-inf without a path); not differentiable
    by JAX (callers wrap it)."""
    (score,) = _call("dense_tropical_total", diff, aux, _shapes(diff, False, False))
    return score


@functools.cache
def _tropical_op(reference: derivatives.ValueAndGrad) -> derivatives.KernelOp:
    def kernel(diff: Diff, aux: Aux) -> tuple[jax.Array, Diff]:
        score, emission_grad, weight_grad, final_grad = _call(
            "dense_tropical_grad", diff, aux, _shapes(diff, False, True)
        )
        return score, (weight_grad, final_grad, emission_grad)

    return derivatives.KernelOp(kernel, reference)


def tropical_total_and_grads(
    reference: derivatives.ValueAndGrad, diff: Diff, aux: Aux
) -> tuple[jax.Array, Diff]:
    """(best score [B], the best path's 0/1 indicator by weight, final
    weight and emission) by the kernel; differentiable through `reference`."""
    result: tuple[jax.Array, Diff] = derivatives.kernel(_tropical_op(reference), diff, aux)
    return result
