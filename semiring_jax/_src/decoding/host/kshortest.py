"""The n best paths of an acyclic graph, exactly: a k-shortest-paths search.

The OpenFst approach (Mohri & Riley, "An efficient algorithm for the
n-best-strings problem", 2002) on a DAG: exact backward best scores
β(s) (best score from s to the end, final weight included), then a
best-first search over partial paths from the start with priority
score-so-far + β(state). β is exact, so the priority of a partial path is
the score of its best completion, and complete paths come off the heap
best first. A state is expanded at most n times: a later partial path into
it has n better ones there, and each of them with the same suffix makes a
better complete path, so it can be in no top n.

Ending at a final state is a move of its own (to a super-final state, the
final weight as its score), so a heap item is a path of moves. A popped
item pushes only its best move, and the next-best sibling of itself
(moves are sorted once, per state, by score to the end): every item pushes
at most two, and the heap holds one item per expanded partial path rather
than one per arc. Items keep a back-pointer to their parent, not their
moves, so nothing is copied along a path. The best move of a popped item
keeps its priority, so it is followed at once, past the heap, while no
item there is better: a path's best completion costs no heap operations.

Ties. Items of equal priority are ordered by their sequence of moves
compared lexicographically, arcs by index and "end here" (-1) before any
arc. Items in the heap are never prefixes of one another, so this order of
two partial paths is that of all their completions: complete paths come
off in the order (score descending, move sequence ascending). Comparing two
items walks their back-pointers to where they part, which only happens on
an exact tie of priorities.

Distinct strings (`unique`). A partial path is (state, output string so
far), epsilon (0) dropped; strings are interned in a trie of ids. Only the
first item popped for a (state, string) pair is expanded: a later one ends
in the same strings with lower scores, so it is never the best path of its
string. A state is expanded for at most n distinct strings: a path into it
under a new string v has n better ones there under other strings u_i, and
u_i x are n distinct strings that beat v x with any suffix x. The first
complete path of each string is its best path.

Cost: at most n expansions per state (with `unique` too: n distinct
strings per state), each pushing at most two items and each item popped
once, so O(n (S + A) log(n (S + A))) time and O(n (S + A)) memory in the
worst case; the search stops after the n-th complete path, so a lattice
whose best paths share long prefixes expands far fewer. Scores are summed
in float64, and the order is exact up to the rounding of those sums.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host.levels import longest_path_levels

__all__ = ["Compiled", "Moves", "Paths", "best_to_end", "k_shortest"]

_END = -1  # the move "stop at this (final) state"


class Paths(NamedTuple):
    """The n best paths, best first; entries past the found ones are empty."""

    arcs: np.ndarray  # int32 [n, slots]: arc indices in order, 0 past the length
    lengths: np.ndarray  # int32 [n]
    final_states: np.ndarray  # int32 [n]: the state each path stops in (0 if none)
    found: np.ndarray  # bool [n]
    scores: np.ndarray  # float64 [n]: -inf where not found

    @classmethod
    def empty(cls, n: int, slots: int) -> Paths:
        """n paths, none found yet."""
        return cls(
            np.zeros((n, slots), np.int32),
            np.zeros(n, np.int32),
            np.zeros(n, np.int32),
            np.zeros(n, bool),
            np.full(n, -np.inf),
        )


def best_to_end(
    num_states: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, final: np.ndarray
) -> np.ndarray:
    """β: the best score of a path from each state to a final state, final
    weight included (-inf if none), float64 [S].

    One numpy step per level of the longest-path levelling, last level
    first, so each arc's destination is done before its source.

    Args:
      num_states: S.
      src, dst: int [A], the usable arcs of an acyclic graph.
      weight: float64 [A].
      final: float64 [S], -inf where not final.
    """
    levels = longest_path_levels(num_states, src, dst)
    if levels is None:
        raise ValueError("best_to_end: the arcs have a cycle")
    beta = np.array(final, np.float64)
    if not src.size:
        return beta
    arc_level = levels[src]
    order = np.argsort(-arc_level, kind="stable")
    bounds = np.flatnonzero(np.diff(arc_level[order])) + 1
    for group in np.split(order, bounds):
        np.maximum.at(beta, src[group], weight[group] + beta[dst[group]])
    return beta


class _Node:
    """A partial path: its last move, and a back-pointer to the rest."""

    __slots__ = ("arc", "depth", "move", "parent", "score", "state", "text")

    def __init__(
        self, parent: _Node | None, move: int, arc: int, state: int, score: float, text: int
    ) -> None:
        self.parent = parent
        self.move = move  # its position in the sorted move list (-1: the root)
        self.arc = arc  # the arc index, or _END
        self.state = state  # the state the path is in (S: it has ended)
        self.score = score  # the score so far
        self.text = text  # the output string so far, a trie id (unique only)
        self.depth: int = 0 if parent is None else parent.depth + 1

    def __lt__(self, other: _Node) -> bool:
        # Reached only on equal priorities: the lexicographic order of the
        # move sequences, decided where the two paths part.
        mine, theirs = self, other
        while mine.depth > theirs.depth:
            mine = mine.parent  # type: ignore[assignment]
        while theirs.depth > mine.depth:
            theirs = theirs.parent  # type: ignore[assignment]
        if mine is theirs:  # one extends the other (never both in the heap)
            return self.depth < other.depth
        while mine.parent is not theirs.parent:
            mine, theirs = mine.parent, theirs.parent  # type: ignore[assignment]
        return mine.arc < theirs.arc


class Moves(NamedTuple):
    """Each state's moves, best first (CSR): arcs and "end here".

    Attributes:
      offsets: int64 [S + 2], state s's moves are [offsets[s], offsets[s + 1])
        (S: the super-final state, no moves).
      value: float64 [M], the best score to the end after the move: weight + β(dst).
      weight: float64 [M], the arc's weight, or the final weight.
      arc: int64 [M], the arc index, or -1 (end here).
      target: int64 [M], dst, or S.
      label: int64 [M], olabel, or 0.
    """

    offsets: np.ndarray
    value: np.ndarray
    weight: np.ndarray
    arc: np.ndarray
    target: np.ndarray
    label: np.ndarray


# A compiled search: (moves, S, β(0), n, unique, slots) -> the n best paths,
# on plain arrays (the kernel glue knows neither type): the fields of
# `Moves` in, those of `Paths` out.
Compiled = Callable[[tuple[np.ndarray, ...], int, float, int, bool, int], tuple[np.ndarray, ...]]


def _moves(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    olabel: np.ndarray,
    arc_index: np.ndarray,
    weight: np.ndarray,
    final: np.ndarray,
    beta: np.ndarray,
) -> Moves:
    """Moves that can still end: arcs into states with β > -inf, and the
    stop at each final state; sorted by (state, value descending, arc key)."""
    live = beta[dst] > -np.inf
    finals = np.flatnonzero(final > -np.inf)
    state = np.concatenate([src[live], finals])
    move_weight = np.concatenate([weight[live], final[finals]])
    value = np.concatenate([weight[live] + beta[dst[live]], final[finals]])
    arc = np.concatenate([arc_index[live], np.full(finals.size, _END)])
    target = np.concatenate([dst[live], np.full(finals.size, num_states)])
    label = np.concatenate([olabel[live], np.zeros(finals.size, np.int64)])
    order = np.lexsort((arc, -value, state))
    offsets = np.zeros(num_states + 2, np.int64)  # S: the super-final state, no moves
    np.cumsum(np.bincount(state, minlength=num_states + 1), out=offsets[1:])
    return Moves(offsets, value[order], move_weight[order], arc[order], target[order], label[order])


def k_shortest(
    num_states: int,
    src: np.ndarray,
    dst: np.ndarray,
    olabel: np.ndarray,
    arc_index: np.ndarray,
    weight: np.ndarray,
    final: np.ndarray,
    n: int,
    slots: int,
    *,
    unique: bool = False,
    compiled: Compiled | None = None,
) -> Paths:
    """The n best successful paths from state 0 (see the module docstring).

    Args:
      num_states: S.
      src, dst, olabel: int [A], the usable arcs (real, weight > -inf) of an
        acyclic graph; NaN and +inf weights are the caller's to refuse.
      arc_index: int [A], the index each arc has in the caller's arrays
        (the tie rule compares these).
      weight: float64 [A].
      final: float64 [S], -inf where not final.
      n: the number of paths, >= 1.
      slots: the width of `Paths.arcs`, at least the longest path's length.
      unique: distinct output strings (epsilon 0 dropped), each by its best
        path.
      compiled: a compiled twin of the search (the same paths, in the same
        order), or None for this module's.
    Returns:
      `Paths`, best first.
    """
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    weight, final = np.asarray(weight, np.float64), np.asarray(final, np.float64)
    beta = best_to_end(num_states, src, dst, weight, final)
    moves = _moves(
        num_states,
        src,
        dst,
        np.asarray(olabel, np.int64),
        np.asarray(arc_index, np.int64),
        weight,
        final,
        beta,
    )
    best = float(beta[0]) if num_states else -np.inf
    if compiled is not None and best > -np.inf:
        return Paths(*compiled(moves, num_states, best, n, unique, slots))
    ends = _search(moves, num_states, best, n, unique)
    paths = Paths.empty(n, slots)
    for j, end in enumerate(ends):
        arcs = []
        node = end.parent
        while node is not None and node.parent is not None:
            arcs.append(node.arc)
            node = node.parent
        paths.final_states[j] = 0 if end.parent is None else end.parent.state
        paths.arcs[j, : len(arcs)] = arcs[::-1]
        paths.lengths[j] = len(arcs)
        paths.found[j] = True
        paths.scores[j] = end.score
    return paths


def _search(moves: Moves, num_states: int, best: float, n: int, unique: bool) -> list[_Node]:
    """The best-first search: the end nodes of the n best paths (strings)."""
    if best == -np.inf:
        return []
    # Python lists: their items read faster than numpy's, one at a time.
    offsets, value, target, label = (
        array.tolist() for array in (moves.offsets, moves.value, moves.target, moves.label)
    )
    move_weight, move_arc = moves.weight.tolist(), moves.arc.tolist()
    expanded = [0] * (num_states + 1)  # S: the super-final state
    seen: set[tuple[int, int]] = set()  # (state, string) pairs expanded (unique)
    trie: dict[tuple[int, int], int] = {}  # (string, label) -> string; 0 is ""

    def text_after(text: int, move: int) -> int:
        if not unique or label[move] == 0:
            return text
        return trie.get((text, label[move]), -1)  # -1: a string no path has had yet

    def closed(state: int, text: int) -> bool:
        return expanded[state] >= n or (unique and (state, text) in seen)

    def first_open(parent: _Node, move: int) -> tuple[float, _Node] | None:
        """(priority, item) of `parent`'s first move from `move` on into an
        open (state, string); moves into a closed one are skipped (it stays
        closed)."""
        stop = offsets[parent.state + 1]
        while move < stop and closed(target[move], text_after(parent.text, move)):
            move += 1
        if move == stop:
            return None
        text = parent.text
        if unique and label[move] != 0:
            text = trie.setdefault((text, label[move]), len(trie) + 1)
        score = parent.score + move_weight[move]
        node = _Node(parent, move, move_arc[move], target[move], score, text)
        # The priority is the score of the best completion, score + β(target).
        return parent.score + value[move], node

    def push(heap: list[tuple[float, _Node]], parent: _Node, move: int) -> None:
        found = first_open(parent, move)
        if found is not None:
            heapq.heappush(heap, (-found[0], found[1]))

    heap: list[tuple[float, _Node]] = [(-best, _Node(None, -1, _END, 0, 0.0, 0))]
    ends: list[_Node] = []
    while heap and len(ends) < n:
        _, node = heapq.heappop(heap)
        while True:
            if node.parent is not None:
                push(heap, node.parent, node.move + 1)  # the next sibling
            if closed(node.state, node.text):
                break
            expanded[node.state] += 1
            if unique:
                seen.add((node.state, node.text))
            if node.state == num_states:
                ends.append(node)
                break
            child = first_open(node, offsets[node.state])
            if child is None:
                break
            # The best move keeps the best completion: unless an item in the
            # heap is now better, the child is what the heap would give
            # next (on a tie too: every item there parts from this path
            # after a larger move), so go on to it without the heap.
            if heap and child[0] < -heap[0][0]:
                heapq.heappush(heap, (-child[0], child[1]))
                break
            node = child[1]
    return ends
