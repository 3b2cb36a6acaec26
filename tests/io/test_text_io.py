"""OpenFst and k2 text formats: round trips, pynini agreement, errors."""

import math

import numpy as np
import pynini
import pytest
from hypothesis import given, settings

import semiring_jax as sj
from tests.strategies import acyclic_fsas, as_rows


def build(data, transducer):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(
        as_rows(arcs, transducer), final, num_states=num_states, dtype="float64"
    )


def assert_same_fsa(a, b, num_states=None):
    """Equal structure and weights (state count may shrink at the end)."""
    for field in ["src", "dst", "ilabel", "olabel", "weight"]:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    size = num_states or a.num_states
    np.testing.assert_array_equal(a.final_weight[:size], b.final_weight[:size])
    assert a.is_acceptor == b.is_acceptor


@settings(max_examples=40, deadline=None)
@given(data=acyclic_fsas(transducer=True))
def test_k2_round_trip_is_exact(data):
    fsa = build(data, transducer=True)
    assert_same_fsa(sj.Fsa.from_k2(fsa.to_k2(), dtype="float64"), fsa)


@settings(max_examples=40, deadline=None)
@given(data=acyclic_fsas(transducer=True))
def test_openfst_round_trip_keeps_the_language(data):
    fsa = build(data, transducer=True)
    back = sj.Fsa.from_openfst(fsa.to_openfst(), acceptor=False, dtype="float64")
    for semiring in [sj.LOG, sj.TROPICAL]:
        np.testing.assert_allclose(
            sj.tot_score(back, semiring), sj.tot_score(fsa, semiring), rtol=1e-12
        )
    not_from_start = np.asarray(fsa.src) != 0
    if (np.diff(not_from_start.astype(int)) >= 0).all():
        # Arc order is kept when state 0's arcs already come first.
        np.testing.assert_array_equal(back.weight[: len(data[1])], fsa.weight)


def test_openfst_text_agrees_with_pynini():
    text = "0 1 1 1 0.5\n0 1 2 2 1.5\n1 2 3 4 0.25\n1 2.0\n2\n"
    fsa = sj.Fsa.from_openfst(text, dtype="float64")
    fst = pynini.Fst(arc_type="log")
    for _ in range(3):
        fst.add_state()
    fst.set_start(0)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            fst.add_arc(
                int(fields[0]),
                pynini.Arc(
                    int(fields[2]),
                    int(fields[3]),
                    pynini.Weight("log", float(fields[4])),
                    int(fields[1]),
                ),
            )
        else:
            cost = float(fields[1]) if len(fields) > 1 else 0.0
            fst.set_final(int(fields[0]), pynini.Weight("log", cost))
    expected = -float(pynini.shortestdistance(fst, reverse=True, delta=1e-9)[0])
    assert float(sj.tot_score(fsa)) == pytest.approx(expected, rel=1e-6)
    # And pynini's own printer's output reads back to the same FSA.
    printed = fst.print()
    again = sj.Fsa.from_openfst(printed, dtype="float64")
    assert float(sj.tot_score(again)) == pytest.approx(expected, rel=1e-6)


def test_openfst_acceptor_forms():
    three = sj.Fsa.from_openfst("0 1 7\n1\n")
    assert three.is_acceptor and float(three.weight[0]) == 0.0
    four = sj.Fsa.from_openfst("0 1 7 0.5\n1\n")
    assert four.is_acceptor and float(four.weight[0]) == -0.5
    transducer = sj.Fsa.from_openfst("0 1 7 8\n1\n")
    assert not transducer.is_acceptor
    forced = sj.Fsa.from_openfst("0 1 7 8\n1\n", acceptor=True)
    assert forced.is_acceptor and float(forced.weight[0]) == -8.0
    assert "0\t1\t7\t0.5\n" in four.to_openfst()
    start_elsewhere = sj.Fsa.from_openfst("3 1 7\n1 0 8\n0\n")
    assert float(sj.tot_score(start_elsewhere)) == 0.0
    empty = sj.Fsa.from_openfst("")
    assert empty.num_states == 1 and float(sj.tot_score(empty)) == -math.inf


def test_openfst_start_without_arcs_round_trips():
    fsa = sj.Fsa.from_arcs([(1, 2, 1, 0.0)], final=[2], num_states=3)
    back = sj.Fsa.from_openfst(fsa.to_openfst())
    assert float(sj.tot_score(back)) == -math.inf


@pytest.mark.parametrize(
    "text, message",
    [
        ("0 1 a 0.5\n", r"from_openfst: line 1: expected an integer, got 'a'"),
        ("0 1 2 3\n1\n0 1 2\n", r"line 3: .* mixes acceptor and transducer arcs"),
        ("0 1 2 3 4 5\n", r"line 1: expected 'src dst ilabel \[olabel\] \[weight\]'"),
        ("0 1 2 x\n", r"line 1: expected a number, got 'x'"),
        ("0 1 2\n\n1 nan\n", r"line 3: expected a number, got 'nan'"),
        ("0 1 2 -inf\n", r"line 1: cost -inf"),
    ],
)
def test_openfst_errors_name_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_openfst(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("0 1 5 0.5\n1 2 -1 0.0\n", r"from_k2: the last line must name the final state"),
        ("0 1 5 0.5\n1 2 5 0.0\n2\n", r"line 2: arcs into the final state 2 must have label -1"),
        ("0 1 -1 0.5\n1 2 -1 0.0\n2\n", r"line 1: arcs into the final state 2 must have label -1"),
        ("0 2 -1 0.5\n0 2 -1 0.0\n2\n", r"line 2: state 0 has a second final arc"),
        ("0 1 5\n1\n", r"line 1: expected 'src dst label score'"),
        ("0 3 5 0.5\n2\n", r"line 1: state 3 is above the final state 2"),
    ],
)
def test_k2_errors_name_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_k2(text)


def test_k2_transducer():
    fsa = sj.Fsa.from_k2("0 1 5 6 0.5\n1 2 -1 -1 0.25\n2\n")
    assert not fsa.is_acceptor and fsa.num_states == 2
    assert fsa.to_k2() == "0 1 5 6 0.5\n1 2 -1 -1 0.25\n2\n"


@pytest.mark.parametrize(
    "text, message",
    [
        # Integer fields are ASCII digits with an optional sign, within int32.
        ("0 1 1_000 0.5\n1\n", r"from_openfst: line 1: expected an integer, got '1_000'"),
        ("0 1 1e9 0.5\n1\n", r"from_openfst: line 1: expected an integer, got '1e9'"),
        ("0 1 \u0661\u0662 0.5\n1\n", r"line 1: expected an integer, got '\u0661\u0662'"),
        ("0 1 2 0.5\n1e9\n", r"line 2: expected an integer, got '1e9'"),
        (
            "0 1 4294967296 0.5\n1\n",
            r"line 1: '4294967296' is too large for int32 \(at most 2\*\*31 - 1\)",
        ),
        ("0 1 " + "9" * 5000 + "\n1\n", r"line 1: '9999.*' is too large for int32"),
        # Weights: ASCII decimal numbers or an infinity.
        ("0 1 2 1_0.5\n1\n", r"line 1: expected a number, got '1_0.5'"),
        ("0 1 2 \u0661.5\n1\n", r"line 1: expected a number, got '\u0661.5'"),
        (
            "0 1 2 1e400\n1\n",
            r"line 1: '1e400' is too large for float64 \(write inf or Infinity for an "
            r"infinite weight\)",
        ),
        # Overflow in the dtype names the line (it became an infinite score).
        (
            "0 1 2 0.5\n1 2 3 -1e39\n2\n",
            r"from_openfst: line 2: cost -1e\+39 is outside the range of float32 \(its "
            r"score would round to inf\)",
        ),
        ("0 1 2 0.5\n1 1e39\n", r"line 2: cost 1e\+39 is outside the range of float32"),
        # 17 bytes that would take 2.2 GB: state ids are bounded by the input.
        (
            "0 1 1 0\n30000000\n",
            r"from_openfst: line 2: state 30000000 is not below 1048580 = 2 \* arcs \+ "
            r"final states \+ 1 \+ 2\*\*20",
        ),
        ("0 2147483647 1\n1\n", r"line 1: state 2147483647 is not below 1048580"),
    ],
)
def test_openfst_fields_are_strict_and_sizes_bounded(text, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_openfst(text)


def test_openfst_weights_keep_their_spellings():
    fsa = sj.Fsa.from_openfst("0 1 2 +Infinity\n0 1 3 -.5\n0 1 4 1E-3\n1 inf\n1 2 5 7.\n2\n")
    np.testing.assert_array_equal(fsa.weight, np.float32([-np.inf, 0.5, -1e-3, -7.0]))
    assert fsa.num_states == 3 and bool(fsa.final_weight[2] == 0.0)
    # `1 inf`: OpenFst's zero final weight, so state 1 is not final.
    np.testing.assert_array_equal(fsa.final_mask, [False, False, True])
    fsa = sj.Fsa.from_openfst("0 1 2 1e300\n1\n", dtype="float64")
    np.testing.assert_array_equal(fsa.weight, [-1e300])


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "0 1 5 0.5\n1 2 -1 0.25\n2000000000\n",
            r"from_k2: line 3: final state 2000000000 is not below 1048582",
        ),
        ("0 1 5 0.5\n1 2 -1 0.25\n-3\n", r"from_k2: line 3: final state -3 is negative"),
        ("0 1 5 1e300\n1 2 -1 0.25\n2\n", r"line 1: score 1e\+300 is outside the range of float32"),
        ("0 1 5 0.5\n1 2 -1 -1e300\n2\n", r"line 2: score -1e\+300 is outside the range"),
        ("0 1 5 0.5\n1 2 -1 0.25\n2.0\n", r"line 3: expected an integer, got '2.0'"),
        ("0 1 5 0.5\n3 2 -1 0.25\n2\n", r"line 2: state 3 is above the final state 2"),
    ],
)
def test_k2_fields_are_strict_and_sizes_bounded(text, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_k2(text)


def test_errors_quote_long_lines_cut_short():
    # A single huge line makes a short message (fields and lines cut to 60).
    line = "0 1 2 " + "x" * 1_000_000
    with pytest.raises(ValueError) as info:
        sj.Fsa.from_openfst(line + "\n")
    message = str(info.value)
    assert message.startswith("from_openfst: line 1: expected a number, got 'xxx")
    assert len(message) < 250 and "\u2026" in message
