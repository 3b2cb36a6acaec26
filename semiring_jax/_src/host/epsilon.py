"""Structure of epsilon removal (numpy only).

An epsilon arc has label 0 on both sides. For each state p, its epsilon
closure R(p) holds the states q reachable from p by epsilon arcs alone
(p included), at weight d(p, q) = ⊕ over those epsilon paths. The result
keeps the states; each non-epsilon arc q -> r gives an arc p -> r for every
p with q in R(p), weighted d(p, q) ⊗ w; final(p) = ⊕_q d(p, q) ⊗ final(q).

The weights d(p, q) are computed in JAX as the forward scores of a *pair
graph*: a start state with an arc (weight one) into each pair (p, p), and
for each pair (p, q') and epsilon arc q' -> q an arc into pair (p, q) with
that arc's weight. Its structure, and everything else here, is worked out
once on the host. The epsilon subgraph must be acyclic (else d would need
an infinite sum; a ValueError names a state on the cycle).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from semiring_jax._src.host import levels as levels_lib
from semiring_jax._src.host.structure import Parts

__all__ = ["EpsilonRemoval", "epsilon_removal"]


class EpsilonRemoval(NamedTuple):
    """Host tables for one FSA's epsilon removal.

    Attributes:
      pair_src, pair_dst: int [P'], arcs of the pair graph (state 0 is its
        start, pair i is state i + 1).
      pair_arc: int [P'], the input arc whose weight each pair arc carries,
        -1 for the start's arcs (weight one).
      num_pairs: P.
      arc_pair, arc_input: int [A'], for each result arc the pair (p, q)
        whose weight d it takes and the non-epsilon input arc q -> r.
      src, dst, ilabel, olabel: int [A'], the result arcs.
      final_pairs: int [S, R], for each state p the pairs (p, q) with q
        final, padded with P (a pair of weight zero); final_states [S, R]
        the matching q (0 on padding).
    """

    pair_src: np.ndarray
    pair_dst: np.ndarray
    pair_arc: np.ndarray
    num_pairs: int
    arc_pair: np.ndarray
    arc_input: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    ilabel: np.ndarray
    olabel: np.ndarray
    final_pairs: np.ndarray
    final_states: np.ndarray


def epsilon_removal(parts: Parts) -> tuple[EpsilonRemoval | None, tuple[int, ...]]:
    """The tables, or (None, cycle) if the epsilon arcs form a cycle."""
    is_epsilon = (parts.ilabel == 0) & (parts.olabel == 0)
    eps = np.flatnonzero(is_epsilon)
    cycle = levels_lib.find_cycle(parts.num_states, parts.src[eps], parts.dst[eps])
    if cycle:
        return None, cycle
    eps_out: list[list[int]] = [[] for _ in range(parts.num_states)]
    for arc in eps.tolist():
        eps_out[int(parts.src[arc])].append(arc)
    # Pairs (p, q), discovered from each p along epsilon arcs; the pair
    # graph gets one arc per (pair, epsilon arc) step.
    pair_index: dict[tuple[int, int], int] = {}
    pair_src: list[int] = []
    pair_dst: list[int] = []
    pair_arc: list[int] = []
    for p in range(parts.num_states):
        pair_index[(p, p)] = len(pair_index)
        pair_src.append(0)
        pair_dst.append(pair_index[(p, p)] + 1)
        pair_arc.append(-1)
        stack, seen = [p], {p}
        while stack:
            q = stack.pop()
            for arc in eps_out[q]:
                r = int(parts.dst[arc])
                if (p, r) not in pair_index:
                    pair_index[(p, r)] = len(pair_index)
                pair_src.append(pair_index[(p, q)] + 1)
                pair_dst.append(pair_index[(p, r)] + 1)
                pair_arc.append(arc)
                if r not in seen:
                    seen.add(r)
                    stack.append(r)
    num_pairs = len(pair_index)
    pairs = np.array(list(pair_index.keys()), np.int64).reshape(-1, 2)  # [P, 2] (p, q)
    # Result arcs: every non-epsilon arc q -> r, once per pair (p, q).
    real = np.flatnonzero(~is_epsilon)
    by_src: list[list[int]] = [[] for _ in range(parts.num_states)]
    for arc in real.tolist():
        by_src[int(parts.src[arc])].append(arc)
    pair_of_arc: list[int] = []
    input_of_arc: list[int] = []
    for index, (_, q) in enumerate(pairs.tolist()):
        for arc in by_src[q]:
            pair_of_arc.append(index)
            input_of_arc.append(arc)
    arc_pair = np.array(pair_of_arc, np.int64)
    arc_input = np.array(input_of_arc, np.int64)
    # Final weights: ⊕ over the pairs (p, q) with q final.
    final = parts.is_final[pairs[:, 1]]
    owners = pairs[final, 0]
    counts = np.bincount(owners, minlength=parts.num_states)
    width = max(int(counts.max(initial=0)), 1)
    final_pairs = np.full((parts.num_states, width), num_pairs, np.int64)
    final_states = np.zeros((parts.num_states, width), np.int64)
    order = np.argsort(owners, kind="stable")
    rank = np.arange(order.size) - (np.cumsum(counts) - counts)[owners[order]]
    final_pairs[owners[order], rank] = np.flatnonzero(final)[order]
    final_states[owners[order], rank] = pairs[final, 1][order]
    src = pairs[arc_pair, 0] if arc_pair.size else np.zeros(0, np.int64)
    tables = EpsilonRemoval(
        np.array(pair_src),
        np.array(pair_dst),
        np.array(pair_arc),
        num_pairs,
        arc_pair,
        arc_input,
        src,
        parts.dst[arc_input],
        parts.ilabel[arc_input],
        parts.olabel[arc_input],
        final_pairs,
        final_states,
    )
    return tables, ()
