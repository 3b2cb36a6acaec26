"""Structure of weighted determinization that holds for any weights (numpy only).

The result's states are weighted subsets {(q, r_q)} of input states, built
breadth first from {(0, one)}. On label x, a subset moves to the subset of
states q' entered by its members' x-arcs, with v(q') = ⊕ (r_q ⊗ w), an arc
weight W = ⊕ v and new residuals r_q' = v(q') ⊘ W. Two subsets may be merged
only if their residuals are equal; here that must hold for *every* weight
(the result's structure may not depend on weight values), which is certain
only for singletons (the residual of {q'} is always one). So singletons are
merged by state, and every other subset is a new state. The result can be
larger than OpenFst's (which merges subsets with equal residual values), with
the same weighted language.

Residuals are computed in JAX (`structural/determinize.py`) from the tables here: one
*depth* at a time (breadth-first levels), each transition's member values
v(q') as ⊕ over its terms r_q ⊗ w_a.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host.sorting import group_by, ranges
from semiring_jax._src.structural.host.structure import Parts

__all__ = ["Depth", "Determinized", "determinize"]


class Depth(NamedTuple):
    """The transitions out of the subsets of one breadth-first depth.

    Residual indices point into the growing residual vector; `one` (the
    last index) is the constant one of singletons.
    """

    term_residual: np.ndarray  # [N] residual of the member the term leaves
    term_arc: np.ndarray  # [N] input arc
    term_slot: np.ndarray  # [N] the (transition, target member) it adds to
    slot_transition: np.ndarray  # [M] the transition of each slot
    slot_residual: np.ndarray  # [M] residual index it defines, or -1 (singleton)
    num_transitions: int


class Determinized(NamedTuple):
    num_states: int
    src: np.ndarray  # [A'] result arcs, in creation order (depth by depth)
    dst: np.ndarray
    label: np.ndarray
    depths: list
    num_residuals: int  # the constant one has index num_residuals
    member_state: np.ndarray  # [K] (result state of each member)
    member_input: np.ndarray  # [K] its input state
    member_residual: np.ndarray  # [K] its residual index
    is_final: np.ndarray  # bool [S'] (structurally: a member is final)


def _lexsort(*keys: np.ndarray) -> np.ndarray:
    """`np.lexsort(keys)` (the last key primary, stable), as one stable sort
    of a combined key where the keys' spans fit in 62 bits: a depth's
    arrays are small, and a lexsort of three keys costs three sorts.

    Examples:
      >>> _lexsort(np.array([1, 0, 0]), np.array([2, 2, 1]))
      array([2, 1, 0])
    """
    combined = np.zeros(keys[0].shape, np.int64)
    bits = 0
    for key in reversed(keys):
        low = int(key.min(initial=0))
        span = int(key.max(initial=0)) - low + 1
        bits += span.bit_length()
        if bits > 62:
            return np.lexsort(keys)
        combined = combined * span + (key - low)
    return np.argsort(combined, kind="stable")


def determinize(parts: Parts, max_states: int) -> Determinized:
    """Breadth-first weighted subset construction (see the module docstring),
    one depth at a time in vectorised numpy.

    Raises:
      OverflowError: past `max_states` result states, or 16 times as many
        subset members (the caller turns it into a ValueError naming the
        budget).
    """
    src, dst, label = (np.asarray(x, np.int64) for x in (parts.src, parts.dst, parts.ilabel))
    arc_order, arc_offsets = group_by(parts.num_states, src)  # arcs by source, in arc order
    out_degree = np.diff(arc_offsets)
    singleton_of = np.full(parts.num_states, -1, np.int64)  # input state -> result state
    singleton_of[0] = 0
    # Members of the result states, state by state: (input state, residual
    # index); -1 is the constant one (resolved to num_residuals at the end).
    member_state = [np.zeros(1, np.int64)]
    member_input = [np.zeros(1, np.int64)]
    member_residual = [np.full(1, -1, np.int64)]
    num_states, num_residuals = 1, 0
    frontier_members = (member_state[0], member_input[0], member_residual[0])
    arcs_src, arcs_dst, arcs_label, depths = [], [], [], []
    while frontier_members[0].size:
        m_state, m_input, m_residual = frontier_members
        # Every term: a member's outgoing arc, in (member, arc) order.
        counts = out_degree[m_input]
        term_member = np.repeat(np.arange(m_state.size), counts)
        term_arc = arc_order[ranges(arc_offsets[m_input], counts)]
        if term_arc.size == 0:
            break
        term_state, term_label = m_state[term_member], label[term_arc]
        term_target = dst[term_arc]
        # Transitions: (state, label), in that order; slots: their distinct
        # targets, in target order. Terms stay in (member, arc) order within
        # a transition (stable sorts).
        by_target = _lexsort(term_target, term_label, term_state)
        s_state, s_label, s_target = (
            term_state[by_target],
            term_label[by_target],
            term_target[by_target],
        )
        new_transition = np.ones(term_arc.size, bool)
        new_transition[1:] = (s_state[1:] != s_state[:-1]) | (s_label[1:] != s_label[:-1])
        new_slot = new_transition.copy()
        new_slot[1:] |= s_target[1:] != s_target[:-1]
        slot_of_term = np.empty(term_arc.size, np.int64)
        slot_of_term[by_target] = np.cumsum(new_slot) - 1
        transition_of_term = np.empty(term_arc.size, np.int64)
        transition_of_term[by_target] = np.cumsum(new_transition) - 1
        order = _lexsort(term_label, term_state)
        term_member, term_arc = term_member[order], term_arc[order]
        term_state, term_label = term_state[order], term_label[order]
        term_slot, term_transition = slot_of_term[order], transition_of_term[order]
        new_transition = np.ones(term_arc.size, bool)
        new_transition[1:] = term_transition[1:] != term_transition[:-1]
        slot_first_sorted = np.flatnonzero(new_slot)
        slot_transition = transition_of_term[by_target][slot_first_sorted]
        slot_target = s_target[slot_first_sorted]
        num_transitions = int(term_transition[-1]) + 1
        transition_first = np.flatnonzero(new_transition)
        targets_per = np.bincount(slot_transition, minlength=num_transitions)
        singleton = targets_per == 1
        # Which transitions create a state, in transition order: every
        # subset of several states, and the first singleton of an input
        # state not seen before.
        single_target = np.full(num_transitions, -1, np.int64)
        single_target[slot_transition[singleton[slot_transition]]] = slot_target[
            singleton[slot_transition]
        ]
        unseen = singleton & (singleton_of[np.maximum(single_target, 0)] < 0)
        first_seen = np.zeros(num_transitions, bool)
        candidates = np.flatnonzero(unseen)
        if candidates.size:
            _, first = np.unique(single_target[candidates], return_index=True)
            first_seen[candidates[first]] = True
        creates = ~singleton | first_seen
        created = num_states + np.cumsum(creates) - 1
        singleton_of[single_target[first_seen]] = created[first_seen]
        transition_dst = np.where(creates, created, singleton_of[np.maximum(single_target, 0)])
        num_states += int(creates.sum())
        # Residual indices: one per slot of a subset of several states.
        multi_slot = ~singleton[slot_transition]
        slot_residual = np.full(slot_transition.size, -1, np.int64)
        slot_residual[multi_slot] = num_residuals + np.arange(int(multi_slot.sum()))
        num_residuals += int(multi_slot.sum())
        if num_states > max_states or num_residuals > 16 * max_states:
            raise OverflowError(num_states)
        # The new states' members, state by state, targets in order.
        new_slots = np.flatnonzero(creates[slot_transition])
        frontier_members = (
            transition_dst[slot_transition[new_slots]],
            slot_target[new_slots],
            slot_residual[new_slots],
        )
        for column, values in zip((member_state, member_input, member_residual), frontier_members):
            column.append(values)
        arcs_src.append(term_state[transition_first])
        arcs_dst.append(transition_dst)
        arcs_label.append(term_label[transition_first])
        depths.append(
            Depth(
                m_residual[term_member],
                term_arc,
                term_slot,
                slot_transition,
                slot_residual,
                num_transitions,
            )
        )
    one = num_residuals
    resolve = lambda values: np.where(values < 0, one, values)
    depths = [depth._replace(term_residual=resolve(depth.term_residual)) for depth in depths]
    states, inputs = np.concatenate(member_state), np.concatenate(member_input)
    is_final = np.zeros(num_states, bool)
    is_final[states[np.asarray(parts.is_final)[inputs]]] = True
    concat = lambda parts_: np.concatenate(parts_) if parts_ else np.zeros(0, np.int64)
    return Determinized(
        num_states,
        concat(arcs_src),
        concat(arcs_dst),
        concat(arcs_label),
        depths,
        num_residuals,
        states,
        inputs,
        resolve(np.concatenate(member_residual)),
        is_final,
    )
