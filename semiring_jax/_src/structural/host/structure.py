"""Result structures of the simple structural algorithms (numpy only).

Each function takes FSA structure (`Parts`, real arcs only) and returns the
result's structure plus, for every result arc and final state, the
*sources* of its weight: indices into the operands' weights laid end to end
as

    [arc weights of operand 0, final weights of operand 0, arc weights of
     operand 1, final weights of operand 1, ..., ZERO, ONE]

(`Sources` computes the offsets). A result weight is the ⊗-product (sum of
scores) of its sources: one for most ops, two where composition pairs an
arc of each operand (the second is ONE otherwise). The weights themselves
are then gathered in JAX (`structural/arc_map.py`), so they stay
differentiable. Nothing here looks at a
weight value: which states are final is structure (final weight > -inf).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from semiring_jax._src.core.host import levels as levels_lib

__all__ = [
    "Parts",
    "Result",
    "Sources",
    "arc_sort",
    "closure",
    "concat",
    "connect",
    "invert",
    "project",
    "prune",
    "reverse",
    "top_sort",
    "trimmed",
    "union",
]


class Parts(NamedTuple):
    """One operand's structure: real arcs only, in arc order."""

    num_states: int
    src: np.ndarray
    dst: np.ndarray
    ilabel: np.ndarray
    olabel: np.ndarray
    is_final: np.ndarray  # bool [S]
    is_acceptor: bool


class Result(NamedTuple):
    """A result's structure and where each weight comes from."""

    num_states: int
    src: np.ndarray
    dst: np.ndarray
    ilabel: np.ndarray
    olabel: np.ndarray
    arc_source: np.ndarray  # [A'] or [A', 2] indices into the sources
    final_source: np.ndarray  # [S'] or [S', 2] (ZERO: not final)
    is_acceptor: bool


class Sources(NamedTuple):
    """Offsets of each operand's arc and final weights among the sources."""

    arc_offsets: list
    final_offsets: list
    zero: int
    one: int

    @staticmethod
    def of(operands: Sequence[Parts]) -> Sources:
        arc_offsets, final_offsets, offset = [], [], 0
        for parts in operands:
            arc_offsets.append(offset)
            offset += parts.src.shape[0]
            final_offsets.append(offset)
            offset += parts.num_states
        return Sources(arc_offsets, final_offsets, offset, offset + 1)

    def finals(self, parts: Parts, index: int) -> np.ndarray:
        """Final-weight sources of an operand's states (ZERO where not final)."""
        return np.where(
            parts.is_final, self.final_offsets[index] + np.arange(parts.num_states), self.zero
        )


def _result(parts: Parts, sources: Sources, **changes: Any) -> Result:
    fields = dict(
        num_states=parts.num_states,
        src=parts.src,
        dst=parts.dst,
        ilabel=parts.ilabel,
        olabel=parts.olabel,
        arc_source=sources.arc_offsets[0] + np.arange(parts.src.shape[0]),
        final_source=sources.finals(parts, 0),
        is_acceptor=parts.is_acceptor,
    )
    fields.update(changes)
    return Result(**fields)


def invert(parts: Parts) -> Result:
    """Input and output labels swapped."""
    return _result(parts, Sources.of([parts]), ilabel=parts.olabel, olabel=parts.ilabel)


def project(parts: Parts, side: str) -> Result:
    """An acceptor of the input (or output) labels."""
    labels = parts.ilabel if side == "input" else parts.olabel
    return _result(parts, Sources.of([parts]), ilabel=labels, olabel=labels, is_acceptor=True)


def arc_sort(parts: Parts, by: str) -> Result:
    """Arcs ordered by source state, then label (`by`), then the other label,
    then destination; ties keep their order."""
    first, second = (parts.ilabel, parts.olabel) if by == "ilabel" else (parts.olabel, parts.ilabel)
    order = np.lexsort((parts.dst, second, first, parts.src))
    return _permuted_arcs(parts, order)


def _permuted_arcs(parts: Parts, order: np.ndarray) -> Result:
    sources = Sources.of([parts])
    return _result(
        parts,
        sources,
        src=parts.src[order],
        dst=parts.dst[order],
        ilabel=parts.ilabel[order],
        olabel=parts.olabel[order],
        arc_source=sources.arc_offsets[0] + order,
    )


def _renumbered(
    parts: Parts, new_state: np.ndarray, num_states: int, keep_arc: np.ndarray
) -> Result:
    """States renumbered by `new_state` [S] (-1: dropped), arcs filtered."""
    sources = Sources.of([parts])
    arcs = np.flatnonzero(keep_arc)
    final_source = np.full(num_states, sources.zero, np.int64)
    kept = new_state >= 0
    final_source[new_state[kept]] = sources.finals(parts, 0)[kept]
    return Result(
        num_states,
        new_state[parts.src[arcs]],
        new_state[parts.dst[arcs]],
        parts.ilabel[arcs],
        parts.olabel[arcs],
        sources.arc_offsets[0] + arcs,
        final_source,
        parts.is_acceptor,
    )


def top_sort(parts: Parts) -> tuple[Result | None, tuple[Any, ...]]:
    """States renumbered so that every arc goes to a higher number, start 0.

    Returns the result and (), or (None, culprit) where `culprit` is a
    cycle (states) or (start_state_entered_by,) an arc into the start.
    """
    levels = levels_lib.longest_path_levels(parts.num_states, parts.src, parts.dst)
    if levels is None:
        return None, levels_lib.find_cycle(parts.num_states, parts.src, parts.dst)
    entering_start = np.flatnonzero(parts.dst == 0)
    if entering_start.size:
        return None, ("start", int(parts.src[entering_start[0]]))
    rank = levels.astype(np.int64).copy()
    rank[0] = -1  # the start first among the states of level 0
    order = np.argsort(rank, kind="stable")
    new_state = np.empty(parts.num_states, np.int64)
    new_state[order] = np.arange(parts.num_states)
    return _renumbered(parts, new_state, parts.num_states, np.ones(parts.src.shape[0], bool)), ()


def connect(parts: Parts, all_reachable: bool = False, useful: np.ndarray | None = None) -> Result:
    """Only states on some path from the start to a final state (and the
    start itself, so that a result always has state 0). `all_reachable`:
    the caller built only states reachable from the start (a search from
    it), so only the backward search is made; `useful` (bool [S]): the
    caller knows those states (from a smaller graph), so none is made."""
    num_states = parts.num_states
    if useful is None:
        useful = levels_lib.reachable_states(
            num_states, np.flatnonzero(parts.is_final), parts.dst, parts.src
        )
        if not all_reachable:
            useful &= levels_lib.reachable_states(num_states, np.array([0]), parts.src, parts.dst)
    useful = useful.copy()
    useful[0] = True
    new_state = np.full(parts.num_states, -1, np.int64)
    new_state[useful] = np.arange(int(useful.sum()))
    keep_arc = useful[parts.src] & useful[parts.dst]
    if not (useful & parts.is_final).any():  # no path: the start alone
        keep_arc[:] = False
    return _renumbered(parts, new_state, int(useful.sum()), keep_arc)


def _join(
    operands: Sequence[Parts], state_offsets: np.ndarray, sources: Sources
) -> list[np.ndarray]:
    """The operands' arcs laid side by side, states shifted."""
    columns = [
        np.concatenate([parts.src + offset for parts, offset in zip(operands, state_offsets)]),
        np.concatenate([parts.dst + offset for parts, offset in zip(operands, state_offsets)]),
        np.concatenate([parts.ilabel for parts in operands]),
        np.concatenate([parts.olabel for parts in operands]),
        np.concatenate(
            [
                sources.arc_offsets[i] + np.arange(parts.src.shape[0])
                for i, parts in enumerate(operands)
            ]
        ),
    ]
    return columns


def _epsilon_arcs(src: np.ndarray, dst: np.ndarray, source: np.ndarray | int) -> list[np.ndarray]:
    src = np.asarray(src, np.int64)
    zeros = np.zeros(src.shape[0], np.int64)
    return [src, np.asarray(dst, np.int64) + zeros, zeros, zeros, np.asarray(source) + zeros]


def _with_arcs(
    num_states: int,
    base: list[np.ndarray],
    extra: list[np.ndarray],
    final_source: np.ndarray,
    is_acceptor: bool,
    extra_first: bool = False,
) -> Result:
    parts = [extra, base] if extra_first else [base, extra]
    src, dst, ilabel, olabel, source = (np.concatenate([p[i] for p in parts]) for i in range(5))
    return Result(num_states, src, dst, ilabel, olabel, source, final_source, is_acceptor)


def reverse(parts: Parts) -> Result:
    """OpenFst's Reverse: a new start 0 with epsilon arcs, weighted by the
    final weights, into the old final states; arcs turned around; the old
    start final (weight one). State s becomes s + 1."""
    sources = Sources.of([parts])
    finals = np.flatnonzero(parts.is_final)
    base = [
        parts.dst + 1,
        parts.src + 1,
        parts.ilabel,
        parts.olabel,
        sources.arc_offsets[0] + np.arange(parts.src.shape[0]),
    ]
    extra = _epsilon_arcs(np.zeros(finals.size), finals + 1, sources.final_offsets[0] + finals)
    final_source = np.full(parts.num_states + 1, sources.zero, np.int64)
    final_source[1] = sources.one
    return _with_arcs(
        parts.num_states + 1, base, extra, final_source, parts.is_acceptor, extra_first=True
    )


def union(operands: Sequence[Parts]) -> Result:
    """A new start 0 with an epsilon arc (weight one) into each operand's
    start; operand i's states follow, shifted."""
    sources = Sources.of(operands)
    offsets = np.cumsum([1] + [parts.num_states for parts in operands])
    base = _join(operands, offsets[:-1], sources)
    extra = _epsilon_arcs(np.zeros(len(operands)), offsets[:-1], sources.one)
    final_source = np.concatenate(
        [[sources.zero]] + [sources.finals(parts, i) for i, parts in enumerate(operands)]
    )
    return _with_arcs(
        int(offsets[-1]), base, extra, final_source, operands[0].is_acceptor, extra_first=True
    )


def concat(operands: Sequence[Parts]) -> Result:
    """Operands one after another: from each final state of operand i an
    epsilon arc, weighted by its final weight, into operand i + 1's start;
    only the last operand's finals stay final."""
    sources = Sources.of(operands)
    offsets = np.cumsum([0] + [parts.num_states for parts in operands])
    base = _join(operands, offsets[:-1], sources)
    links: list[list[np.ndarray]] = [[], [], []]
    for i, parts in enumerate(operands[:-1]):
        finals = np.flatnonzero(parts.is_final)
        links[0].append(finals + offsets[i])
        links[1].append(np.full(finals.size, offsets[i + 1]))
        links[2].append(sources.final_offsets[i] + finals)
    extra = _epsilon_arcs(
        *(np.concatenate(column) if column else np.zeros(0, np.int64) for column in links)
    )
    final_source = np.full(int(offsets[-1]), sources.zero, np.int64)
    final_source[offsets[-2] :] = sources.finals(operands[-1], len(operands) - 1)
    return _with_arcs(int(offsets[-1]), base, extra, final_source, operands[0].is_acceptor)


def closure(parts: Parts) -> Result:
    """OpenFst's Closure (star): a new final start 0 (weight one) with an
    epsilon arc into the old start; from each final state an epsilon arc,
    weighted by its final weight, back to the old start. State s becomes
    s + 1. The result is cyclic whenever a final state exists."""
    sources = Sources.of([parts])
    finals = np.flatnonzero(parts.is_final)
    base = [
        parts.src + 1,
        parts.dst + 1,
        parts.ilabel,
        parts.olabel,
        sources.arc_offsets[0] + np.arange(parts.src.shape[0]),
    ]
    extra = [
        np.concatenate([[0], finals + 1]),
        np.ones(finals.size + 1, np.int64),
        np.zeros(finals.size + 1, np.int64),
        np.zeros(finals.size + 1, np.int64),
        np.concatenate([[sources.one], sources.final_offsets[0] + finals]),
    ]
    final_source = np.concatenate([[sources.one], sources.finals(parts, 0)])
    return _with_arcs(
        parts.num_states + 1, base, extra, final_source, parts.is_acceptor, extra_first=True
    )


def trimmed(
    result: Result,
    sources: Sources,
    all_reachable: bool = False,
    useful: np.ndarray | None = None,
) -> Result:
    """`result` with only the states on a successful path (start kept); a
    state is final where its final source is not ZERO; `all_reachable` and
    `useful` as in `connect`."""
    is_final = result.final_source != sources.zero
    if is_final.ndim == 2:
        is_final = is_final.all(axis=1)
    kept = connect(
        Parts(
            result.num_states,
            result.src,
            result.dst,
            result.ilabel,
            result.olabel,
            is_final,
            result.is_acceptor,
        ),
        all_reachable,
        useful,
    )
    # `kept`'s sources index `result`'s arcs, then its states' finals.
    final_rows = kept.final_source - result.src.shape[0]  # a state, or S for none
    zero_row = np.full((1, *result.final_source.shape[1:]), sources.zero, np.int64)
    final_source = np.concatenate([result.final_source, zero_row])[final_rows]
    return kept._replace(arc_source=result.arc_source[kept.arc_source], final_source=final_source)


def prune(parts: Parts, keep_arc: np.ndarray, keep_final: np.ndarray) -> Result:
    """Only the arcs and final states kept (bool [A], [S]), then trimmed."""
    sources = Sources.of([parts])
    arcs = np.flatnonzero(keep_arc)
    result = Result(
        parts.num_states,
        parts.src[arcs],
        parts.dst[arcs],
        parts.ilabel[arcs],
        parts.olabel[arcs],
        sources.arc_offsets[0] + arcs,
        np.where(keep_final, sources.finals(parts, 0), sources.zero),
        parts.is_acceptor,
    )
    return trimmed(result, sources)
