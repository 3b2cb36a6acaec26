"""Index tables that the score recursions gather through (numpy only).

Each state with an arc (and the start state) gets a *position* in an [L, W]
grid (level, rank in level; levels from `levels.balanced_levels`), kept flat
as `level * W + rank`. Two dummy positions follow the grid: `P = L * W`
holds the semiring's zero and `P + 1` its one. States with no real arc,
other than the start, need no position and map to P, so that batch padding
does not widen any level.

A recursion step pulls, for each state of a level, the scores at the other
ends of its arcs. A state's arcs are split into *rows* of K slots, so that
one state with many arcs does not pad every state to its degree: row r < W
is the first row of the state of rank r, rows W, W + 1, ... hold further
rows, and a [W, C] *combine* table lists each state's rows (C = most rows
of one state). K is chosen per FSA to minimise the padded work.

Padding points at position P and at the dummy arc `A` (weight zero). The
start state's first incoming slot is a pseudo-arc `A + 1` (weight one) from
position P + 1: that is how a path starts, with no special case in the
recursion, and it comes first so that starting fresh wins a TROPICAL tie.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from semiring_jax._src.host import levels as levels_lib
from semiring_jax._src.host.sorting import stable_argsort

__all__ = [
    "ScheduleShape",
    "build_schedule_arrays",
    "common_shape",
    "empty_schedule_arrays",
]


class ScheduleShape(NamedTuple):
    """Padded sizes of a schedule.

    levels L, width W; for incoming and outgoing arcs: rows per level, K
    slots per row, and C rows per state at most.
    """

    levels: int
    width: int
    in_rows: int
    max_in: int
    in_parts: int
    out_rows: int
    max_out: int
    out_parts: int


class _Structure(NamedTuple):
    """What the tables are built from: levels and arc ends of real arcs."""

    num_states: int
    src: np.ndarray
    dst: np.ndarray
    levels: np.ndarray  # [S], -1 where a state needs no position
    placed: np.ndarray  # [S] bool


def _structure(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    lengths: levels_lib.PathLengths,
    num_levels: int,
) -> _Structure:
    placed = (np.bincount(src, minlength=num_states) + np.bincount(dst, minlength=num_states)) > 0
    placed[0] = True
    levels = levels_lib.balanced_levels(num_states, src, dst, placed, lengths, num_levels)
    return _Structure(num_states, src, dst, levels, placed)


def _given(num_states: int, src: np.ndarray, dst: np.ndarray, levels: np.ndarray) -> _Structure:
    """The structure at levels the caller already knows (every arc must go up)."""
    placed = (np.bincount(src, minlength=num_states) + np.bincount(dst, minlength=num_states)) > 0
    placed[0] = True
    if not (levels[dst] > levels[src]).all():
        raise ValueError("build_schedule_arrays: an arc does not go up the given levels")
    return _Structure(num_states, src, dst, np.where(placed, levels, -1), placed)


def _degrees(structure: _Structure) -> tuple[np.ndarray, np.ndarray]:
    """In-degree (the start's pseudo-arc counted) and out-degree per state."""
    in_degree = np.bincount(structure.dst, minlength=structure.num_states)
    in_degree[0] += 1
    return in_degree, np.bincount(structure.src, minlength=structure.num_states)


class _Histogram(NamedTuple):
    """Placed states counted by (level, degree): `_row_counts` of each K
    tried costs the number of distinct pairs, not of states."""

    level: np.ndarray  # int [G]
    degree: np.ndarray  # int [G]
    states: np.ndarray  # int [G], how many placed states have the pair


def _histogram(structure: _Structure, degree: np.ndarray) -> _Histogram:
    levels, degrees = structure.levels[structure.placed], degree[structure.placed]
    base = int(degrees.max(initial=0)) + 1
    keys, states = np.unique(levels * base + degrees, return_counts=True)
    return _Histogram(keys // base, keys % base, states)


def _row_counts(histogram: _Histogram, slots: int, width: int) -> tuple[int, int]:
    """(rows per level, most rows of one state) with `slots` per row."""
    rows = np.maximum(-(-histogram.degree // slots), 1)
    extra = np.bincount(histogram.level, weights=(rows - 1) * histogram.states)
    return width + int(extra.max()), int(rows.max())


# A combine step costs a few more kernel launches per level, worth about
# this many slots of gather-and-reduce work on a CPU; a batch shares them.
_COMBINE_OVERHEAD = 300


def _best_slots(histograms: list[_Histogram], width: int) -> int:
    """The K that minimises the padded work of a level step, over the
    entries (their degree histograms) that share one schedule shape."""
    most = max(max(int(histogram.degree.max()), 1) for histogram in histograms)
    candidates = sorted(
        set(range(1, min(most, 32) + 1)) | {most} | {2**k for k in range(5, most.bit_length())}
    )
    best, best_cost = 1, None
    for slots in candidates:
        counts = [_row_counts(histogram, slots, width) for histogram in histograms]
        rows, parts = max(r for r, _ in counts), max(p for _, p in counts)
        overhead = _COMBINE_OVERHEAD / len(histograms)
        cost = rows * slots + (width * parts + overhead if parts > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = slots, cost
    return best


def _identity(size: int) -> int:
    return size


def _common_shape(
    structures: list[_Structure], round_up: Callable[[int], int], levels: int
) -> ScheduleShape:
    """The smallest shape (sizes passed through `round_up`) that fits all."""
    width = round_up(max(int(np.bincount(st.levels[st.placed]).max()) for st in structures))
    degrees = [_degrees(structure) for structure in structures]
    sizes = []
    for direction in (0, 1):  # incoming, outgoing
        histograms = [_histogram(st, degree[direction]) for st, degree in zip(structures, degrees)]
        slots = round_up(_best_slots(histograms, width))
        counts = [_row_counts(histogram, slots, width) for histogram in histograms]
        sizes += [round_up(max(r for r, _ in counts)), slots, round_up(max(p for _, p in counts))]
    return ScheduleShape(levels, width, *sizes)


# Kernel launches and loop control of one level step, in slots of work.
_LEVEL_OVERHEAD = 500


def _cost(shape: ScheduleShape, batch: int) -> float:
    """Padded work of a forward and a backward scan, in slots per entry."""
    per_level = _LEVEL_OVERHEAD / batch
    for rows, slots, parts in (
        (shape.in_rows, shape.max_in, shape.in_parts),
        (shape.out_rows, shape.max_out, shape.out_parts),
    ):
        if parts > 1:
            per_level += shape.width * parts + _COMBINE_OVERHEAD / batch
        per_level += rows * slots
    return shape.levels * per_level


def _best_shape(
    fsas: Sequence[tuple[int, np.ndarray, np.ndarray]],
    round_up: Callable[[int], int] = _identity,
    known: Sequence[levels_lib.PathLengths] | None = None,
) -> tuple[ScheduleShape, list[_Structure]] | None:
    """The cheapest common shape and the structures it was computed from.

    Levels beyond the depth plus one make a step sequential that could have
    been parallel, but let wide levels spread out; they are tried only when
    the levels are padded by more than half, and kept when the estimated
    work (`_cost`) drops. Every structure is computed at the
    shape's number of levels, so `build_schedule_arrays` finds it again.
    """
    found = list(known) if known is not None else [levels_lib.path_lengths(*a) for a in fsas]
    lengths = [entry for entry in found if entry is not None]
    if len(lengths) < len(found):  # a cycle
        return None
    depth = max(int(entry.earliest.max()) for entry in lengths)
    best: tuple[ScheduleShape, list[_Structure]] | None = None
    for factor in (1.0, 1.25, 1.5):
        num_levels = round_up(math.ceil((depth + 1) * factor))
        structures = [_structure(*arcs, entry, num_levels) for arcs, entry in zip(fsas, lengths)]
        shape = _common_shape(structures, round_up, num_levels)
        if best is None or _cost(shape, len(fsas)) < _cost(best[0], len(fsas)):
            best = shape, structures
        placed = max(int(st.placed.sum()) for st in structures)
        if factor == 1.0 and shape.levels * shape.width <= 1.5 * placed:
            break
    return best


def common_shape(
    fsas: Sequence[tuple[int, np.ndarray, np.ndarray]], round_up: Callable[[int], int] = _identity
) -> ScheduleShape | None:
    """One schedule shape for several FSAs (a batch); None if one is cyclic.

    Args:
      fsas: `(num_states, src, dst)` of each FSA's real arcs.
      round_up: applied to every size (e.g. a bucketing ladder).
    Returns:
      Sizes that fit every FSA, with one K per direction chosen for all.
    """
    found = _best_shape(fsas, round_up)
    return None if found is None else found[0]


def _fit(structure: _Structure, shape: ScheduleShape) -> _Structure:
    """`structure`, checked to fit in `shape` at the shape's K per direction."""
    in_degree, out_degree = _degrees(structure)
    in_rows, in_parts = _row_counts(_histogram(structure, in_degree), shape.max_in, shape.width)
    out_rows, out_parts = _row_counts(_histogram(structure, out_degree), shape.max_out, shape.width)
    placed_levels = structure.levels[structure.placed]
    needed = ScheduleShape(
        int(placed_levels.max()) + 1,
        int(np.bincount(placed_levels).max()),
        in_rows,
        shape.max_in,
        in_parts,
        out_rows,
        shape.max_out,
        out_parts,
    )
    if any(n > s for n, s in zip(needed, shape)):
        raise ValueError(f"build_schedule_arrays: shape {shape} is too small for {needed}")
    return structure


def _rank_in_run(sorted_keys: np.ndarray) -> np.ndarray:
    """Each entry's rank within its run of equal keys (keys sorted), in
    linear time (a searchsorted of the keys into themselves is n log n)."""
    size = sorted_keys.size
    new_run = np.ones(size, dtype=bool)
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new_run[1:])
    index = np.arange(size)
    return index - np.maximum.accumulate(np.where(new_run, index, 0))


def _positions(structure: _Structure, width: int, num_positions: int) -> np.ndarray:
    """Flat grid position of each state; `num_positions` where it has none."""
    states = np.flatnonzero(structure.placed)
    order = states[np.argsort(structure.levels[states], kind="stable")]
    sorted_levels = structure.levels[order]
    rank = _rank_in_run(sorted_levels)
    positions = np.full(structure.num_states, num_positions, dtype=np.int64)
    positions[order] = sorted_levels * width + rank
    return positions


def _pull_tables(
    key_pos: np.ndarray, shape: ScheduleShape, rows: int, slots: int, parts: int
) -> dict[str, np.ndarray]:
    """Entries grouped by the position of their key state, split into rows.

    Args:
      key_pos: int [E], the grid position of each entry's state; a state's
        entries go into its rows in entry order (the tie rule relies on it).
      shape: the padded sizes; rows, slots, parts: this direction's.
    Returns:
      `entry_slot` [E]: each entry's index in the flattened [L, rows, slots]
      table (fill a table with `_scatter`), `combine` [L, W, parts] of row
      indices (`rows` for none), and `row_part` [L, rows]: each row's index
      in the flattened [W, parts] combine table (W * parts for none);
      `order` [E]: the entries sorted by position, stably.
    """
    levels, width = shape.levels, shape.width
    order = stable_argsort(key_pos)
    sorted_pos = key_pos[order]
    rank_in_state = _rank_in_run(sorted_pos)
    level, state_rank = np.divmod(sorted_pos, width)
    if parts == 1:  # every state fits in its own row
        part, slot, row = np.zeros_like(rank_in_state), rank_in_state, state_rank
    else:
        part, slot = np.divmod(rank_in_state, slots)
        # Extra rows (part >= 1) are numbered after the W first rows, level
        # by level.
        is_extra = part >= 1
        starts_row = is_extra & (slot == 0)
        extra_index = np.cumsum(starts_row) - 1  # running count of extra rows
        level_start = np.searchsorted(level[starts_row], np.arange(levels))
        row = np.where(is_extra, width + extra_index - level_start[level], state_rank)
    # int32 throughout, and flat indices: the [L, rows, K] tables can be many
    # times the entries, so they are filled once and scattered into.
    flat_combine = np.full(levels * width * parts, rows, dtype=np.int32)
    flat_combine[(level * width + state_rank) * parts + part] = row
    combine = flat_combine.reshape(levels, width, parts)
    combine[:, :, 0] = np.arange(width)  # every state's first row is its own
    row_part = np.full(levels * rows, width * parts, dtype=np.int32)
    row_part[level * rows + row] = state_rank * parts + part
    entry_slot = np.empty(order.size, dtype=np.int64)
    entry_slot[order] = (level * rows + row) * slots + slot
    return dict(
        entry_slot=entry_slot,
        combine=combine,
        row_part=row_part.reshape(levels, rows),
        order=order,
    )


def _scatter(
    table_shape: tuple[int, int, int], entry_slot: np.ndarray, values: np.ndarray, fill: int
) -> np.ndarray:
    """int32 table of `table_shape`: `values[e]` at entry e's slot, `fill`
    elsewhere."""
    table = np.full(int(np.prod(table_shape)), fill, dtype=np.int32)
    table[entry_slot] = values
    return table.reshape(table_shape)


def build_schedule_arrays(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    arc_mask: np.ndarray,
    shape: ScheduleShape | None = None,
    lengths: levels_lib.PathLengths | None = None,
    levels: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """All index tables of an acyclic FSA, padded to `shape`.

    Args:
      num_states: S (padded).
      src, dst: int [A] (padded); only arcs with `arc_mask` count.
      arc_mask: bool [A].
      shape: padded sizes (from `common_shape`); natural if None.
      lengths: `levels.path_lengths` of the real arcs, if already known.
      levels: int [S], levels to use as they are (with `shape` None), for
        a graph whose builder knows them: no longest paths, no balancing.
    Returns:
      A dict of int32 arrays, the fields of `Schedule` (see fsa.py).
    """
    num_arcs = src.shape[0]
    real = np.flatnonzero(arc_mask)
    real_src, real_dst = src[real], dst[real]
    if shape is None and levels is not None:
        structure = _given(num_states, real_src, real_dst, np.asarray(levels, np.int64))
        depth = int(structure.levels[structure.placed].max()) + 1
        shape = _common_shape([structure], _identity, depth)
    elif shape is None:
        known = None if lengths is None else [lengths]
        best = _best_shape([(num_states, real_src, real_dst)], known=known)
        assert best is not None  # the FSA is acyclic (see Args)
        (shape, (structure,)) = best
    else:
        if lengths is None:
            lengths = levels_lib.path_lengths(num_states, real_src, real_dst)
        assert lengths is not None  # the FSA is acyclic (see Args)
        structure = _fit(_structure(num_states, real_src, real_dst, lengths, shape.levels), shape)
    num_positions = shape.levels * shape.width
    state_pos = _positions(structure, shape.width, num_positions)
    pos_state = np.full(num_positions + 1, num_states, dtype=np.int64)
    pos_state[state_pos] = np.arange(num_states)
    # Incoming entries: the start's pseudo-arc (entry 0), then the real arcs.
    incoming = _pull_tables(
        np.concatenate([[state_pos[0]], state_pos[real_dst]]),
        shape,
        shape.in_rows,
        shape.max_in,
        shape.in_parts,
    )
    in_shape = (shape.levels, shape.in_rows, shape.max_in)
    # Entry 0 is the start's pseudo-arc (arc A + 1 from position P + 1);
    # empty slots read arc A from position P.
    in_arc = _scatter(in_shape, incoming["entry_slot"], np.append(num_arcs + 1, real), num_arcs)
    in_src_pos = _scatter(
        in_shape,
        incoming["entry_slot"],
        np.append(num_positions + 1, state_pos[real_src]),
        num_positions,
    )
    outgoing = _pull_tables(
        state_pos[real_src], shape, shape.out_rows, shape.max_out, shape.out_parts
    )
    out_shape = (shape.levels, shape.out_rows, shape.max_out)
    out_arc = _scatter(out_shape, outgoing["entry_slot"], real, num_arcs)
    out_dst_pos = _scatter(out_shape, outgoing["entry_slot"], state_pos[real_dst], num_positions)
    arc_src_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_dst_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_src_pos[real] = state_pos[real_src]
    arc_dst_pos[real] = state_pos[real_dst]
    # Where each arc's local derivative sits in the flattened [L, rows, K]
    # in-table; the dummy index just past it holds a zero.
    arc_grad_index = np.full(num_arcs, in_arc.size, dtype=np.int64)
    arc_grad_index[real] = incoming["entry_slot"][1:]
    # The incoming entries by position, less the start's pseudo-entry 0.
    by_position = incoming["order"]
    pull_arc, pull_src, pull_end = _pull_order(
        num_arcs,
        real,
        real_src,
        state_pos[real_dst],
        num_positions,
        by_position[by_position > 0] - 1,
    )
    tables = dict(
        state_pos=state_pos,
        pos_state=pos_state[:num_positions].reshape(shape.levels, shape.width),
        in_arc=in_arc,
        in_src_pos=in_src_pos,
        in_combine=incoming["combine"],
        in_row_part=incoming["row_part"],
        out_arc=out_arc,
        out_dst_pos=out_dst_pos,
        out_combine=outgoing["combine"],
        arc_src_pos=arc_src_pos,
        arc_dst_pos=arc_dst_pos,
        arc_grad_index=arc_grad_index,
        pull_arc=pull_arc,
        pull_src=pull_src,
        pull_end=pull_end.reshape(shape.levels, shape.width),
    )
    return {name: np.asarray(value, np.int32) for name, value in tables.items()}


def _pull_order(
    num_arcs: int,
    real: np.ndarray,
    real_src: np.ndarray,
    real_dst_pos: np.ndarray,
    num_positions: int,
    order: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The real arcs grouped by their destination's position, for the CPU
    kernels (`kernels/scores.cc`), which then read every table in order;
    `order` is the stable sort of `real_dst_pos` (found for the in-tables).

    Returns:
      pull_arc, int [A]: the real arcs by (destination position, arc index),
        then the padding arcs; pull_src, int [A]: their source states (0 for
        padding); pull_end, int [P]: where each position's arcs end in
        `pull_arc` (exclusive; a position's arcs start at the previous end).
    """
    is_padding = np.ones(num_arcs, bool)
    is_padding[real] = False
    padding = np.flatnonzero(is_padding)
    pull_arc = np.concatenate([real[order], padding])
    pull_src = np.concatenate([real_src[order], np.zeros(padding.size, real_src.dtype)])
    pull_end = np.cumsum(np.bincount(real_dst_pos, minlength=num_positions)[:num_positions])
    return pull_arc, pull_src, pull_end


def empty_schedule_arrays(num_states: int, num_arcs: int) -> dict[str, np.ndarray]:
    """Zero-sized tables for a cyclic FSA (score ops refuse it before use)."""
    grid = np.zeros((0, 0), np.int32)
    rows = np.zeros((0, 0, 0), np.int32)
    return dict(
        state_pos=np.zeros(num_states, np.int32),
        pos_state=grid,
        in_arc=rows,
        in_src_pos=rows,
        in_combine=rows,
        in_row_part=grid,
        out_arc=rows,
        out_dst_pos=rows,
        out_combine=rows,
        arc_src_pos=np.zeros(num_arcs, np.int32),
        arc_dst_pos=np.zeros(num_arcs, np.int32),
        arc_grad_index=np.zeros(num_arcs, np.int32),
        pull_arc=np.zeros(num_arcs, np.int32),
        pull_src=np.zeros(num_arcs, np.int32),
        pull_end=grid,
    )
