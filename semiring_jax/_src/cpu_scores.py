"""`tot_score` and its gradients through the compiled CPU kernels (traced).

The kernels (`kernels/scores.cc`) walk an unbatched Fsa's states in
topological order and pull each state's incoming arcs from
`Schedule.pull_*`: one pass over the arcs forward, one backward, in
place of the level scan's many small XLA kernels. Batches reach them through
`jax.vmap` (the FFI calls loop over the batch inside one call).

Derivatives come from `kernel_vjp`: the gradient is the backward kernel,
and its own derivative the portable recursion's gradient (passed in as
`reference`), so reverse-over-reverse gives the same results as without the
kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src import kernel_vjp, kernels
from semiring_jax._src.array_types import ArrayLeaf
from semiring_jax._src.schedule import Schedule
from semiring_jax._src.semiring import LOG, TROPICAL, Semiring

__all__ = ["gradients", "tot_score", "usable"]

# (semiring, schedule, weight [A], final_weight [S]) -> (∂/∂weight, ∂/∂final).
Reference = Callable[[Semiring, Schedule, ArrayLeaf, ArrayLeaf], tuple[jax.Array, jax.Array]]


def usable(semiring: Semiring, schedule: Schedule, weight: ArrayLeaf) -> bool:
    """Whether the kernels serve this semiring, Fsa and dtype (trace time)."""
    return (
        (semiring is LOG or semiring is TROPICAL)
        and jnp.dtype(weight.dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))
        and kernels.enabled()
    )


def _tables(schedule: Schedule) -> tuple[jax.Array, ...]:
    """The tables the kernels walk: pos_state, pull_end [L, W], pull_arc,
    pull_src [A]."""
    fields = (schedule.pos_state, schedule.pull_end, schedule.pull_arc, schedule.pull_src)
    return tuple(jnp.asarray(table, jnp.int32) for table in fields)


def _forward(
    semiring: Semiring, schedule: Schedule, src: ArrayLeaf, weight: jax.Array, final: jax.Array
) -> tuple[jax.Array, jax.Array, Any]:
    """(total [], α [S], saved). LOG saves each arc's unnormalised local
    weight exp(α[src] + w - max) [A] and each state's 1 / sum [S]; TROPICAL
    each state's chosen arc [S] (int32, -1 for none). Not differentiable
    by JAX: see `_op`."""
    dtype = weight.dtype
    total_alpha = (jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct(final.shape, dtype))
    if semiring is LOG:
        call = jax.ffi.ffi_call(
            "semiring_jax_log_forward",
            (*total_alpha, jax.ShapeDtypeStruct(weight.shape, dtype), total_alpha[1]),
            vmap_method="broadcast_all",
        )
        total, alpha, local, norm = call(weight, final, *_tables(schedule))
        return total, alpha, (local, norm)
    call = jax.ffi.ffi_call(
        "semiring_jax_tropical_forward",
        (*total_alpha, jax.ShapeDtypeStruct(final.shape, jnp.int32)),
        vmap_method="broadcast_all",
    )
    total, alpha, choice = call(weight, final, *_tables(schedule))
    return total, alpha, choice


def _backward(
    semiring: Semiring,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: jax.Array,
    final: jax.Array,
    alpha: jax.Array,
    saved: Any,
    total: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    dtype = weight.dtype
    shapes = (jax.ShapeDtypeStruct(weight.shape, dtype), jax.ShapeDtypeStruct(final.shape, dtype))
    if semiring is LOG:
        call = jax.ffi.ffi_call("semiring_jax_log_backward", shapes, vmap_method="broadcast_all")
        local, norm = saved
        arc_grad, final_grad = call(final, *_tables(schedule), alpha, local, norm, total)
    else:
        call = jax.ffi.ffi_call(
            "semiring_jax_tropical_backward", shapes, vmap_method="broadcast_all"
        )
        arc_grad, final_grad = call(final, jnp.asarray(src, jnp.int32), alpha, saved)
    return arc_grad, final_grad


@functools.cache
def _op(semiring: Semiring, reference: Reference) -> kernel_vjp.KernelOp:
    """The kernels as a `KernelOp` with diff = (weight, final) and aux =
    (schedule, src); cached, so that traces share one static argument."""

    def forward(diff: tuple[jax.Array, jax.Array], aux: tuple[Schedule, ArrayLeaf]) -> Any:
        total, alpha, saved = _forward(semiring, aux[0], aux[1], *diff)
        return total, (alpha, saved)

    def backward(
        diff: tuple[jax.Array, jax.Array],
        aux: tuple[Schedule, ArrayLeaf],
        total: jax.Array,
        kept: tuple[jax.Array, Any],
        cotangent: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        grads = _backward(semiring, aux[0], aux[1], *diff, *kept, total)
        return grads[0] * cotangent, grads[1] * cotangent

    def scan_gradient(
        diff: tuple[jax.Array, jax.Array], aux: tuple[Schedule, ArrayLeaf], cotangent: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        grads = reference(semiring, aux[0], *diff)
        return grads[0] * cotangent, grads[1] * cotangent

    return kernel_vjp.KernelOp(forward, backward, scan_gradient)


def _inputs(weight: ArrayLeaf, final: ArrayLeaf) -> tuple[jax.Array, jax.Array]:
    weight = jnp.asarray(weight)
    return weight, jnp.asarray(final, weight.dtype)


def gradients(
    semiring: Semiring,
    reference: Reference,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: ArrayLeaf,
    final: ArrayLeaf,
) -> tuple[jax.Array, jax.Array]:
    """∂ tot_score / ∂ (weight [A], final_weight [S]) by the kernels; its own
    derivatives come from `reference`, the portable recursion's gradient."""
    diff = _inputs(weight, final)
    one = jnp.ones((), diff[0].dtype)
    grads: tuple[jax.Array, jax.Array] = kernel_vjp.gradient(
        _op(semiring, reference), diff, (schedule, src), one
    )
    return grads


def tot_score(
    semiring: Semiring,
    reference: Reference,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: ArrayLeaf,
    final: ArrayLeaf,
) -> jax.Array:
    """The total score of an unbatched Fsa by the kernels, [].

    Its gradient is the kernels' backward pass; derivatives of that gradient
    come from `reference`, the portable recursion's gradient.
    """
    return kernel_vjp.value(_op(semiring, reference), _inputs(weight, final), (schedule, src))
