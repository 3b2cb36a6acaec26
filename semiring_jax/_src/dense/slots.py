"""Slot tables of a graph for the dense scan, and the moves along them.

See `dense/frame_scan.py` for what the slots are and `core/host/dense_tables.py`
for their layout: incoming arcs in rows of K slots (row s < S the first row
of state s, further rows for states with more than K arcs), and a tree per
such state that combines its rows. `pull` gathers, for every slot, the
score at its source state; `push` gathers, for every outgoing slot, a value
of the incoming slot of the same arc; `to_states` turns one value per row
into one per state. A banded graph (src None) pulls and pushes with shifts
and has one row per state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "COLUMNS_UP_TO",
    "Slots",
    "Tree",
    "by_columns",
    "frame_columns",
    "frame_scores",
    "max_or_zero",
    "num_states",
    "pull",
    "pull_columns",
    "push",
    "push_columns",
    "push_destinations",
    "to_states",
]


class Tree(NamedTuple):
    """The trees that combine the rows of states with more than one row
    (`core/host/dense_tables.py`).

    Attributes:
      leaf: int32 [G, F^(L-1), F], the row at each leaf (R for padding),
        [0, 1, 1] if no state has more than one row; its shape gives the
        fan-in F and the levels L.
      top: int32 [S], each such state's node in tree levels 1..L laid end
        to end (their total size for a state with one row).
    """

    leaf: jax.Array
    top: jax.Array


class Slots(NamedTuple):
    """Integer tables of a graph's slots (see the module docstring).

    Attributes:
      src: int32 [R, K], the source state of each incoming slot (any state
        if unused); None for a banded graph (slot k of s comes from s - k).
      label: int32 [R, K], the emission column of each slot; None when the
        emissions are given per state, [T, S].
      leaving: int32 [Ro, Ko], the outgoing slots: rows of each state's
        outgoing arcs (laid out as the incoming ones), each naming the
        arc's incoming slot in the flattened [R * K] (R * K where unused);
        None for a banded graph.
      row_state: int32 [R], the state of each incoming row; None when
        R == S (row s is state s).
      in_tree: the `Tree` of the incoming rows (its `top` gives S); None
        for a banded graph.
      out_dst: int32 [Ro, Ko], each outgoing slot's destination (S where
        unused); None for a banded graph.
      out_tree: the `Tree` of the outgoing rows; None for a banded graph.
    """

    src: jax.Array | None
    label: jax.Array | None
    leaving: jax.Array | None
    row_state: jax.Array | None = None
    in_tree: Tree | None = None
    out_dst: jax.Array | None = None
    out_tree: Tree | None = None


def num_states(slots: Slots, num_rows: int) -> int:
    """S, for incoming tables of `num_rows` rows."""
    return num_rows if slots.in_tree is None else slots.in_tree.top.shape[0]


def _shifted(values: jax.Array, offset: int, fill: float) -> jax.Array:
    """`values` [S] moved by `offset`: out[s] = values[s - offset], else fill."""
    if offset == 0:
        return values
    size = values.shape[0]
    pad = jnp.full((abs(offset),), fill, values.dtype)
    if offset > 0:
        return jnp.concatenate([pad, values])[:size]
    return jnp.concatenate([values, pad])[-offset:]


def _padded(values: jax.Array, fill: Any) -> jax.Array:
    """`values` [N, ...] with `fill` (a value of shape [...]) appended at
    index N."""
    pad = jnp.broadcast_to(jnp.asarray(fill, values.dtype), (1, *values.shape[1:]))
    return jnp.concatenate([values, pad])


def pull(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> jax.Array:
    """[R, K]: the score at each slot's source state."""
    if slots.src is None:
        return jnp.stack([_shifted(scores, k, fill) for k in range(num_slots)], axis=1)
    return scores[slots.src]


def push(slot_values: jax.Array, slots: Slots, fill: float) -> jax.Array:
    """[Ro, Ko]: for each outgoing slot, the value [R, K] at its arc's
    incoming slot."""
    if slots.src is None:
        return jnp.stack(
            [_shifted(slot_values[:, k], -k, fill) for k in range(slot_values.shape[1])], axis=1
        )
    assert slots.leaving is not None  # only a banded graph (src None) has none
    return _padded(slot_values.reshape(-1), fill)[slots.leaving]


def to_states(
    rows: Sequence[jax.Array],
    tree: Tree | None,
    fills: Sequence[float | int],
    reduce: Callable[[list[jax.Array]], list[jax.Array]],
) -> list[jax.Array]:
    """One value per state [S] from values per row [R]: row s itself for a
    state with one row, the top of its tree for the others.

    Args:
      rows: parallel values per row, e.g. a score and its best slot, the
        (hi, lo) of a pair, or the leaves of a record (each [R, ...]).
      tree: the rows' `Tree`; None when row s is state s (R == S).
      fills: each value's padding (the semiring's zero, an unused index).
      reduce: ⊕ of parallel [N, F, ...] arrays along axis 1, to [N, ...]; it must
        return the first of equal best entries where ties matter.
    """
    if tree is None:
        return list(rows)
    size = tree.top.shape[0]
    if tree.leaf.shape[0] == 0:  # no state has a second row
        return [row[:size] for row in rows]
    fan = tree.leaf.shape[2]
    nodes = [_padded(row, fill)[tree.leaf.reshape(-1)] for row, fill in zip(rows, fills)]
    levels: list[list[jax.Array]] = []
    width = tree.leaf.shape[1] * fan
    while width > 1:
        nodes = reduce([node.reshape(-1, fan, *node.shape[1:]) for node in nodes])
        levels.append(nodes)
        width //= fan
    tops = [
        _padded(jnp.concatenate([level[i] for level in levels]), fill)[tree.top]
        for i, fill in enumerate(fills)
    ]
    has_tree = tree.top < sum(level[0].shape[0] for level in levels)
    return [
        jnp.where(has_tree.reshape(-1, *(1,) * (top.ndim - 1)), top, row[:size])
        for top, row in zip(tops, rows)
    ]


# Up to this many slots, per-slot work is written column by column: the
# elementwise ops fuse into one kernel per step, where [R, K] arrays and
# reductions over K would not. Wider graphs keep [R, K] arrays: their steps
# are big enough that one reduction beats K unrolled columns.
COLUMNS_UP_TO = 8

Slotwise = list[jax.Array] | jax.Array  # K columns [R], or one [R, K] array


def by_columns(slots: Slots, num_slots: int) -> bool:
    """Whether per-slot values are handled as a list of columns."""
    return slots.src is None or num_slots <= COLUMNS_UP_TO


def _split(values: jax.Array, slots: Slots) -> Slotwise:
    if by_columns(slots, values.shape[1]):
        return [values[:, k] for k in range(values.shape[1])]
    return values


def pull_columns(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> Slotwise:
    """`pull`, as columns (see COLUMNS_UP_TO)."""
    if slots.src is None:
        return [_shifted(scores, k, fill) for k in range(num_slots)]
    return _split(scores[slots.src], slots)


def push_columns(slot_values: jax.Array, slots: Slots, fill: float) -> Slotwise:
    """`push` of slot values [R, K], as columns (see COLUMNS_UP_TO)."""
    if slots.src is None:
        return [_shifted(slot_values[:, k], -k, fill) for k in range(slot_values.shape[1])]
    return _split(push(slot_values, slots, fill), slots)


def push_destinations(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> Slotwise:
    """For each outgoing slot, the score [S] at its destination, as columns
    (see COLUMNS_UP_TO); `num_slots` is the banded graph's K. Shifting or
    gathering the [S] scores themselves, not an expression of them, keeps
    XLA from recomputing that expression once per column."""
    if slots.src is None:
        return [_shifted(scores, -k, fill) for k in range(num_slots)]
    assert slots.out_dst is not None  # only a banded graph (src None) has none
    return _split(_padded(scores, fill)[slots.out_dst], slots)


def _row_frame(frame: jax.Array, slots: Slots) -> jax.Array:
    """A per-state frame [S] read per incoming row [R]."""
    return frame if slots.row_state is None else _padded(frame, 0)[slots.row_state]


def frame_columns(frame: jax.Array, slots: Slots, num_slots: int) -> Slotwise:
    """This frame's emission per slot, as columns (see COLUMNS_UP_TO)."""
    if slots.label is None:
        per_row = _row_frame(frame, slots)
        return [per_row] * num_slots if by_columns(slots, num_slots) else per_row[:, None]
    return _split(frame[slots.label], slots)


def frame_scores(frame: jax.Array, slots: Slots) -> jax.Array:
    """This frame's emission per slot, [R, K], or per row, [R, 1]."""
    return _row_frame(frame, slots)[:, None] if slots.label is None else frame[slots.label]


def max_or_zero(scores: jax.Array) -> jax.Array:
    """The max of `scores` [S], or 0 when none is finite."""
    top = jnp.max(scores, initial=-jnp.inf)
    return jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
