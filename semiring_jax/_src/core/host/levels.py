"""Level assignment of an acyclic FSA's states, and cycle finding (numpy).

A level assignment puts every arc from a lower level to a strictly higher
one, so a recursion can compute a whole level in one step: the number of
sequential steps is the number of levels, the FSA's depth plus one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host.sorting import group_by, group_rows

__all__ = [
    "PathLengths",
    "balanced_levels",
    "find_cycle",
    "longest_path_levels",
    "path_lengths",
    "reachable_states",
    "with_height",
]


def _once(states: np.ndarray, stamp: np.ndarray) -> np.ndarray:
    """`states` with repeats dropped, without a sort: each keeps the
    occurrence whose index its entry of `stamp` (scratch, int [S]) ends up
    holding."""
    if states.size < 2:
        return states
    index = np.arange(states.size)
    stamp[states] = index
    return states[stamp[states] == index]


def longest_path_levels(num_states: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Length of the longest path into each state, or None if cyclic.

    Kahn's algorithm, one whole frontier per numpy step.

    Args:
      num_states: S.
      src, dst: int [A], the real arcs only.
    Returns:
      int64 [S] levels, or None when some state lies on a cycle.
    """
    order, offsets = group_by(num_states, src)
    out_dst = dst[order]
    in_degree = np.bincount(dst, minlength=num_states)
    levels = np.full(num_states, -1, dtype=np.int64)
    stamp = np.zeros(num_states, dtype=np.int64)
    frontier = np.flatnonzero(in_degree == 0)
    level = 0
    while frontier.size:
        levels[frontier] = level
        if frontier.size == 1:  # deep, narrow FSAs: skip the row arithmetic
            targets = out_dst[offsets[frontier[0]] : offsets[frontier[0] + 1]]
        else:
            targets = out_dst[group_rows(frontier, offsets)]
        np.subtract.at(in_degree, targets, 1)
        # A target reached by several arcs of this step is ready once.
        frontier = _once(targets[in_degree[targets] == 0], stamp)
        level += 1
    return None if (levels < 0).any() else levels


def reachable_states(
    num_states: int, sources: np.ndarray, src: np.ndarray, dst: np.ndarray
) -> np.ndarray:
    """The states reachable from `sources` along the arcs `src -> dst`.

    Breadth first, one whole frontier per numpy step, so the work is O(A)
    plus one step per BFS level.

    Args:
      num_states: S.
      sources: int [N], the states to start from (reachable by definition).
      src, dst: int [A], the real arcs only.
    Returns:
      bool [S].
    Examples:
      >>> import numpy as np
      >>> src, dst = np.array([0, 1, 3]), np.array([1, 2, 2])
      >>> reachable_states(4, np.array([0]), src, dst)
      array([ True,  True,  True, False])
    """
    order, offsets = group_by(num_states, src)
    next_state = dst[order]
    seen = np.zeros(num_states, dtype=bool)
    stamp = np.zeros(num_states, dtype=np.int64)
    frontier = np.unique(np.asarray(sources, dtype=np.int64))
    seen[frontier] = True
    while frontier.size:
        targets = next_state[group_rows(frontier, offsets)]
        frontier = _once(targets[~seen[targets]], stamp)
        seen[frontier] = True
    return seen


class PathLengths(NamedTuple):
    """Longest path into each state (`earliest`) and out of it (`height`).

    `height` only serves balancing (`balanced_levels`), which deep graphs
    skip, so it may be None until `with_height` finds it: one numpy pass
    per level saved on exactly the graphs where such passes cost most.
    """

    earliest: np.ndarray  # int64 [S]
    height: np.ndarray | None = None  # int64 [S]


def path_lengths(
    num_states: int, src: np.ndarray, dst: np.ndarray, *, height: bool = True
) -> PathLengths | None:
    """The longest-path lengths of every state (`height` only if asked for);
    None if the arcs have a cycle."""
    earliest = longest_path_levels(num_states, src, dst)
    if earliest is None:
        return None
    found = PathLengths(earliest)
    return with_height(found, src, dst) if height else found


def with_height(lengths: PathLengths, src: np.ndarray, dst: np.ndarray) -> PathLengths:
    """`lengths` with its `height` found, if it was not."""
    if lengths.height is not None:
        return lengths
    height = longest_path_levels(lengths.earliest.shape[0], dst, src)
    assert height is not None  # the reversed arcs of an acyclic graph are acyclic
    return lengths._replace(height=height)


def balanced_levels(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    placed: np.ndarray,
    lengths: PathLengths,
    num_levels: int | None = None,
) -> np.ndarray:
    """Levels of an acyclic FSA, as even in width as can be.

    By default there are as few levels as possible, the depth plus one, but
    a state with slack (its longest path in is shorter than the room left by
    its longest path out) may sit later, so that the widest level, which
    every level is padded to, shrinks. More levels give more slack still.
    List scheduling: level by level, the ready states that must go now do,
    and the others fill up to a width no assignment can beat, least slack
    first.

    Args:
      num_states: S.
      src, dst: int [A], the real arcs only (acyclic).
      placed: bool [S], the states to give levels (the others get -1).
      lengths: `path_lengths(num_states, src, dst)` (with its height).
      num_levels: at least the depth plus one; that by default.
    Returns:
      int64 [S] levels.
    """
    earliest, height = lengths
    assert height is not None  # see Args
    num_levels = max(num_levels or 0, int(earliest[placed].max()) + 1)
    latest = num_levels - 1 - height
    if np.array_equal(latest[placed], earliest[placed]):
        # No state has slack (a lattice of frames: every path to a state is
        # as long): each level is forced.
        return np.where(placed, earliest, -1)
    # No level assignment can be narrower than what must fit below each
    # level (states whose latest level is at most l) or above it (states
    # whose earliest level is at least l): aim at that width from the start.
    counts_latest = np.bincount(latest[placed], minlength=num_levels)
    counts_earliest = np.bincount(earliest[placed], minlength=num_levels)
    below = np.cumsum(counts_latest) / np.arange(1, num_levels + 1)
    above = np.cumsum(counts_earliest[::-1])[::-1] / np.arange(num_levels, 0, -1)
    bound = math.ceil(max(below.max(), above.max()))
    if counts_earliest.max() <= bound:
        # The longest-path levels already reach the bound (a chain, say):
        # nothing can be narrower, so skip the list-scheduling passes.
        return np.where(placed, earliest, -1)
    # The greedy pass with cap `bound` can leave slack states behind until
    # they all fall due together; a slightly higher cap can end narrower.
    best: tuple[int, np.ndarray] | None = None
    for capacity in sorted({math.ceil(bound * step) for step in (1.0, 1.2, 1.5)}):
        levels = _list_schedule(num_states, src, dst, placed, latest, num_levels, capacity)
        width = int(np.bincount(levels[placed]).max())
        if best is None or width < best[0]:
            best = width, levels
        if width <= bound:  # no assignment is narrower
            break
    assert best is not None  # the loop runs at least once
    return best[1]


def _list_schedule(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    placed: np.ndarray,
    latest: np.ndarray,
    num_levels: int,
    capacity: int,
) -> np.ndarray:
    """One list-scheduling pass: up to `capacity` states a level, least
    slack first, and every state by its `latest` level."""
    order, offsets = group_by(num_states, src)
    out_dst = dst[order]
    waiting = np.bincount(dst, minlength=num_states)  # unplaced predecessors
    levels = np.full(num_states, -1, dtype=np.int64)
    ready = np.flatnonzero(placed & (waiting == 0))
    for level in range(num_levels):
        urgent = latest[ready] <= level
        chosen, rest = ready[urgent], ready[~urgent]
        room = max(capacity - chosen.size, 0)
        if rest.size > room:
            by_slack = np.argsort(latest[rest], kind="stable")
            chosen, rest = np.concatenate([chosen, rest[by_slack[:room]]]), rest[by_slack[room:]]
        else:
            chosen, rest = np.concatenate([chosen, rest]), rest[:0]
        levels[chosen] = level
        targets = out_dst[group_rows(chosen, offsets)]
        np.subtract.at(waiting, targets, 1)
        targets = np.unique(targets)
        ready = np.concatenate([rest, targets[waiting[targets] == 0]])
    return levels


def find_cycle(num_states: int, src: np.ndarray, dst: np.ndarray) -> tuple[int, ...]:
    """A cycle of states (first state repeated at the end), or () if acyclic."""
    if longest_path_levels(num_states, src, dst) is not None:
        return ()
    # Strip states that cannot be on a cycle (no arc in or no arc out),
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
    next_state: dict[int, int] = {}
    for s, d in zip(src[arc_alive].tolist(), dst[arc_alive].tolist()):
        next_state.setdefault(s, d)
    state = int(np.flatnonzero(alive)[0])
    seen = []
    while state not in seen:
        seen.append(state)
        state = next_state[state]
    cycle = seen[seen.index(state) :]
    return tuple([*cycle, cycle[0]])
