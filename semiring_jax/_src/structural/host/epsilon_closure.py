"""Structure of epsilon removal (numpy only).

An epsilon arc has label 0 on both sides. For each state p, its epsilon
closure R(p) holds the states q reachable from p by epsilon arcs alone
(p included), at weight d(p, q) = ⊕ over those epsilon paths. The result
keeps the states; each non-epsilon arc q -> r gives an arc p -> r for every
p with q in R(p), weighted d(p, q) ⊗ w; final(p) = ⊕_q d(p, q) ⊗ final(q).

The weights d(p, q) are computed in JAX as the forward scores of a *pair
graph*: a start state whose arcs (weight one) reach each pair (p, p), and
for each pair (p, q') and epsilon arc q' -> q an arc into pair (p, q) with
that arc's weight. Its structure, and everything else here, is worked out
once on the host. The epsilon subgraph must be acyclic (else d would need
an infinite sum; a ValueError names a state on the cycle).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host import dense_tables
from semiring_jax._src.core.host import levels as levels_lib
from semiring_jax._src.core.host.sorting import group_by, group_rows, ranges, stable_argsort
from semiring_jax._src.structural.host.structure import Parts

__all__ = ["EpsilonRemoval", "epsilon_removal"]


class EpsilonRemoval(NamedTuple):
    """Host tables for one FSA's epsilon removal.

    Attributes:
      pair_src, pair_dst: int [P'], arcs of the pair graph: states 0 to
        N - 1 are a tree of weight-one arcs from its start (state 0) to the
        pairs (p, p); pair i is state N + i.
      pair_arc: int [P'], the input arc whose weight each pair arc carries,
        -1 for the tree's arcs (weight one).
      num_pairs: P.
      num_tree: N.
      pair_level: int [N + P], a level for each pair-graph state such that
        every pair-graph arc goes up.
      arc_pair, arc_input: int [A'], for each result arc the pair (p, q)
        whose weight d it takes and the non-epsilon input arc q -> r.
      src, dst, ilabel, olabel: int [A'], the result arcs.
      final_pairs: int [S, R], for each state p the pairs (p, q) with q
        final, padded with P (a pair of weight zero); final_states [S, R]
        the matching q (0 on padding).
      useful: bool [S], the states on a successful path of the result.
    """

    pair_src: np.ndarray
    pair_dst: np.ndarray
    pair_arc: np.ndarray
    num_pairs: int
    num_tree: int
    pair_level: np.ndarray
    arc_pair: np.ndarray
    arc_input: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    ilabel: np.ndarray
    olabel: np.ndarray
    final_pairs: np.ndarray
    final_states: np.ndarray
    useful: np.ndarray


# Fan-out of the tree from the pair graph's start to the pairs (p, p). One
# start arc per state would make the start a hub whose S arcs pad the level
# schedule's every row (K slots, or many combine parts).
_FAN_OUT = 16


def _start_tree(num_leaves: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """A tree of at most `_FAN_OUT` children per node from node 0 to
    `num_leaves` leaves: (N internal nodes, src [E], dst [E], the depth of
    each internal node [N]); leaf j is node N + j, at depth len(...) of the
    last. Child i of a layer hangs from node i // _FAN_OUT above."""
    sizes = [num_leaves]
    while sizes[-1] > _FAN_OUT:
        sizes.append(-(-sizes[-1] // _FAN_OUT))
    sizes.append(1)
    sizes.reverse()  # root, internal layers, leaves
    first = np.cumsum([0, *sizes])  # first node of each layer
    src = [first[k - 1] + np.arange(sizes[k]) // _FAN_OUT for k in range(1, len(sizes))]
    dst = [first[k] + np.arange(sizes[k]) for k in range(1, len(sizes))]
    depth = np.repeat(np.arange(len(sizes) - 1), sizes[:-1])
    return int(first[-2]), np.concatenate(src), np.concatenate(dst), depth


class _Pairs(NamedTuple):
    """The epsilon closure as pairs, and the pair graph's arcs."""

    p: np.ndarray  # int64 [P]; pairs (p, q) grouped by q, in eps-level order
    q: np.ndarray  # int64 [P]
    arc_from: np.ndarray  # int64 [P']: pair index of (p, q) for each (pair, eps arc) step
    arc_to: np.ndarray  # int64 [P']: pair index of (p, r)
    arc: np.ndarray  # int64 [P']: the epsilon arc q -> r


def _closure_pairs(
    num_states: int,
    eps_src: np.ndarray,
    eps_dst: np.ndarray,
    eps_arc: np.ndarray,
    eps_level: np.ndarray,
) -> _Pairs:
    """Every pair (p, q) with q reachable from p by epsilon arcs.

    States are taken one epsilon level at a time (the longest epsilon path
    into them), so when a state r is reached, every pair (p, q) of every q
    with an epsilon arc into r is already known: the pairs (., r) are those
    pairs' p, plus r itself, made in one vectorised step per level. Each
    level's pairs are stored grouped by their q, so a q's p's are one
    contiguous range (`start[q]`, `count[q]`).
    """
    start = np.zeros(num_states, np.int64)
    count = np.zeros(num_states, np.int64)
    arcs_by_level, level_offsets = group_by(int(eps_level.max(initial=0)) + 1, eps_level[eps_dst])
    states_by_level, state_offsets = group_by(int(eps_level.max(initial=0)) + 1, eps_level)
    pair_p: list[np.ndarray] = []
    pair_q: list[np.ndarray] = []
    steps_from: list[np.ndarray] = []
    steps_to: list[np.ndarray] = []
    steps_arc: list[np.ndarray] = []
    total = 0
    for level in range(level_offsets.size - 1):
        arcs = arcs_by_level[level_offsets[level] : level_offsets[level + 1]]
        states = states_by_level[state_offsets[level] : state_offsets[level + 1]]
        # One step per (pair (p, q), epsilon arc q -> r): pair index, p, r.
        q = eps_src[arcs]
        step_from = ranges(start[q], count[q])
        step_arc = np.repeat(arcs, count[q])
        step_p = np.concatenate(pair_p)[step_from] if step_from.size else step_from
        step_r = eps_dst[step_arc]
        # The new pairs (p, r), r at this level: those steps' and (r, r).
        keys = np.concatenate([step_r * num_states + step_p, states * num_states + states])
        unique, inverse = np.unique(keys, return_inverse=True)
        new_q, new_p = np.divmod(unique, num_states)
        first = np.searchsorted(new_q, states)
        start[states] = total + first
        count[states] = np.searchsorted(new_q, states, side="right") - first
        steps_from.append(step_from)
        steps_to.append(total + inverse[: step_from.size])
        steps_arc.append(eps_arc[step_arc])
        pair_p.append(new_p)
        pair_q.append(new_q)
        total += unique.size
    return _Pairs(
        np.concatenate(pair_p),
        np.concatenate(pair_q),
        np.concatenate(steps_from),
        np.concatenate(steps_to),
        np.concatenate(steps_arc),
    )


def epsilon_removal(parts: Parts) -> tuple[EpsilonRemoval | None, tuple[int, ...]]:
    """The tables, or (None, cycle) if the epsilon arcs form a cycle."""
    num_states = parts.num_states
    is_epsilon = (parts.ilabel == 0) & (parts.olabel == 0)
    eps = np.flatnonzero(is_epsilon)
    eps_src, eps_dst = parts.src[eps].astype(np.int64), parts.dst[eps].astype(np.int64)
    eps_level = levels_lib.longest_path_levels(num_states, eps_src, eps_dst)
    if eps_level is None:
        return None, levels_lib.find_cycle(num_states, eps_src, eps_dst)
    pairs = _closure_pairs(num_states, eps_src, eps_dst, eps, eps_level)
    num_pairs = pairs.p.size
    # The pair graph: a tree of weight-one arcs from its start (state 0) to
    # the pairs (p, p); pair i is state num_tree + i.
    diagonal = np.flatnonzero(pairs.p == pairs.q)
    num_tree, tree_src, tree_dst, tree_depth = _start_tree(diagonal.size)
    # Levels that every pair-graph arc goes up: the tree's depths, then for a
    # pair (p, q) the leaves' depth plus q's epsilon level.
    leaf_depth = int(tree_depth.max()) + 1
    pair_level = np.concatenate([tree_depth, leaf_depth + eps_level[pairs.q]])
    leaf = tree_dst >= num_tree
    tree_dst[leaf] = num_tree + diagonal[tree_dst[leaf] - num_tree]
    pair_src = np.concatenate([tree_src, pairs.arc_from + num_tree])
    pair_dst = np.concatenate([tree_dst, pairs.arc_to + num_tree])
    pair_arc = np.concatenate([np.full(tree_src.size, -1, np.int64), pairs.arc])
    # Result arcs: every non-epsilon arc q -> r, once per pair (p, q),
    # ordered by p, then pair, then arc.
    real = np.flatnonzero(~is_epsilon)
    real_order, real_offsets = group_by(num_states, parts.src[real])
    real_count = real_offsets[1:] - real_offsets[:-1]
    # The pairs are sorted by p (stably), not the arcs: fewer to sort.
    by_p = stable_argsort(pairs.p)
    arc_pair = np.repeat(by_p, real_count[pairs.q[by_p]])
    arc_input = real[real_order[group_rows(pairs.q[by_p], real_offsets)]]
    # Final weights: ⊕ over the pairs (p, q) with q final.
    final = np.flatnonzero(parts.is_final[pairs.q])
    owners = pairs.p[final]
    by_owner = dense_tables.arcs_by_state(num_states, owners, np.ones(owners.size, bool))
    final_pairs = np.append(final, num_pairs)[by_owner]
    final_states = np.append(pairs.q[final], 0)[by_owner]
    tables = EpsilonRemoval(
        pair_src,
        pair_dst,
        pair_arc,
        num_pairs,
        num_tree,
        pair_level,
        arc_pair,
        arc_input,
        pairs.p[arc_pair],
        parts.dst[arc_input],
        parts.ilabel[arc_input],
        parts.olabel[arc_input],
        final_pairs,
        final_states,
        _useful(parts, is_epsilon),
    )
    return tables, ()


def _useful(parts: Parts, is_epsilon: np.ndarray) -> np.ndarray:
    """The states on a successful path of the result, found on the input
    (fewer arcs): those reaching a final state (an input path to one is a
    result path to a state whose closure holds it) and, besides the start,
    those a non-epsilon arc enters from a state the start reaches (the
    result's arcs are closures followed by such an arc)."""
    num_states = parts.num_states
    reached = levels_lib.reachable_states(num_states, np.array([0]), parts.src, parts.dst)
    entered = np.zeros(num_states, bool)
    entered[parts.dst[~is_epsilon & reached[parts.src]]] = True
    entered[0] = True
    finals = np.flatnonzero(parts.is_final)
    return entered & levels_lib.reachable_states(num_states, finals, parts.dst, parts.src)
