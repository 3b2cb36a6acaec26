"""Composition of two transducers with epsilons (numpy only).

The result's states are triples (state of a, state of b, filter). Label 0
is epsilon. A path of the result pairs a path of `a` and a path of `b` whose
labels match (a's output against b's input), with each operand's epsilon
moves made alone. Without a filter, k epsilon moves of `a` and m of `b`
between two matched labels could interleave in (k + m choose k) ways and
the result would count such paths that many times. The *sequence filter*
(OpenFst's default) allows one order only: a's epsilon moves first (filter
0), then b's (filter 1, after which a may not move alone until the next
match resets the filter to 0).

Only pair states reachable from (0, 0, 0) are built, then the result is
trimmed to states on a successful path (`structure.connect`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from semiring_jax._src.host import structure
from semiring_jax._src.host.structure import Parts, Result, Sources

__all__ = ["compose"]


def _leaving(parts: Parts, labels: np.ndarray) -> list[dict[int, list[int]]]:
    """For each state, {label: [arc indices]} of its arcs (arc order kept)."""
    table: list[dict[int, list[int]]] = [{} for _ in range(parts.num_states)]
    for arc, (state, label) in enumerate(zip(parts.src.tolist(), labels.tolist())):
        table[state].setdefault(label, []).append(arc)
    return table


def compose(a: Parts, b: Parts) -> Result:
    """The composition a ∘ b (a's output labels meet b's input labels).

    Returns:
      The trimmed result; its arcs and final states carry two weight
      sources each (a's and b's; ONE for the side that does not move).
    """
    sources = Sources.of([a, b])
    a_out, b_in = _leaving(a, a.olabel), _leaving(b, b.ilabel)
    # Python lists: indexing them in the loop is far cheaper than numpy's.
    a_dst, a_ilabel, b_dst, b_olabel = (
        a.dst.tolist(),
        a.ilabel.tolist(),
        b.dst.tolist(),
        b.olabel.tolist(),
    )
    a_is_final, b_is_final = a.is_final.tolist(), b.is_final.tolist()
    a_arc, b_arc = sources.arc_offsets[0], sources.arc_offsets[1]
    a_final, b_final = sources.finals(a, 0), sources.finals(b, 1)
    ids = {(0, 0, 0): 0}
    queue = deque([(0, 0, 0)])
    arcs = []  # (src, dst, ilabel, olabel, source a, source b)
    final = [(sources.zero, sources.zero)]

    def target(state: tuple[int, int, int]) -> int:
        if state not in ids:
            ids[state] = len(ids)
            final.append((sources.zero, sources.zero))
            queue.append(state)
        return ids[state]

    while queue:
        state = queue.popleft()
        s1, s2, fresh = state
        here = ids[state]
        if a_is_final[s1] and b_is_final[s2]:
            final[here] = (int(a_final[s1]), int(b_final[s2]))
        for label, arcs1 in a_out[s1].items():
            if label == 0:
                if fresh == 0:  # a's epsilon moves come first
                    for i in arcs1:
                        arcs.append(
                            (
                                here,
                                target((a_dst[i], s2, 0)),
                                a_ilabel[i],
                                0,
                                a_arc + i,
                                sources.one,
                            )
                        )
                continue
            matches = b_in[s2].get(label)
            if not matches:
                continue
            for i in arcs1:
                for j in matches:
                    arcs.append(
                        (
                            here,
                            target((a_dst[i], b_dst[j], 0)),
                            a_ilabel[i],
                            b_olabel[j],
                            a_arc + i,
                            b_arc + j,
                        )
                    )
        for j in b_in[s2].get(0, ()):  # then b's epsilon moves
            arcs.append((here, target((s1, b_dst[j], 1)), 0, b_olabel[j], sources.one, b_arc + j))
    columns = np.array(arcs, np.int64).reshape(-1, 6)
    built = Result(
        len(ids),
        columns[:, 0],
        columns[:, 1],
        columns[:, 2],
        columns[:, 3],
        columns[:, 4:6],
        np.array(final, np.int64),
        False,
    )
    return structure.trimmed(built, sources)
