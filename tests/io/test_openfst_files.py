"""OpenFst text from files: `Fsa.read_openfst`, and `Fsa.from_openfst`
refusing what looks like a file name instead of text."""

import pathlib

import numpy as np
import pytest

import semiring_jax as sj

TEXT = "0 1 5 8 0.5\n1 2 6 9 0.25\n2 0.0\n"


def _same(a, b):
    assert a.is_acceptor == b.is_acceptor
    for field in ("src", "dst", "ilabel", "olabel", "weight", "final_weight", "final_mask"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


@pytest.mark.parametrize("as_path", [str, pathlib.Path])
def test_read_openfst_is_from_openfst_of_the_file(tmp_path, as_path):
    path = tmp_path / "lexicon.txt"
    path.write_text(TEXT)
    _same(sj.Fsa.read_openfst(as_path(path)), sj.Fsa.from_openfst(TEXT))
    _same(
        sj.Fsa.read_openfst(as_path(path), dtype="float64", acceptor=False),
        sj.Fsa.from_openfst(TEXT, dtype="float64", acceptor=False),
    )


def test_read_openfst_takes_symbol_tables(tmp_path):
    letters = sj.SymbolTable(["<eps>", "a", "b"])
    digits = sj.SymbolTable(["<eps>", "one", "two"])
    path = tmp_path / "named.txt"
    path.write_text("0 1 a two 0.5\n1 2 b one\n2\n")
    fsa = sj.Fsa.read_openfst(path, isymbols=letters, osymbols=digits)
    assert fsa.ilabel.tolist() == [1, 2] and fsa.olabel.tolist() == [2, 1]
    path.write_text("0 1 a 0.5\n1 2 c\n2\n")
    with pytest.raises(ValueError, match=rf"^read_openfst: {path}: line 2: symbol 'c' is not in"):
        sj.Fsa.read_openfst(path, isymbols=letters)


def test_read_openfst_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("0 1 5 0.5\n1 x\n")
    with pytest.raises(
        ValueError, match=rf"^read_openfst: {path}: line 2: expected a number, got 'x'"
    ):
        sj.Fsa.read_openfst(path)
    path.write_bytes(b"0 1 5 0.5\n1 \xff\n")
    with pytest.raises(ValueError, match=rf"^read_openfst: {path}: line 2: byte 0xff at column 3"):
        sj.Fsa.read_openfst(path)
    with pytest.raises(FileNotFoundError):
        sj.Fsa.read_openfst(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match=r"^read_openfst: dtype must be float32 or float64"):
        sj.Fsa.read_openfst(path, dtype="int32")
    # Text in place of a name names the function that reads text.
    with pytest.raises(ValueError, match=r"takes a file name, not text .*Fsa\.from_openfst"):
        sj.Fsa.read_openfst(TEXT)


@pytest.mark.parametrize("name", ["lexicon.txt", "/data/G.fst", "  words.txt\n"])
def test_from_openfst_of_a_file_name_names_read_openfst(name):
    with pytest.raises(ValueError, match=r"^from_openfst: takes OpenFst text, not a file") as e:
        sj.Fsa.from_openfst(name)
    assert repr(name.strip()) in str(e.value)
    assert "sj.Fsa.read_openfst(path)" in str(e.value)


def test_from_openfst_of_an_existing_file_or_path_object(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = pathlib.Path("my lattice.txt")  # two fields, so only its existence tells
    path.write_text(TEXT)
    for name in (str(path), path):
        with pytest.raises(ValueError, match=r"not a file name such as 'my lattice\.txt'"):
            sj.Fsa.from_openfst(name)
    # Quoted names are cut, as all quoted input is.
    with pytest.raises(ValueError, match=r"such as '.{60}…'"):
        sj.Fsa.from_openfst(str(tmp_path / path))
    with pytest.raises(TypeError, match=r"^from_openfst: text must be a str, got bytes"):
        sj.Fsa.from_openfst(TEXT.encode())


def test_from_openfst_still_reads_valid_text_and_reports_bad_lines(tmp_path, monkeypatch):
    # A one-field text is a final state, even where a file of that name exists.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "0").write_text(TEXT)
    assert sj.Fsa.from_openfst("0").num_states == 1
    # A bad arc line, or a bad line of several, keeps its own error.
    with pytest.raises(ValueError, match=r"^from_openfst: line 1: expected an integer, got 'x'"):
        sj.Fsa.from_openfst("0 1 x 0.5")
    with pytest.raises(ValueError, match=r"^from_openfst: line 2: expected an integer"):
        sj.Fsa.from_openfst("0 1 5\nlexicon.txt\n")
