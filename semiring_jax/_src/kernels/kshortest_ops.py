"""`nbest`'s search through the compiled host function.

`kernels/kshortest.cc` runs the best-first search of
`decoding/host/kshortest.py` (the same paths in the same order, ties
included) on the moves that module sorts: plain C called through ctypes on
numpy arrays, outside any XLA program; it serves a CPU backend (on a GPU
or TPU host the library is not built, and the numpy search serves).
"""

from __future__ import annotations

import ctypes

import numpy as np

from semiring_jax._src.kernels import loader

__all__ = ["k_shortest"]


def k_shortest(
    moves: tuple[np.ndarray, ...], num_states: int, best: float, n: int, unique: bool, slots: int
) -> tuple[np.ndarray, ...]:
    """A `kshortest.Compiled`: the n best paths from state 0 (β(0) = `best`)
    over `moves` (offsets, value, weight, arc, target, label: the fields of
    `kshortest.Moves`), as the fields of `kshortest.Paths`: (arcs int32
    [n, slots], lengths int32 [n], final_states int32 [n], found bool [n],
    scores float64 [n]), the paths past the found ones empty."""
    search = loader.host_function("SjKShortest")
    search.restype = ctypes.c_int64
    i64 = lambda array: np.ascontiguousarray(array, np.int64)
    f64 = lambda array: np.ascontiguousarray(array, np.float64)
    offsets, value, weight, arc, target, label = moves
    offsets, value, weight = i64(offsets), f64(value), f64(weight)
    arc, target, label = i64(arc), i64(target), i64(label)
    # The function indexes the moves by these: they must agree.
    assert offsets.size == num_states + 2 and offsets[-1] == value.size, (offsets.size, value.size)
    arcs = np.zeros((n, slots), np.int32)
    lengths, final_states = np.zeros(n, np.int32), np.zeros(n, np.int32)
    found_paths, scores = np.zeros(n, bool), np.full(n, -np.inf)
    found = search(
        ctypes.c_int64(num_states),
        loader.pointer(offsets, ctypes.c_int64),
        loader.pointer(value, ctypes.c_double),
        loader.pointer(weight, ctypes.c_double),
        *(loader.pointer(table, ctypes.c_int64) for table in (arc, target, label)),
        ctypes.c_double(best),
        ctypes.c_int64(n),
        ctypes.c_int64(int(unique)),
        ctypes.c_int64(slots),
        loader.pointer(arcs, ctypes.c_int32),
        loader.pointer(lengths, ctypes.c_int32),
        loader.pointer(final_states, ctypes.c_int32),
        loader.pointer(scores, ctypes.c_double),
    )
    if found == -2:
        raise MemoryError("nbest: out of memory in the search")
    if found < 0:
        raise AssertionError(f"nbest: inconsistent moves or slots (a bug), code {found}")
    found_paths[:found] = True
    return arcs, lengths, final_states, found_paths, scores
