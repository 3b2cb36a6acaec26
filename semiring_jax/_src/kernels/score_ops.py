"""The score ops' compiled CPU kernels (traced): `tot_score` and its
gradients in LOG and TROPICAL, `kbest_scores`' k best paths and `entropy`
with its gradients.

The kernels (`kernels/scores.cc`) walk an unbatched Fsa's states level by
level, in the schedule's order (`Schedule.levels.pos_state`), and pull each
state's incoming arcs from `Schedule.pull`: one pass over the arcs for the
value, and one more, backward, in the same call for the gradient, in place
of the level scan's many small XLA ops. Batches reach them through
`jax.vmap` (the FFI calls loop over the batch inside one call). Where they
serve is the route table's to say (`core/route_table.py`), at lowering time.

The gradient call is a `derivatives.kernel`: its own derivative is the
portable recursion's (passed in as `reference`), so second derivatives
agree with the scan's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import derivatives
from semiring_jax._src.core.array_types import ArrayLeaf
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.semiring import Semiring
from semiring_jax._src.kernels import loader

__all__ = ["entropy", "kbest", "total", "value_and_grads"]

Diff = tuple[jax.Array, jax.Array]  # (weight [A], final_weight [S])
Aux = tuple[Schedule, ArrayLeaf, ArrayLeaf]  # (schedule, src [A], final_mask [S])


def _tables(schedule: Schedule) -> tuple[jax.Array, ...]:
    """The tables the kernels walk: pos_state, pull_end [L, W], pull_arc,
    pull_src [A]."""
    fields = (schedule.levels.pos_state, schedule.pull.end, schedule.pull.arc, schedule.pull.src)
    return tuple(jnp.asarray(table, jnp.int32) for table in fields)


def _inputs(weight: ArrayLeaf, final: ArrayLeaf) -> Diff:
    weight = jnp.asarray(weight)
    return weight, jnp.asarray(final, weight.dtype)


def _final_mask(final: jax.Array, final_mask: ArrayLeaf | None) -> jax.Array:
    """tot_score's kernels' final_mask [S]: which final weights they read
    (-inf elsewhere; every one where None)."""
    if final_mask is None:
        return jnp.ones(final.shape, bool)
    return jnp.asarray(final_mask, bool)


def total(
    semiring: Semiring,
    schedule: Schedule,
    weight: ArrayLeaf,
    final: ArrayLeaf,
    final_mask: ArrayLeaf | None = None,
) -> jax.Array:
    """The total score [] of an unbatched Fsa by the value kernel (not
    differentiable by JAX: callers wrap it in `derivatives.score`). Final
    weights are read where `final_mask` [S] holds (every one where None),
    as -inf elsewhere: the kernel applies the mask, so that no select on
    [S] runs in the program around it."""
    weight, final = _inputs(weight, final)
    call = loader.ffi(
        f"{semiring.arithmetic}_total",
        weight.dtype,
        jax.ShapeDtypeStruct((), weight.dtype),
        vmap_method="broadcast_all",
    )
    return call(weight, final, _final_mask(final, final_mask), *_tables(schedule))


@functools.cache
def _op(semiring: Semiring, reference: derivatives.ValueAndGrad) -> derivatives.KernelOp:
    """The gradient kernel and its reference; cached, so that traces share
    one static argument."""

    def kernel(diff: Diff, aux: Aux) -> tuple[jax.Array, Diff]:
        (weight, final), (schedule, src, final_mask) = diff, aux
        dtype = weight.dtype
        shapes = (
            jax.ShapeDtypeStruct((), dtype),
            jax.ShapeDtypeStruct(weight.shape, dtype),
            jax.ShapeDtypeStruct(final.shape, dtype),
        )
        call = loader.ffi(f"{semiring.arithmetic}_grad", dtype, shapes, vmap_method="broadcast_all")
        # The tropical trace-back also reads each arc's source state.
        extra = () if semiring.arithmetic == "log" else (jnp.asarray(src, jnp.int32),)
        mask = _final_mask(final, final_mask)
        value, arc_grad, final_grad = call(weight, final, mask, *_tables(schedule), *extra)
        return value, (arc_grad, final_grad)

    return derivatives.KernelOp(kernel, reference)


def value_and_grads(
    semiring: Semiring,
    reference: derivatives.ValueAndGrad,
    schedule: Schedule,
    src: ArrayLeaf,
    final_mask: ArrayLeaf,
    weight: ArrayLeaf,
    final: ArrayLeaf,
) -> tuple[jax.Array, Diff]:
    """(total [], (∂/∂weight [A], ∂/∂final [S])) by the gradient kernel,
    reading final weights where `final_mask` [S] holds (-inf elsewhere,
    and gradient 0 there); differentiable through `reference((weight,
    final), (schedule, src, final_mask))`, the portable recursion's (total,
    gradients)."""
    result: tuple[jax.Array, Diff] = derivatives.kernel(
        _op(semiring, reference), _inputs(weight, final), (schedule, src, final_mask)
    )
    return result


def kbest(
    schedule: Schedule, weight: ArrayLeaf, final: ArrayLeaf, k: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The k best path scores of an unbatched Fsa by the KBEST kernel:
    (scores [k] best first, -inf where fewer; each path's arcs [k, L], A
    past its end; its final state [k], S where none). Not differentiable
    by JAX: `scores/kbest.py` builds the derivative from the paths."""
    weight, final = _inputs(weight, final)
    length = max(int(schedule.levels.pos_state.shape[-2]), 1)
    shapes = (
        jax.ShapeDtypeStruct((k,), weight.dtype),
        jax.ShapeDtypeStruct((k, length), jnp.int32),
        jax.ShapeDtypeStruct((k,), jnp.int32),
    )
    call = loader.ffi("kbest", weight.dtype, shapes, vmap_method="broadcast_all")
    scores, paths, ends = call(weight, final, *_tables(schedule), k=np.int64(k))
    return scores, paths, ends


def entropy(schedule: Schedule, weight: ArrayLeaf, final: ArrayLeaf) -> tuple[jax.Array, Diff]:
    """(entropy [], (∂/∂weight [A], ∂/∂final [S])) of an unbatched Fsa's
    LOG path distribution by the ENTROPY kernel (not differentiable by JAX:
    callers wrap it in `derivatives.kernel`)."""
    weight, final = _inputs(weight, final)
    shapes = (
        jax.ShapeDtypeStruct((), weight.dtype),
        jax.ShapeDtypeStruct(weight.shape, weight.dtype),
        jax.ShapeDtypeStruct(final.shape, weight.dtype),
    )
    call = loader.ffi("entropy", weight.dtype, shapes, vmap_method="broadcast_all")
    value, arc_grad, final_grad = call(weight, final, *_tables(schedule))
    return value, (arc_grad, final_grad)
