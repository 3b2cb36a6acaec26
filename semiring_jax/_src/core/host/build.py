"""Checking and normalising user-given arcs and final weights (numpy only).

Sizes are checked before anything is allocated per state: without an
explicit `num_states`, state ids must stay below `state_limit(A, F)` =
2 A + F + 1 + 2**20 for A arcs and F final states (the most states such an
input can name, plus 2**20 = 1,048,576 unnamed ones), so that the memory a
build takes stays proportional to the size of its input. States, labels and
`num_states` are int32 (at most 2**31 - 1), and a finite weight that the
dtype cannot hold (it would round to +inf or -inf) is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from semiring_jax._src.core.host import messages

__all__ = [
    "SPARE_STATES",
    "ArcArrays",
    "arcs_from_rows",
    "beyond_limit",
    "check_int32_field",
    "check_weights",
    "first_overflow",
    "state_limit",
    "swap_start",
]

_INT32_MAX = int(np.iinfo(np.int32).max)
# Unnamed states an input may imply beyond those it names (see state_limit).
SPARE_STATES = 1 << 20


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
    # Which states are final (structure, so always numpy), bool [S]. None
    # means the states whose final weight is > -inf, for callers whose
    # format defines finality by the weight (OpenFst's infinite cost);
    # `fsa.assemble` derives it then, and needs the weights concrete.
    final_mask: np.ndarray | None = None


def state_limit(num_arcs: int, num_finals: int) -> int:
    """The bound on state ids of an input of `num_arcs` arcs and `num_finals`
    final states that gives no `num_states`: every id must be below it.

    2 states per arc, 1 per final state and the start are the most such an
    input can name; `SPARE_STATES` more allow some unnamed ones, so that the
    memory taken stays proportional to the input (never above 2**31 - 1).
    """
    return min(2 * num_arcs + num_finals + 1 + SPARE_STATES, _INT32_MAX)


def beyond_limit(limit: int) -> str:
    """The end of the message for a state id at or above `limit`."""
    if limit == _INT32_MAX:
        return "is not below 2**31 - 1, the bound on state ids (int32)"
    return (
        f"is not below {limit} = 2 * arcs + final states + 1 + 2**20, the bound on "
        f"state ids that keeps memory proportional to the input"
    )


def first_overflow(values: np.ndarray, dtype: Any) -> int:
    """The index of the first finite value of `values` that rounds to +inf
    or -inf in `dtype`, or -1."""
    dtype = np.dtype(dtype)
    if values.size == 0 or np.dtype(values.dtype).itemsize <= dtype.itemsize:
        return -1
    with np.errstate(over="ignore"):
        cast = values.astype(dtype)
    bad = np.flatnonzero(np.isfinite(values) & ~np.isfinite(cast))
    return int(bad[0]) if bad.size else -1


def _overflow_message(value: float, dtype: Any) -> str:
    dtype = np.dtype(dtype)
    rounded = "inf" if value > 0 else "-inf"
    largest = str(np.finfo(dtype).max)
    return (
        f"{value}, which {dtype} cannot hold (it would round to {rounded}; the "
        f"largest {dtype} is {largest})"
    )


def check_weights(weights: np.ndarray, fn: str, what: str, dtype: Any = None) -> None:
    """Raises on NaN or +inf; -inf (the semiring zero) is allowed. With a
    `dtype`, also on a finite weight that rounds to +inf or -inf in it."""
    bad = np.flatnonzero(np.isnan(weights) | (weights == np.inf))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{fn}: {what} {i} has weight {weights[i]}; weights must be finite or -inf"
        )
    i = -1 if dtype is None else first_overflow(weights, dtype)
    if i >= 0:
        raise ValueError(f"{fn}: {what} {i} has weight {_overflow_message(weights[i], dtype)}")


def check_int32_field(values: np.ndarray, fn: str, field: str) -> np.ndarray:
    """An integer field [..., A] (states or labels) as int32, checked at
    its full width first, so that int64 2**32 + 1 is refused rather than
    wrapped to 1; the message names the entry (batched) and the arc."""
    bad = np.argwhere((values < 0) | (values > _INT32_MAX))
    if bad.size:
        *entry, arc = (int(i) for i in bad[0])
        where = "".join(f"entry {i}, " for i in entry) + f"arc {arc}"
        raise ValueError(
            f"{fn}: {where} has {field}={values[tuple(bad[0])]}; expected a non-negative "
            f"integer (int32: at most 2**31 - 1)"
        )
    return values.astype(np.int32)


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
            f"{fn}: arc {i} has {field}={_plain(values[i])}; expected a non-negative integer "
            f"(int32: at most 2**31 - 1)"
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
                f"{fn}: arc {i} is {messages.cut(repr(arc))}; expected (src, dst, label, "
                f"weight) or (src, dst, ilabel, olabel, weight)"
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
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"{fn}: arcs must hold numbers: {messages.cut(str(err), 200)}") from None


def _final_weights(
    final: Mapping[int, float] | Sequence[int], fn: str
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(final, Mapping):
        states, weights = list(final.keys()), list(final.values())
    else:
        states = np.asarray(final).reshape(-1).tolist()
        weights = [0.0] * len(states)
    for state in states:
        try:
            integral = not isinstance(state, bool) and float(state).is_integer()
        except (TypeError, ValueError, OverflowError):
            integral = False
        if not integral or not 0 <= state <= _INT32_MAX:
            raise ValueError(
                f"{fn}: final state {messages.cut(repr(state))} is not a non-negative integer "
                f"(int32: at most 2**31 - 1)"
            )
    weights_array = np.asarray(weights, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(np.isnan(weights_array) | (weights_array == np.inf))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{fn}: final state {states[i]} has weight {weights_array[i]}; "
            f"weights must be finite or -inf"
        )
    return np.asarray(states, dtype=np.int64).reshape(-1), weights_array


def _check_state_limit(
    src: np.ndarray, dst: np.ndarray, final_states: np.ndarray, start: int, fn: str
) -> None:
    """Raises, naming the first arc, final state or start at fault, if a
    state id is not below `state_limit` (before any per-state array)."""
    limit = state_limit(src.shape[0], final_states.shape[0])
    bad = np.flatnonzero((src >= limit) | (dst >= limit))
    if bad.size:
        i = int(bad[0])
        field, value = ("src", src[i]) if src[i] >= limit else ("dst", dst[i])
        raise ValueError(
            f"{fn}: arc {i} has {field}={value}, which {beyond_limit(limit)} "
            f"(pass num_states= for a sparser numbering)"
        )
    bad = np.flatnonzero(final_states >= limit)
    if bad.size:
        raise ValueError(
            f"{fn}: final state {final_states[bad[0]]} {beyond_limit(limit)} "
            f"(pass num_states= for a sparser numbering)"
        )
    if start >= limit:
        raise ValueError(
            f"{fn}: start={start} {beyond_limit(limit)} (pass num_states= for a sparser numbering)"
        )


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
    check_weights(weight, fn, "arc", dtype)
    final_states, final_values = _final_weights(final, fn)
    if not (
        isinstance(start, (int, np.integer))
        and not isinstance(start, bool)
        and 0 <= start <= _INT32_MAX
    ):
        raise ValueError(
            f"{fn}: start must be a non-negative int (at most 2**31 - 1), got {start!r}"
        )
    if num_states is None:
        _check_state_limit(src, dst, final_states, int(start), fn)
        num_states = 1 + max(
            int(start),
            int(src.max(initial=0)),
            int(dst.max(initial=0)),
            int(final_states.max(initial=0)),
        )
    elif (
        not isinstance(num_states, (int, np.integer))
        or isinstance(num_states, bool)
        or not 1 <= num_states <= _INT32_MAX
    ):
        raise ValueError(
            f"{fn}: num_states must be a positive int (at most 2**31 - 1), got {num_states!r}"
        )
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
    i = first_overflow(final_values, dtype)
    if i >= 0:
        raise ValueError(
            f"{fn}: final state {final_states[i]} has weight "
            f"{_overflow_message(final_values[i], dtype)}"
        )
    final_weight = np.full(num_states, -math.inf)
    final_weight[final_states] = final_values
    # A state named in `final` is final whatever its weight (-inf included),
    # so that finality never depends on a weight value.
    final_mask = np.zeros(num_states, bool)
    final_mask[final_states] = True
    _, _, final_mask = swap_start(src, dst, final_mask, int(start))
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
        final_mask,
    )
