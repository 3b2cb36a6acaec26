"""Fsa.from_pynini / Fsa.to_pynini: round trips and scores against OpenFst."""

import math
import sys

import numpy as np
import pynini
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles
from tests.strategies import acyclic_fsas, as_rows, padded

ARC_TYPES = ["standard", "log", "log64"]


def build(data, transducer, dtype):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype=dtype)


def by_source(fsa):
    """The real arcs as a dict of arrays, stably sorted by source state
    (OpenFst keeps arcs per state, so this order survives a round trip)."""
    order = np.argsort(np.asarray(fsa.src), kind="stable")
    return {
        field: np.asarray(getattr(fsa, field))[order]
        for field in ["src", "dst", "ilabel", "olabel", "weight"]
    }


def assert_same(back, fsa, weight_dtype):
    """Equal up to arc order within a state; weights as `weight_dtype` keeps them."""
    assert back.num_states == fsa.num_states
    # OpenFst calls an Fst whose arcs all have ilabel == olabel an acceptor,
    # so a transducer of such arcs comes back as an acceptor.
    same_labels = bool(np.all(np.asarray(fsa.ilabel) == np.asarray(fsa.olabel)))
    assert back.is_acceptor == (fsa.is_acceptor or same_labels)
    assert back.dtype == fsa.dtype
    ours, theirs = by_source(fsa), by_source(back)
    for field in ["src", "dst", "ilabel", "olabel"]:
        np.testing.assert_array_equal(theirs[field], ours[field], err_msg=field)
    rounded = lambda w: np.asarray(w).astype(weight_dtype).astype(fsa.dtype)
    np.testing.assert_array_equal(theirs["weight"], rounded(ours["weight"]))
    np.testing.assert_array_equal(back.final_weight, rounded(fsa.final_weight))


@settings(max_examples=25, deadline=None)
@given(
    data=acyclic_fsas(transducer=True),
    transducer=st.booleans(),
    arc_type=st.sampled_from(ARC_TYPES),
    dtype=st.sampled_from(["float32", "float64"]),
)
# A transducer whose arcs all have equal labels comes back an acceptor.
@example(data=(2, [(0, 1, 0, 0, 0.0)], {}), transducer=True, arc_type="standard", dtype="float32")
def test_ours_to_pynini_and_back(data, transducer, arc_type, dtype):
    fsa = build(data, transducer, dtype)
    fst = fsa.to_pynini(arc_type=arc_type)
    assert fst.arc_type() == arc_type and fst.start() == 0
    back = sj.Fsa.from_pynini(fst, dtype=dtype)
    # Exact where the arc type holds the dtype; rounded to float32 otherwise.
    exact = arc_type == "log64" or dtype == "float32"
    weight_dtype = fsa.dtype if exact else np.float32
    if exact or not np.isfinite(np.asarray(fsa.weight)).all():
        assert_same(back, fsa, weight_dtype)
    else:
        # float64 -> float32 goes through pynini's decimal text: within one ulp.
        np.testing.assert_allclose(by_source(back)["weight"], by_source(fsa)["weight"], rtol=2e-7)


@settings(max_examples=25, deadline=None)
@given(
    data=acyclic_fsas(transducer=True), arc_type=st.sampled_from(ARC_TYPES), start=st.integers(0, 5)
)
def test_pynini_to_ours_and_back(data, arc_type, start):
    num_states, arcs, final = data
    fst = oracles.to_pynini(num_states, arcs, final, arc_type)
    fst.set_start(start % num_states)
    dtype = "float64" if arc_type == "log64" else "float32"
    fsa = sj.Fsa.from_pynini(fst, dtype=dtype)
    again = fsa.to_pynini(arc_type=arc_type)
    if start % num_states == 0:
        assert pynini.equal(again, fst)
    # In general the same FST with the start state swapped with state 0.
    swap = list(range(num_states))
    swap[0], swap[start % num_states] = swap[start % num_states], 0
    assert again.start() == 0 and again.num_states() == num_states
    assert fst_lines(again) == fst_lines(fst, swap)


def fst_lines(fst, renumber=None):
    """Every arc and final weight, states renumbered, weights as OpenFst's text."""
    renumber = renumber or list(range(fst.num_states()))
    lines = []
    for state in fst.states():
        lines.append((renumber[state], cost_text(fst.final(state))))
        lines += [
            (
                renumber[state],
                renumber[arc.nextstate],
                arc.ilabel,
                arc.olabel,
                cost_text(arc.weight),
            )
            for arc in fst.arcs(state)
        ]
    return sorted(lines, key=repr)


def cost_text(weight):
    text = weight.to_string()
    return "0" if text == "-0" else text  # the oracle writes a score of 0.0 as cost -0.0


@settings(max_examples=25, deadline=None)
@given(data=acyclic_fsas(transducer=True), start=st.integers(0, 5))
def test_scores_agree_with_openfst(data, start):
    num_states, arcs, final = data
    start %= num_states
    # "standard" (tropical) weights are float32, "log64" ones float64.
    for arc_type, semiring, tolerance in [("log64", sj.LOG, 1e-8), ("tropical", sj.TROPICAL, 1e-6)]:
        fst = oracles.to_pynini(num_states, arcs, final, arc_type)
        fst.set_start(start)
        distance = pynini.shortestdistance(fst, reverse=True, delta=1e-12)
        expected = -float(distance[start]) if start < len(distance) else -math.inf
        fsa = padded(sj.Fsa.from_pynini(fst, dtype="float64"))  # one shape: one compile
        assert float(sj.tot_score(fsa, semiring)) == pytest.approx(
            expected, rel=tolerance, abs=tolerance
        )


def test_log64_weights_are_exact():
    # float(pynini.Weight) keeps 9 digits; the conversion must not.
    weight = 0.1 + 1e-12
    fsa = sj.Fsa.from_arcs(
        [(0, 1, 1, weight), (1, 2, 2, -math.inf)], final={2: math.pi}, dtype="float64"
    )
    fst = fsa.to_pynini(arc_type="log64")
    assert float(next(iter(fst.arcs(0))).weight) != -weight  # pynini's view is rounded
    back = sj.Fsa.from_pynini(fst, dtype="float64")
    np.testing.assert_array_equal(back.weight, [weight, -math.inf])
    np.testing.assert_array_equal(back.final_weight, [-math.inf, -math.inf, math.pi])


def test_start_empty_and_acceptor():
    fst = pynini.Fst()
    assert fst.start() == -1
    empty = sj.Fsa.from_pynini(fst)
    assert empty.num_states == 1 and float(sj.tot_score(empty)) == -math.inf
    no_start = pynini.Fst()
    no_start.add_states(2)  # states but no start: no path either
    no_start.set_final(1)
    assert float(sj.tot_score(sj.Fsa.from_pynini(no_start))) == -math.inf
    word = pynini.accep("ab", weight=0.25)
    fsa = sj.Fsa.from_pynini(word)
    assert fsa.is_acceptor
    assert float(sj.tot_score(fsa)) == -0.25
    cross = pynini.cross("a", "b")
    assert not sj.Fsa.from_pynini(cross).is_acceptor
    # Any pywrapfst FST, a const one included, is read through a vector copy.
    import pywrapfst

    const = pywrapfst.convert(word, fst_type="const")
    assert const.fst_type() == "const"
    np.testing.assert_array_equal(sj.Fsa.from_pynini(const).weight, fsa.weight)
    # Start state 2 of 3: renumbered to 0, so the path reads 7 then 8.
    moved = sj.Fsa.from_openfst("2 1 7 0.5\n1 0 8\n0\n")
    fst = pynini.Fst(arc_type="log")
    fst.add_states(3)
    fst.set_start(2)
    fst.add_arc(2, pynini.Arc(7, 7, pynini.Weight("log", 0.5), 1))
    fst.add_arc(1, pynini.Arc(8, 8, pynini.Weight("log", 0.0), 0))
    fst.set_final(0)
    ours = sj.Fsa.from_pynini(fst)
    for field in ["src", "dst", "label", "weight", "final_weight"]:
        np.testing.assert_array_equal(
            np.sort(getattr(ours, field)), np.sort(getattr(moved, field)), err_msg=field
        )


def test_symbol_tables():
    letters = sj.SymbolTable(["<eps>", "a", "b"], name="letters")
    digits = sj.SymbolTable(["<eps>", "one", "two"], name="digits")
    transducer = sj.Fsa.from_arcs([(0, 1, 1, 2, 0.5), (1, 2, 2, 0, 0.0)], final=[2])
    fst = transducer.to_pynini(isymbols=letters, osymbols=digits)
    assert sj.SymbolTable.from_pynini(fst.input_symbols()) == letters
    assert sj.SymbolTable.from_pynini(fst.output_symbols()) == digits
    assert "a\ttwo" in fst.print()
    # Attached tables are skipped when reading the FST back.
    back = sj.Fsa.from_pynini(fst)
    np.testing.assert_array_equal(back.olabel, transducer.olabel)
    acceptor = sj.Fsa.from_arcs([(0, 1, 1, 0.5)], final=[1]).to_pynini(isymbols=letters)
    assert sj.SymbolTable.from_pynini(acceptor.output_symbols()) == letters
    assert fst.input_symbols().name() == "letters"
    assert transducer.to_pynini().input_symbols() is None


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: sj.stack([sj.linear_fsa([1])]).to_pynini(),
            ValueError,
            r"to_pynini: takes an unbatched Fsa, got batch_shape=\(1,\)",
        ),
        (
            lambda: sj.linear_fsa([1]).to_pynini(arc_type="tropical"),
            ValueError,
            r"to_pynini: arc_type must be one of \['log', 'log64', 'standard'\], got 'tropical'",
        ),
        (
            lambda: sj.linear_fsa([1, 5]).to_pynini(isymbols=sj.SymbolTable(["<eps>", "a"])),
            ValueError,
            r"to_pynini: arc 1 has label=5, which isymbols does not hold",
        ),
        (
            lambda: sj.Fsa.from_arcs([(0, 1, 1, 3, 0.0)], final=[1]).to_pynini(
                osymbols=sj.SymbolTable(["<eps>", "a"])
            ),
            ValueError,
            r"arc 0 has olabel=3, which osymbols does not hold",
        ),
        (
            lambda: sj.Fsa.from_pynini("0 1 2\n"),
            TypeError,
            r"from_pynini: fst must be a pynini.Fst",
        ),
        (
            lambda: sj.Fsa.from_pynini(pynini.accep("a"), dtype="int32"),
            ValueError,
            r"from_pynini: dtype must be float32 or float64",
        ),
    ],
)
def test_errors_are_located(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_bad_weights_name_the_arc():
    fst = pynini.Fst()
    fst.add_states(2)
    fst.set_start(0)
    fst.add_arc(0, pynini.Arc(1, 1, pynini.Weight("tropical", 0.0), 1))
    fst.add_arc(0, pynini.Arc(1, 1, pynini.Weight.no_weight("tropical"), 1))  # NaN
    with pytest.raises(ValueError, match=r"from_pynini: arc 1 has weight nan"):
        sj.Fsa.from_pynini(fst)


def test_missing_pynini_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynini", None)  # import pynini now fails
    with pytest.raises(ImportError, match=r"pip install 'semiring_jax\[pynini\]'"):
        sj.linear_fsa([1]).to_pynini()
    with pytest.raises(ImportError, match=r"from_pynini needs pynini"):
        sj.Fsa.from_pynini(object())
    with pytest.raises(ImportError, match=r"SymbolTable.to_pynini needs pynini"):
        sj.SymbolTable(["a"]).to_pynini()
