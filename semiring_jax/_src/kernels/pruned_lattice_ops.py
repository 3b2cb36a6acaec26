"""`intersect_dense_pruned`'s lattice through the compiled host function.

`kernels/pruned_lattice.cc` builds the lattice that
`decoding/host/pruned_lattice.py` builds, bit for bit, in three passes over
the arcs between consecutive frames' active states, where the numpy one
holds every frame's such arcs at once. It is plain C called through ctypes
on numpy arrays (the lattice is built on the host, outside any XLA
program), so it serves a CPU backend of any number of devices; on a GPU or
TPU host the library is not built, and numpy's builder serves.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from semiring_jax._src.kernels import loader

__all__ = ["LatticeGraph", "pruned_lattice"]


class LatticeGraph(NamedTuple):
    """A graph's real arcs grouped by source state (as `SearchGraph`), with
    their values.

    Attributes:
      out_start: int32 [S + 1].
      dst, label: int32 [A'] in that order.
      position: int32 [A'], each arc's index among the real arcs.
      weight: float64 [A'], their weights' values.
      final_weight: float64 [S], -inf where not final.
    """

    out_start: np.ndarray
    dst: np.ndarray
    label: np.ndarray
    position: np.ndarray
    weight: np.ndarray
    final_weight: np.ndarray


def pruned_lattice(
    graph: LatticeGraph,
    emissions: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray],
    length: int,
    output_beam: float,
    *,
    searched: bool,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """As `decoding.host.pruned_lattice.pruned_lattice`, from the rows 0 ..
    `length` (`(first, state)`: row t, the states active after t frames, is
    `state[first[t]:first[t + 1]]`) and emissions float64 [T, V] (values).
    `searched`: the rows come from a beam search (so every active state is
    reachable from the start, and the pass that finds those is skipped).
    Returns the lattice's fields in `LatticeStructure`'s order: (num_states,
    src, dst, arc, frame, final_state), int32 arrays after the count."""
    build = loader.host_function("SjPrunedLattice")
    take = loader.host_function("SjPrunedLatticeTake")
    i32 = lambda array: np.ascontiguousarray(array, np.int32)
    f64 = lambda array: np.ascontiguousarray(array, np.float64)
    tables = [i32(graph.out_start), i32(graph.dst), i32(graph.label), i32(graph.position)]
    values = [f64(graph.weight), f64(graph.final_weight), f64(emissions)]
    first, state = (i32(row) for row in rows)
    # The function reads length + 1 rows and length frames.
    assert first.size == length + 2 and state.size == first[-1], (first.size, length)
    assert emissions.shape[0] >= length, (emissions.shape, length)
    handle, sizes = ctypes.c_void_p(), np.zeros(2, np.int64)
    code = build(
        ctypes.c_int64(graph.final_weight.size),
        ctypes.c_int64(graph.dst.size),
        *(loader.pointer(table, ctypes.c_int32) for table in tables),
        *(loader.pointer(value, ctypes.c_double) for value in values),
        ctypes.c_int64(emissions.shape[-1]),
        loader.pointer(first, ctypes.c_int32),
        loader.pointer(state, ctypes.c_int32),
        ctypes.c_int64(length),
        ctypes.c_double(output_beam),
        ctypes.c_int64(int(searched)),
        ctypes.byref(handle),
        loader.pointer(sizes, ctypes.c_int64),
    )
    if code == 2:
        raise MemoryError("intersect_dense_pruned: out of memory building the lattice")
    if code != 0:
        raise AssertionError("intersect_dense_pruned: inconsistent lattice tables (a bug)")
    num_states, num_arcs = (int(size) for size in sizes)
    src, dst, arc, frame = (np.empty(num_arcs, np.int32) for _ in range(4))
    final_state = np.empty(num_states, np.int32)
    outputs = (src, dst, arc, frame, final_state)
    take(handle, *(loader.pointer(out, ctypes.c_int32) for out in outputs))
    return num_states, src, dst, arc, frame, final_state
