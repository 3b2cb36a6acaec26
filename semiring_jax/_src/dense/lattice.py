"""`intersect_dense`: the materialised lattice of a dense intersection.

The structure (which (frame, state) pairs and arcs survive) is worked out on
the host by `host/lattice_structure.py`; the weights are JAX expressions of the graph's
weights and the emissions, so scores of the lattice differentiate back to
both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.batch import stack_entries
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.host import levels
from semiring_jax._src.dense.dense import check_emissions, check_graph, check_lengths
from semiring_jax._src.dense.host import lattice_structure
from semiring_jax._src.structural.arc_map import parts_of, placeholder
from semiring_jax._src.structural.host.structure import Parts

__all__ = ["intersect_dense"]


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
      A batched acyclic Fsa with B entries (padded as by `sj.stack`).
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
    emissions = check_emissions(emissions, "intersect_dense")
    batch, num_frames, num_columns = emissions.shape
    if lengths is None:
        lengths = np.full(batch, num_frames)
    lengths = checks.concrete(lengths, "lengths", "intersect_dense")
    check_lengths(lengths, batch, num_frames, "intersect_dense", "lengths", "T")
    check_graph(graph, batch, num_columns, emissions.dtype, "intersect_dense")
    # Each lattice is built once, in the stack; its longest paths are known
    # from the frames (see `_path_lengths`).
    found = [
        _one_lattice(graph_entry(graph, b), emissions[b], int(lengths[b])) for b in range(batch)
    ]
    lattices, path_lengths = [fsa for fsa, _ in found], [known for _, known in found]
    return stack_entries(lattices, lengths=path_lengths)


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


def _one_lattice(graph: Fsa, emissions: jax.Array, length: int) -> tuple[Fsa, levels.PathLengths]:
    """One utterance's lattice, its tables not built (for `stack_entries`),
    and its longest paths."""
    parts = parts_of(graph, "intersect_dense")  # concrete structure, real arcs
    found = lattice_structure.lattice_structure(
        parts.num_states, parts.src, parts.dst, parts.is_final, length
    )
    return lattice_fsa(graph, parts, emissions, found, length)


def lattice_fsa(
    graph: Fsa,
    parts: Parts,
    emissions: jax.Array,
    found: lattice_structure.LatticeStructure,
    length: int,
) -> tuple[Fsa, levels.PathLengths]:
    """The lattice Fsa of a structure over `graph`'s real arcs (`parts`),
    its weights JAX gathers of the graph's and of `emissions` [T, V] (not
    built, for `stack_entries`), and its longest paths."""
    arcs = np.flatnonzero(np.asarray(graph.arc_mask))[found.arc]
    labels = parts.ilabel[found.arc]
    weight = graph.weight[arcs] + emissions[found.frame, labels]
    final_weight = jnp.where(
        found.final_state >= 0, graph.final_weight[np.maximum(found.final_state, 0)], -jnp.inf
    )
    fsa = placeholder(
        found.num_states,
        found.src,
        found.dst,
        labels,
        parts.olabel[found.arc],
        graph.dtype,
        graph.is_acceptor,
        is_final=found.final_state >= 0,
        defer=True,
    ).replace(weight=weight, final_weight=final_weight)
    return fsa, _path_lengths(found, length)
