"""Tests of the command line (`_src/main.py`), against OpenFst where it applies.

Most tests call `main` in-process; two run `python -m semiring_jax` for the
exit status, stderr and stdin of a real process.
"""

import contextlib
import io
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import pywrapfst
from hypothesis import given, settings

import semiring_jax as sj
from semiring_jax._src.cli.main import main
from tests.oracles import openfst_shortest_distance, openfst_tot_score
from tests.strategies import acyclic_fsas, as_rows, dense_graphs

DIAMOND = "0 1 5 0.5\n0 2 6 1.5\n1 3 7 0.0\n2 3 7 0.25\n3 0.25\n"  # costs


def _run(argv, stdin=""):
    """(exit status, stdout, stderr) of `main(argv)` with `stdin` as input."""
    out, err = io.StringIO(), io.StringIO()
    saved_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    finally:
        sys.stdin = saved_stdin
    return status, out.getvalue(), err.getvalue()


def _openfst_text(num_states, arcs, final, transducer):
    rows = as_rows(arcs, transducer) if arcs else np.zeros((0, 5 if transducer else 4))
    return sj.Fsa.from_arcs(rows, final, num_states=num_states, dtype=np.float64).to_openfst()


def _info_table(text):
    return {line[:40].strip(): line[40:] for line in text.splitlines()}


def test_help_exits_0_and_usage_errors_exit_2():
    status, out, _ = _run(["--help"])
    assert status == 0 and "best-path" in out
    status, _, err = _run(["score", "--semiring", "real"])
    assert status == 2 and "invalid choice: 'real'" in err
    assert _run([])[0] == 2


# fstinfo's property lines, and the OpenFst flag behind each.
_FSTINFO = {
    "acceptor": pywrapfst.ACCEPTOR,
    "input deterministic": pywrapfst.I_DETERMINISTIC,
    "output deterministic": pywrapfst.O_DETERMINISTIC,
    "input/output epsilons": pywrapfst.EPSILONS,
    "input epsilons": pywrapfst.I_EPSILONS,
    "output epsilons": pywrapfst.O_EPSILONS,
    "input label sorted": pywrapfst.I_LABEL_SORTED,
    "output label sorted": pywrapfst.O_LABEL_SORTED,
    "acyclic": pywrapfst.ACYCLIC,
    "top sorted": pywrapfst.TOP_SORTED,
    "accessible": pywrapfst.ACCESSIBLE,
    "coaccessible": pywrapfst.COACCESSIBLE,
}


def _compile(text, acceptor, arc_type="standard"):
    """What fstcompile makes of the same text."""
    compiler = pywrapfst.Compiler(arc_type=arc_type, acceptor=acceptor, keep_state_numbering=True)
    compiler.write(text)
    return compiler.compile()


@settings(max_examples=25, deadline=None)
@given(dense_graphs(), acyclic_fsas(transducer=True))
def test_info_matches_openfst_on_the_same_text(cyclic, transducer):
    for (num_states, arcs, final), is_transducer in [(cyclic, False), (transducer, True)]:
        text = _openfst_text(num_states, arcs, final, is_transducer)
        status, out, err = _run(["info"], stdin=text)
        assert status == 0, err
        table = _info_table(out)
        fst = _compile(text, acceptor=not is_transducer)
        # Text without arc lines cannot say that it is a transducer.
        is_transducer = is_transducer and bool(arcs)
        assert table["fst type"] == ("transducer" if is_transducer else "acceptor")
        assert int(table["# of states"]) == fst.num_states()
        assert int(table["# of arcs"]) == sum(fst.num_arcs(s) for s in fst.states())
        for key, flag in _FSTINFO.items():
            assert table[key] == ("y" if fst.properties(flag, True) == flag else "n"), key
        connected = table["accessible"] == table["coaccessible"] == "y"
        assert table["connected"] == ("y" if connected else "n")


def test_info_json_is_machine_readable():
    status, out, _ = _run(["info", "--json", "-"], stdin=DIAMOND)
    data = json.loads(out)
    assert status == 0
    assert data["fst_type"] == "acceptor" and data["start"] == 0
    assert (data["num_states"], data["num_arcs"], data["num_final_states"]) == (4, 4, 1)
    assert data["acyclic"] is True and data["connected"] is True


@settings(max_examples=20, deadline=None)
@given(acyclic_fsas())
def test_score_costs_match_openfst_shortestdistance(draw):
    num_states, arcs, final = draw
    text = _openfst_text(num_states, arcs, final, False)
    for name, arc_type in [("log", "log64"), ("tropical", "tropical")]:
        status, out, err = _run(["score", "--semiring", name, "--costs", "--float64"], text)
        assert status == 0, err
        expected = 0.0 - openfst_tot_score(num_states, arcs, final, arc_type)
        np.testing.assert_allclose(float(out), expected, rtol=1e-6, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(acyclic_fsas())
def test_per_state_scores_match_openfst(draw):
    num_states, arcs, final = draw
    text = _openfst_text(num_states, arcs, final, False)
    for direction, reverse in [("forward", False), ("backward", True)]:
        status, out, err = _run(
            ["score", "--per-state", direction, "--float64", "--semiring", "tropical"], text
        )
        assert status == 0, err
        rows = [line.split("\t") for line in out.splitlines()]
        assert [int(state) for state, _ in rows] == list(range(len(rows)))
        scores = [float(value) for _, value in rows]  # "-Infinity" reads as -inf
        expected = openfst_shortest_distance(num_states, arcs, final, "tropical", reverse)
        np.testing.assert_allclose(scores, expected[: len(rows)], atol=1e-5)


def test_score_prints_float32_by_default_and_float64_on_request():
    # The float32 nearest the exact -0.4980709186546271 (the kernels add in double).
    assert _run(["score"], DIAMOND)[1] == "-0.49807093\n"
    value = float(_run(["score", "--float64"], DIAMOND)[1])
    assert value == pytest.approx(math.log(math.exp(-0.75) + math.exp(-2.0)), abs=1e-15)
    assert _run(["score", "--semiring", "tropical", "--costs"], DIAMOND)[1] == "0.75\n"


def test_score_of_an_fsa_without_paths_is_minus_infinity():
    assert _run(["score"], "0 1 5 0.5\n")[1] == "-Infinity\n"
    assert _run(["score", "--costs"], "0 1 5 0.5\n")[1] == "Infinity\n"


def test_cyclic_score_is_a_one_line_error_naming_a_state(tmp_path):
    path = tmp_path / "loop.fst"
    path.write_text("0 1 5 0.0\n1 0 6 0.0\n1\n")
    status, out, err = _run(["score", str(path)])
    assert (status, out) == (2, "")
    assert err == (
        "semiring-jax: error: tot_score: state 0 lies on a cycle (0 -> 1 -> 0); "
        "score recursions need an acyclic FSA\n"
    )


def test_bad_files_name_the_file_and_line():
    status, _, err = _run(["info"], "0 1 5 0.5\n1 2 x\n")
    assert status == 2
    assert err.startswith("semiring-jax: error: <stdin>: from_openfst: line 2:")
    assert err.count("\n") == 1
    status, _, err = _run(["info", "/nonexistent/a.fst"])
    assert status == 2 and "No such file" in err
    status, _, err = _run(["info", "--format", "k2"], "0 1 5 0.5\n")
    assert status == 2 and "the last line must name the final state" in err


def test_errors_are_one_short_line_with_status_2(tmp_path, monkeypatch):
    from semiring_jax._src.cli import main

    # 17 bytes that would take 2.2 GB: refused before allocating.
    status, _, err = _run(["info"], "0 1 1 0\n30000000\n")
    assert status == 2
    assert err.startswith("semiring-jax: error: <stdin>: from_openfst: line 2: state 30000000")
    # A single long line makes a short message (it was twice the line's size).
    status, _, err = _run(["info"], "0 1 5 " + "7" * 2_000_000 + "x\n")
    assert status == 2 and err.count("\n") == 1 and len(err) < 300
    assert err.startswith("semiring-jax: error: <stdin>: from_openfst: line 1: expected a number")
    # Bad UTF-8 names the file and the line (of the FST or of a symbol file).
    fst = tmp_path / "a.fst"
    fst.write_bytes(b"0 1 5 0.5\n1 2 \xff 0.5\n2\n")
    status, _, err = _run(["info", str(fst)])
    assert status == 2
    assert err == (
        f"semiring-jax: error: {fst}: line 2: byte 0xff at column 5 is not UTF-8; "
        f"the text must be UTF-8\n"
    )
    fst.write_text("0 1 a 0.5\n1\n")
    symbols = tmp_path / "words.syms"
    symbols.write_bytes(b"<eps> 0\n\xe9 1\n")
    status, _, err = _run(["info", "--isymbols", str(symbols), str(fst)])
    assert status == 2
    assert err.startswith(f"semiring-jax: error: {symbols}: SymbolTable.read: line 2: byte 0xe9")
    # Running out of memory, or any failure, is one line and status 2 too.
    for error in (MemoryError("Unable to allocate 2.2 GiB"), RecursionError(), KeyError("x")):

        def fail(args, error=error):
            raise error

        monkeypatch.setitem(main._COMMANDS, "info", fail)
        status, out, err = _run(["info"], DIAMOND)
        assert (status, out) == (2, "") and err.count("\n") == 1
        assert err.startswith("semiring-jax: error: ") and "Traceback" not in err
    assert err == "semiring-jax: error: internal error: KeyError: 'x'\n"
    monkeypatch.setitem(main._COMMANDS, "info", lambda args: (_ for _ in ()).throw(MemoryError()))
    assert _run(["info"], DIAMOND)[2] == "semiring-jax: error: out of memory\n"

    def interrupt(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(main._COMMANDS, "info", interrupt)
    assert _run(["info"], DIAMOND)[0] == 130


def test_integer_options_are_ascii_and_compose_has_a_budget(tmp_path):
    status, _, err = _run(["determinize", "--max-states", "1_000"], DIAMOND)
    assert status == 2 and "expected a positive integer (ASCII digits), got '1_000'" in err
    status, _, err = _run(["determinize", "--max-states", "\u0661\u0662"], DIAMOND)
    assert status == 2 and "expected a positive integer" in err
    fst = tmp_path / "d.fst"
    fst.write_text(DIAMOND)
    status, _, err = _run(["compose", "--max-arcs", "2", str(fst), str(fst)])
    assert status == 2
    assert err.startswith("semiring-jax: error: compose: more than max_arcs = 2 arcs")
    status, _, err = _run(["compose", "--max-states", "2", str(fst), str(fst)])
    assert status == 2 and "compose: more than max_states = 2 pair states" in err
    assert _run(["compose", str(fst), str(fst)])[0] == 0


def test_best_path_as_fsa_and_as_labels():
    status, out, _ = _run(["best-path"], DIAMOND)
    assert (status, out) == (0, "0\t1\t5\t0.5\n1\t2\t7\t0.0\n2\t0.25\n")
    assert _run(["best-path", "--labels"], DIAMOND)[1] == "5 7\t-0.75\n"
    assert _run(["best-path", "--labels", "--costs"], DIAMOND)[1] == "5 7\t0.75\n"
    transducer = "0 1 5 8 0.5\n0 1 6 9 0.25\n1 0.0\n"
    assert _run(["best-path", "--labels"], transducer)[1] == "6\t9\t-0.25\n"


def test_best_path_without_a_path_exits_1():
    status, out, err = _run(["best-path", "--labels"], "0 1 5 0.5\n")
    assert (status, out, err) == (1, "", "semiring-jax: best-path: no successful path\n")
    assert _run(["best-path"], "0 1 5 0.5\n")[1] == "0\tInfinity\n"


def test_k2_input_output_and_auto_detection(tmp_path):
    status, k2_text, _ = _run(["best-path", "--out-format", "k2"], DIAMOND)
    assert (status, k2_text) == (0, "0 1 5 -0.5\n1 2 7 0.0\n2 3 -1 -0.25\n3\n")
    path = tmp_path / "path.k2"
    assert _run(["determinize", "--format", "auto", "-o", str(path)], k2_text)[0] == 0
    assert path.read_text() == k2_text  # the output format follows the input's
    assert _run(["score", "--format", "k2", str(path)])[1] == "-0.75\n"


def test_compose_takes_at_most_one_operand_from_stdin():
    status, out, err = _run(["compose", "-", "-"], DIAMOND)
    assert (status, out) == (2, "")
    assert err == ("semiring-jax: error: compose: only one of the two inputs can be stdin ('-')\n")


def test_compose_and_determinize_keep_the_openfst_score(tmp_path):
    first, second = tmp_path / "a.fst", tmp_path / "b.fst"
    first.write_text("0 1 1 5 0.5\n0 1 2 6 0.25\n1 2 3 7 1.0\n2 0.0\n")
    second.write_text(DIAMOND)
    composed = tmp_path / "c.fst"
    assert _run(["compose", str(first), str(second), "-o", str(composed)])[0] == 0
    openfst = pywrapfst.compose(
        _compile(first.read_text(), acceptor=False),
        _compile(DIAMOND, acceptor=True).arcsort("ilabel"),
    )
    expected = float(pywrapfst.shortestdistance(openfst, reverse=True)[0])
    got = float(_run(["score", "--semiring", "tropical", "--costs", str(composed)])[1])
    assert got == pytest.approx(expected, abs=1e-6)
    status, out, _ = _run(["determinize", "--semiring", "tropical"], DIAMOND)
    assert status == 0 and _info_table(_run(["info"], out)[1])["input deterministic"] == "y"
    assert _run(["score", "--semiring", "tropical"], out)[1] == "-0.75\n"
    status, _, err = _run(["determinize", str(first)])
    assert status == 2 and "takes an acceptor" in err


def test_draw_dot_and_svg(monkeypatch):
    status, out, _ = _run(["draw", "--title", "diamond"], DIAMOND)
    assert status == 0 and out.startswith("digraph FSA {") and 'label = "diamond"' in out
    if shutil.which("dot") is not None:
        status, out, _ = _run(["draw", "--out-format", "svg"], DIAMOND)
        assert status == 0 and "<svg" in out
    monkeypatch.setenv("PATH", "")
    status, out, err = _run(["draw", "--out-format", "svg"], DIAMOND)
    assert (status, out) == (2, "")
    assert "Graphviz's 'dot' program is not on PATH" in err


def test_python_m_semiring_jax_bad_file_and_pipeline(tmp_path):
    bad = tmp_path / "bad.fst"
    bad.write_text("0 1 5 0.5\n0 1 five 0.5\n")
    result = subprocess.run(
        [sys.executable, "-m", "semiring_jax", "info", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert f"{bad}: from_openfst: line 2:" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "semiring_jax", "info", "-"],
        input=DIAMOND,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert _info_table(result.stdout)["# of states"] == "4"


def test_symbol_tables_for_reading_writing_drawing_and_labels(tmp_path):
    letters, xy = tmp_path / "letters.syms", tmp_path / "xy.syms"
    letters.write_text("<eps> 0\na 1\nb 2\nc 3\n")
    xy.write_text("<eps>\t0\nx\t1\ny\t2\n")
    words = tmp_path / "s.fst"
    words.write_text("0 1 a 0.5\n0 1 b 0.25\n1 2 c 0.0\n2 0.0\n")
    with_letters = ["--isymbols", str(letters), str(words)]
    assert _run(["best-path", *with_letters])[1] == "0\t1\tb\t0.25\n1\t2\tc\t0.0\n2\t0.0\n"
    assert _run(["best-path", "--labels", *with_letters])[1] == "b c\t-0.25\n"
    assert '0 -> 1 [label = "a/-0.5"];' in _run(["draw", *with_letters])[1]
    # A maps letters to x/y; the result reads letters in and writes x/y out.
    mapping = tmp_path / "map.fst"
    mapping.write_text("0 0 a x 0.5\n0 0 b y 0.0\n0 0 c x 0.0\n0 0.0\n")
    status, out, err = _run(
        [
            "compose",
            "--isymbols",
            str(letters),
            "--msymbols",
            str(letters),
            "--osymbols",
            str(xy),
            str(words),
            str(mapping),
        ]
    )
    assert (status, err) == (0, "")
    assert out == "0\t1\ta\tx\t1.0\n0\t1\tb\ty\t0.25\n1\t2\tc\tx\t0.0\n2\t0.0\n"
    # Without --osymbols the result's output labels are the acceptor B's.
    status, out, _ = _run(
        ["compose", "--isymbols", str(xy), "--msymbols", str(letters), "-", str(words)],
        "0 1 x a 0.0\n1 2 y c 0.0\n2\n",
    )
    assert (status, out) == (0, "0\t1\tx\ta\t0.5\n1\t2\ty\tc\t0.0\n2\t0.0\n")
    status, _, err = _run(["info", "--isymbols", str(xy), str(words)])
    assert status == 2 and err.startswith(f"semiring-jax: error: {words}: from_openfst: line 1")


def test_version_prints_the_package_version():
    status, out, err = _run(["--version"])
    assert (status, out, err) == (0, f"semiring-jax {sj.__version__}\n", "")


def test_project_keeps_the_input_or_the_output_labels(tmp_path):
    transducer = "0 1 5 8 0.5\n0 1 6 9 0.25\n1 0.0\n"
    inputs = "0\t1\t5\t0.5\n0\t1\t6\t0.25\n1\t0.0\n"
    outputs = "0\t1\t8\t0.5\n0\t1\t9\t0.25\n1\t0.0\n"
    assert _run(["project"], transducer) == (0, inputs, "")
    assert _run(["project", "--project-type", "input"], transducer) == (0, inputs, "")
    assert _run(["project", "--project-type", "output"], transducer) == (0, outputs, "")
    assert _run(["project", "--project-output"], transducer) == (0, outputs, "")
    status, _, err = _run(["project", "--project-type", "input", "--project-output"], transducer)
    assert status == 2 and "not allowed with argument" in err
    # --out-format k2; an acceptor projects to itself.
    assert _run(["project", "--out-format", "k2"], transducer)[1] == (
        "0 1 5 -0.5\n0 1 6 -0.25\n1 2 -1 0.0\n2\n"
    )
    assert _run(["project", "--project-output"], inputs)[1] == inputs
    # The kept side's symbol table labels the acceptor.
    letters, xy = tmp_path / "letters.syms", tmp_path / "xy.syms"
    letters.write_text("<eps> 0\na 1\nb 2\n")
    xy.write_text("<eps> 0\nx 1\ny 2\n")
    tables = ["--isymbols", str(letters), "--osymbols", str(xy)]
    named = "0 1 a y 0.5\n1 2 b x 0.0\n2\n"
    assert _run(["project", *tables], named)[1] == "0\t1\ta\t0.5\n1\t2\tb\t0.0\n2\t0.0\n"
    assert _run(["project", "--project-output", *tables], named)[1] == (
        "0\t1\ty\t0.5\n1\t2\tx\t0.0\n2\t0.0\n"
    )


def test_compose_project_determinize_pipeline_matches_openfst(tmp_path):
    # A maps letters 1, 2, 3 to words 10, 20; two paths of A o B read 1 3, one 2.
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("0 1 1 10 0.5\n0 2 1 10 1.5\n1 3 3 20 0.25\n2 3 3 20 0.0\n0 3 2 20 2.0\n3\n")
    second.write_text("0 1 10 0.0\n1 2 20 0.5\n0 2 20 0.0\n2\n")
    status, composed, err = _run(["compose", str(first), str(second)])
    assert (status, err) == (0, "")
    status, projected, err = _run(["project"], composed)
    assert (status, err) == (0, "")
    status, determinized, err = _run(["determinize", "--semiring", "tropical"], projected)
    assert (status, err) == (0, "")
    assert _info_table(_run(["info"], determinized)[1])["input deterministic"] == "y"
    openfst = pywrapfst.determinize(
        pywrapfst.compose(
            _compile(first.read_text(), acceptor=False),
            _compile(second.read_text(), acceptor=True).arcsort("ilabel"),
        ).project("input")
    )
    for text in (composed, projected, determinized):
        got = float(_run(["score", "--semiring", "tropical", "--costs"], text)[1])
        assert got == pytest.approx(float(pywrapfst.shortestdistance(openfst, reverse=True)[0]))
    assert _run(["best-path", "--labels", "--costs"], determinized)[1] == "1 3\t1.25\n"
    # Here ours is as small as OpenFst's: 3 states, 3 arcs.
    table = _info_table(_run(["info"], determinized)[1])
    assert int(table["# of states"]) == openfst.num_states() == 3
    assert int(table["# of arcs"]) == sum(openfst.num_arcs(s) for s in openfst.states()) == 3
