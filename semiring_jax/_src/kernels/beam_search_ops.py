"""The beam search of `intersect_dense_pruned` through the compiled host function.

`kernels/beam_search.cc` makes the traced search's choices
(`decoding/beam_search.py`) by token passing: per frame it reads only the
active states' arcs, drops those below the best candidate so far less the
beam in a vectorised pass, and keeps each destination's best in a table
whose touched entries it lists, where the traced search pays for [S]
segment reductions and a top-K over every edge slot. It returns only the
kept states, packed row after row (`first`, `state`: what
`decoding/host/active_rows.py` calls `ActiveRows`), not K padded slots per
frame. An utterance
whose candidates hold a NaN or +inf is flagged (None), and the caller
searches it with the traced search, which keeps NaN candidates visible.
Plain C called through ctypes on numpy arrays, one utterance a call (the
caller runs one per core), outside any XLA program; not differentiable
(the search only chooses states).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from semiring_jax._src.kernels import loader

__all__ = ["SearchTables", "search"]


class SearchTables(NamedTuple):
    """A `SearchGraph`'s arrays on the host, with the arcs' weights.

    Attributes:
      out_start: int32 [S + 1].
      dst, label: int32 [A' + 1] (the spare arc last).
      weight: float32 or float64 [A' + 1], the emissions' dtype (spare: -inf).
      expand: E, the bound on the arcs expanded per frame.
    """

    out_start: np.ndarray
    dst: np.ndarray
    label: np.ndarray
    weight: np.ndarray
    expand: int


def search(
    tables: SearchTables,
    emissions: np.ndarray,
    length: int,
    *,
    search_beam: float,
    slots: int,
    min_active: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """One utterance's rows 0 .. `length` from emissions [>= length, V] (the
    tables' weight dtype), as `decoding.beam_search.beam_search` keeps them:
    (first int32 [length + 2], state int32 [first[-1]]), row t being
    `state[first[t]:first[t + 1]]`; None where a candidate was NaN or +inf
    (to be searched again)."""
    run = loader.host_function("SjBeamSearch")
    take = loader.host_function("SjBeamSearchTake")
    i32 = lambda array: np.ascontiguousarray(array, np.int32)
    out_start, dst, label = i32(tables.out_start), i32(tables.dst), i32(tables.label)
    weight = np.ascontiguousarray(tables.weight)
    rows = np.ascontiguousarray(emissions[:length], weight.dtype)
    # The function reads `length` frames of V and one weight per arc.
    assert rows.shape[0] == length and weight.size == dst.size == label.size, (rows.shape, length)
    handle, size = ctypes.c_void_p(), np.zeros(1, np.int64)
    code = run(
        ctypes.c_int64(out_start.size - 1),
        ctypes.c_int64(dst.size),
        *(loader.pointer(table, ctypes.c_int32) for table in (out_start, dst, label)),
        weight.ctypes.data_as(ctypes.c_void_p),
        rows.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int64(weight.itemsize),
        ctypes.c_int64(emissions.shape[-1]),
        ctypes.c_int64(length),
        ctypes.c_int64(slots),
        ctypes.c_int64(tables.expand),
        ctypes.c_int64(min_active),
        ctypes.c_double(search_beam),
        ctypes.byref(handle),
        loader.pointer(size, ctypes.c_int64),
    )
    if code == 3:
        return None
    if code == 2:
        raise MemoryError("intersect_dense_pruned: out of memory in the beam search")
    if code != 0:
        raise AssertionError("intersect_dense_pruned: inconsistent search tables (a bug)")
    first, state = np.empty(length + 2, np.int32), np.empty(int(size[0]), np.int32)
    take(handle, loader.pointer(first, ctypes.c_int32), loader.pointer(state, ctypes.c_int32))
    return first, state
