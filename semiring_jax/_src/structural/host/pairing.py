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
trimmed to states on a successful path (`structure.connect`). A budget
bounds the construction: more than `max_states` pair states or `max_arcs`
arcs (built, before trimming) raise `BudgetExceeded` as soon as the count
is known and before the arrays that would hold them are allocated; the
dense pair index holds at most `_DENSE_PAIRS` entries, and a wave of pair
states is expanded in chunks of about `_CHUNK` arcs of `a`, so memory stays
proportional to the budget and the operands.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from semiring_jax._src.core.host.sorting import ranges
from semiring_jax._src.structural.host import structure
from semiring_jax._src.structural.host.structure import Parts, Result, Sources

__all__ = ["BudgetExceeded", "compose"]


class BudgetExceeded(OverflowError):
    """The construction would pass `budget` (`"max_states"` or `"max_arcs"`)."""

    def __init__(self, budget: str, limit: int) -> None:
        super().__init__(f"more than {budget} = {limit}")
        self.budget, self.limit = budget, limit


def _leaving(parts: Parts, labels: np.ndarray) -> list[dict[int, list[int]]]:
    """For each state, {label: [arc indices]} of its arcs (arc order kept)."""
    table: list[dict[int, list[int]]] = [{} for _ in range(parts.num_states)]
    for arc, (state, label) in enumerate(zip(parts.src.tolist(), labels.tolist())):
        table[state].setdefault(label, []).append(arc)
    return table


# Pair states are numbered through a dense [S_a * S_b * 2] index up to this
# many entries (128 MB of int64), so that the index itself is bounded; beyond
# it the per-state loop serves.
_DENSE_PAIRS = 16_000_000
# A wave's pair states are expanded in chunks of about this many arcs of a.
_CHUNK = 1 << 16


def _chunks(wave: np.ndarray, a_offsets: np.ndarray) -> list[np.ndarray]:
    """Consecutive pieces of `wave` (rows (s1, s2, filter)) with about
    `_CHUNK` arcs of a (plus one per state) each; a state with more arcs
    is a piece alone. Expanding them in turn gives the same result as the
    whole wave at once: terms are ordered by the wave's row first."""
    s1 = wave[:, 0]
    ends = np.cumsum(a_offsets[s1 + 1] - a_offsets[s1] + 1)
    pieces, start = [], 0
    while start < wave.shape[0]:
        before = ends[start - 1] if start else 0
        stop = max(int(np.searchsorted(ends, before + _CHUNK, "right")), start + 1)
        pieces.append(wave[start:stop])
        start = stop
    return pieces


def compose(a: Parts, b: Parts, *, max_states: int, max_arcs: int) -> Result:
    """The composition a ∘ b (a's output labels meet b's input labels).

    Breadth first from (0, 0, 0), one wave of pair states at a time in
    vectorised numpy; the same result, state for state and arc for arc, as
    visiting the pair states one by one (`_compose_loop`, which serves when
    the pair space is too large to index densely).

    Returns:
      The trimmed result; its arcs and final states carry two weight
      sources each (a's and b's; ONE for the side that does not move).
    Raises:
      BudgetExceeded: past `max_states` pair states or `max_arcs` arcs
        (before trimming), before allocating for them.
    """
    sources = Sources.of([a, b])
    if a.num_states * b.num_states * 2 > _DENSE_PAIRS:
        built = _compose_loop(a, b, sources, max_states, max_arcs)
    else:
        built = _compose_waves(a, b, sources, max_states, max_arcs)
    # Only pair states reachable from (0, 0, 0) are built.
    return structure.trimmed(built, sources, all_reachable=True)


def _by_label_groups(parts: Parts, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each state's arcs in the order the loop visits them: label groups in
    order of their first arc, arcs in index order within a group. Returns
    (order [A], offsets [S + 1])."""
    num_arcs = labels.shape[0]
    src = np.asarray(parts.src, np.int64)
    arcs = np.arange(num_arcs)
    by_pair = np.lexsort((arcs, labels, src))
    starts = np.ones(num_arcs, bool)
    starts[1:] = (src[by_pair][1:] != src[by_pair][:-1]) | (
        labels[by_pair][1:] != labels[by_pair][:-1]
    )
    group = np.cumsum(starts) - 1
    first_arc = by_pair[starts][group]  # per sorted arc: its group's first arc
    first_of = np.empty(num_arcs, np.int64)
    first_of[by_pair] = first_arc
    order = np.lexsort((arcs, first_of, src))
    offsets = np.zeros(parts.num_states + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=parts.num_states), out=offsets[1:])
    return order, offsets


# Key ranges are looked up in a dense [keys + 1] table of starts up to this
# many keys (or 4 per arc, if more), else by binary search.
_DENSE_KEYS = 1 << 22


class _KeyRanges:
    """Where each key's entries lie among sorted keys `[lo, hi)`: a dense
    table of run starts when the keys are few enough (a gather per query,
    not a binary search of unsorted queries), else `searchsorted`."""

    def __init__(self, sorted_keys: np.ndarray, num_keys: int) -> None:
        self.sorted_keys = sorted_keys
        self.starts: np.ndarray | None = None
        if num_keys <= max(_DENSE_KEYS, 4 * sorted_keys.size):
            self.starts = np.zeros(num_keys + 1, np.int64)
            np.cumsum(np.bincount(sorted_keys, minlength=num_keys), out=self.starts[1:])

    def __call__(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.starts is not None:
            return self.starts[keys], self.starts[keys + 1]
        return (
            np.searchsorted(self.sorted_keys, keys, "left"),
            np.searchsorted(self.sorted_keys, keys, "right"),
        )


def _merge_by_state(first: np.ndarray, then: np.ndarray, num_states: int) -> np.ndarray:
    """The order that puts, for each state in turn, its entries of `first`
    and then its entries of `then` (both grouped by state, ascending), each
    in its own order: indices into their concatenation, in linear time."""
    count_first = np.bincount(first, minlength=num_states)
    count_then = np.bincount(then, minlength=num_states)
    start = np.cumsum(count_first + count_then) - count_first - count_then
    rank = lambda states, counts: np.arange(states.size) - (np.cumsum(counts) - counts)[states]
    order = np.empty(first.size + then.size, np.int64)
    order[start[first] + rank(first, count_first)] = np.arange(first.size)
    order[start[then] + count_first[then] + rank(then, count_then)] = first.size + np.arange(
        then.size
    )
    return order


def _first_seen(id_of: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The distinct `keys` in order of first occurrence, without a sort; they
    must be unset (-1) in `id_of`, which serves as scratch and is left with
    codes below -1 at them (the caller numbers them next)."""
    # Occurrence i is coded i - n - 2 (below -1, rising with i): the minimum
    # at a key is its first occurrence's code.
    code = np.arange(keys.size) - keys.size - 2
    np.minimum.at(id_of, keys, code)
    return keys[id_of[keys] == code]


def _compose_waves(a: Parts, b: Parts, sources: Sources, max_states: int, max_arcs: int) -> Result:
    a_labels, b_labels = np.asarray(a.olabel, np.int64), np.asarray(b.ilabel, np.int64)
    a_dst, a_ilabel = np.asarray(a.dst, np.int64), np.asarray(a.ilabel, np.int64)
    b_dst, b_olabel = np.asarray(b.dst, np.int64), np.asarray(b.olabel, np.int64)
    # Index -1 (no b arc: a moves alone) reads the 0 appended here.
    b_dst_or_0, b_olabel_or_0 = np.append(b_dst, 0), np.append(b_olabel, 0)
    a_order, a_offsets = _by_label_groups(a, a_labels)
    # b's arcs by (state, label), arc order within: matches and epsilons.
    b_src = np.asarray(b.src, np.int64)
    num_labels = int(max(a_labels.max(initial=0), b_labels.max(initial=0))) + 1
    b_key = b_src * num_labels + b_labels
    b_order = np.lexsort((np.arange(b_key.size), b_key))
    b_ranges = _KeyRanges(b_key[b_order], b.num_states * num_labels)
    a_final, b_final = sources.finals(a, 0), sources.finals(b, 1)
    a_arc, b_arc = sources.arc_offsets[0], sources.arc_offsets[1]
    num_b = b.num_states
    id_of = np.full(a.num_states * num_b * 2, -1, np.int64)
    id_of[0] = 0
    wave = np.zeros((1, 3), np.int64)  # (s1, s2, filter) of the states to visit
    num_ids = 1
    columns: list[np.ndarray] = []
    finals: list[np.ndarray] = []
    num_arcs = 0
    while wave.shape[0]:
        reached: list[np.ndarray] = []  # the next wave, chunk by chunk
        for chunk in _chunks(wave, a_offsets):
            s1, s2, fresh = chunk[:, 0], chunk[:, 1], chunk[:, 2]
            here = id_of[(s1 * num_b + s2) * 2 + fresh]
            both_final = np.asarray(a.is_final)[s1] & np.asarray(b.is_final)[s2]
            finals.append(
                np.stack(
                    [
                        np.where(both_final, a_final[s1], sources.zero),
                        np.where(both_final, b_final[s2], sources.zero),
                    ],
                    axis=1,
                )
            )
            # a's arcs of every state, in the loop's order.
            counts = a_offsets[s1 + 1] - a_offsets[s1]
            a_state = np.repeat(np.arange(s1.size), counts)
            i = a_order[ranges(a_offsets[s1], counts)]
            label = a_labels[i]
            # Epsilon arcs of a move alone, and only with the filter at 0;
            # others meet b's arcs of the same label.
            eps = label == 0
            lo, hi = b_ranges(s2[a_state] * num_labels + label)
            per_arc = np.where(eps, (fresh[a_state] == 0).astype(np.int64), hi - lo)
            # Then b's epsilon moves of every state: count every new arc
            # before any is built, so that memory stays within the budget.
            lo0, hi0 = b_ranges(s2 * num_labels)
            num_arcs += int(per_arc.sum()) + int((hi0 - lo0).sum())
            if num_arcs > max_arcs:
                raise BudgetExceeded("max_arcs", max_arcs)
            term_a = np.repeat(np.arange(i.size), per_arc)
            match_counts = np.where(eps, 0, hi - lo)
            match_rows = ranges(lo, match_counts)  # b positions of every match, in order
            # Per term: its b arc (-1 for a's epsilon moves), in emission order.
            term_is_eps = eps[term_a]
            term_b = np.full(term_a.size, -1, np.int64)
            term_b[~term_is_eps] = b_order[match_rows]
            term_i = i[term_a]
            term_state = a_state[term_a]
            t1 = a_dst[term_i]
            t2 = np.where(term_is_eps, s2[term_state], b_dst_or_0[term_b])
            a_terms = (
                t1,
                t2,
                np.zeros(term_a.size, np.int64),
                a_ilabel[term_i],
                np.where(term_is_eps, 0, b_olabel_or_0[term_b]),
                a_arc + term_i,
                np.where(term_is_eps, sources.one, b_arc + term_b),
            )
            j0 = b_order[ranges(lo0, hi0 - lo0)]
            eps_state = np.repeat(np.arange(s2.size), hi0 - lo0)
            b_terms = (
                s1[eps_state],
                b_dst[j0],
                np.ones(j0.size, np.int64),
                np.zeros(j0.size, np.int64),
                b_olabel[j0],
                np.full(j0.size, sources.one, np.int64),
                b_arc + j0,
            )
            # Each state's a-based terms, then its b-based ones, in order.
            order = _merge_by_state(term_state, eps_state, s1.size)
            terms = [np.concatenate(pair)[order] for pair in zip(a_terms, b_terms)]
            t1, t2, tf, ilabel, olabel, source_a, source_b = terms
            state = np.concatenate([term_state, eps_state])[order]
            key = (t1 * num_b + t2) * 2 + tf
            new_keys = _first_seen(id_of, key[id_of[key] < 0])
            if num_ids + new_keys.size > max_states:
                raise BudgetExceeded("max_states", max_states)
            id_of[new_keys] = num_ids + np.arange(new_keys.size)
            num_ids += new_keys.size
            columns.append(
                np.stack([here[state], id_of[key], ilabel, olabel, source_a, source_b], 1)
            )
            reached.append(new_keys)
        keys = np.concatenate(reached)
        wave = np.stack([keys // 2 // num_b, keys // 2 % num_b, keys % 2], axis=1)
    arcs = np.concatenate(columns) if columns else np.zeros((0, 6), np.int64)
    return Result(
        num_ids,
        arcs[:, 0],
        arcs[:, 1],
        arcs[:, 2],
        arcs[:, 3],
        arcs[:, 4:6],
        np.concatenate(finals),
        False,
    )


def _compose_loop(a: Parts, b: Parts, sources: Sources, max_states: int, max_arcs: int) -> Result:
    """The composition, one pair state at a time (see `compose`)."""
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
    arcs: list[tuple[int, ...]] = []  # (src, dst, ilabel, olabel, source a, source b)
    final = [(sources.zero, sources.zero)]

    def target(state: tuple[int, int, int]) -> int:
        if state not in ids:
            if len(ids) >= max_states:
                raise BudgetExceeded("max_states", max_states)
            ids[state] = len(ids)
            final.append((sources.zero, sources.zero))
            queue.append(state)
        return ids[state]

    def room(count: int) -> None:
        """Raises if `count` more arcs would pass the budget."""
        if len(arcs) + count > max_arcs:
            raise BudgetExceeded("max_arcs", max_arcs)

    while queue:
        state = queue.popleft()
        s1, s2, fresh = state
        here = ids[state]
        if a_is_final[s1] and b_is_final[s2]:
            final[here] = (int(a_final[s1]), int(b_final[s2]))
        for label, arcs1 in a_out[s1].items():
            if label == 0:
                if fresh == 0:  # a's epsilon moves come first
                    room(len(arcs1))
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
            room(len(arcs1) * len(matches))
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
        room(len(b_in[s2].get(0, ())))
        for j in b_in[s2].get(0, ()):  # then b's epsilon moves
            arcs.append((here, target((s1, b_dst[j], 1)), 0, b_olabel[j], sources.one, b_arc + j))
    columns = np.array(arcs, np.int64).reshape(-1, 6)
    return Result(
        len(ids),
        columns[:, 0],
        columns[:, 1],
        columns[:, 2],
        columns[:, 3],
        columns[:, 4:6],
        np.array(final, np.int64),
        False,
    )
