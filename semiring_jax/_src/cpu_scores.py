"""`tot_score` and its gradients through the compiled CPU kernels (traced).

The kernels (`kernels/scores.cc`) walk an unbatched Fsa's states in
topological order and pull each state's incoming arcs from
`Schedule.pull_*`: one pass over the arcs forward, one backward, in
place of the level scan's many small XLA kernels. Batches reach them through
`jax.vmap` (the FFI calls loop over the batch inside one call).

The gradient is a `jax.custom_vjp` like the scan version's. Its backward
pass is itself a `custom_vjp` whose derivative is the portable recursion's
(passed in as `reference`), so reverse-over-reverse gives the same results
as without the kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src import kernels
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
    each state's chosen arc [S] (int32, -1 for none). Not differentiable:
    see `_forward_core`."""
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _gradients_core(
    semiring: Semiring,
    reference: Reference,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: jax.Array,
    final: jax.Array,
    alpha: jax.Array,
    saved: Any,
    total: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    return _backward(semiring, schedule, src, weight, final, alpha, saved, total)


def _gradients_fwd(
    semiring: Semiring,
    reference: Reference,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: jax.Array,
    final: jax.Array,
    alpha: jax.Array,
    saved: Any,
    total: jax.Array,
) -> tuple[tuple[jax.Array, jax.Array], tuple[Any, ...]]:
    # The primal through the custom_vjp again, so that an outer derivative
    # of this rule sees the rules, not the FFI call.
    out = _gradients_core(semiring, reference, schedule, src, weight, final, alpha, saved, total)
    return out, (schedule, weight, final, alpha, saved, total)


def _gradients_bwd(
    semiring: Semiring,
    reference: Reference,
    residuals: tuple[Any, ...],
    cotangents: tuple[jax.Array, jax.Array],
) -> tuple[Any, ...]:
    # α, the saved values and the total are functions of the weights; the
    # reference's derivative with respect to the weights already counts
    # their part, so they get zero cotangents.
    schedule, weight, final, alpha, saved, total = residuals
    _, pullback = jax.vjp(lambda w, f: reference(semiring, schedule, w, f), weight, final)
    weight_ct, final_ct = pullback(cotangents)
    saved_ct = jax.tree_util.tree_map(
        lambda x: jnp.zeros_like(x) if jnp.issubdtype(x.dtype, jnp.floating) else None, saved
    )
    return None, None, weight_ct, final_ct, jnp.zeros_like(alpha), saved_ct, jnp.zeros_like(total)


_gradients_core.defvjp(_gradients_fwd, _gradients_bwd)


# The forward pass with its derivative. Only the total's cotangent counts:
# α and the saved values flow into nothing but `_gradients_core`, which
# gives them zero cotangents (its derivative is the reference's, taken with
# respect to the weights directly).
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _forward_core(
    semiring: Semiring,
    reference: Reference,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: jax.Array,
    final: jax.Array,
) -> tuple[jax.Array, jax.Array, Any]:
    return _forward(semiring, schedule, src, weight, final)


def _forward_fwd(
    semiring: Semiring,
    reference: Reference,
    schedule: Schedule,
    src: ArrayLeaf,
    weight: jax.Array,
    final: jax.Array,
) -> tuple[tuple[jax.Array, jax.Array, jax.Array], tuple[Any, ...]]:
    out = _forward_core(semiring, reference, schedule, src, weight, final)  # see _gradients_fwd
    return out, (schedule, src, weight, final, *out)


def _forward_bwd(
    semiring: Semiring,
    reference: Reference,
    residuals: tuple[Any, ...],
    cotangents: tuple[jax.Array, jax.Array, jax.Array],
) -> tuple[Any, ...]:
    schedule, src, weight, final, total, alpha, saved = residuals
    arc_grad, final_grad = _gradients_core(
        semiring, reference, schedule, src, weight, final, alpha, saved, total
    )
    total_ct = cotangents[0]
    return None, None, arc_grad * total_ct, final_grad * total_ct


_forward_core.defvjp(_forward_fwd, _forward_bwd)


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
    weight, final = _inputs(weight, final)
    total, alpha, saved = _forward_core(semiring, reference, schedule, src, weight, final)
    return _gradients_core(semiring, reference, schedule, src, weight, final, alpha, saved, total)


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
    weight, final = _inputs(weight, final)
    return _forward_core(semiring, reference, schedule, src, weight, final)[0]
