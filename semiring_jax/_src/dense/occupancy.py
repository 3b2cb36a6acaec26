"""`dense_occupancy`: per-frame posteriors of a dense intersection.

Both views are gradients of `dense_tot_score` with respect to emissions, so
they reuse its custom gradient (the compensated LOG forward-backward, or the
TROPICAL trace-back) and never build the lattice. Per label, that is the
gradient itself. Per state, each arc reads its emission through a column of
its own (ilabel, dst) pair: the gradient of such a column is the posterior of
entering dst at that frame with that label, and summing the pairs of each
dst gives the state's occupancy exactly. The pairs are few in the usual
graphs (V for `ctc_topo`, S for a CTC graph), at most A.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.inputs import check_inputs
from semiring_jax._src.core.semiring import LOG, Semiring, check_float_semiring
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.dense.dense import dense_tot_score

__all__ = ["dense_occupancy"]

_VIEWS = ("labels", "states")


def dense_occupancy(
    graph: Fsa,
    emissions: Any,
    lengths: Any | None = None,
    semiring: Semiring = LOG,
    *,
    over: str = "labels",
) -> jax.Array:
    """Per-frame occupancy of the labels or the states of `graph`.

    The paths are those of `dense_tot_score`: every arc consumes one frame
    and adds `emissions[b, t, arc.ilabel]`; a path counts if it ends in a
    final state after exactly `lengths[b]` frames.

    - LOG: `over="labels"` gives the posterior probability that frame t is
      consumed by an arc with ilabel v (the gradient of `dense_tot_score`
      with respect to `emissions`); `over="states"` the posterior probability
      that the path is in graph state s after frame t (the destination of
      frame t's arc). Each row within the length sums to 1.
    - TROPICAL: the same quantities for the best path alone, a 0/1 indicator
      with one 1 per frame, so `argmax` over the last axis is the best
      alignment (ties as in `viterbi_decode`; the labels equal its
      `frame_labels` within the length).
    - Any other semiring: the gradient of its `dense_tot_score`.

    Frames past `lengths[b]` are 0, and so is every frame of an utterance
    with no path of the right length (never NaN).

    Args:
      graph: an Fsa shared by the batch, or a batched Fsa with B entries.
        With `over="states"`, a concrete graph costs one emission column
        per distinct (ilabel, dst) pair; a traced one, one per arc.
      emissions: float [B, T, V], per-frame scores (e.g. log-probabilities).
      lengths: int [B] in [0, T]; T by default.
      semiring: LOG (default), TROPICAL or any `Semiring`.
      over: "labels" (default) for [B, T, V], or "states" for [B, T, S].
    Returns:
      float [B, T, V] or [B, T, S], the emissions' dtype.
    Raises:
      ValueError: for an `over` other than "labels" or "states", or as
        `dense_tot_score`.
      TypeError: for a Semiring passed in place of `lengths`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)],
      ...                          final=[1])
      >>> emissions = jnp.log(jnp.array([[[0.6, 0.4], [0.3, 0.7]]], jnp.float32))
      >>> # Two paths: labels 0 1 (probability 0.42) and 1 1 (0.28).
      >>> print(jnp.round(sj.dense_occupancy(graph, emissions), 3))
      [[[0.6 0.4]
        [0.  1. ]]]
      >>> print(sj.dense_occupancy(graph, emissions, semiring=sj.TROPICAL, over="states"))
      [[[1. 0.]
        [0. 1.]]]
    """
    if over not in _VIEWS:
        raise ValueError(f"dense_occupancy: over must be 'labels' or 'states', got {over!r}")
    if isinstance(lengths, Semiring):  # dense_occupancy(graph, emissions, sj.TROPICAL)
        raise TypeError("dense_occupancy: lengths is a Semiring; pass it by keyword, semiring=...")
    check_float_semiring(semiring, "dense_occupancy")
    emissions, lengths = check_inputs(graph, emissions, lengths, "dense_occupancy")
    batch, _, num_columns = emissions.shape
    if over == "labels":
        return _label_occupancy(graph, emissions, lengths, semiring)
    pair_of_arc, pair_label, pair_state = _pairs(graph, batch, num_columns)
    return _state_occupancy(
        graph.replace(ilabel=pair_of_arc), emissions, lengths, pair_label, pair_state, semiring
    )


def _emission_grad(
    graph: Fsa, emissions: jax.Array, lengths: jax.Array, semiring: Semiring
) -> jax.Array:
    # Utterances are independent, so the gradient of the sum is each one's
    # own gradient; an all -inf total contributes exactly 0.
    return jax.grad(lambda e: jnp.sum(dense_tot_score(graph, e, lengths, semiring)))(emissions)


@functools.partial(jax.jit, static_argnames="semiring")
@per_device(lambda graph, *rest: [bool(graph.batch_shape), True, True] + [False] * len(rest[2:]))
def _label_occupancy(
    graph: Fsa, emissions: jax.Array, lengths: jax.Array, semiring: Semiring
) -> jax.Array:
    return _emission_grad(graph, emissions, lengths, semiring)


@functools.partial(jax.jit, static_argnames="semiring")
@per_device(lambda graph, *rest: [bool(graph.batch_shape), True, True, True, True, False])
def _state_occupancy(
    pair_graph: Fsa,
    emissions: jax.Array,
    lengths: jax.Array,
    pair_label: jax.Array,
    pair_state: jax.Array,
    semiring: Semiring,
) -> jax.Array:
    """pair_label, pair_state: int32 [B, P], each pair's column and state."""
    pair_emissions = jax.vmap(lambda e, label: e[:, label])(emissions, pair_label)  # [B, T, P]
    pair_occupancy = _emission_grad(pair_graph, pair_emissions, lengths, semiring)
    num_frames, num_states = emissions.shape[1], pair_graph.num_states

    def by_state(occupancy: jax.Array, state: jax.Array) -> jax.Array:
        return jnp.zeros((num_frames, num_states), occupancy.dtype).at[:, state].add(occupancy)

    return jax.vmap(by_state)(pair_occupancy, pair_state)


def _pairs(graph: Fsa, batch: int, num_columns: int) -> tuple[Any, jax.Array, jax.Array]:
    """(pair of each arc int32 [A] or [B, A], pair_label [B, P], pair_state
    [B, P]): the distinct (ilabel, dst) pairs of the real arcs when the
    structure is concrete, else one pair per arc."""
    fields = (graph.ilabel, graph.dst, graph.arc_mask)
    if any(checks.is_traced(field) for field in fields):
        labels = jnp.clip(graph.ilabel, 0, num_columns - 1)  # padding arcs: any column
        arcs = jnp.broadcast_to(jnp.arange(graph.num_arcs, dtype=jnp.int32), graph.ilabel.shape)
        shape = (batch, graph.num_arcs)
        return (
            arcs,
            jnp.broadcast_to(labels, shape).astype(jnp.int32),
            jnp.broadcast_to(graph.dst, shape).astype(jnp.int32),
        )
    ilabel, dst, real = (np.asarray(field) for field in fields)
    real = real.astype(bool)
    # Padding arcs (weight -inf) share pair 0, so at least one pair exists.
    found = np.stack([ilabel[real], dst[real]], axis=1).reshape(-1, 2)
    pairs, inverse = np.unique(
        np.concatenate([np.zeros((1, 2), found.dtype), found]), axis=0, return_inverse=True
    )
    pair_of_arc = np.zeros(ilabel.shape, np.int32)
    pair_of_arc[real] = inverse.reshape(-1)[1:]
    as_rows = lambda values: np.broadcast_to(values.astype(np.int32), (batch, pairs.shape[0]))
    return pair_of_arc, jnp.asarray(as_rows(pairs[:, 0])), jnp.asarray(as_rows(pairs[:, 1]))
