"""Level schedules: the index tables that score recursions gather through.

Numpy only, never traced. A state's level is the length of the longest path
that reaches it from any state without incoming arcs, so every arc goes from
a lower level to a higher one, and one step of a recursion can compute a
whole level at once: the number of sequential steps is the depth of the FSA.

Each state gets a *position* in an [L, W] grid (level, rank in level), kept
flat as `level * W + rank`; position `P = L * W` is a dummy whose score is the
semiring's zero. Padding in every table points at the dummy position, or at
the dummy arc `A` (whose weight is zero). States with no real arc at all,
other than the start, need no position and are mapped to the dummy too, so
that batch padding does not widen level 0.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

__all__ = ["ScheduleShape", "find_cycle", "state_levels", "schedule_shape",
           "build_schedule_arrays", "empty_schedule_arrays"]


class ScheduleShape(NamedTuple):
    """Padded sizes of a schedule: levels L, width W, in/out degree K."""

    levels: int
    width: int
    max_in: int
    max_out: int

    def maximum(self, other: "ScheduleShape") -> "ScheduleShape":
        return ScheduleShape(*(max(a, b) for a, b in zip(self, other)))


def _csr(num_states: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arc indices grouped by `keys` (stable), and the [S + 1] row offsets."""
    order = np.argsort(keys, kind="stable")
    offsets = np.zeros(num_states + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=num_states), out=offsets[1:])
    return order, offsets


def state_levels(num_states: int, src: np.ndarray,
                 dst: np.ndarray) -> Optional[np.ndarray]:
    """Longest-path level of each state, or None if the arcs have a cycle.

    Kahn's algorithm, one whole frontier per numpy step.

    Args:
      num_states: S.
      src, dst: int [A], the real arcs only.
    Returns:
      int64 [S] levels, or None when some state lies on a cycle.
    """
    order, offsets = _csr(num_states, src)
    out_dst = dst[order]
    in_degree = np.bincount(dst, minlength=num_states)
    levels = np.full(num_states, -1, dtype=np.int64)
    frontier = np.flatnonzero(in_degree == 0)
    level = 0
    while frontier.size:
        levels[frontier] = level
        starts, ends = offsets[frontier], offsets[frontier + 1]
        counts = ends - starts
        # All out-arcs of the frontier, gathered without a Python loop.
        flat = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        targets = out_dst[flat]
        np.subtract.at(in_degree, targets, 1)
        targets = np.unique(targets)
        frontier = targets[in_degree[targets] == 0]
        level += 1
    return None if (levels < 0).any() else levels


def find_cycle(num_states: int, src: np.ndarray, dst: np.ndarray) -> tuple[int, ...]:
    """A cycle of states (first state repeated at the end), or () if acyclic."""
    if state_levels(num_states, src, dst) is not None:
        return ()
    # Strip states that cannot be on a cycle (no path in or no path out),
    # then walk arcs inside the remaining core until a state repeats.
    alive = np.ones(num_states, dtype=bool)
    arc_alive = np.ones(src.shape[0], dtype=bool)
    while True:
        has_in = np.bincount(dst[arc_alive], minlength=num_states) > 0
        has_out = np.bincount(src[arc_alive], minlength=num_states) > 0
        new_alive = alive & has_in & has_out
        arc_alive &= new_alive[src] & new_alive[dst]
        if (new_alive == alive).all():
            break
        alive = new_alive
    next_state = {}
    for s, d in zip(src[arc_alive].tolist(), dst[arc_alive].tolist()):
        next_state.setdefault(s, d)
    state = int(np.flatnonzero(alive)[0])
    seen = []
    while state not in seen:
        seen.append(state)
        state = next_state[state]
    cycle = seen[seen.index(state):]
    return tuple(cycle + [cycle[0]])


def _positions(num_states: int, levels: np.ndarray, has_arc: np.ndarray,
               width: int) -> np.ndarray:
    """Flat grid position of each state; -1 where it needs none."""
    placed = has_arc.copy()
    placed[0] = True  # the start state always has a position
    positions = np.full(num_states, -1, dtype=np.int64)
    states = np.flatnonzero(placed)
    order = states[np.argsort(levels[states], kind="stable")]
    sorted_levels = levels[order]
    first_of_level = np.searchsorted(sorted_levels, sorted_levels, side="left")
    rank = np.arange(order.size) - first_of_level
    positions[order] = sorted_levels * width + rank
    return positions


def _natural_shape(num_states: int, src: np.ndarray, dst: np.ndarray,
                   levels: np.ndarray) -> ScheduleShape:
    has_arc = (np.bincount(src, minlength=num_states)
               + np.bincount(dst, minlength=num_states)) > 0
    has_arc[0] = True
    placed_levels = levels[has_arc]
    return ScheduleShape(
        levels=int(placed_levels.max()) + 1,
        width=int(np.bincount(placed_levels).max()),
        max_in=int(np.bincount(dst, minlength=1).max(initial=0)),
        max_out=int(np.bincount(src, minlength=1).max(initial=0)))


def schedule_shape(num_states: int, src: np.ndarray,
                   dst: np.ndarray) -> Optional[ScheduleShape]:
    """The unpadded schedule sizes of an FSA's real arcs; None if cyclic."""
    levels = state_levels(num_states, src, dst)
    if levels is None:
        return None
    return _natural_shape(num_states, src, dst, levels)


def _arc_table(keys: np.ndarray, positions_of_key: np.ndarray, num_positions: int,
               width: int, num_arcs_padded: int) -> tuple[np.ndarray, np.ndarray]:
    """[P + 1, width] table of arc indices grouped by the position of `keys`.

    Arcs appear in increasing index order in each row (the tie rule relies on
    it); empty slots hold the dummy arc `num_arcs_padded`. Returns the table
    and the slot of each arc in its row.
    """
    key_positions = positions_of_key[keys]
    order = np.argsort(key_positions, kind="stable")
    sorted_positions = key_positions[order]
    slot_sorted = np.arange(order.size) - np.searchsorted(sorted_positions, sorted_positions)
    table = np.full((num_positions + 1, max(width, 1)), num_arcs_padded, dtype=np.int32)
    table[sorted_positions, slot_sorted] = order
    slots = np.empty(order.size, dtype=np.int64)
    slots[order] = slot_sorted
    return table[:num_positions, :width], slots


def build_schedule_arrays(num_states: int, src: np.ndarray, dst: np.ndarray,
                          arc_mask: np.ndarray,
                          shape: Optional[ScheduleShape] = None) -> dict[str, np.ndarray]:
    """All index tables of an acyclic FSA, padded to `shape`.

    Args:
      num_states: S (padded).
      src, dst: int [A] (padded); only arcs with `arc_mask` count.
      arc_mask: bool [A].
      shape: padded sizes, at least the natural ones; natural if None.
    Returns:
      A dict of int32 arrays, the fields of `Schedule` (see fsa.py).
    Raises:
      ValueError: if the real arcs have a cycle (callers check first).
    """
    num_arcs = src.shape[0]
    real = np.flatnonzero(arc_mask)
    real_src, real_dst = src[real], dst[real]
    levels = state_levels(num_states, real_src, real_dst)
    if levels is None:
        raise ValueError("build_schedule_arrays: the FSA has a cycle")
    natural = _natural_shape(num_states, real_src, real_dst, levels)
    shape = natural if shape is None else natural.maximum(shape)
    num_positions = shape.levels * shape.width
    has_arc = (np.bincount(real_src, minlength=num_states)
               + np.bincount(real_dst, minlength=num_states)) > 0
    state_pos = _positions(num_states, levels, has_arc, shape.width)
    state_pos = np.where(state_pos < 0, num_positions, state_pos)
    pos_state = np.full(num_positions, num_states, dtype=np.int64)
    placed = np.flatnonzero(state_pos < num_positions)
    pos_state[state_pos[placed]] = placed
    # Tables list real arcs only; gather positions through the real subset.
    in_table, in_slot = _arc_table(real_dst, state_pos, num_positions, shape.max_in, real.size)
    out_table, _ = _arc_table(real_src, state_pos, num_positions, shape.max_out, real.size)
    real_with_dummy = np.append(real, num_arcs)
    in_arc = real_with_dummy[in_table]
    out_arc = real_with_dummy[out_table]
    src_pos_with_dummy = np.append(state_pos[src], num_positions)
    dst_pos_with_dummy = np.append(state_pos[dst], num_positions)
    arc_src_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_dst_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_src_pos[real] = state_pos[real_src]
    arc_dst_pos[real] = state_pos[real_dst]
    # Where each arc's local gradient sits in the flattened [P, 1 + K] table
    # of a level step's candidates (slot 0 is the start term); the dummy
    # index P * (1 + K) is a zero appended after it.
    arc_grad_index = np.full(num_arcs, num_positions * (1 + shape.max_in), dtype=np.int64)
    arc_grad_index[real] = state_pos[real_dst] * (1 + shape.max_in) + 1 + in_slot
    grid = (shape.levels, shape.width)
    tables = dict(
        state_pos=state_pos,
        pos_state=pos_state.reshape(grid),
        in_arc=in_arc.reshape(grid + (shape.max_in,)),
        in_src_pos=src_pos_with_dummy[in_arc].reshape(grid + (shape.max_in,)),
        out_arc=out_arc.reshape(grid + (shape.max_out,)),
        out_dst_pos=dst_pos_with_dummy[out_arc].reshape(grid + (shape.max_out,)),
        arc_src_pos=arc_src_pos,
        arc_dst_pos=arc_dst_pos,
        arc_grad_index=arc_grad_index,
    )
    return {name: value.astype(np.int32) for name, value in tables.items()}


def empty_schedule_arrays(num_states: int, num_arcs: int) -> dict[str, np.ndarray]:
    """Zero-sized tables for a cyclic FSA (score ops refuse it before use)."""
    grid = (0, 0)
    return dict(
        state_pos=np.zeros(num_states, np.int32),
        pos_state=np.zeros(grid, np.int32),
        in_arc=np.zeros(grid + (0,), np.int32),
        in_src_pos=np.zeros(grid + (0,), np.int32),
        out_arc=np.zeros(grid + (0,), np.int32),
        out_dst_pos=np.zeros(grid + (0,), np.int32),
        arc_src_pos=np.zeros(num_arcs, np.int32),
        arc_dst_pos=np.zeros(num_arcs, np.int32),
        arc_grad_index=np.zeros(num_arcs, np.int32),
    )

