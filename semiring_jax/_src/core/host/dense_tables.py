"""The tables of dense intersection: arcs in rows, and trees over rows (numpy only).

Dense intersection steps through frames, not levels, so it needs no level
schedule: one frame reduces every state's incoming arcs at once (the
forward pass), or its outgoing ones (the backward pass). The tables work
for cyclic FSAs too: every arc consumes a frame, so a cycle is just a path
that takes several frames. Each direction (incoming arcs grouped by
destination, outgoing ones by source) gets:

- *rows* of K slots, int32 [R, K], R = S + extra rows: a state's arcs fill
  its rows in arc order; row s < S is state s's first row (all padding for
  a state without arcs) and rows S, S + 1, ... hold the further rows of the
  states with more than K arcs (*hubs*), hub after hub in state order. ⊕
  over a row's slots gives one value per row.
- a *tree* per hub, of fan-in F, over its m row values: they are the first
  leaves of an aligned block of F^d leaves (d the least with F^d >= m).
  Blocks are laid out largest first, so that each starts at a multiple of
  its size: level j of the tree is then level j - 1 reshaped to [-1, F] and
  reduced, with no index table above the leaves, and the hub's value is
  node offset / F^d of level d. Nodes that straddle two blocks mix
  unrelated hubs and are never read. `leaf` int32 [G, F^(L-1), F] names
  each leaf's row (R for padding; [0, 1, 1] without hubs); `top` int32 [S]
  each hub's node in levels 1..L laid end to end (their total size for the
  other states).

Every step is a gather and a reduction along one axis, so any semiring's
`sum(axis=...)` serves, and a reduction that keeps the first maximum keeps
TROPICAL's tie rule (the lowest-numbered best arc), since slots, rows and
leaves are all in arc order.

K and F are chosen per direction to minimise the padded work of a frame
(`_cost`). K = 1 with F = 2 is always a candidate, which bounds what is
chosen: at K = 1 the rows hold at most S + A slots (A real arcs), and a
hub's block is under twice its degree, so the leaves, rounded up to a
multiple of the largest block, are fewer than 4 A, and the nodes above them
as many. So the rows and leaves of one direction hold at most
2 S + 25 A + 300 (log2 A + 3) entries, and a frame's work is as bounded;
never S times the largest degree. (Both directions together: a star of
10^6 arcs takes 4 A entries, a lexicon-like graph 2.4 A, plus 2 S for the
`top` tables.) A batch shares one K per direction, the largest of its
entries' (an entry's rows then take up to that K over its own K times the
slots), and one F, of the entries' F (and 2) the one that pads least
(`common_dense_shape`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host.sorting import stable_argsort

__all__ = [
    "DenseShape",
    "arcs_by_state",
    "build_dense_tables",
    "common_dense_shape",
    "dense_shape",
]


def arcs_by_state(
    num_states: int, key: np.ndarray, arc_mask: np.ndarray, width: int = 1
) -> np.ndarray:
    """int32 [S, K]: row s lists the real arcs with `key == s`, in arc order.

    Args:
      num_states: S.
      key: int [A], the state each arc belongs to (dst for incoming arcs,
        src for outgoing ones).
      arc_mask: bool [A]; padding arcs are left out.
      width: the least K (for stacking entries to one width).
    Returns:
      The table, padded with A (one past the last arc); K is the largest
      number of arcs of one state, at least `width` and at least 1.

    Examples:
      >>> arcs_by_state(3, np.array([1, 2, 1]), np.array([True, True, True]))
      array([[3, 3],
             [0, 2],
             [1, 3]], dtype=int32)
    """
    num_arcs = key.shape[0]
    real = np.flatnonzero(arc_mask)
    order = real[stable_argsort(key[real])]
    counts = np.bincount(key[order], minlength=num_states)
    starts = np.cumsum(counts) - counts
    rank = np.arange(order.size) - starts[key[order]]
    slots = max(int(counts.max(initial=0)), width, 1)
    table = np.full((num_states, slots), num_arcs, dtype=np.int32)
    table[key[order], rank] = order
    return table


class DenseShape(NamedTuple):
    """Padded sizes of the dense tables (`build_dense_tables`).

    For incoming (`in_`) and outgoing (`out_`) arcs: `slots` K per row;
    `fan` F, the trees' fan-in (1 without trees); `extra_rows`, the rows
    beyond the S first ones; `leaves`, the trees' leaves before rounding up
    to whole groups of F^L; `levels` L of the trees (0: no state has more
    than K arcs); `hub_arcs`, the arcs of the states with more than K arcs
    (it bounds the leaves at a wider K or F, for `common_dense_shape`).
    """

    in_slots: int
    in_fan: int
    in_extra_rows: int
    in_leaves: int
    in_levels: int
    in_hub_arcs: int
    out_slots: int
    out_fan: int
    out_extra_rows: int
    out_leaves: int
    out_levels: int
    out_hub_arcs: int


class _Side(NamedTuple):
    """The sizes of one direction (the six fields of a `DenseShape` half)."""

    slots: int
    fan: int
    extra_rows: int
    leaves: int
    levels: int
    hub_arcs: int


def _halves(shape: DenseShape) -> tuple[_Side, _Side]:
    return _Side(*shape[:6]), _Side(*shape[6:])


def _depths(rows: np.ndarray, fan: int) -> np.ndarray:
    """int64: the least d with fan ** d >= rows, per entry."""
    depth = np.zeros(rows.shape, np.int64)
    reach = np.ones(rows.shape, np.int64)
    while (short := reach < rows).any():
        depth += short
        reach = np.where(short, reach * fan, reach)
    return depth


class _Degrees(NamedTuple):
    """A direction's states counted by degree, and their rows at some K."""

    degree: np.ndarray  # int64 [D], the distinct degrees
    states: np.ndarray  # int64 [D], how many states have each
    rows: np.ndarray  # int64 [D], rows of K slots that each degree takes


def _at_slots(degrees: np.ndarray, states: np.ndarray, slots: int) -> _Degrees:
    return _Degrees(degrees, states, np.maximum(-(-degrees // slots), 1))


def _sizes(found: _Degrees, slots: int, fan: int) -> _Side:
    """The sizes at `slots` K and `fan` F (F unused without hubs: 1)."""
    hub = found.rows > 1
    extra = int(((found.rows - 1) * found.states).sum())
    if not hub.any():
        return _Side(slots, 1, extra, 0, 0, 0)
    depth = _depths(found.rows[hub], fan)
    return _Side(
        slots,
        fan,
        extra,
        int((fan**depth * found.states[hub]).sum()),
        int(depth.max()),
        int((found.degree[hub] * found.states[hub]).sum()),
    )


def _padded_leaves(side: _Side) -> int:
    """G * F^L: the leaves rounded up to whole groups of the largest block."""
    if side.levels == 0 or side.fan < 2:
        return 0
    block = side.fan**side.levels
    return -(-side.leaves // block) * block


# A tree level costs a few kernel launches per frame, worth about this many
# slots of gather-and-reduce work on a CPU.
_LEVEL_OVERHEAD = 300


def _cost(side: _Side, num_states: int) -> int:
    """Padded work of one direction in one frame, in slots: the rows; with
    hubs, the leaves gathered and reduced, the nodes above them (a LOG node
    costs a log and a renormalisation), each state's pick of its value, and
    the launches of each level."""
    cost = (num_states + side.extra_rows) * side.slots
    if side.levels:
        leaves = _padded_leaves(side)
        nodes = sum(leaves // side.fan**level for level in range(1, side.levels + 1))
        cost += 2 * leaves + 4 * nodes + num_states + _LEVEL_OVERHEAD * (side.levels + 2)
    return cost


_FANS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _best_at(found: _Degrees, slots: int, num_states: int, fan: int | None) -> _Side:
    """The sizes at `slots` K and the F (or `fan`) that minimises `_cost`:
    a few round fan-ins and those that fit the largest hub's rows in 1 to
    6 levels exactly (the least F on ties)."""
    if fan is not None:
        return _sizes(found, slots, fan)
    most = int(found.rows.max(initial=1))
    if most == 1:
        return _sizes(found, slots, 1)
    exact = {math.ceil(most ** (1 / levels) - 1e-9) for levels in range(1, 7)}
    fans = sorted({f for f in (*_FANS, *exact) if 2 <= f <= most} | {2})
    return min(_sizes_at_fans(found, slots, fans), key=lambda side: _cost(side, num_states))


def _sizes_at_fans(found: _Degrees, slots: int, fans: Sequence[int]) -> list[_Side]:
    """`_sizes` at each of `fans` (some state has more than K arcs), the
    trees' depths found for all of them at once: the search tries dozens
    of (K, F) pairs, and one numpy pass per pair cost more than the tables."""
    hub = found.rows > 1
    rows, states = found.rows[hub], found.states[hub]
    extra = int(((found.rows - 1) * found.states).sum())
    hub_arcs = int((found.degree[hub] * states).sum())
    fan = np.array(fans, np.int64)[:, None]
    # The least d with F^d >= rows, from logarithms, then made exact.
    depth = np.ceil(np.log(rows) / np.log(fan)).astype(np.int64)
    depth += fan**depth < rows
    depth -= (depth > 0) & (fan ** np.maximum(depth - 1, 0) >= rows)
    reach = fan**depth
    leaves, levels = (reach * states).sum(axis=1), depth.max(axis=1)
    return [
        _Side(slots, f, extra, int(leaf), int(level), hub_arcs)
        for f, leaf, level in zip(fans, leaves, levels)
    ]


def _lower_bound(found: _Degrees, slots: int, num_states: int) -> int:
    """A bound from below on `_cost` at `slots` K, whatever the F."""
    extra = int(((found.rows - 1) * found.states).sum())
    hubs = int(found.states[found.rows > 1].sum())
    return (num_states + extra) * slots + 2 * (extra + hubs)


def _best_side(
    num_states: int,
    key: np.ndarray,
    arc_mask: np.ndarray,
    slots: int | None,
    fan: int | None,
) -> _Side:
    """The sizes at `slots` K and `fan` F, each (if None) the one that
    minimises `_cost` (the least K on ties)."""
    degree = np.bincount(key[arc_mask], minlength=num_states)
    degrees, states = np.unique(degree, return_counts=True)
    if slots is not None:
        candidates = [slots]
    else:
        most = max(int(degrees.max(initial=0)), 1)
        candidates = sorted(
            set(range(1, min(most, 32) + 1)) | {most} | {2**k for k in range(5, most.bit_length())}
        )
    # A K's rows, (S + E) K for E extra rows, and its leaves, at least one
    # per hub row (E + H for H hubs) and read twice, bound its cost from
    # below: try the K of the cheapest bound first, and stop at a bound
    # above the best cost (most K then need no fan search at all).
    found = [_at_slots(degrees, states, k) for k in candidates]
    bounds = [_lower_bound(f, k, num_states) for f, k in zip(found, candidates)]
    best: tuple[int, int, _Side] | None = None
    for i in sorted(range(len(candidates)), key=lambda i: (bounds[i], candidates[i])):
        if best is not None and bounds[i] > best[0]:
            break
        side = _best_at(found[i], candidates[i], num_states, fan)
        best = min(
            best or (_cost(side, num_states), side.slots, side),
            (_cost(side, num_states), side.slots, side),
        )
    assert best is not None  # there is at least one candidate
    return best[2]


def dense_shape(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    arc_mask: np.ndarray,
    *,
    slots: tuple[int, int] | None = None,
    fans: tuple[int, int] | None = None,
) -> DenseShape:
    """The natural (cheapest) dense-table sizes of one FSA; with `slots`
    or `fans`, those at (incoming, outgoing) K or F instead of the cheapest.

    Examples:
      >>> star = dense_shape(5, np.zeros(4, int), np.arange(1, 5), np.ones(4, bool))
      >>> star.in_slots, star.in_levels, star.out_slots, star.out_levels
      (1, 0, 4, 0)
      >>> dense_shape(5, np.zeros(4, int), np.arange(1, 5), np.ones(4, bool), slots=(1, 1))[6:]
      (1, 4, 3, 4, 1, 4)
    """
    arc_mask = np.asarray(arc_mask, bool)
    for name, given in (("slots", slots), ("fans", fans)):
        if given is not None and min(given) < (1 if name == "slots" else 2):
            raise ValueError(
                f"dense_shape: {name} must be at least {1 if name == 'slots' else 2}, got {given}"
            )
    in_slots, out_slots = (None, None) if slots is None else slots
    in_fan, out_fan = (None, None) if fans is None else fans
    incoming = _best_side(num_states, np.asarray(dst), arc_mask, in_slots, in_fan)
    outgoing = _best_side(num_states, np.asarray(src), arc_mask, out_slots, out_fan)
    return DenseShape(*incoming, *outgoing)


def _depth(rows: int, fan: int) -> int:
    """The least d with fan ** d >= rows."""
    depth, reach = 0, 1
    while reach < rows:
        depth, reach = depth + 1, reach * fan
    return depth


def _fit(sides: Sequence[_Side], slots: int, fan: int) -> _Side:
    """Sizes that fit every side at `slots` K (their largest) and `fan` F.

    A side at a smaller K needs no more extra rows at K, and its hubs no
    more rows than F_e^L_e (it fits them in L_e levels of F_e), so as many
    levels as that needs at F; at another K or F its leaves are fewer than
    F / K times its hub arcs: a hub of m >= 2 rows of K has a block of
    F^d <= F (m - 1) < F / K times its degree leaves.
    """
    leaves, levels = [0], [0]
    for side in sides:
        if side.levels == 0:  # no hubs, nor any at a larger K
            continue
        if (side.slots, side.fan) == (slots, fan):
            leaves.append(side.leaves)
            levels.append(side.levels)
        else:
            leaves.append(-(-fan * side.hub_arcs // slots))
            levels.append(_depth(side.fan**side.levels, fan))
    return _Side(
        slots,
        fan,
        max(side.extra_rows for side in sides),
        max(leaves),
        max(levels),
        max(side.hub_arcs for side in sides),
    )


def _common_side(sides: Sequence[_Side]) -> _Side:
    """Sizes that fit every side: the largest K, and of the entries' F (and
    2) the one with the least padded work (`_fit`). One K for all keeps
    each entry's rows exact; the largest F would not keep its leaves so:
    a star's single hub fits a tree of one level of 10^6 leaves, which
    would give every hub of another entry a block of 10^6."""
    slots = max(side.slots for side in sides)
    fans = {side.fan for side in sides if side.levels}
    if not fans:
        return _fit(sides, slots, 1)
    fits = [_fit(sides, slots, fan) for fan in sorted(fans | {2})]
    return min(fits, key=lambda side: _cost(side, 0))


def common_dense_shape(shapes: Sequence[DenseShape]) -> DenseShape:
    """Sizes that fit every one of `shapes` (a batch's entries): one K per
    direction, the largest, and one F (see `_common_side`).

    Examples:
      >>> wide = dense_shape(2, np.zeros(3, int), np.ones(3, int), np.ones(3, bool))
      >>> star = dense_shape(5, np.zeros(4, int), np.arange(1, 5), np.ones(4, bool))
      >>> common_dense_shape([wide, star]).in_slots
      3
    """
    halves = [_halves(shape) for shape in shapes]
    incoming = _common_side([half[0] for half in halves])
    outgoing = _common_side([half[1] for half in halves])
    return DenseShape(*incoming, *outgoing)


def _side_tables(
    num_states: int, key: np.ndarray, arc_mask: np.ndarray, side: _Side, name: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows [S + extra, K], leaf [G, F^(L-1), F], top [S]) of one direction
    (see the module docstring); a ValueError if `side` is too small."""
    num_arcs = key.shape[0]
    slots, fan = side.slots, side.fan
    real = np.flatnonzero(arc_mask)
    order = real[stable_argsort(key[real])]
    keys = key[order]
    counts = np.bincount(keys, minlength=num_states)
    rank = np.arange(order.size) - (np.cumsum(counts) - counts)[keys]
    rows = np.maximum(-(-counts // slots), 1)
    more = rows - 1
    extra_start = num_states + np.cumsum(more) - more  # a hub's second row
    hubs = np.flatnonzero(more)
    if hubs.size and fan < 2:
        raise ValueError(
            f"build_dense_tables: the {name} arcs need trees at slots={slots}, "
            f"but the shape has fan={fan}"
        )
    depth = _depths(rows[hubs], max(fan, 2))
    need = dict(
        extra_rows=int(more.sum()), leaves=int((fan**depth).sum()), levels=int(depth.max(initial=0))
    )
    for field, size in need.items():
        if size > getattr(side, field):
            raise ValueError(
                f"build_dense_tables: the {name} arcs need {field}={size} at "
                f"slots={slots}, fan={fan}, but the shape has {getattr(side, field)}"
            )
    num_rows = num_states + side.extra_rows
    row_in_state = rank // slots
    row = np.where(row_in_state == 0, keys, extra_start[keys] + row_in_state - 1)
    flat = np.full(num_rows * slots, num_arcs, dtype=np.int32)
    flat[row * slots + rank % slots] = order  # a flat scatter: twice as fast
    table = flat.reshape(num_rows, slots)
    # Hubs largest block first (then by state), so that blocks stay aligned.
    by_block = np.argsort(-depth, kind="stable")
    hubs, depth = hubs[by_block], depth[by_block]
    block = fan**depth
    offset = np.cumsum(block) - block
    width = fan**side.levels
    groups = _padded_leaves(side) // width
    leaf = np.full(groups * width, num_rows, dtype=np.int32)
    member = np.repeat(np.arange(hubs.size), rows[hubs])
    first = np.cumsum(rows[hubs]) - rows[hubs]  # each hub's first entry in `member`
    index = np.arange(member.size) - np.repeat(first, rows[hubs])
    state = hubs[member]
    leaf[offset[member] + index] = np.where(index == 0, state, extra_start[state] + index - 1)
    level_sizes = [groups * width // fan**level for level in range(1, side.levels + 1)]
    level_start = np.concatenate([[0], np.cumsum(level_sizes, dtype=np.int64)])
    top = np.full(num_states, level_start[-1], dtype=np.int32)
    top[hubs] = level_start[depth - 1] + offset // block
    if groups == 0:
        return table, leaf.reshape(0, 1, 1), top
    return table, leaf.reshape(groups, width // fan, fan), top


def build_dense_tables(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    arc_mask: np.ndarray,
    shape: DenseShape | None = None,
) -> dict[str, np.ndarray]:
    """The `Schedule` fields that dense intersection reads, padded to
    `shape` (natural if None); built for cyclic FSAs too.

    Returns:
      int32 tables (see the module docstring): `dense_in_arc` [S + extra, K]
      (arc A for padding), `dense_in_leaf` [G, F^(L-1), F], `dense_in_top` [S]; and
      for outgoing arcs `dense_out_slot` [S + extra', K'], each one's slot
      in `dense_in_arc` flattened (its size for padding), `dense_out_leaf`
      and `dense_out_top`.
    Raises:
      ValueError: if the FSA does not fit `shape`, naming the size.

    Examples:
      >>> tables = build_dense_tables(3, np.array([0, 0, 1]), np.array([1, 2, 2]),
      ...                             np.ones(3, bool))
      >>> tables["dense_in_arc"]  # state 2's arcs 1 and 2 share a row
      array([[3, 3],
             [0, 3],
             [1, 2]], dtype=int32)
      >>> tables["dense_out_slot"]  # arcs 0 and 1 leave state 0
      array([[2, 4],
             [5, 6],
             [6, 6]], dtype=int32)
    """
    src, dst = np.asarray(src), np.asarray(dst)
    arc_mask = np.asarray(arc_mask, bool)
    if shape is None:
        shape = dense_shape(num_states, src, dst, arc_mask)
    incoming, outgoing = _halves(shape)
    in_arc, in_leaf, in_top = _side_tables(num_states, dst, arc_mask, incoming, "incoming")
    out_arc, out_leaf, out_top = _side_tables(num_states, src, arc_mask, outgoing, "outgoing")
    # Each arc's slot among the incoming rows, so that the backward pass
    # reads the weights and emissions that the forward pass set out.
    flat = in_arc.reshape(-1)
    real = np.flatnonzero(flat < src.shape[0])
    slot_of_arc = np.full(src.shape[0] + 1, flat.size, dtype=np.int32)
    slot_of_arc[flat[real]] = real
    return dict(
        dense_in_arc=in_arc,
        dense_in_leaf=in_leaf,
        dense_in_top=in_top,
        dense_out_slot=slot_of_arc[out_arc],
        dense_out_leaf=out_leaf,
        dense_out_top=out_top,
    )
