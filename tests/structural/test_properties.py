"""Tests of structural/host/properties.py against brute force and OpenFst (pynini)."""

import numpy as np
import pynini
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_jax._src.core.host import build
from semiring_jax._src.core.host.levels import reachable_states
from semiring_jax._src.structural.host.properties import (
    fsa_properties,
    is_deterministic,
    is_label_sorted,
)
from tests.oracles import to_pynini
from tests.strategies import acyclic_fsas, as_rows, dense_graphs

# Any FSA: cyclic acceptors (self-loops included) and acyclic transducers.
ANY_FSA = st.one_of(
    dense_graphs().map(lambda draw: (draw, False)),
    acyclic_fsas(transducer=True).map(lambda draw: (draw, True)),
)


def _arrays(num_states, arcs, final, transducer):
    rows = as_rows(arcs, transducer) if arcs else np.zeros((0, 5 if transducer else 4))
    return build.arcs_from_rows(
        rows, final, num_states=num_states, start=0, dtype=np.float64, fn="test"
    )


def _brute_reachable(num_states, sources, arcs):
    seen, stack = set(sources), list(sources)
    while stack:
        state = stack.pop()
        for src, dst, *_ in arcs:
            if src == state and dst not in seen:
                seen.add(dst)
                stack.append(dst)
    return np.array([s in seen for s in range(num_states)])


def _has_cycle(num_states, arcs):
    """A state reaches itself by one or more arcs."""
    for state in range(num_states):
        successors = [dst for src, dst, *_ in arcs if src == state]
        if _brute_reachable(num_states, successors, arcs)[state]:
            return True
    return False


_OPENFST_FLAGS = {
    "acyclic": pynini.ACYCLIC,
    "input_deterministic": pynini.I_DETERMINISTIC,
    "output_deterministic": pynini.O_DETERMINISTIC,
    "epsilons": pynini.EPSILONS,
    "input_epsilons": pynini.I_EPSILONS,
    "output_epsilons": pynini.O_EPSILONS,
    "input_label_sorted": pynini.I_LABEL_SORTED,
    "output_label_sorted": pynini.O_LABEL_SORTED,
    "top_sorted": pynini.TOP_SORTED,
    "accessible": pynini.ACCESSIBLE,
    "coaccessible": pynini.COACCESSIBLE,
    "acceptor": pynini.ACCEPTOR,
}


@settings(max_examples=150, deadline=None)
@given(ANY_FSA)
def test_properties_match_openfst(draw):
    (num_states, arcs, final), transducer = draw
    props = fsa_properties(_arrays(num_states, arcs, final, transducer))
    fst = to_pynini(num_states, arcs, final, "tropical")
    for name, flag in _OPENFST_FLAGS.items():
        openfst = fst.properties(flag, True) == flag
        assert getattr(props, name) == openfst, name


@settings(max_examples=150, deadline=None)
@given(ANY_FSA)
def test_properties_match_brute_force(draw):
    (num_states, arcs, final), transducer = draw
    props = fsa_properties(_arrays(num_states, arcs, final, transducer))
    finals = [s for s, w in final.items() if w > -np.inf]
    accessible = _brute_reachable(num_states, [0], arcs)
    reversed_arcs = [(dst, src) for src, dst, *_ in arcs]
    coaccessible = _brute_reachable(num_states, finals, reversed_arcs)
    assert props.num_states == num_states and props.num_arcs == len(arcs)
    assert props.num_final_states == len(finals)
    assert props.num_accessible == accessible.sum()
    assert props.num_coaccessible == coaccessible.sum()
    assert props.num_connected == (accessible & coaccessible).sum()
    assert props.connected == bool((accessible & coaccessible).all())
    assert props.acyclic == (not _has_cycle(num_states, arcs))
    assert props.num_input_epsilons == sum(arc[2] == 0 for arc in arcs)
    assert props.num_output_epsilons == sum(arc[3] == 0 for arc in arcs)
    assert props.num_epsilons == sum(arc[2] == 0 == arc[3] for arc in arcs)
    assert props.is_acceptor == (not transducer)


def test_reachable_states_follows_arcs_only_forward():
    src, dst = np.array([0, 2, 1]), np.array([1, 1, 3])
    assert reachable_states(4, np.array([0]), src, dst).tolist() == [True, True, False, True]
    assert reachable_states(4, np.array([3]), dst, src).tolist() == [True, True, True, True]
    assert reachable_states(2, np.array([], np.int64), src[:0], dst[:0]).tolist() == [False, False]


def test_determinism_counts_epsilon_as_a_label():
    assert is_deterministic(np.array([0, 1]), np.array([0, 0]))
    assert not is_deterministic(np.array([1, 0, 1]), np.array([0, 0, 0]))
    assert is_deterministic(np.zeros(0, np.int32), np.zeros(0, np.int32))


def test_label_sorted_reads_each_states_arcs_in_stored_order():
    assert is_label_sorted(np.array([0, 0, 0]), np.array([1, 1, 2]))
    assert not is_label_sorted(np.array([1, 0, 1]), np.array([4, 0, 3]))
    assert is_label_sorted(np.zeros(0, np.int32), np.zeros(0, np.int32))


def test_single_state_with_no_arcs():
    props = fsa_properties(_arrays(1, [], {}, False))
    assert props.acyclic and props.top_sorted and props.accessible
    assert not props.coaccessible and not props.connected
    assert (props.num_states, props.num_arcs, props.num_final_states) == (1, 0, 0)
