"""Index tables that the level scans gather through (numpy only).

A level scan computes the scores of many states in one step, each state
pulling the scores at the other ends of its arcs through K *slots*. Two
things would make those tables grow faster than the FSA:

- **Degree.** One state with d arcs would pad every state to d slots (a
  star of 100,000 arcs: 10^10 slots). Instead a state with more than K arcs
  in one direction gets a *fan tree*: its arcs are split, in arc order,
  among helper nodes of at most K arcs each, and the helpers (recursively)
  feed the state through helper arcs of weight one. A helper is a state of
  the schedule only; it changes no score, since ⊗ one is the identity and ⊕
  is associative, and splitting in arc order keeps TROPICAL's tie rule (the
  first best arc in arc order wins).
- **Width.** A level with many states would pad every level to its width.
  Instead each level is cut into *steps* of C positions; the steps of one
  level are independent, so a scan runs one step at a time.

K (per direction) and C are chosen to minimise the padded work, under a
memory bound: at most max(4 (A + S), 2^22) slots per direction (2 K S
when K ≤ 8) and at most 2 S' + 64 positions, where S' counts the states
and helpers placed (S' ≤ S + 2 A / K).

Positions are flat, `step * C + rank`; two dummy positions follow the N
steps: `P = N * C` holds the semiring's zero and `P + 1` its one. States
with no real arc, other than the start, need no position and map to P, so
that batch padding widens nothing.

Arcs of the schedule (the *augmented* arcs) are the real arcs (their own
index), the dummy arc A (weight zero, the padding slots), the start's
pseudo-arc A + 1 (weight one, from position P + 1: that is how a path
starts, and it comes first so that starting fresh wins a TROPICAL tie) and
the helper arcs A + 2 + h (weight one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host import levels as levels_lib
from semiring_jax._src.core.host.sorting import stable_argsort

__all__ = [
    "ScheduleShape",
    "build_common",
    "build_schedule_arrays",
    "empty_schedule_arrays",
]


class ScheduleShape(NamedTuple):
    """Padded sizes of a schedule: N steps of C positions, K slots per
    position for incoming and for outgoing arcs, and H helper arcs."""

    steps: int
    width: int
    in_slots: int
    out_slots: int
    helpers: int


def _identity(size: int) -> int:
    return size


# Kernel launches and loop control of one step, in slots of work.
_STEP_OVERHEAD = 500
# Slots per direction that any FSA may pad to (16 MiB of int32 per table):
# below this a fan tree's extra steps cost more than the memory it saves.
_FREE_SLOTS = 2**22
# Deeper graphs keep their longest-path levels unbalanced (see `_plan`).
_BALANCED_LEVELS = 1024


class _Arcs(NamedTuple):
    """One entry's real arcs: the structure the tables are built from."""

    num_states: int
    num_arcs: int  # A, padding included
    real: np.ndarray  # int [R], the real arcs' indices
    src: np.ndarray  # int [R]
    dst: np.ndarray  # int [R]


def _arcs(num_states: int, src: np.ndarray, dst: np.ndarray, arc_mask: np.ndarray) -> _Arcs:
    real = np.flatnonzero(arc_mask)
    return _Arcs(
        num_states, src.shape[0], real, src[real].astype(np.int64), dst[real].astype(np.int64)
    )


def _placed(arcs: _Arcs) -> np.ndarray:
    placed = np.zeros(arcs.num_states, bool)
    placed[arcs.src] = True
    placed[arcs.dst] = True
    placed[0] = True
    return placed


def _degrees(arcs: _Arcs) -> tuple[np.ndarray, np.ndarray]:
    """In-degree (the start's pseudo-arc counted) and out-degree per state."""
    in_degree = np.bincount(arcs.dst, minlength=arcs.num_states)
    in_degree[0] += 1
    return in_degree, np.bincount(arcs.src, minlength=arcs.num_states)


def _tree_sizes(degree: np.ndarray, count: np.ndarray, fan: int) -> tuple[int, int]:
    """(helpers, deepest tree) when states of `degree` (`count` of each)
    are fed by fan trees of fan-in `fan`."""
    helpers, depth = 0, 0
    width = degree.astype(np.int64)
    while True:
        heavy = width > fan
        if not heavy.any():
            return helpers, depth
        width = np.where(heavy, -(-width // fan), width)
        helpers += int((width * count)[heavy].sum())
        depth += 1


def _best_fan(degree: np.ndarray, placed: int, num_arcs: int, depth: int) -> int:
    """The fan-in K of one direction: least padded work, within the memory
    bound of the module docstring.

    Every arc on a path may pass through a fan tree, so trees of depth t
    can stretch a path of `depth` levels to about depth * (1 + t) steps:
    that many more steps is what a tree costs, against the slots that a
    larger K pads every position with."""
    values, count = np.unique(degree, return_counts=True)
    most = int(values.max(initial=0))
    if most <= 1:
        return 1
    budget = max(4 * (num_arcs + placed), _FREE_SLOTS, 2 * most * placed if most <= 8 else 0)
    candidates = set(range(2, min(most, 64) + 1)) | {most, min(most, budget // placed)}
    candidates |= {2**k for k in range(6, most.bit_length())}
    best, best_cost = 2, None
    for fan in sorted(candidates):
        helpers, tree_depth = _tree_sizes(values, count, fan)
        slots = (placed + helpers) * fan
        if slots > budget and fan > 2:
            continue
        cost = slots + _STEP_OVERHEAD * depth * tree_depth
        if best_cost is None or cost < best_cost:
            best, best_cost = fan, cost
    return best


class _Graph(NamedTuple):
    """An entry's schedule graph: the start's pseudo-arc, real arcs and the
    helper arcs of its fan trees, as *entries* e = 0 .. R + H (the
    pseudo-arc first, then the real arcs in order, then the helpers).

    The entries that end at one node, and those that leave one, are in
    slot order by entry index: a node's real arcs in arc order (the
    pseudo-arc first, so that starting fresh wins a TROPICAL tie), a fan
    tree's helper arcs in the order of the groups they gather (`_split`
    appends them so), and no node mixes the two (a split moves all of a
    node's entries to its helpers). So every slot table is one stable sort
    by node, or by position, away.
    """

    num_nodes: int  # states, then helpers
    src: np.ndarray  # int [E], -1 for the pseudo-arc
    dst: np.ndarray  # int [E]
    helpers: int  # H, helper arcs (= helper nodes)
    in_helpers: int  # the first of them belong to in-trees, the rest to out-trees


def _split(
    num_nodes: int,
    ends: np.ndarray,
    others: np.ndarray,
    active: np.ndarray,
    fan: int,
) -> tuple[int, np.ndarray, np.ndarray]:
    """Fan trees on one side: every node with more than `fan` active
    entries ending at it has them regrouped, in entry order, under helper
    nodes of `fan` entries each; new entries (helper arcs, appended in
    group order) join each helper to the node, until no node has more
    than `fan`."""
    while True:
        counts = np.bincount(ends[active], minlength=num_nodes)
        heavy = counts > fan
        if not heavy.any():
            return num_nodes, ends, others
        chosen = np.flatnonzero(active & heavy[np.where(active, ends, 0)])
        order = chosen[stable_argsort(ends[chosen])]
        node = ends[order]
        group = _rank_in_run(node) // fan
        first = np.ones(order.size, bool)
        first[1:] = (node[1:] != node[:-1]) | (group[1:] != group[:-1])
        helper = num_nodes + np.cumsum(first) - 1
        ends = ends.copy()
        ends[order] = helper
        parents, helpers = node[first], helper[first]
        num_nodes += helpers.size
        ends = np.concatenate([ends, parents])
        others = np.concatenate([others, helpers])
        active = np.concatenate([active, np.ones(helpers.size, bool)])


def _graph(arcs: _Arcs, fan_in: int, fan_out: int) -> _Graph:
    count = arcs.real.size
    src = np.concatenate([[-1], arcs.src])
    dst = np.concatenate([[0], arcs.dst])
    everything = np.ones(count + 1, bool)
    num_nodes, dst, src = _split(arcs.num_states, dst, src, everything, fan_in)
    in_helpers = num_nodes - arcs.num_states
    # The out-trees split the same entries on their source side; the in
    # helpers' own arcs are single out-arcs, and the pseudo-arc has none.
    not_pseudo = np.arange(src.size) != 0
    num_nodes, src, dst = _split(num_nodes, src, dst, not_pseudo, fan_out)
    return _Graph(num_nodes, src, dst, src.size - count - 1, in_helpers)


class _Plan(NamedTuple):
    """One entry's graph and its levels, before cutting levels into steps."""

    arcs: _Arcs
    graph: _Graph
    levels: np.ndarray  # int [num_nodes], -1 where no position is needed


def _plan(
    arcs: _Arcs,
    fan_in: int,
    fan_out: int,
    lengths: levels_lib.PathLengths | None = None,
    known_levels: np.ndarray | None = None,
) -> _Plan | None:
    """The entry's graph at the given fan-ins and its levels (None if the
    FSA is cyclic): the FSA's own levels (`known_levels`, or balanced from
    `lengths`, its real arcs' longest paths, found if None), stretched to
    make room for the fan trees (`_stretched`)."""
    graph = _graph(arcs, fan_in, fan_out)
    placed = _placed(arcs)
    if known_levels is not None:
        real_levels = np.asarray(known_levels, np.int64)
        if not (real_levels[arcs.dst] > real_levels[arcs.src]).all():
            raise ValueError("build_schedule_arrays: an arc does not go up the given levels")
    else:
        if lengths is None:
            lengths = levels_lib.path_lengths(arcs.num_states, arcs.src, arcs.dst, height=False)
        if lengths is None:
            return None
        if int(lengths.earliest.max(initial=0)) >= _BALANCED_LEVELS:
            # Balancing costs a numpy pass per level; on a graph this deep
            # the cut of wide levels into steps does nearly as well.
            real_levels = lengths.earliest
        else:
            lengths = levels_lib.with_height(lengths, arcs.src, arcs.dst)
            real_levels = levels_lib.balanced_levels(
                arcs.num_states, arcs.src, arcs.dst, placed, lengths
            )
    real_levels = np.where(placed, real_levels, -1)
    return _Plan(arcs, graph, _stretched(graph, real_levels, arcs))


def _stretched(graph: _Graph, real_levels: np.ndarray, arcs: _Arcs) -> np.ndarray:
    """Levels of every node: the states' levels spread m = 1 + T_in + T_out
    apart (T: the deepest tree of each side), an in-tree's helper at depth
    j sitting j levels below its state, an out-tree's j levels above.

    An arc from t to s climbs at least m levels (s's level is above t's),
    more than the T_out + T_in its trees take, so every arc of the graph
    goes up. Levels no node takes cost no step. Found without a second
    longest-path pass: each helper's depth and state come from its parent
    in a few vectorised sweeps (one per tree level)."""
    num_states, helpers = arcs.num_states, graph.helpers
    if helpers == 0:
        return real_levels
    ids = num_states + np.arange(helpers)
    entry = arcs.real.size + 1 + np.arange(helpers)  # each helper's own arc
    is_in = np.arange(helpers) < graph.in_helpers
    parent = np.where(is_in, graph.dst[entry], graph.src[entry])
    depth = np.zeros(graph.num_nodes, np.int64)
    root = np.arange(graph.num_nodes)
    while True:
        new_depth, new_root = depth[parent] + 1, root[parent]
        if np.array_equal(new_depth, depth[ids]) and np.array_equal(new_root, root[ids]):
            break
        depth[ids], root[ids] = new_depth, new_root
    deepest_in = int(depth[ids[is_in]].max(initial=0))
    deepest_out = int(depth[ids[~is_in]].max(initial=0))
    spread = 1 + deepest_in + deepest_out
    levels = np.full(graph.num_nodes, -1, np.int64)
    levels[:num_states] = np.where(real_levels >= 0, real_levels * spread + deepest_in, -1)
    levels[ids] = levels[root[ids]] + np.where(is_in, -1, 1) * depth[ids]
    return levels


def _widths(plan: _Plan) -> np.ndarray:
    """Placed nodes per level, int [L]."""
    return np.bincount(plan.levels[plan.levels >= 0])


def _steps(widths: np.ndarray, width: int) -> int:
    return int((-(-widths // width)).sum())


def _best_width(
    all_widths: list[np.ndarray], slots: int, round_up: Callable[[int], int]
) -> tuple[int, int]:
    """(C, N): the positions per step, and the steps that fit every entry,
    for the least padded work of a scan; at most 2 S' + 64 positions."""
    widest = max(int(widths.max(initial=1)) for widths in all_widths)
    placed = max(int(widths.sum()) for widths in all_widths)
    levels = max(widths.size for widths in all_widths)
    candidates = {widest, max(placed // max(levels, 1), 1)}
    candidates |= {-(-widest // parts) for parts in range(2, 17)}
    candidates |= {2**k for k in range(widest.bit_length())}
    overhead = _STEP_OVERHEAD / len(all_widths)
    best: tuple[float, int, int] | None = None
    for width in sorted(candidates):
        width = round_up(width)
        steps = round_up(max(_steps(widths, width) for widths in all_widths))
        if steps * width > 2 * placed + 64 and width > 1:
            continue
        cost = steps * (overhead + width * slots)
        if best is None or cost < best[0]:
            best = cost, width, steps
    assert best is not None  # width 1 always fits
    return best[1], best[2]


def _fans(arcs: _Arcs, lengths: levels_lib.PathLengths) -> tuple[int, int]:
    """The natural (K_in, K_out) of one entry."""
    in_degree, out_degree = _degrees(arcs)
    placed = _placed(arcs)
    depth = int(lengths.earliest[placed].max()) + 1
    count, num_arcs = int(placed.sum()), arcs.real.size
    return (
        _best_fan(in_degree[in_degree > 0], count, num_arcs, depth),
        _best_fan(out_degree[out_degree > 0], count, num_arcs, depth),
    )


def _plans(
    entries: Sequence[_Arcs],
    round_up: Callable[[int], int],
    lengths: Sequence[levels_lib.PathLengths | None] | None,
    known_levels: np.ndarray | None = None,
) -> tuple[ScheduleShape, list[_Plan]] | None:
    """One common shape for `entries`, and each entry's plan at it;
    `known_levels` (of a single entry) stand in for its longest paths."""
    found = []
    for i, arcs in enumerate(entries):
        known = lengths[i] if lengths is not None else None
        if known_levels is not None:  # they choose K as the depths would
            levels = np.asarray(known_levels, np.int64)
            known = levels_lib.PathLengths(levels)
        elif known is None:
            known = levels_lib.path_lengths(arcs.num_states, arcs.src, arcs.dst, height=False)
        if known is None:  # a cycle
            return None
        found.append(known)
    fans = [_fans(arcs, entry_lengths) for arcs, entry_lengths in zip(entries, found)]
    fan_in = round_up(max(fan for fan, _ in fans))
    fan_out = round_up(max(fan for _, fan in fans))
    plans = []
    for arcs, entry_lengths in zip(entries, found):
        plan = _plan(arcs, fan_in, fan_out, entry_lengths, known_levels)
        assert plan is not None  # acyclic, as its lengths show
        plans.append(plan)
    width, steps = _best_width([_widths(plan) for plan in plans], fan_in + fan_out, round_up)
    helpers = round_up(max(plan.graph.helpers for plan in plans))
    return ScheduleShape(steps, width, fan_in, fan_out, helpers), plans


def build_common(
    fsas: Sequence[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
    round_up: Callable[[int], int] = _identity,
    lengths: Sequence[levels_lib.PathLengths | None] | None = None,
) -> tuple[ScheduleShape, list[dict[str, np.ndarray]]] | None:
    """Every entry's tables at one common shape, each built once.

    Args:
      fsas: `(num_states, src, dst, arc_mask)` of each entry (padded arrays).
      round_up: applied to every size (e.g. a bucketing ladder).
      lengths: `levels.path_lengths` of each entry's real arcs, if known.
    Returns:
      (shape, tables per entry), or None if an entry is cyclic.
    """
    if lengths is not None and any(entry is None for entry in lengths):
        return None
    found = _plans([_arcs(*fsa) for fsa in fsas], round_up, lengths)
    if found is None:
        return None
    shape, plans = found
    return shape, [_tables(plan, shape) for plan in plans]


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
      shape: padded sizes (from `build_common`); natural if None.
      lengths: `levels.path_lengths` of the real arcs, if already known.
      levels: int [S], levels to use as they are (with `shape` None), for
        a graph whose builder knows them: no longest paths, no balancing
        (unless the graph needs fan trees).
    Returns:
      A dict of int32 arrays, the level fields of `Schedule`.
    Raises:
      ValueError: if `shape` is too small, or an arc does not go up `levels`.
    """
    arcs = _arcs(num_states, src, dst, arc_mask)
    if shape is None:
        found = _plans([arcs], _identity, None if lengths is None else [lengths], levels)
        assert found is not None  # the FSA is acyclic (see Args)
        natural, (natural_plan,) = found
        return _tables(natural_plan, natural)
    plan = _plan(arcs, shape.in_slots, shape.out_slots, lengths)
    assert plan is not None  # the FSA is acyclic (see Args)
    return _tables(plan, shape)


def _rank_in_run(sorted_keys: np.ndarray) -> np.ndarray:
    """Each entry's rank within its run of equal keys (keys sorted), in
    linear time (a searchsorted of the keys into themselves is n log n)."""
    size = sorted_keys.size
    new_run = np.ones(size, dtype=bool)
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new_run[1:])
    index = np.arange(size)
    return index - np.maximum.accumulate(np.where(new_run, index, 0))


def _positions(plan: _Plan, shape: ScheduleShape) -> np.ndarray:
    """Flat position of each node (P where it has none), levels cut into
    steps of C."""
    width, num_positions = shape.width, shape.steps * shape.width
    nodes = np.flatnonzero(plan.levels >= 0)
    order = nodes[np.argsort(plan.levels[nodes], kind="stable")]
    level = plan.levels[order]
    rank = _rank_in_run(level)
    widths = _widths(plan)
    first_step = np.cumsum(-(-widths // width)) - (-(-widths // width))
    steps = int((-(-widths // width)).sum())
    if steps > shape.steps or plan.graph.helpers > shape.helpers:
        raise ValueError(
            f"build_schedule_arrays: shape {shape} is too small for {steps} steps "
            f"and {plan.graph.helpers} helpers"
        )
    positions = np.full(plan.graph.num_nodes, num_positions, dtype=np.int64)
    positions[order] = (first_step[level] + rank // width) * width + rank % width
    return positions


def _slots(key_pos: np.ndarray, slots: int) -> np.ndarray:
    """Each entry's flat slot `position * K + rank` (entries of one position
    in index order, which is their slot order: see `_Graph`)."""
    order = stable_argsort(key_pos)
    rank = _rank_in_run(key_pos[order])
    if rank.size and int(rank.max()) >= slots:
        raise ValueError(f"build_schedule_arrays: a position needs more than {slots} slots")
    entry_slot = np.empty(order.size, dtype=np.int64)
    entry_slot[order] = key_pos[order] * slots + rank
    return entry_slot


def _scatter(size: int, entry_slot: np.ndarray, values: np.ndarray, fill: int) -> np.ndarray:
    """int32 [size]: `values[e]` at entry e's slot, `fill` elsewhere."""
    table = np.full(size, fill, dtype=np.int32)
    table[entry_slot] = values
    return table


def _tables(plan: _Plan, shape: ScheduleShape) -> dict[str, np.ndarray]:
    """The level tables of one entry at `shape`."""
    arcs, graph = plan.arcs, plan.graph
    num_states, num_arcs, count = arcs.num_states, arcs.num_arcs, arcs.real.size
    steps, width = shape.steps, shape.width
    num_positions = steps * width
    node_pos = _positions(plan, shape)
    # Augmented arc ids of the entries: real arcs, the pseudo-arc, helpers.
    entry_arc = np.concatenate(
        [[num_arcs + 1], arcs.real, num_arcs + 2 + np.arange(graph.helpers)]
    ).astype(np.int64)
    src_pos = np.where(graph.src >= 0, node_pos[np.maximum(graph.src, 0)], num_positions + 1)
    dst_pos = node_pos[graph.dst]
    in_size = num_positions * shape.in_slots
    in_slot = _slots(dst_pos, shape.in_slots)
    in_arc = _scatter(in_size, in_slot, entry_arc, num_arcs)
    in_src_pos = _scatter(in_size, in_slot, src_pos, num_positions)
    outgoing = np.arange(entry_arc.size) != 0  # the pseudo-arc leaves nothing
    out_size = num_positions * shape.out_slots
    out_slot = _slots(src_pos[outgoing], shape.out_slots)
    out_arc = _scatter(out_size, out_slot, entry_arc[outgoing], num_arcs)
    out_dst_pos = _scatter(out_size, out_slot, dst_pos[outgoing], num_positions)
    arc_src_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_dst_pos = np.full(num_arcs, num_positions, dtype=np.int64)
    arc_src_pos[arcs.real] = src_pos[1 : count + 1]
    arc_dst_pos[arcs.real] = dst_pos[1 : count + 1]
    # Where each arc's local derivative sits in the flattened [N, C, K]
    # in-table; the dummy index just past it holds a zero.
    arc_grad_index = np.full(num_arcs, in_size, dtype=np.int64)
    arc_grad_index[arcs.real] = in_slot[1 : count + 1]
    helper_grad_index = np.full(shape.helpers, in_size, dtype=np.int64)
    helper_grad_index[: graph.helpers] = in_slot[count + 1 :]
    state_pos = node_pos[:num_states]
    pos_state = np.full(num_positions + 1, num_states, dtype=np.int64)
    pos_state[state_pos] = np.arange(num_states)
    pull_arc, pull_src, pull_end = _pull_order(arcs, state_pos, num_positions)
    grid = (steps, width)
    tables = dict(
        state_pos=state_pos,
        pos_state=pos_state[:num_positions].reshape(grid),
        in_arc=in_arc.reshape(*grid, shape.in_slots),
        in_src_pos=in_src_pos.reshape(*grid, shape.in_slots),
        out_arc=out_arc.reshape(*grid, shape.out_slots),
        out_dst_pos=out_dst_pos.reshape(*grid, shape.out_slots),
        arc_src_pos=arc_src_pos,
        arc_dst_pos=arc_dst_pos,
        arc_grad_index=arc_grad_index,
        helper_grad_index=helper_grad_index,
        pull_arc=pull_arc,
        pull_src=pull_src,
        pull_end=pull_end.reshape(grid),
    )
    return {name: np.asarray(value, np.int32) for name, value in tables.items()}


def _pull_order(
    arcs: _Arcs, state_pos: np.ndarray, num_positions: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The real arcs grouped by their destination state's position, for the
    CPU kernels (`kernels/scores.cc`), which read every table in order and
    need no fan trees.

    Returns:
      pull_arc, int [A]: the real arcs by (destination position, arc index),
        then the padding arcs; pull_src, int [A]: their source states (0 for
        padding); pull_end, int [P]: where each position's arcs end in
        `pull_arc` (exclusive; a position's arcs start at the previous end).
    """
    dst_pos = state_pos[arcs.dst]
    order = stable_argsort(dst_pos)
    is_padding = np.ones(arcs.num_arcs, bool)
    is_padding[arcs.real] = False
    padding = np.flatnonzero(is_padding)
    pull_arc = np.concatenate([arcs.real[order], padding])
    pull_src = np.concatenate([arcs.src[order], np.zeros(padding.size, np.int64)])
    pull_end = np.cumsum(np.bincount(dst_pos, minlength=num_positions)[:num_positions])
    return pull_arc, pull_src, pull_end


def empty_schedule_arrays(num_states: int, num_arcs: int) -> dict[str, np.ndarray]:
    """Zero-sized tables for a cyclic FSA (score ops refuse it before use)."""
    grid = np.zeros((0, 0), np.int32)
    slots = np.zeros((0, 0, 0), np.int32)
    return dict(
        state_pos=np.zeros(num_states, np.int32),
        pos_state=grid,
        in_arc=slots,
        in_src_pos=slots,
        out_arc=slots,
        out_dst_pos=slots,
        arc_src_pos=np.zeros(num_arcs, np.int32),
        arc_dst_pos=np.zeros(num_arcs, np.int32),
        arc_grad_index=np.zeros(num_arcs, np.int32),
        helper_grad_index=np.zeros(0, np.int32),
        pull_arc=np.zeros(num_arcs, np.int32),
        pull_src=np.zeros(num_arcs, np.int32),
        pull_end=grid,
    )
