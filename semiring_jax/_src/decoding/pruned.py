"""`intersect_dense_pruned`: a beam search, then the lattice it leaves.

On a CPU backend where the CPU kernels are built, each utterance is one
task (a thread per core): `kernels/beam_search.cc` searches it by token passing and returns
the states kept after each frame (`ActiveRows`), and
`kernels/pruned_lattice.cc` keeps the arcs between them within the output
beam. Elsewhere (a GPU or TPU host builds nothing), and for an utterance
whose search met a NaN or +inf, the
search is traced (`decoding/beam_search.py`: static shapes, K state slots
per frame) and its padded rows go to the same lattice builder, or to
numpy's (`decoding/host/pruned_lattice.py`). The lattice's weights are
then one JAX gather of the graph's weights and the emissions for the
batch (`dense/lattice.py`), as in `intersect_dense`.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks, route_table, routes
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.inputs import check_inputs
from semiring_jax._src.decoding import beam_search
from semiring_jax._src.decoding.host import pruned_lattice
from semiring_jax._src.decoding.host.active_rows import ActiveRows
from semiring_jax._src.dense.host.lattice_structure import LatticeStructure
from semiring_jax._src.dense.lattice import graph_entry, lattice_batch
from semiring_jax._src.kernels import beam_search_ops, pruned_lattice_ops
from semiring_jax._src.structural.arc_map import parts_of
from semiring_jax._src.structural.host.structure import Parts

__all__ = ["intersect_dense_pruned"]

_FN = "intersect_dense_pruned"


def _check_beams(search_beam: float, output_beam: float, min_active: Any, max_active: Any) -> None:
    for name, beam in (("search_beam", search_beam), ("output_beam", output_beam)):
        if not beam >= 0:  # NaN fails too
            raise ValueError(f"{_FN}: {name} must be >= 0 (inf: no beam), got {beam}")
    checks.check_int(max_active, "max_active", _FN, 1)
    checks.check_int(min_active, "min_active", _FN, 0)


def _values(array: Any) -> np.ndarray:
    """Concrete values for the host's beam (under `jax.grad` outside jit
    too, where stop_gradient gives them)."""
    value = jax.lax.stop_gradient(array)
    if checks.is_traced(value):
        raise ValueError(
            f"{_FN}: the lattice's structure is built on the host: call it outside jax.jit"
        )
    return np.asarray(value, np.float64)


def intersect_dense_pruned(
    graph: Fsa,
    emissions: Any,
    lengths: Any = None,
    *,
    search_beam: float = 20.0,
    output_beam: float = 8.0,
    min_active: int = 30,
    max_active: int = 10_000,
    max_arcs: int | None = None,
) -> Fsa:
    """The pruned lattice of a large graph against per-frame scores.

    A frame-synchronous beam search (k2's `intersect_dense_pruned`): after
    each frame it keeps the `max_active` best states (best: the Viterbi
    score of the best partial path into the state), those within
    `search_beam` of the frame's best, but at least the `min_active` best.
    The lattice then holds the graph arcs between states kept at
    consecutive frames that lie on a path of `lengths[b]` frames from the
    start to a final state, and whose best such path is within
    `output_beam` of the best path. Its layout, states and weights are
    those of `intersect_dense` (state (t, s) after t frames, numbered in
    frame order; arc weight = graph weight + emission), so with infinite
    beams and `max_active` >= S it is `intersect_dense`'s lattice, and its
    weights are differentiable in `emissions` and the graph's weights (the
    choice of states and arcs is a constant).

    The search runs compiled, with static shapes: K = min(max_active, S)
    slots per frame, at most E arcs expanded per frame (E: the sum of the K
    largest out-degrees), O(E log E) work per frame. On a CPU backend
    (where the CPU kernels are built) compiled host code makes the same
    choices by token passing, in O(active arcs + R log K) per frame (R: the
    states reached), and builds the lattice too, a thread per core; on a
    GPU or TPU host nothing is compiled (the traced search runs there, and
    numpy builds the lattice). Ties between
    states at the max_active cut go to the state reached first (by the
    slot order of its best arc's source, then the arc's order), as
    `jax.lax.top_k` breaks them. Memory: the graph and the lattice, and
    for the search the states kept after each frame of the utterances
    being searched (one per core; the traced search holds int32
    [B, T + 1, K] slots).

    A NaN score is kept by the search and not cut by the output beam, so
    a NaN emission on a searched arc of some path reaches the lattice's
    weights: a concrete one raises the `ValueError` that `intersect_dense`
    raises (naming the lattice arc), a traced one (under `jax.grad`) gives
    a NaN lattice; so does a traced NaN final weight of a state kept at
    the last frame (the state stays final). An utterance whose search
    keeps no path to a final state gets a one-state lattice with no arcs
    and no final state.

    Args:
      graph: an Fsa shared by the batch, or a batched Fsa with B entries;
        every arc consumes a frame (no epsilons), cycles allowed; its
        structure must be concrete.
      emissions: float [B, T, V].
      lengths: int [B] in [0, T], concrete; T by default.
      search_beam, output_beam: floats >= 0; inf for no beam.
      min_active, max_active: ints >= 0 and >= 1; a min_active above
        max_active counts as max_active.
      max_arcs: None (E as above: exact for the slots kept) or an int >= 1,
        a cap on the arcs expanded per frame; the slots are in score
        order, so a cap drops the worst active states' arcs first. For
        graphs where a few states have most arcs (a language model's
        history states), E can be far above the arcs actually active.
    Returns:
      A batched acyclic Fsa with B entries (padded as by `sj.stack`); for
      B = 0, a batch of no entries (batch shape (0,), the sizes of a
      lattice with one state and no arc).
    Raises:
      ValueError: as `intersect_dense`, for a beam < 0 or NaN, a
        negative min_active or max_active < 1, or when called under `jax.jit`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)],
      ...                          final=[1])
      >>> emissions = jnp.log(jnp.array([[[0.9, 0.1], [0.25, 0.75]]], jnp.float32))
      >>> # Labels 0 1 (0.675) and 1 1 (0.075): the second is 2.2 below, cut.
      >>> lattice = sj.intersect_dense_pruned(graph, emissions, output_beam=1.0)
      >>> lattice.num_states, lattice.num_arcs  # (0, 0) -> (1, 0) -> (2, 1)
      (3, 2)
      >>> print(jnp.round(jnp.exp(sj.tot_score(lattice)), 4))
      [0.675]
    """
    emissions, lengths = check_inputs(graph, emissions, lengths, _FN, host=True)
    batch = emissions.shape[0]
    _check_beams(search_beam, output_beam, min_active, max_active)
    if max_arcs is not None:
        checks.check_int(max_arcs, "max_arcs", _FN, 1)
    native = jax.lax.stop_gradient(emissions)
    values = _values(native)
    if not batch:
        return lattice_batch(graph, [], emissions, [], [])
    slots = min(max_active, graph.num_states)
    min_active = min(min_active, slots)
    entries = [
        _HostGraph.of(graph_entry(graph, b), slots, max_arcs, native.dtype)
        for b in range(batch if graph.batch_shape else 1)
    ]
    graphs = entries if graph.batch_shape else entries * batch
    sizes: dict[str, Any] = {
        "search_beam": float(search_beam),
        "slots": slots,
        "min_active": min_active,
    }
    compiled = routes.on_host(route_table.PRUNED_SEARCH, native.dtype) == "host_kernel"
    structures: list[LatticeStructure | None] = [None] * batch
    if compiled:
        # The search, then the lattice, of one utterance a task (ctypes lets
        # go of the GIL): only the kept states of each frame are held.
        rows = np.asarray(native)

        def compiled_one(b: int) -> LatticeStructure | None:
            found = beam_search_ops.search(graphs[b].tables, rows[b], int(lengths[b]), **sizes)
            if found is None:  # a NaN or +inf candidate: searched again below
                return None
            return _compiled_lattice(
                graphs[b], values[b], ActiveRows(*found), int(lengths[b]), output_beam
            )

        with concurrent.futures.ThreadPoolExecutor(min(batch, os.cpu_count() or 1)) as pool:
            structures = list(pool.map(compiled_one, range(batch)))
    redo = [b for b in range(batch) if structures[b] is None]
    # The traced search keeps a NaN candidate visible; it serves all where
    # the compiled functions are not built.
    for b, padded in zip(redo, _traced_rows(graph, entries, native, lengths, redo, sizes)):
        length = int(lengths[b])
        if compiled:
            found = ActiveRows.from_padded(padded, length)
            structures[b] = _compiled_lattice(graphs[b], values[b], found, length, output_beam)
        else:
            structures[b] = _numpy_lattice(graphs[b], values[b], padded, length, output_beam)
    parts = [host.parts for host in graphs]
    done = [structure for structure in structures if structure is not None]
    assert len(done) == batch  # each utterance searched once or again above
    return lattice_batch(graph, parts, emissions, done, lengths.tolist())


class _HostGraph(NamedTuple):
    """One graph entry's concrete structure and weight values, read once for
    the search and every utterance's lattice; its real arcs grouped by
    source state once for both."""

    fsa: Fsa
    parts: Parts
    real: np.ndarray  # int [A'], the real arcs' indices
    weight: np.ndarray  # float64 [A'], their weights' values
    final_weight: np.ndarray  # float64 [S], -inf where not final
    search: beam_search.SearchGraph  # arc: positions among the real arcs
    tables: beam_search_ops.SearchTables  # the search's, weights in the emissions' dtype
    lattice: pruned_lattice_ops.LatticeGraph

    @classmethod
    def of(cls, fsa: Fsa, slots: int, max_arcs: int | None, dtype: Any) -> _HostGraph:
        parts = parts_of(fsa, _FN)
        real = np.flatnonzero(checks.concrete(fsa.arc_mask, "arc_mask", _FN))
        final = np.where(parts.is_final, _values(fsa.final_weight), -np.inf)
        native = np.asarray(jax.lax.stop_gradient(fsa.weight))[real]
        weight = native.astype(np.float64)
        search = beam_search.search_graph(
            fsa.num_states,
            parts.src,
            parts.dst,
            parts.ilabel,
            np.arange(real.size),
            slots,
            max_arcs,
        )
        order = np.asarray(search.arc)
        tables = beam_search_ops.SearchTables(
            np.asarray(search.out_start),
            np.asarray(search.dst),
            np.asarray(search.label),
            _with_spare_weight(native, order, dtype),
            search.expand,
        )
        lattice = pruned_lattice_ops.LatticeGraph(
            tables.out_start, tables.dst[:-1], tables.label[:-1], order, weight[order], final
        )
        return cls(fsa, parts, real, weight, final, search, tables, lattice)


def _compiled_lattice(
    graph: _HostGraph, values: np.ndarray, rows: ActiveRows, length: int, output_beam: float
) -> LatticeStructure:
    """One utterance's lattice by the compiled builder, from the rows a
    search kept (so `searched`: every kept state is reachable)."""
    return LatticeStructure(
        *pruned_lattice_ops.pruned_lattice(
            graph.lattice, values, rows, length, output_beam, searched=True
        )
    )


def _with_spare_weight(native: np.ndarray, order: np.ndarray, dtype: Any) -> np.ndarray:
    """[A' + 1] in `dtype`: native[order], then the spare arc's -inf."""
    out = np.full(order.size + 1, -np.inf, dtype)
    out[:-1] = native[order]
    return out


def _traced_rows(
    graph: Fsa,
    entries: list[_HostGraph],
    emissions: jax.Array,
    lengths: np.ndarray,
    which: list[int],
    sizes: dict[str, Any],
) -> list[np.ndarray]:
    """The traced search's rows int32 [T + 1, K] of utterances `which`
    (in that order): one batched search per graph entry."""
    if not which:
        return []
    groups = [[b] for b in which] if graph.batch_shape else [which]
    found: dict[int, np.ndarray] = {}
    for group in groups:
        host = entries[group[0]] if graph.batch_shape else entries[0]
        rows = _traced_search(host, emissions[np.asarray(group)], lengths[group], **sizes)
        found.update(zip(group, rows))
    return [found[b] for b in which]


def _traced_search(
    graph: _HostGraph,
    emissions: jax.Array,
    lengths: np.ndarray,
    *,
    search_beam: float,
    min_active: int,
    slots: int,
) -> np.ndarray:
    """The active states int32 [B, T + 1, K] of one graph's utterances by
    the traced search (`decoding/beam_search.py`)."""
    tables = graph.tables
    found = beam_search.beam_search(
        jnp.asarray(tables.out_start),
        jnp.asarray(tables.dst),
        jnp.asarray(tables.label),
        jnp.asarray(tables.weight),
        emissions,
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(search_beam, emissions.dtype),
        expand=tables.expand,
        slots=slots,
        min_active=min_active,
    )
    return np.asarray(found)


def _numpy_lattice(
    graph: _HostGraph, values: np.ndarray, rows: np.ndarray, length: int, output_beam: float
) -> LatticeStructure:
    """One utterance's lattice structure by numpy from its padded search
    rows [T + 1, K] and emission values [T, V]."""
    parts = graph.parts
    return pruned_lattice.pruned_lattice(
        parts.src,
        parts.dst,
        parts.ilabel,
        graph.weight,
        graph.final_weight,
        values,
        [np.unique(row[row >= 0]) for row in rows[: length + 1]],
        output_beam,
    )
