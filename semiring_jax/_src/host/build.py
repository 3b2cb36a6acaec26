"""Checking and normalising user-given arcs and final weights (numpy only)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["ArcArrays", "arcs_from_rows", "check_weights", "swap_start"]

_INT32_MAX = np.iinfo(np.int32).max


class ArcArrays(NamedTuple):
    """Structure and weights of one FSA, as validated numpy arrays."""

    num_states: int
    src: np.ndarray  # int32 [A]
    dst: np.ndarray  # int32 [A]
    ilabel: np.ndarray  # int32 [A]
    olabel: np.ndarray  # int32 [A]
    # Weights are numpy when built here, but `unstack` and the structural ops
    # carry jax.Arrays (possibly traced) through, so that gradients flow; Any
    # because host/ code does not import jax.
    weight: Any  # float [A]
    final_weight: Any  # float [S]
    is_acceptor: bool


def check_weights(weights: np.ndarray, fn: str, what: str) -> None:
    """Raises on NaN or +inf; -inf (the semiring zero) is allowed."""
    bad = np.flatnonzero(np.isnan(weights) | (weights == np.inf))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{fn}: {what} {i} has weight {weights[i]}; weights must be finite or -inf"
        )


def _plain(value: float) -> str:
    """A number as a user wrote it: `3` or `1.5`, never `np.float64(3.0)`."""
    value = float(value)
    return str(int(value)) if value.is_integer() else str(value)


def _integral_column(rows: np.ndarray, column: int, fn: str, field: str) -> np.ndarray:
    values = rows[:, column]
    bad = np.flatnonzero(
        ~np.isfinite(values) | (values != np.round(values)) | (values < 0) | (values > _INT32_MAX)
    )
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{fn}: arc {i} has {field}={_plain(values[i])}; expected a non-negative integer"
        )
    return values.astype(np.int32)


def _rows(arcs: Any, fn: str) -> np.ndarray:
    """Arcs as a float64 [A, 4 | 5] array, with located shape errors."""
    if isinstance(arcs, np.ndarray):
        if arcs.size == 0:
            return np.zeros((0, arcs.shape[1] if arcs.ndim == 2 else 4))
        if arcs.ndim != 2 or arcs.shape[1] not in (4, 5):
            raise ValueError(
                f"{fn}: arcs must have shape [A, 4] (src, dst, label, weight) or [A, 5] "
                f"(src, dst, ilabel, olabel, weight), got {arcs.shape}"
            )
        return arcs.astype(np.float64)
    arcs = list(arcs)
    for i, arc in enumerate(arcs):
        if not isinstance(arc, (tuple, list, np.ndarray)) or len(arc) not in (4, 5):
            raise ValueError(
                f"{fn}: arc {i} is {arc!r}; expected (src, dst, label, weight) or "
                f"(src, dst, ilabel, olabel, weight)"
            )
        if len(arc) != len(arcs[0]):
            raise ValueError(
                f"{fn}: arc {i} has {len(arc)} fields but arc 0 has {len(arcs[0])}; "
                f"an FSA is all acceptor arcs or all transducer arcs"
            )
    if not arcs:
        return np.zeros((0, 4))
    try:
        return np.asarray(arcs, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{fn}: arcs must hold numbers: {err}") from None


def _final_weights(
    final: Mapping[int, float] | Sequence[int], fn: str
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(final, Mapping):
        states, weights = list(final.keys()), list(final.values())
    else:
        states = np.asarray(final).reshape(-1).tolist()
        weights = [0.0] * len(states)
    for state in states:
        if isinstance(state, bool) or not float(state).is_integer() or state < 0:
            raise ValueError(f"{fn}: final state {state!r} is not a non-negative integer")
    weights_array = np.asarray(weights, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(np.isnan(weights_array) | (weights_array == np.inf))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{fn}: final state {states[i]} has weight {weights_array[i]}; "
            f"weights must be finite or -inf"
        )
    return np.asarray(states, dtype=np.int64).reshape(-1), weights_array


def swap_start(
    src: np.ndarray, dst: np.ndarray, final: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renumbers states so that `start` becomes 0 (swapping it with 0)."""
    if start == 0:
        return src, dst, final
    swap = np.arange(final.shape[0])
    swap[[0, start]] = [start, 0]
    return swap[src], swap[dst], final[swap]


def arcs_from_rows(
    arcs: Any, final: Any, *, num_states: int | None, start: int, dtype: np.dtype, fn: str
) -> ArcArrays:
    """Validates `from_arcs`-style input; see `Fsa.from_arcs` for the format."""
    rows = _rows(arcs, fn)
    is_acceptor = rows.shape[1] == 4
    src = _integral_column(rows, 0, fn, "src")
    dst = _integral_column(rows, 1, fn, "dst")
    ilabel = _integral_column(rows, 2, fn, "label" if is_acceptor else "ilabel")
    olabel = ilabel if is_acceptor else _integral_column(rows, 3, fn, "olabel")
    weight = rows[:, -1]
    check_weights(weight, fn, "arc")
    final_states, final_values = _final_weights(final, fn)
    if not (isinstance(start, (int, np.integer)) and start >= 0):
        raise ValueError(f"{fn}: start must be a non-negative int, got {start!r}")
    referenced = max(
        int(start),
        int(src.max(initial=0)),
        int(dst.max(initial=0)),
        int(final_states.max(initial=0)),
    )
    if num_states is None:
        num_states = referenced + 1
    elif not isinstance(num_states, (int, np.integer)) or num_states < 1:
        raise ValueError(f"{fn}: num_states must be a positive int, got {num_states!r}")
    for field, values in (("src", src), ("dst", dst)):
        bad = np.flatnonzero(values >= num_states)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{fn}: arc {i} has {field}={values[i]} but num_states={num_states}")
    bad = np.flatnonzero(final_states >= num_states)
    if bad.size:
        raise ValueError(
            f"{fn}: final state {final_states[bad[0]]} is out of range for num_states={num_states}"
        )
    if start >= num_states:
        raise ValueError(f"{fn}: start={start} is out of range for num_states={num_states}")
    final_weight = np.full(num_states, -math.inf)
    final_weight[final_states] = final_values
    src, dst, final_weight = swap_start(src, dst, final_weight, int(start))
    return ArcArrays(
        int(num_states),
        src.astype(np.int32),
        dst.astype(np.int32),
        ilabel,
        olabel.copy(),
        weight.astype(dtype),
        final_weight.astype(dtype),
        is_acceptor,
    )
