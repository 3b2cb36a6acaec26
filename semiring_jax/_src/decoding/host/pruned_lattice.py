"""The lattice a beam search leaves, pruned to an output beam (numpy only).

The search (`decoding/beam_search.py`) records which graph states were
active after each frame. Here the lattice's arcs are the graph arcs from a
state active at frame t to one active at t + 1, cut to the states on some
path of `length` frames from (0, 0) to a final state, and then to the
arcs whose best path through them is within `output_beam` of the best
path (Viterbi scores forward and backward over those arcs). Work and
memory are proportional to the active states' arcs, never to T · S.
"""

from __future__ import annotations

import numpy as np

from semiring_jax._src.dense.host.lattice_structure import LatticeStructure

__all__ = ["pruned_lattice"]


def _out_arcs(out_start: np.ndarray, by_src: np.ndarray, states: np.ndarray) -> np.ndarray:
    """The real arcs leaving `states` (graph arc indices)."""
    first, last = out_start[states], out_start[states + 1]
    counts = last - first
    offsets = np.repeat(first - np.cumsum(counts) + counts, counts)
    return by_src[np.arange(counts.sum()) + offsets]


def _member(sorted_values: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(is each of `values` in `sorted_values`, its index there)."""
    where = np.minimum(np.searchsorted(sorted_values, values), max(sorted_values.size - 1, 0))
    found = sorted_values.size > 0
    inside = (sorted_values[where] == values) if found else np.zeros(values.shape, bool)
    return inside, where


def _connected(
    sizes: list[int], src: list[np.ndarray], dst: list[np.ndarray], final: np.ndarray
) -> list[np.ndarray]:
    """Which of each frame's arcs lie on a path from the start to a final
    state (local state indices per frame; `final` bool over the last
    frame's states)."""
    length = len(src)
    reach = [np.zeros(size, bool) for size in sizes]
    reach[0][0] = True
    for t in range(length):
        reach[t + 1][dst[t][reach[t][src[t]]]] = True
    alive = [np.zeros(size, bool) for size in sizes]
    alive[length] = reach[length] & final
    keep = []
    for t in range(length - 1, -1, -1):
        used = reach[t][src[t]] & alive[t + 1][dst[t]]
        alive[t][src[t][used]] = True
        keep.append(used)
    return keep[::-1]


def _viterbi(
    sizes: list[int],
    src: list[np.ndarray],
    dst: list[np.ndarray],
    score: list[np.ndarray],
    final_score: np.ndarray,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Best scores from the start to, and from, each frame's states."""
    length = len(src)
    alpha = [np.full(size, -np.inf) for size in sizes]
    alpha[0][0] = 0.0
    for t in range(length):
        np.maximum.at(alpha[t + 1], dst[t], alpha[t][src[t]] + score[t])
    beta = [np.full(size, -np.inf) for size in sizes]
    beta[length] = final_score.copy()
    for t in range(length - 1, -1, -1):
        np.maximum.at(beta[t], src[t], beta[t + 1][dst[t]] + score[t])
    return alpha, beta


def pruned_lattice(
    graph_src: np.ndarray,
    graph_dst: np.ndarray,
    graph_label: np.ndarray,
    graph_weight: np.ndarray,
    final_weight: np.ndarray,
    emissions: np.ndarray,
    active: list[np.ndarray],
    output_beam: float,
) -> LatticeStructure:
    """The lattice of the searched states, pruned to `output_beam`.

    Args:
      graph_src, graph_dst, graph_label: int [A], the graph's real arcs.
      graph_weight: float [A], their weights (values, for the beam only).
      final_weight: float [S], -inf where not final (NaN: final).
      emissions: float [T, V], values (for the beam only).
      active: length + 1 sorted int arrays, the states active after each
        frame (active[0] holds the start state 0).
      output_beam: keep the arcs whose best path is within this of the best
        (inf: every connected arc). With a NaN among the scores read, no
        arc is cut by the beam (so that the NaN reaches the lattice).
    Returns:
      A `LatticeStructure` (arc = index into the real arcs given), states
      numbered in frame order, (0, 0) first.
    """
    length = len(active) - 1
    by_src = np.argsort(graph_src, kind="stable")
    out_start = np.searchsorted(graph_src[by_src], np.arange(final_weight.size + 1))
    sizes = [states.size for states in active]
    arcs, src, dst, score = [], [], [], []
    for t in range(length):
        leaving = _out_arcs(out_start, by_src, active[t])
        inside, target = _member(active[t + 1], graph_dst[leaving])
        leaving = leaving[inside]
        arcs.append(leaving)
        src.append(np.searchsorted(active[t], graph_src[leaving]))
        dst.append(target[inside])
        score.append(graph_weight[leaving] + emissions[t, graph_label[leaving]])
    last_final = final_weight[active[length]]
    # A NaN final weight is final too: its NaN must reach the lattice.
    is_final = last_final != -np.inf
    keep = _connected(sizes, src, dst, is_final)
    if np.isfinite(output_beam):
        read = [s[k] for s, k in zip(score, keep, strict=True)]
        if not any(np.isnan(s).any() for s in read) and not np.isnan(last_final).any():
            # Over the connected arcs only: a NaN or inf on an arc of no
            # path to a final state must not reach the kept arcs' scores.
            alpha, beta = _viterbi(
                sizes,
                [s[k] for s, k in zip(src, keep, strict=True)],
                [d[k] for d, k in zip(dst, keep, strict=True)],
                read,
                last_final,
            )
            best = beta[0][0]  # the best path's score (-inf: none)
            for t in range(length):
                through = alpha[t][src[t]] + score[t] + beta[t + 1][dst[t]]
                keep[t] &= through >= best - output_beam  # False where not connected
            # Arcs within the beam of a finite best lie on such paths; with
            # infinities about, cut to the connected ones once more.
            cut = [(s[k], d[k]) for s, d, k in zip(src, dst, keep, strict=True)]
            again = _connected(sizes, [c[0] for c in cut], [c[1] for c in cut], is_final)
            for t in range(length):
                picked = np.flatnonzero(keep[t])
                keep[t] = np.zeros_like(keep[t])
                keep[t][picked[again[t]]] = True
    return _numbered(active, arcs, src, dst, keep, is_final, length)


def _numbered(
    active: list[np.ndarray],
    arcs: list[np.ndarray],
    src: list[np.ndarray],
    dst: list[np.ndarray],
    keep: list[np.ndarray],
    final: np.ndarray,
    length: int,
) -> LatticeStructure:
    """Number the states the kept arcs touch in frame order, (0, 0) first."""
    used = [np.zeros(states.size, bool) for states in active]
    used[0][0] = True
    for t in range(length):
        used[t][src[t][keep[t]]] = True
        used[t + 1][dst[t][keep[t]]] = True
    if length and not any(k.any() for k in keep):
        used = [np.zeros(states.size, bool) for states in active]
        used[0][0] = True
    offsets = np.cumsum([0] + [int(u.sum()) for u in used])
    ids = [np.cumsum(u) - 1 + offsets[t] for t, u in enumerate(used)]
    lattice_src = np.concatenate([ids[t][src[t][keep[t]]] for t in range(length)] + [[]])
    lattice_dst = np.concatenate([ids[t + 1][dst[t][keep[t]]] for t in range(length)] + [[]])
    arc = np.concatenate([arcs[t][keep[t]] for t in range(length)] + [[]])
    frame = np.concatenate([np.full(int(keep[t].sum()), t) for t in range(length)] + [[]])
    num_states = max(int(offsets[-1]), 1)
    final_state = np.full(num_states, -1, np.int64)
    is_end = used[length] & final
    if length == 0 or arc.size:
        final_state[ids[length][is_end]] = active[length][is_end]
    order = np.lexsort((arc, lattice_src))
    as32 = lambda values: np.asarray(values, np.int64)[order].astype(np.int32)
    return LatticeStructure(
        num_states,
        as32(lattice_src),
        as32(lattice_dst),
        as32(arc),
        as32(frame),
        final_state.astype(np.int32),
    )
