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

Residuals are computed in JAX (`determinize.py`) from the tables here: one
*depth* at a time (breadth-first levels), each transition's member values
v(q') as ⊕ over its terms r_q ⊗ w_a.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from semiring_jax._src.host.structure import Parts

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


def determinize(parts: Parts, max_states: int) -> Determinized:
    """Breadth-first weighted subset construction (see the module docstring).

    Raises:
      OverflowError: past `max_states` result states, or 16 times as many
        subset members (the caller turns it into a ValueError naming the
        budget).
    """
    leaving: list[defaultdict[int, list[int]]] = [
        defaultdict(list) for _ in range(parts.num_states)
    ]
    for arc, (state, label) in enumerate(zip(parts.src.tolist(), parts.ilabel.tolist())):
        leaving[state][label].append(arc)
    one = -1  # resolved to num_residuals at the end
    singletons = {0: 0}
    members = [[(0, one)]]  # per result state: (input state, residual index)
    src, dst, labels, depths = [], [], [], []
    num_residuals = 0
    frontier = [0]
    while frontier:
        # (residual, arc, slot) of every term
        terms: tuple[list[int], list[int], list[int]] = ([], [], [])
        slot_transition: list[int] = []
        slot_residual: list[int] = []
        transitions = 0
        next_frontier = []
        for state in frontier:
            by_label = defaultdict(list)  # label -> [(residual, arc, target)]
            for q, residual in members[state]:
                for label, arcs in leaving[q].items():
                    for arc in arcs:
                        by_label[label].append((residual, arc, int(parts.dst[arc])))
            for label in sorted(by_label):
                items = by_label[label]
                targets = sorted({target for _, _, target in items})
                slots = {target: len(slot_transition) + k for k, target in enumerate(targets)}
                if len(targets) == 1:
                    target_state = singletons.get(targets[0])
                    if target_state is None:
                        target_state = singletons[targets[0]] = len(members)
                        members.append([(targets[0], one)])
                        next_frontier.append(target_state)
                    slot_residual.append(-1)
                else:
                    target_state = len(members)
                    new = list(range(num_residuals, num_residuals + len(targets)))
                    num_residuals += len(targets)
                    members.append(list(zip(targets, new)))
                    next_frontier.append(target_state)
                    slot_residual.extend(new)
                slot_transition.extend([transitions] * len(targets))
                for residual, arc, target in items:
                    terms[0].append(residual)
                    terms[1].append(arc)
                    terms[2].append(slots[target])
                src.append(state)
                dst.append(target_state)
                labels.append(label)
                transitions += 1
                if len(members) > max_states or num_residuals > 16 * max_states:
                    raise OverflowError(len(members))
        if transitions:
            term_residual, term_arc, term_slot = (np.array(column, np.int64) for column in terms)
            depths.append(
                Depth(
                    term_residual,
                    term_arc,
                    term_slot,
                    np.array(slot_transition, np.int64),
                    np.array(slot_residual, np.int64),
                    transitions,
                )
            )
        frontier = next_frontier
    resolve = lambda values: np.where(values == one, num_residuals, values)
    depths = [depth._replace(term_residual=resolve(depth.term_residual)) for depth in depths]
    flat = [(state, q, r) for state, group in enumerate(members) for q, r in group]
    member_state, member_input, member_residual = (
        np.array(column, np.int64) for column in zip(*flat)
    )
    is_final = np.zeros(len(members), bool)
    is_final[member_state[parts.is_final[member_input]]] = True
    return Determinized(
        len(members),
        np.array(src, np.int64),
        np.array(dst, np.int64),
        np.array(labels, np.int64),
        depths,
        num_residuals,
        member_state,
        member_input,
        resolve(member_residual),
        is_final,
    )
