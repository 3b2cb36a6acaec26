"""Index tables that the score recursions gather through (numpy only).

Each state with an arc (and the start state) gets a *position* in an [L, W]
grid (level, rank in level; levels from `levels.balanced_levels`), kept flat
as `level * W + rank`. Two dummy positions follow the grid: `P = L * W`
holds the semiring's zero and `P + 1` its one. Padding in every table points
at position P, or at the dummy arc `A` (weight zero). The start state's row
of incoming arcs begins with a pseudo-arc `A + 1` (weight one) from position
P + 1: that is how a path starts, with no special case in the recursion, and
it sits first so that starting fresh wins a TROPICAL tie. States with no
real arc, other than the start, need no position and map to P, so that
batch padding does not widen any level.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from semiring_jax._src.host import levels as levels_lib

__all__ = ["ScheduleShape", "schedule_shape", "build_schedule_arrays",
           "empty_schedule_arrays"]


class ScheduleShape(NamedTuple):
    """Padded sizes of a schedule: levels L, width W, in/out degree K."""

    levels: int
    width: int
    max_in: int
    max_out: int

    def maximum(self, other: "ScheduleShape") -> "ScheduleShape":
        return ScheduleShape(*(max(a, b) for a, b in zip(self, other)))


def _placed(num_states: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    placed = (np.bincount(src, minlength=num_states)
              + np.bincount(dst, minlength=num_states)) > 0
    placed[0] = True
    return placed


def _natural_shape(num_states: int, src: np.ndarray, dst: np.ndarray,
                   levels: np.ndarray, placed: np.ndarray) -> ScheduleShape:
    in_degree = np.bincount(dst, minlength=num_states)
    in_degree[0] += 1  # the start's pseudo-arc
    return ScheduleShape(
        levels=int(levels[placed].max()) + 1,
        width=int(np.bincount(levels[placed]).max()),
        max_in=int(in_degree.max()),
        max_out=int(np.bincount(src, minlength=1).max(initial=0)))


def schedule_shape(num_states: int, src: np.ndarray,
                   dst: np.ndarray) -> Optional[ScheduleShape]:
    """The unpadded schedule sizes of an FSA's real arcs; None if cyclic."""
    if levels_lib.longest_path_levels(num_states, src, dst) is None:
        return None
    placed = _placed(num_states, src, dst)
    levels = levels_lib.balanced_levels(num_states, src, dst, placed)
    return _natural_shape(num_states, src, dst, levels, placed)


def _positions(levels: np.ndarray, placed: np.ndarray, width: int,
               num_positions: int) -> np.ndarray:
    """Flat grid position of each state; `num_positions` where it has none."""
    states = np.flatnonzero(placed)
    order = states[np.argsort(levels[states], kind="stable")]
    sorted_levels = levels[order]
    rank = np.arange(order.size) - np.searchsorted(sorted_levels, sorted_levels)
    positions = np.full(levels.shape[0], num_positions, dtype=np.int64)
    positions[order] = sorted_levels * width + rank
    return positions


def _arc_table(key_positions: np.ndarray, num_positions: int, width: int,
               fill: int) -> tuple[np.ndarray, np.ndarray]:
    """[P, width] table of entry indices grouped by `key_positions`.

    Entries appear in increasing index order in each row (the tie rule relies
    on it); empty slots hold `fill`. Returns the table and each entry's slot.
    """
    order = np.argsort(key_positions, kind="stable")
    sorted_positions = key_positions[order]
    slot_sorted = np.arange(order.size) - np.searchsorted(sorted_positions, sorted_positions)
    table = np.full((num_positions + 1, max(width, 1)), fill, dtype=np.int64)
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
    """
    num_arcs = src.shape[0]
    real = np.flatnonzero(arc_mask)
    real_src, real_dst = src[real], dst[real]
    placed = _placed(num_states, real_src, real_dst)
    levels = levels_lib.balanced_levels(num_states, real_src, real_dst, placed)
    natural = _natural_shape(num_states, real_src, real_dst, levels, placed)
    shape = natural if shape is None else natural.maximum(shape)
    grid = (shape.levels, shape.width)
    num_positions = shape.levels * shape.width
    state_pos = _positions(levels, placed, shape.width, num_positions)
    pos_state = np.full(num_positions + 1, num_states, dtype=np.int64)
    pos_state[state_pos] = np.arange(num_states)
    # Incoming arcs: the start's pseudo-arc (entry 0), then the real arcs.
    in_entries = np.concatenate([[num_arcs + 1], real])
    in_entry_src_pos = np.concatenate([[num_positions + 1], state_pos[real_src]])
    in_table, in_slot = _arc_table(np.concatenate([[state_pos[0]], state_pos[real_dst]]),
                                   num_positions, shape.max_in, fill=real.size + 1)
    in_arc = np.append(in_entries, num_arcs)[in_table]
    in_src_pos = np.append(in_entry_src_pos, num_positions)[in_table]
    out_table, _ = _arc_table(state_pos[real_src], num_positions, shape.max_out,
                              fill=real.size)
    out_arc = np.append(real, num_arcs)[out_table]
    out_dst_pos = np.append(state_pos[real_dst], num_positions)[out_table]
    arc_src_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_dst_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_src_pos[real] = state_pos[real_src]
    arc_dst_pos[real] = state_pos[real_dst]
    # Where each arc's local gradient sits in the flattened [P, K] table of
    # in-arc slots; the dummy index P * K is a zero appended after it.
    arc_grad_index = np.full(num_arcs, num_positions * shape.max_in, dtype=np.int64)
    arc_grad_index[real] = state_pos[real_dst] * shape.max_in + in_slot[1:]
    tables = dict(
        state_pos=state_pos,
        pos_state=pos_state[:num_positions].reshape(grid),
        in_arc=in_arc.reshape(grid + (shape.max_in,)),
        in_src_pos=in_src_pos.reshape(grid + (shape.max_in,)),
        out_arc=out_arc.reshape(grid + (shape.max_out,)),
        out_dst_pos=out_dst_pos.reshape(grid + (shape.max_out,)),
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
