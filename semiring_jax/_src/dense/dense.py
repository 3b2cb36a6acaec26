"""Dense intersection of a graph with per-frame scores [B, T, V].

`dense_tot_score` and `viterbi_decode` run the scan of `frame_scan.py`
over a graph's dense tables (`Schedule.dense`, built on
the host by `core/host/dense_tables.py`), vmapped over the batch, without
materialising the lattice. The graph may be cyclic: every arc consumes one
frame. The tables, and each frame's work, grow with the arcs and states, not
with S times the largest degree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy.typing as npt

from semiring_jax._src.core import derivatives, records, route_table, routes
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.inputs import check_inputs
from semiring_jax._src.core.semiring import LOG, TROPICAL, Semiring, lifted
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.dense import arc_scan, frame_scan
from semiring_jax._src.dense.slots import Slots, Tree
from semiring_jax._src.kernels import dense_ops

__all__ = ["dense_tot_score", "graph_slots", "viterbi_decode"]


def graph_slots(graph: Fsa, semiring: Semiring) -> tuple[Slots, jax.Array, jax.Array]:
    """(slots, slot_weight [R, K], final_weight [S]) of one unbatched graph,
    read through its host-built tables (gathers only); unused slots and
    non-final states weigh the semiring's zero."""
    tables = graph.schedule.dense
    in_arc = tables.in_arc  # [R, K], A where unused
    num_states = graph.num_states
    num_rows = in_arc.shape[0]
    src = jnp.append(graph.src, 0)[in_arc]
    label = jnp.append(graph.ilabel, 0)[in_arc]
    dst = jnp.append(graph.dst, num_states)  # A: no state
    weight = records.take(
        records.append(lifted(semiring, graph.weight, graph.arc_mask), semiring.zero), in_arc
    )
    # A state's further rows (R > S) start with one of its arcs, and
    # padding rows with arc A.
    row_state = None
    if num_rows > num_states:
        first = jnp.arange(num_states, dtype=jnp.int32)
        row_state = jnp.concatenate([first, dst[in_arc[num_states:, 0]].astype(jnp.int32)])
    leaving = jnp.asarray(tables.out_slot)  # [Ro, Ko], R * K where unused
    out_dst = dst[jnp.append(in_arc.reshape(-1), graph.num_arcs)[leaving]]
    slots = Slots(
        src=src,
        label=label,
        leaving=leaving,
        row_state=row_state,
        in_tree=Tree(jnp.asarray(tables.in_leaf), jnp.asarray(tables.in_top)),
        out_dst=out_dst,
        out_tree=Tree(jnp.asarray(tables.out_leaf), jnp.asarray(tables.out_top)),
    )
    # Non-final states stop with the semiring's zero, whatever they store.
    final_weight = lifted(semiring, graph.final_weight, graph.final_mask)
    return slots, weight, final_weight


def _over_batch(
    one_utterance: Callable[[Fsa, jax.Array, jax.Array], Any],
    graph: Fsa,
    emissions: jax.Array,
    lengths: jax.Array,
) -> Any:
    """`one_utterance(graph, emissions [T, V], length)` vmapped over B."""
    graph_axis = 0 if graph.batch_shape else None
    return jax.vmap(one_utterance, in_axes=(graph_axis, 0, 0))(graph, emissions, lengths)


def kernel_inputs(
    graph: Fsa, emissions: jax.Array, leak: jax.Array | None = None
) -> tuple[dense_ops.Diff, dense_ops.Arcs]:
    """The kernel's (weight [B, A], final weight [B, S], emissions) and the
    graph's structure: padding arcs and non-final states at -inf (column -1
    for padding), a shared graph's weights broadcast over B so that each
    entry's gradient is its own. `leak` [S]: Kaldi's leaky HMM (none by
    default)."""
    batch = emissions.shape[0]
    zero = -jnp.inf
    weight = jnp.where(graph.arc_mask, graph.weight, zero)
    final_weight = jnp.where(graph.final_mask, graph.final_weight, zero)
    column = jnp.where(graph.arc_mask, graph.ilabel, -1).astype(jnp.int32)
    rows = lambda x: x if graph.batch_shape else x[None]
    if leak is None:
        leak = jnp.zeros((1, graph.num_states), emissions.dtype)
    arcs = dense_ops.Arcs(
        src=rows(graph.src.astype(jnp.int32)),
        dst=rows(graph.dst.astype(jnp.int32)),
        column=rows(column),
        leak=jnp.broadcast_to(leak, (rows(final_weight).shape[0], graph.num_states)),
    )
    widen = lambda x: jnp.broadcast_to(rows(x), (batch, x.shape[-1]))
    return (widen(weight), widen(final_weight), emissions), arcs


def _frame_scan_total(
    semiring: Semiring,
    weight: jax.Array,
    final: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    graph: Fsa,
) -> jax.Array:
    """The frame scan's total of one utterance, in the kernel's inputs."""
    fsa = graph.replace(weight=weight.astype(graph.dtype), final_weight=final.astype(graph.dtype))
    slots, slot_weight, final_weight = graph_slots(fsa, semiring)
    return frame_scan.total(semiring, slots, slot_weight, final_weight, emissions, length)


def _scan_value_and_grads(
    semiring: Semiring, diff: dense_ops.Diff, aux: dense_ops.Aux
) -> tuple[jax.Array, dense_ops.Diff]:
    """The frame scan's (totals [B], gradients like `diff`), by autodiff:
    the TROPICAL kernel's reference, and the tests'. aux = (arcs, lengths,
    graph)."""
    _, lengths, graph = aux
    graph_axis = 0 if graph.batch_shape else None
    one = functools.partial(_frame_scan_total, semiring)
    value_and_grad = jax.value_and_grad(one, argnums=(0, 1, 2))
    value, grads = jax.vmap(value_and_grad, in_axes=(0, 0, 0, 0, graph_axis))(*diff, lengths, graph)
    return value, grads


@functools.cache
def _kernel_op(semiring: Semiring) -> derivatives.ScoreOp:
    """The kernel's dense total (LOG or TROPICAL) as a `derivatives.ScoreOp`
    over (weight [B, A], final weight [B, S], emissions [B, T, V])."""
    log = semiring.arithmetic == "log"
    # LOG's reference is the arc scan, whose recomputation in compensated
    # pairs keeps O(1) differences beside a -1e30 mask; the frame scan
    # lost them where a whole frame reads such a mask (posteriors 0.13 off).
    portable = arc_scan.score_op(leaky=False)
    reference = (
        portable.value_and_grad if log else functools.partial(_scan_value_and_grads, semiring)
    )

    def value(diff: dense_ops.Diff, aux: dense_ops.Aux) -> jax.Array:
        if log:
            return dense_ops.log_total(portable.value, diff, aux)
        return dense_ops.tropical_total(diff, aux)

    def value_and_some_grads(
        diff: dense_ops.Diff, aux: dense_ops.Aux, wanted: tuple[bool, ...]
    ) -> tuple[jax.Array, tuple[jax.Array | None, ...]]:
        if log:  # the kernel skips the weights' gradient when unwanted
            total, grads = dense_ops.log_total_and_grads(reference, diff, aux, weights=wanted[0])
        else:
            total, grads = dense_ops.tropical_total_and_grads(reference, diff, aux)
        return total, derivatives.keep_wanted(grads, wanted)

    return derivatives.ScoreOp(
        value, derivatives.every_grad(value_and_some_grads), value_and_some_grads
    )


def kernel_total(
    semiring: Semiring, graph: Fsa, emissions: jax.Array, lengths: jax.Array
) -> jax.Array:
    """`dense_tot_score` [B] by the kernel (LOG or TROPICAL)."""
    diff, arcs = kernel_inputs(graph, emissions)
    return derivatives.score(_kernel_op(semiring), diff, (arcs, lengths, graph))


def _arc_scan_total(graph: Fsa, emissions: jax.Array, lengths: jax.Array) -> jax.Array:
    """`dense_tot_score` [B] in LOG by the arc scan (`arc_scan.py`)."""
    diff, arcs = kernel_inputs(graph, emissions)
    return derivatives.score(arc_scan.score_op(leaky=False), diff, (arcs, lengths, graph))


def _frame_scan_totals(
    semiring: Semiring, graph: Fsa, emissions: jax.Array, lengths: jax.Array
) -> jax.Array:
    """`dense_tot_score` [B] by the frame scan, vmapped over B."""

    def one_utterance(graph: Fsa, emissions: jax.Array, length: jax.Array) -> jax.Array:
        slots, slot_weight, final_weight = graph_slots(graph, semiring)
        if semiring.lift is not None:
            emissions = semiring.lift(emissions)
        return frame_scan.total(semiring, slots, slot_weight, final_weight, emissions, length)

    return _over_batch(one_utterance, graph, emissions, lengths)


# A frame whose largest emission is beyond this magnitude is shifted to 0.
_HUGE = 2.0**20


def _frame_offsets(emissions: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(emissions [B, T, V] less their frames' offsets, the offsets summed
    over each utterance's first `lengths` frames [B]).

    A frame's offset is its largest finite emission where that is huge (a
    -1e30 mask on every column), else 0. Such a frame would round away the
    O(1) differences between paths on every route (the float or double
    score it is added to keeps none of them): LOG posteriors came out 0.18
    off and TROPICAL's best path was wrong. A common offset per frame
    changes no posterior and no best path, so it is taken out before the
    recursion and added to the total after it, as a constant (no gradient
    flows through it). Ordinary frames are left exactly as they are."""
    top = jnp.max(emissions, axis=-1, initial=-jnp.inf)  # [B, T]; NaN stays NaN
    huge = jnp.isfinite(top) & (jnp.abs(top) > _HUGE)
    offset = jax.lax.stop_gradient(jnp.where(huge, top, jnp.zeros_like(top)))
    active = jnp.arange(emissions.shape[1], dtype=lengths.dtype)[None] < lengths[:, None]
    return emissions - offset[..., None], jnp.sum(jnp.where(active, offset, 0), axis=1)


def _offsets_apply(semiring: Semiring) -> bool:
    # Only where ⊗ is addition of plain scores does a common shift commute.
    return bool(semiring.times_is_addition) and semiring.lift is None


def _impls(semiring: Semiring) -> dict[str, Callable[..., Any]]:
    return {
        "cpu_kernel": functools.partial(kernel_total, semiring),
        "arc_scan": _arc_scan_total,
        "frame_scan": functools.partial(_frame_scan_totals, semiring),
    }


def total(semiring: Semiring, graph: Fsa, emissions: jax.Array, lengths: jax.Array) -> jax.Array:
    """`dense_tot_score` [B] by the routes of `route_table.DENSE_TOT_SCORE`:
    the CPU kernel (LOG, TROPICAL), the arc scan (LOG) or the frame scan."""
    offsets = None
    if _offsets_apply(semiring):
        emissions, offsets = _frame_offsets(emissions, lengths)
    totals = routes.dispatch(
        route_table.DENSE_TOT_SCORE,
        _impls(semiring),
        graph,
        emissions,
        lengths,
        dtype=emissions.dtype,
        arithmetic=semiring.arithmetic,
    )
    return totals if offsets is None else totals + offsets


def total_by(
    route: str, semiring: Semiring, graph: Fsa, emissions: jax.Array, lengths: jax.Array
) -> jax.Array:
    """`dense_tot_score` [B] by the route named (tests and benchmarks
    compare them; its conditions must hold)."""
    return _impls(semiring)[route](graph, emissions, lengths)


@functools.partial(jax.jit, static_argnames="semiring")
@per_device(lambda graph, *rest: [bool(graph.batch_shape), True, True] + [False] * len(rest[2:]))
def _dense_tot_score(
    graph: Fsa, emissions: jax.Array, lengths: jax.Array, semiring: Semiring
) -> jax.Array:
    return total(semiring, graph, emissions, lengths)


def dense_tot_score(
    graph: Fsa,
    emissions: npt.ArrayLike,
    lengths: npt.ArrayLike | None = None,
    semiring: Semiring = LOG,
) -> jax.Array:
    """⊕ over the paths of `graph` that consume exactly `lengths[b]` frames.

    Every arc consumes one frame and adds `emissions[b, t, arc.ilabel]` to
    its weight (label 0 is an ordinary column here, e.g. a CTC blank); a
    path counts if it starts in state 0 and ends in a final state (adding
    its final weight) after exactly `lengths[b]` frames. The lattice is not
    materialised: a `lax.scan` over frames carries the [S] forward scores,
    normalised per frame so that float32 stays accurate for long inputs.

    Gradients (a backward recursion for LOG and TROPICAL, as a custom JVP:
    forward and reverse mode both work): with respect to `emissions`
    they are the per-frame posteriors of each column (LOG) or the 0/1
    indicator of the best path's columns (TROPICAL; ties: the lowest
    best final state, then the lowest-numbered arc into each state); with
    respect to `graph.weight` / `final_weight`, the expected number of uses
    (LOG) or the count on the best path. Frames past `lengths[b]` get
    gradient exactly 0; so does everything when no path succeeds (-inf).
    NaN in a weight or in an emission the scan reads (within the length)
    gives NaN, with NaN gradients. Other semirings: plain autodiff through
    an unnormalised scan.

    Args:
      graph: an Fsa (cyclic allowed) shared by the batch, or a batched Fsa
        with B entries (one graph per utterance). Labels in [0, V).
      emissions: float [B, T, V], per-frame scores (e.g. log-probabilities).
      lengths: int [B], frames per utterance in [0, T]; T by default.
        Checked when concrete; traced, clamped to [0, T] before the cast
        to int32 (an int64 value never wraps).
      semiring: LOG (default), TROPICAL or any `Semiring`.
    Returns:
      float [B]; -inf where no path of the right length succeeds.
    Raises:
      ValueError: for emissions not of rank 3, lengths outside [0, T], a
        batched graph whose size is not B, a label outside [0, V) (naming
        the arc), or a graph dtype that differs from the emissions'.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)],
      ...                          final=[1])
      >>> emissions = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75]]], jnp.float32))
      >>> print(jnp.round(jnp.exp(sj.dense_tot_score(graph, emissions)), 4))
      [0.75]
    """
    emissions, lengths = check_inputs(graph, emissions, lengths, "dense_tot_score")
    return _dense_tot_score(graph, emissions, lengths, semiring)


@jax.jit
@per_device(lambda graph, *rest: [bool(graph.batch_shape), True, True] + [False] * len(rest[2:]))
def _viterbi_decode(
    graph: Fsa, emissions: jax.Array, lengths: jax.Array
) -> tuple[jax.Array, jax.Array]:
    def frame_scan_columns(
        graph: Fsa, emissions: jax.Array, lengths: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        def one_utterance(
            graph: Fsa, emissions: jax.Array, length: jax.Array
        ) -> tuple[jax.Array, jax.Array]:
            slots, slot_weight, final_weight = graph_slots(graph, TROPICAL)
            return best_columns(slots, slot_weight, final_weight, emissions, length)

        return _over_batch(one_utterance, graph, emissions, lengths)

    impls: dict[str, Callable[..., Any]] = {
        "cpu_kernel": _kernel_best_columns,
        "frame_scan": frame_scan_columns,
    }
    emissions, offsets = _frame_offsets(emissions, lengths)
    columns, scores = routes.dispatch(
        route_table.VITERBI_DECODE, impls, graph, emissions, lengths, dtype=emissions.dtype
    )
    return columns, scores + offsets


def _kernel_best_columns(
    graph: Fsa, emissions: jax.Array, lengths: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`viterbi_decode` by the kernel: the columns are where the best path's
    emission indicator (its gradient) is 1, frame by frame. One kernel call
    gives the score and the indicator: TROPICAL's derivative is that
    indicator, so the score is made differentiable as score + ⟨indicator,
    diff - stop_gradient(diff)⟩ (exact: the score is linear near a point
    where the best path is unique, and the tie rule picks one path)."""
    diff, arcs = kernel_inputs(graph, emissions)
    aux = (arcs, lengths, graph)
    reference = functools.partial(_scan_value_and_grads, TROPICAL)
    fixed = jax.lax.stop_gradient(diff)
    score, grads = dense_ops.tropical_total_and_grads(reference, fixed, aux)
    indicator = grads[2]
    columns = jnp.where(jnp.any(indicator > 0, axis=-1), jnp.argmax(indicator, axis=-1), -1)
    # Padding and unused entries hold -inf: they move nothing.
    steps = tuple(jnp.where(jnp.isfinite(f), d - f, 0.0) for d, f in zip(diff, fixed, strict=True))
    moved = score + derivatives.contract(score, grads, steps)
    # No path (-inf), +inf or NaN: the score as it is.
    return columns.astype(jnp.int32), jnp.where(jnp.isfinite(score), moved, score)


def best_columns(
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """(int32 [T] column per frame, -1 past `length`; best score []) of one
    utterance. The score is the TROPICAL total, so it is differentiable."""
    alpha, choices, _ = frame_scan.forward_with_choices(
        TROPICAL,
        slots,
        jax.lax.stop_gradient(slot_weight),
        jax.lax.stop_gradient(emissions),
        length,
    )
    _, columns, _, _ = frame_scan.best_frames(
        TROPICAL,
        slots,
        slot_weight.shape,
        jax.lax.stop_gradient(final_weight),
        alpha,
        choices,
        length,
    )
    score = frame_scan.total(TROPICAL, slots, slot_weight, final_weight, emissions, length)
    return columns.astype(jnp.int32), score


def viterbi_decode(
    graph: Fsa, emissions: npt.ArrayLike, lengths: npt.ArrayLike | None = None
) -> tuple[jax.Array, jax.Array]:
    """The best path through `graph`'s dense intersection, frame by frame.

    The path maximises the TROPICAL score of `dense_tot_score` (ties as
    there: the lowest best final state, then the lowest-numbered arc).

    Args:
      graph: an Fsa shared by the batch, or a batched Fsa with B entries.
      emissions: float [B, T, V].
      lengths: int [B] in [0, T]; T by default.
    Returns:
      `(frame_labels, scores)`: int32 [B, T], the ilabel of the arc taken at
      each frame (-1 past `lengths[b]`, and everywhere when no path
      succeeds); float [B], the best path's score, equal to
      `dense_tot_score(graph, emissions, lengths, sj.TROPICAL)`.
    Raises:
      ValueError: as `dense_tot_score`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)],
      ...                          final=[1])
      >>> emissions = jnp.log(jnp.array([[[0.6, 0.4], [0.25, 0.75], [0.1, 0.9]]], jnp.float32))
      >>> labels, scores = sj.viterbi_decode(graph, emissions)
      >>> print(labels, jnp.round(jnp.exp(scores), 4))
      [[0 1 1]] [0.405]
    """
    emissions, lengths = check_inputs(graph, emissions, lengths, "viterbi_decode")
    return _viterbi_decode(graph, emissions, lengths)
