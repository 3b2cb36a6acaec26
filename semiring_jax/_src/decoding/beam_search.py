"""A frame-synchronous beam search over a graph with static shapes (traced).

The search keeps K state slots per utterance (K = `max_active`, or S if
smaller). At each frame it expands every arc of the active states — at
most E of them, E the sum of the K largest out-degrees, a static bound
the host works out — into (destination, score) candidates, keeps each
destination's best, and keeps the K best destinations that are within
`search_beam` of the frame's best (and at least the `min_active` best,
beam or not). The work per frame is O(E) segment reductions and a top-K
of E, whatever the graph's size (the segments' [S] buffers aside).
E may also be capped (`max_arcs`): the slots are in score order, so the
arcs past the cap are those of the frame's worst states.
Frames past an utterance's length leave its slots as they are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["SearchGraph", "beam_search", "search_graph"]


class SearchGraph(NamedTuple):
    """A graph's real arcs grouped by source state, for the search.

    Attributes:
      out_start: int32 [S + 1], state s's arcs are [out_start[s], out_start[s + 1]).
      dst, label: int32 [A' + 1], the arcs in that order, then a spare one.
      arc: int [A'], the index of each into the graph's arc arrays.
      expand: E, the static bound on the arcs K states have.
    """

    out_start: np.ndarray | jax.Array
    dst: np.ndarray | jax.Array
    label: np.ndarray | jax.Array
    arc: np.ndarray | jax.Array
    expand: int


def search_graph(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    label: np.ndarray,
    arc: np.ndarray,
    slots: int,
    max_arcs: int | None = None,
) -> SearchGraph:
    """`SearchGraph` of the real arcs (src, dst, label [A'], `arc` their
    indices in the graph) for `slots` = K states per frame (host); E is
    capped at `max_arcs` where given."""
    order = np.argsort(src, kind="stable")
    out_start = np.searchsorted(src[order], np.arange(num_states + 1)).astype(np.int32)
    degrees = np.diff(out_start)
    expand = int(np.sort(degrees)[::-1][:slots].sum())
    if max_arcs is not None:
        expand = min(expand, max_arcs)
    return SearchGraph(
        out_start, _with_spare(dst, order), _with_spare(label, order), arc[order], max(expand, 1)
    )


def _with_spare(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """int32 [A' + 1]: values[order], then one more arc, never expanded (no
    state's range reaches it), so that a graph without arcs still has
    something to gather from. One copy (these are the graph's size)."""
    out = np.zeros(order.size + 1, np.int32)
    out[:-1] = values[order]
    return out


def _step(
    graph: SearchGraph,
    weight: jax.Array,
    frame: jax.Array,
    states: jax.Array,
    scores: jax.Array,
    search_beam: jax.Array,
    min_active: int,
) -> tuple[jax.Array, jax.Array]:
    """One frame: the next slots (states int32 [K], -1 empty; scores [K])."""
    slots = states.shape[0]
    num_states = graph.out_start.shape[0] - 1
    out_start = jnp.asarray(graph.out_start)
    valid = states >= 0
    state = jnp.where(valid, states, 0)
    degree = jnp.where(valid, out_start[state + 1] - out_start[state], 0)
    ends = jnp.cumsum(degree, dtype=jnp.int32)  # [K]
    edge = jnp.arange(graph.expand, dtype=jnp.int32)
    # The slot of each edge: a count at each slot's first edge, summed up (a
    # slot without arcs shares its start with the next and is skipped).
    starts = jnp.zeros(graph.expand, jnp.int32).at[ends - degree].add(1, mode="drop")
    slot = jnp.minimum(jnp.cumsum(starts, dtype=jnp.int32) - 1, slots - 1)  # [E]
    live = edge < ends[-1]
    arc = jnp.where(live, out_start[state[slot]] + edge - (ends[slot] - degree[slot]), 0)
    label = jnp.asarray(graph.label)[arc]
    candidate = jnp.where(live, scores[slot] + weight[arc] + frame[label], -jnp.inf)
    target = jnp.where(live, jnp.asarray(graph.dst)[arc], num_states)
    # Each destination's best candidate, the first edge among ties, by
    # segment reductions (XLA's CPU sorts are ~100x slower than these).
    top = jax.ops.segment_max(candidate, target, num_segments=num_states + 1)
    is_top = live & (candidate == top[target]) & (candidate > -jnp.inf)
    first = jax.ops.segment_min(
        jnp.where(is_top, edge, graph.expand), target, num_segments=num_states + 1
    )
    # A NaN matches nothing: kept as it is, so that it stays visible.
    keep_edge = (is_top & (first[target] == edge)) | (live & jnp.isnan(candidate))
    candidate = jnp.where(keep_edge, candidate, -jnp.inf)
    best, picked = jax.lax.top_k(candidate, min(slots, graph.expand))  # best first
    rank = jnp.arange(best.shape[0], dtype=jnp.int32)
    # The barrier: a slice of top_k's output read in the fusion below makes
    # XLA's CPU backend redo work per element (7x slower per frame).
    frame_best = jax.lax.optimization_barrier(best)[0]
    keep = (best > -jnp.inf) & ((best >= frame_best - search_beam) | (rank < min_active))
    # NaN scores: kept (a NaN compares false everywhere else), so they stay visible.
    keep |= jnp.isnan(best)
    # Fewer candidates than slots (E < K): the rest stay empty.
    missing = slots - best.shape[0]
    new_states = jnp.pad(jnp.where(keep, target[picked], -1), (0, missing), constant_values=-1)
    new_scores = jnp.pad(jnp.where(keep, best, -jnp.inf), (0, missing), constant_values=-jnp.inf)
    return new_states, new_scores


@functools.partial(jax.jit, static_argnames=("expand", "slots", "min_active"))
def beam_search(
    out_start: jax.Array,
    dst: jax.Array,
    label: jax.Array,
    weight: jax.Array,
    emissions: jax.Array,
    lengths: jax.Array,
    search_beam: jax.Array,
    *,
    expand: int,
    slots: int,
    min_active: int,
) -> jax.Array:
    """`search_one` over a batch: emissions [B, T, V], lengths [B], the
    graph's `SearchGraph` arrays and weight [A' + 1] shared; int32 [B, T + 1, K]."""
    graph = SearchGraph(out_start, dst, label, dst, expand)
    one = lambda frames, length: search_one(
        graph, weight, frames, length, slots, search_beam, min_active
    )
    return jax.vmap(one)(emissions, lengths)


def search_one(
    graph: SearchGraph,
    weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    slots: int,
    search_beam: jax.Array,
    min_active: int,
) -> jax.Array:
    """The active states after each frame of one utterance.

    Args:
      graph: the `SearchGraph`.
      weight: float [A' + 1], the arcs' weights in its order (the spare: any).
      emissions: float [T, V].
      length: int [], frames read.
      slots: K.
      search_beam, min_active: as in `intersect_dense_pruned`.
    Returns:
      int32 [T + 1, K]: row t the states active after t frames (-1: an
      empty slot); rows past `length` repeat row `length`.
    """
    states = jnp.full(slots, -1, jnp.int32).at[0].set(0)
    scores = jnp.full(slots, -jnp.inf, emissions.dtype).at[0].set(0.0)

    def step(
        carry: tuple[jax.Array, jax.Array], inputs: tuple[jax.Array, jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        t, frame = inputs
        new_states, new_scores = _step(
            graph, weight, frame, carry[0], carry[1], search_beam, min_active
        )
        running = t < length
        carry = (jnp.where(running, new_states, carry[0]), jnp.where(running, new_scores, carry[1]))
        return carry, carry[0]

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    _, visited = jax.lax.scan(step, (states, scores), (frames, emissions))
    return jnp.concatenate([states[None], visited], axis=0)
