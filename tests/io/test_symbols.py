"""SymbolTable: OpenFst's text format against pynini, and symbols in text I/O."""

import math

import numpy as np
import pynini
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles
from tests.strategies import acyclic_fsas, as_rows, padded

# Symbols OpenFst's text format can hold: no space, tab or newline.
SYMBOLS = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1, max_size=6
)


@st.composite
def tables(draw):
    symbols = draw(st.lists(SYMBOLS, unique=True, max_size=8))
    keys = draw(
        # Keys are labels, so int32.
        st.lists(
            st.integers(0, 2**31 - 1), unique=True, min_size=len(symbols), max_size=len(symbols)
        )
    )
    return sj.SymbolTable(dict(zip(symbols, keys)), name="drawn")


def test_construction_lookup_and_order():
    table = sj.SymbolTable(["<eps>", "a", "b"], name="letters")
    assert len(table) == 3 and table.name == "letters"
    assert table.find("b") == 2 and table.find(1) == "a" and table.find(np.int32(0)) == "<eps>"
    assert "a" in table and 2 in table and np.int64(2) in table
    assert "z" not in table and 3 not in table and 1.0 not in table and True not in table
    mapping = sj.SymbolTable({"x": 10, "y": 3})
    assert list(mapping) == [(3, "y"), (10, "x")]
    assert mapping.keys() == [3, 10] and mapping.symbols() == ["y", "x"]
    assert mapping == sj.SymbolTable({"y": 3, "x": 10}, name="other")  # name ignored
    assert mapping != sj.SymbolTable({"y": 3, "x": 11}) and mapping != {"y": 3}
    assert repr(mapping) == "SymbolTable({'y': 3, 'x': 10})"
    assert "... (20 symbols)" in repr(sj.SymbolTable([f"s{i}" for i in range(20)]))
    assert sj.SymbolTable().keys() == [] and len(sj.SymbolTable()) == 0


def test_add_symbol_follows_openfst():
    ours, theirs = sj.SymbolTable(), pynini.SymbolTable()
    for symbol, key in [("<eps>", None), ("a", 5), ("b", None), ("a", None), ("c", 2), ("d", None)]:
        expected = theirs.add_symbol(symbol) if key is None else theirs.add_symbol(symbol, key)
        assert ours.add_symbol(symbol, key) == expected
    assert list(ours) == sorted(theirs)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda t: t.find("zz"), ValueError, r"find: no symbol 'zz' in symbol table 'letters'"),
        (lambda t: t.find(7), ValueError, r"find: no key 7 in symbol table 'letters'"),
        (lambda t: t.find(-1), ValueError, r"key -1 is negative"),
        (lambda t: t.find(1.5), TypeError, r"a key must be an int"),
        (lambda t: t.add_symbol("a", 4), ValueError, r"symbol 'a' already has key 1, not 4"),
        (
            lambda t: t.add_symbol("new", 0),
            ValueError,
            r"duplicate key 0 \(already symbol '<eps>'\)",
        ),
        (lambda t: t.add_symbol("two words"), ValueError, r"symbol 'two words' is empty or holds"),
        (lambda t: t.add_symbol(""), ValueError, r"symbol '' is empty"),
        (lambda t: t.add_symbol(3), TypeError, r"a symbol must be a str"),
        (lambda t: t.add_symbol("x", -2), ValueError, r"key -2 is negative"),
        (
            lambda t: sj.SymbolTable(["a", "a"]),
            ValueError,
            r"duplicate symbol 'a' \(already key 0\)",
        ),
        (lambda t: sj.SymbolTable({"a": 1, "b": 1}), ValueError, r"duplicate key 1"),
        (lambda t: sj.SymbolTable("abc"), TypeError, r"got a single str"),
    ],
)
def test_bad_lookups_and_updates_are_located(call, error, message):
    table = sj.SymbolTable(["<eps>", "a"], name="letters")
    with pytest.raises(error, match=message):
        call(table)


def test_text_format_reading():
    table = sj.SymbolTable.from_text("\n<eps>\t0\n  a   7 \r\n\nb\t 3\n")
    assert list(table) == [(0, "<eps>"), (3, "b"), (7, "a")]
    assert table.to_text() == "<eps>\t0\nb\t3\na\t7\n"
    assert sj.SymbolTable.from_text("") == sj.SymbolTable()


@pytest.mark.parametrize(
    "text, message",
    [
        ("a 0\nb\n", r"from_text: line 2: expected 'symbol key', got 'b'"),
        ("a 0\nb 1 2\n", r"line 2: expected 'symbol key', got 'b 1 2'"),
        ("a 0\n\nb x\n", r"line 3: key 'x' is not a non-negative integer in 'b x'"),
        ("a -1\n", r"line 1: key '-1' is not a non-negative integer"),
        ("a 1.0\n", r"line 1: key '1.0' is not a non-negative integer"),
        ("a 0\nb 1\na 2\n", r"line 3: duplicate symbol 'a' \(already key 0\) in 'a 2'"),
        ("a 0\nb 0\n", r"line 2: duplicate key 0 \(already symbol 'a'\) in 'b 0'"),
    ],
)
def test_bad_text_names_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        sj.SymbolTable.from_text(text)


def test_read_error_names_the_file(tmp_path):
    path = tmp_path / "bad.syms"
    path.write_text("a 0\nb\n")
    with pytest.raises(ValueError, match=r"bad.syms: SymbolTable.from_text: line 2"):
        sj.SymbolTable.read(path)


@pytest.mark.parametrize(
    "text, message",
    [
        # Keys are ASCII digits (int() would take these) and int32 labels.
        ("a 1_000\n", r"line 1: key '1_000' is not a non-negative integer"),
        ("a \u0661\u0662\n", r"line 1: key '\u0661\u0662' is not a non-negative integer"),
        ("a 1e9\n", r"line 1: key '1e9' is not a non-negative integer"),
        (
            "a 2147483648\n",
            r"line 1: key 2147483648 is above 2\*\*31 - 1; keys are labels, which are int32 "
            r"in 'a 2147483648'",
        ),
        ("a " + "9" * 5000 + "\n", r"line 1: key '9999.*' is above 2\*\*31 - 1"),
        (
            "a 0\n" + "b" * 1_000_000 + " x\n",
            r"line 2: key 'x' is not a non-negative integer in 'bbb",
        ),
    ],
)
def test_keys_are_ascii_int32_and_quotes_are_short(text, message):
    with pytest.raises(ValueError, match=message) as info:
        sj.SymbolTable.from_text(text)
    assert len(str(info.value)) < 250
    with pytest.raises(ValueError, match=r"SymbolTable: key 2147483648 is above 2\*\*31 - 1"):
        sj.SymbolTable({"a": 2**31})
    assert sj.SymbolTable({"a": 2**31 - 1}).find("a") == 2**31 - 1


def test_bad_utf8_names_the_symbol_file_and_line(tmp_path):
    path = tmp_path / "words.syms"
    path.write_bytes(b"<eps> 0\nhello 1\nw\xf6rld 2\n")  # Latin-1, not UTF-8
    with pytest.raises(
        ValueError,
        match=r"words.syms: SymbolTable.read: line 3: byte 0xf6 at column 2 is not UTF-8; "
        r"the text must be UTF-8",
    ):
        sj.SymbolTable.read(path)


@settings(max_examples=25, deadline=None)
@given(table=tables())
def test_text_round_trips_through_pynini(tmp_path_factory, table):
    directory = tmp_path_factory.mktemp("syms")
    ours = directory / "ours.syms"
    table.write(ours)
    theirs = pynini.SymbolTable.read_text(str(ours))
    assert list(theirs) == list(table)
    assert sj.SymbolTable.read(ours) == table
    written = directory / "theirs.syms"
    theirs.write_text(str(written))
    assert sj.SymbolTable.read(written) == table
    assert sj.SymbolTable.from_pynini(theirs) == table
    assert list(table.to_pynini()) == list(table)


def test_pynini_names_carry_over():
    theirs = pynini.SymbolTable(name="words")
    theirs.add_symbol("<eps>", 0)
    assert sj.SymbolTable.from_pynini(theirs).name == "words"
    assert sj.SymbolTable(["<eps>"], name="mine").to_pynini().name() == "mine"


# -- symbols in OpenFst text ------------------------------------------------------

LETTERS = sj.SymbolTable(["<eps>", "a", "b", "c", "d"], name="letters")
DIGITS = sj.SymbolTable({"<eps>": 0, "one": 1, "two": 2, "three": 3, "four": 4})


@settings(max_examples=25, deadline=None)
@given(data=acyclic_fsas(transducer=True), transducer=st.booleans())
def test_symbol_text_matches_pynini_print(data, transducer):
    num_states, arcs, final = data
    fsa = sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype="float64")
    transducer = not fsa.is_acceptor  # no arcs: an acceptor
    osymbols = DIGITS if transducer else None
    text = fsa.to_openfst(isymbols=LETTERS, osymbols=osymbols)
    back = sj.Fsa.from_openfst(
        text, dtype="float64", isymbols=LETTERS, osymbols=osymbols, acceptor=not transducer
    )
    # What pynini prints of the same FST (built independently) reads back alike.
    if not transducer:
        arcs = [(s, d, i, i, w) for s, d, i, _, w in arcs]
    fst = oracles.to_pynini(num_states, arcs, final, "log64")
    printed = fst.print(
        isymbols=LETTERS.to_pynini(),
        osymbols=(DIGITS if transducer else LETTERS).to_pynini(),
        acceptor=not transducer,
    )
    theirs = sj.Fsa.from_openfst(
        printed, dtype="float64", isymbols=LETTERS, osymbols=osymbols, acceptor=not transducer
    )
    # The same arcs, labels written as the same symbols.
    width = 4 if transducer else 3
    arc_fields = lambda text: sorted(
        line.split()[:width] for line in text.splitlines() if len(line.split()) > 2
    )
    assert arc_fields(text) == arc_fields(printed)
    for semiring in [sj.LOG, sj.TROPICAL]:  # padded: one shape, one compile
        expected = float(sj.tot_score(padded(fsa), semiring))
        assert float(sj.tot_score(padded(back), semiring)) == pytest.approx(expected, rel=1e-12)
        # pynini prints 6 significant digits.
        assert float(sj.tot_score(padded(theirs), semiring)) == pytest.approx(
            expected, rel=1e-5, abs=1e-5
        )
    if (fsa.src[1:] >= fsa.src[:-1]).all():  # arcs already leave state 0 first
        np.testing.assert_array_equal(back.ilabel, fsa.ilabel)
        np.testing.assert_array_equal(back.olabel, fsa.olabel)


def test_symbols_in_text():
    text = "0 1 a one 0.5\n0 1 b two\n1 2 c <eps> 1.5\n2 -1.0\n"
    fsa = sj.Fsa.from_openfst(text, isymbols=LETTERS, osymbols=DIGITS)
    assert not fsa.is_acceptor
    np.testing.assert_array_equal(fsa.ilabel, [1, 2, 3])
    np.testing.assert_array_equal(fsa.olabel, [1, 2, 0])
    assert fsa.to_openfst(isymbols=LETTERS, osymbols=DIGITS) == (
        "0\t1\ta\tone\t0.5\n0\t1\tb\ttwo\t0.0\n1\t2\tc\t<eps>\t1.5\n2\t-1.0\n"
    )
    # Only one column named: the other stays numeric.
    assert "0\t1\t1\tone\t0.5\n" in fsa.to_openfst(osymbols=DIGITS)
    # An acceptor's one column uses whichever table is given.
    acceptor = sj.Fsa.from_openfst("0 1 a 0.5\n1 2 b\n2\n", isymbols=LETTERS)
    assert acceptor.is_acceptor
    np.testing.assert_array_equal(acceptor.label, [1, 2])
    assert acceptor.to_openfst(osymbols=LETTERS) == acceptor.to_openfst(isymbols=LETTERS)
    assert acceptor.to_openfst(isymbols=LETTERS, osymbols=LETTERS).startswith("0\t1\ta\t0.5")
    # Four fields: with osymbols the last is an output symbol, else a cost.
    four = sj.Fsa.from_openfst("0 1 a two\n1\n", isymbols=LETTERS, osymbols=DIGITS)
    assert not four.is_acceptor and int(four.olabel[0]) == 2
    cost = sj.Fsa.from_openfst("0 1 a 2\n1\n", isymbols=LETTERS, osymbols=LETTERS)
    assert cost.is_acceptor and float(cost.weight[0]) == -2.0
    assert float(sj.tot_score(sj.Fsa.from_openfst("", isymbols=LETTERS))) == -math.inf


@pytest.mark.parametrize(
    "text, kwargs, message",
    [
        ("0 1 a\n1 2 zz\n2\n", dict(isymbols=LETTERS), r"line 2: symbol 'zz' is not in isymbols"),
        (
            "0 1 a one\n0 1 b eleven\n1\n",
            dict(isymbols=LETTERS, osymbols=DIGITS),
            r"line 2: symbol 'eleven' is not in osymbols, in '0 1 b eleven'",
        ),
        ("0 1 a one 0.5\n1\n", dict(isymbols=LETTERS), r"line 1: expected an integer, got 'one'"),
        (
            "0 1 a\n1\n",
            dict(isymbols=LETTERS, osymbols=DIGITS),
            r"an acceptor has one label column, but isymbols and osymbols differ",
        ),
    ],
)
def test_unknown_symbols_name_the_line(text, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sj.Fsa.from_openfst(text, **kwargs)


def test_unknown_labels_name_the_arc():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 1, 0.0), (1, 2, 9, 2, 0.0), (1, 2, 2, 7, 0.0)], final=[2])
    with pytest.raises(ValueError, match=r"to_openfst: arc 1 has ilabel=9, which isymbols"):
        fsa.to_openfst(isymbols=LETTERS)
    with pytest.raises(ValueError, match=r"to_openfst: arc 2 has olabel=7, which osymbols"):
        fsa.to_openfst(osymbols=DIGITS)
    with pytest.raises(TypeError, match=r"isymbols must be a sj.SymbolTable"):
        fsa.to_openfst(isymbols={"a": 1})
    acceptor = sj.Fsa.from_arcs([(0, 1, 8, 0.0)], final=[1])
    with pytest.raises(ValueError, match=r"arc 0 has label=8, which osymbols does not hold"):
        acceptor.to_openfst(osymbols=LETTERS)
