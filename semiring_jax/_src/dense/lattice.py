"""`intersect_dense`: the materialised lattice of a dense intersection.

The structure (which (frame, state) pairs and arcs survive) is worked out on
the host by `host/lattice_structure.py`; the weights are JAX expressions of the graph's
weights and the emissions, so scores of the lattice differentiate back to
both.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core.batch import stack_entries
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.host import levels
from semiring_jax._src.core.inputs import check_inputs
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.dense.host import lattice_structure
from semiring_jax._src.structural.arc_map import parts_of, placeholder
from semiring_jax._src.structural.host.structure import Parts

__all__ = ["intersect_dense", "lattice_batch"]


def intersect_dense(
    graph: Fsa, emissions: npt.ArrayLike, lengths: npt.ArrayLike | None = None
) -> Fsa:
    """The lattice of `graph` against per-frame scores, as a batched Fsa.

    Lattice state (t, s) is graph state s after t frames; each graph arc a
    becomes, at each frame t, an arc (t, src) -> (t + 1, dst) with the
    graph's labels and weight `weight[a] + emissions[b, t, ilabel[a]]`;
    states (lengths[b], s) are final with `final_weight[s]`. Only states on
    a path of exactly `lengths[b]` frames from the start to a final state
    are kept (the lattice is connected; which states survive depends on the
    structure, never on weight values: -inf weights are kept). States are
    numbered in frame order, start first. An utterance with no such path
    gets a one-state lattice with no arcs and no final state.

    `tot_score(lattice, semiring)` equals `dense_tot_score(graph,
    emissions, lengths, semiring)`, and both differentiate to the same
    gradients with respect to `emissions` and the graph's weights.

    Args:
      graph: an Fsa shared by the batch, or a batched Fsa with B entries;
        its structure (and labels) must be concrete.
      emissions: float [B, T, V]; may be traced.
      lengths: int [B] in [0, T], concrete; T by default.
    Returns:
      A batched acyclic Fsa with B entries (padded as by `sj.stack`); for
      B = 0, a batch of no entries (batch shape (0,)).
    Raises:
      ValueError: as `dense_tot_score`, or for traced lengths or structure.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)],
      ...                          final=[1])
      >>> emissions = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75]]], jnp.float32))
      >>> lattice = sj.intersect_dense(graph, emissions)
      >>> lattice.num_states, lattice.num_arcs  # (frame, state): (0,0) (1,0) (1,1) (2,1)
      (4, 4)
      >>> print(jnp.round(jnp.exp(sj.tot_score(lattice)), 4))
      [0.75]
    """
    emissions, frames = check_inputs(graph, emissions, lengths, "intersect_dense", host=True)
    batch = emissions.shape[0]
    # Each lattice is built once, in the stack; its longest paths are known
    # from the frames (see `_path_lengths`).
    if graph.batch_shape:
        parts = [parts_of(graph_entry(graph, b), "intersect_dense") for b in range(batch)]
    else:  # a shared graph's, read once
        parts = [parts_of(graph, "intersect_dense")] * batch
    found = [
        lattice_structure.lattice_structure(p.num_states, p.src, p.dst, p.is_final, int(frames[b]))
        for b, p in enumerate(parts)
    ]
    return lattice_batch(graph, parts, emissions, found, frames.tolist())


def graph_entry(graph: Fsa, b: int) -> Fsa:
    """Entry b of a batched graph; a shared (unbatched) graph itself."""
    return graph if not graph.batch_shape else jax.tree_util.tree_map(lambda x: x[b], graph)


def _path_lengths(found: lattice_structure.LatticeStructure, length: int) -> levels.PathLengths:
    """`levels.path_lengths` of a lattice, from its frames: every state (t, s)
    lies on a path of exactly `length` frames from the start, so its longest
    path in has t arcs and its longest path out `length - t`; a lattice with
    no arc is the start alone (0 and 0)."""
    frame = np.zeros(found.num_states, np.int64)
    frame[found.src] = found.frame
    frame[found.dst] = found.frame.astype(np.int64) + 1
    if not found.src.size:
        return levels.PathLengths(frame, frame.copy())
    return levels.PathLengths(frame, length - frame)


def _structure_fsa(graph: Fsa, parts: Parts, found: lattice_structure.LatticeStructure) -> Fsa:
    """The lattice's structure as a deferred Fsa (weights not set)."""
    return placeholder(
        found.num_states,
        found.src,
        found.dst,
        parts.ilabel[found.arc],
        parts.olabel[found.arc],
        graph.dtype,
        graph.is_acceptor,
        is_final=found.final_state >= 0,
        defer=True,
    )


def lattice_batch(
    graph: Fsa,
    parts: Sequence[Parts],
    emissions: jax.Array,
    found: Sequence[lattice_structure.LatticeStructure],
    lengths: Sequence[int],
) -> Fsa:
    """The batched lattice of one structure per utterance, its weights one
    JAX gather for the whole batch (an op per utterance would be compiled
    anew for each lattice's sizes).

    Args:
      graph: the graph, shared or batched with B entries.
      parts: each utterance's graph entry's real arcs (`parts_of`).
      emissions: float [B, T, V].
      found: each utterance's `LatticeStructure` over its `parts`.
      lengths: each utterance's frames.
    Returns:
      The lattices stacked, as `stack_entries` pads them; for B = 0, a
      batch of no entries.
    """
    if not found:
        return _no_entries(graph)
    # A shell reads only the graph's dtype and kind, which its entries share.
    shells = [_structure_fsa(graph, p, f) for p, f in zip(parts, found, strict=True)]
    known = [_path_lengths(f, length) for f, length in zip(found, lengths, strict=True)]
    stacked = stack_entries(shells, lengths=known)
    num_arcs, num_states = stacked.num_arcs, stacked.num_states
    # Host index arrays [B, M] and [B, N]: graph arc, frame, label; the
    # graph state of each final lattice state (0 where none).
    real = np.atleast_2d(np.asarray(graph.arc_mask))  # [1 or B, A]
    arc = np.zeros((len(found), num_arcs), np.int32)
    frame, label = np.zeros_like(arc), np.zeros_like(arc)
    state = np.zeros((len(found), num_states), np.int32)
    # Each graph entry's real arcs, found once: a shared graph's serve every
    # utterance (a pass over 10^6 arcs each cost more than the gather).
    real_arcs: dict[int, np.ndarray] = {}
    for b, f in enumerate(found):
        count = f.arc.size
        entry = b if graph.batch_shape else 0
        if entry not in real_arcs:
            real_arcs[entry] = np.flatnonzero(real[entry])
        arc[b, :count] = real_arcs[entry][f.arc]
        frame[b, :count], label[b, :count] = f.frame, parts[b].ilabel[f.arc]
        state[b, : f.final_state.size] = np.maximum(f.final_state, 0)
    masks = (np.asarray(stacked.arc_mask), np.asarray(stacked.final_mask))
    weight, final_weight = _weights(graph, emissions, arc, frame, label, state, *masks)
    return stacked.replace(weight=weight, final_weight=final_weight)


@jax.jit
@per_device(lambda graph, *rest: [bool(graph.batch_shape)] + [True] * len(rest))
def _weights(
    graph: Fsa,
    emissions: jax.Array,
    arc: jax.Array,
    frame: jax.Array,
    label: jax.Array,
    state: jax.Array,
    arc_mask: jax.Array,
    final_mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The lattices' arc weights [B, M] (graph arc `arc` plus the emission
    at (`frame`, `label`)) and final weights [B, N] (graph state `state`).
    Gathers per utterance (batching dims): an index of entries would gather
    the whole batch onto each device of a sharded batch."""
    if graph.batch_shape:
        graph_weight = jax.vmap(lambda row, index: row[index])(graph.weight, arc)
        graph_final = jax.vmap(lambda row, index: row[index])(graph.final_weight, state)
    else:
        graph_weight, graph_final = graph.weight[arc], graph.final_weight[state]
    emitted = jax.vmap(lambda scores, at, column: scores[at, column])(emissions, frame, label)
    weight = jnp.where(arc_mask, graph_weight + emitted, -jnp.inf)
    return weight, jnp.where(final_mask, graph_final, -jnp.inf)


def _no_entries(graph: Fsa) -> Fsa:
    """A batched lattice of B = 0 entries: the lattice of an utterance
    without a path (one state, no arc), stacked, its batch axis cut to 0,
    so that its sizes, dtype and kind are those of any lattice."""
    shell = placeholder(1, [], [], [], [], graph.dtype, graph.is_acceptor, defer=True)
    start = np.zeros(1, np.int64)  # the start state's longest paths in and out
    one = stack_entries([shell], lengths=[levels.PathLengths(start, start.copy())])
    return jax.tree_util.tree_map(lambda leaf: leaf[:0], one)
