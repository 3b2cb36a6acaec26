"""Fsa.to_dot options, SVG rendering through `dot`, and the notebook fallbacks."""

import re
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.io.host import dot

HAS_DOT = shutil.which("dot") is not None
ARCS = [(0, 1, 1, 2, 0.5), (0, 1, 2, 0, -0.25), (1, 2, 3, 3, 1.0)]
SYMBOLS = ["<eps>", "a", 'say "hi"', "back\\slash"]


class FindTable:
    """Stands in for sj.SymbolTable: find(int) -> str, KeyError if unknown."""

    def __init__(self, symbols):
        self.symbols = dict(enumerate(symbols))

    def find(self, key):
        return self.symbols[key]


def transducer():
    return sj.Fsa.from_arcs(ARCS, final={2: -0.5})


def arc_lines(source):
    return [line.strip() for line in source.splitlines() if "->" in line]


def svg_of(source):
    """`dot -Tsvg` of the source, parsed: every output must be valid Graphviz."""
    result = subprocess.run(
        ["dot", "-Tsvg"], input=source, text=True, capture_output=True, check=True, timeout=30
    )
    return ElementTree.fromstring(result.stdout)


def test_default_drawing_is_unchanged():
    lines = arc_lines(transducer().to_dot())
    assert lines == [
        '0 -> 1 [label = "1:2/0.5"];',
        '0 -> 1 [label = "2:0/-0.25"];',
        '1 -> 2 [label = "3:3/1"];',
    ]
    assert '2 [label = "2/-0.5", shape = doublecircle];' in transducer().to_dot()


@pytest.mark.parametrize(
    "table",
    [SYMBOLS, dict(enumerate(SYMBOLS)), FindTable(SYMBOLS)],
    ids=["sequence", "mapping", "find"],
)
def test_symbols_are_looked_up_and_escaped(table):
    source = transducer().to_dot(isymbols=table, osymbols=table, title='the "demo"')
    assert arc_lines(source) == [
        '0 -> 1 [label = "a:say \\"hi\\"/0.5"];',
        '0 -> 1 [label = "say \\"hi\\":<eps>/-0.25"];',
        '1 -> 2 [label = "back\\\\slash:back\\\\slash/1"];',
    ]
    assert 'label = "the \\"demo\\"";' in source
    if HAS_DOT:
        texts = [text.text for text in svg_of(source).iter("{http://www.w3.org/2000/svg}text")]
        assert 'a:say "hi"/0.5' in texts and "back\\slash:back\\slash/1" in texts


def test_only_input_symbols_for_an_acceptor():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5)], final=[1])
    assert arc_lines(fsa.to_dot(isymbols=["<eps>", "a"], osymbols=[])) == [
        '0 -> 1 [label = "a/0.5"];'
    ]
    assert arc_lines(transducer().to_dot(isymbols=SYMBOLS))[0] == '0 -> 1 [label = "a:2/0.5"];'


def test_weights_hidden_and_precision():
    source = transducer().to_dot(show_weights=False)
    assert arc_lines(source)[0] == '0 -> 1 [label = "1:2"];'
    assert '2 [label = "2", shape = doublecircle];' in source
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 1.23456)], final={1: 0.1234567}, dtype=np.float64)
    source = fsa.to_dot(precision=5)
    assert '[label = "1/1.2346"]' in source and 'label = "1/0.12346"' in source


def test_arc_values_label_colour_and_width():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 1.0), (0, 1, 2, 0.0), (1, 2, 3, 0.0)], final=[2])
    posteriors = sj.arc_posteriors(fsa)  # [0.731, 0.269, 1.0]
    lines = arc_lines(fsa.to_dot(arc_values=posteriors, value_name="p", show_weights=False))
    assert lines[0].startswith('0 -> 1 [label = "1\\np=0.731", color = "#')
    colours = [re.search(r'color = "(#[0-9a-f]{6})"', line).group(1) for line in lines]
    widths = [float(re.search(r"penwidth = ([0-9.]+)", line).group(1)) for line in lines]
    assert colours[2] == "#08306b" and colours[1] == "#c8c8c8"  # max and min of the ramp
    assert widths[1] == 0.5 and widths[2] == 4.0 and 0.5 < widths[0] < 4.0
    plain = arc_lines(
        fsa.to_dot(arc_values=np.array([1.0, 2.0, -np.inf]), color=False, width=False)
    )
    assert plain[2] == '1 -> 2 [label = "3/0\\n-inf"];'
    if HAS_DOT:
        svg_of(fsa.to_dot(arc_values=posteriors, value_name="p", title="posteriors"))


def test_arc_values_of_a_padded_fsa_drop_the_padding():
    short = sj.Fsa.from_arcs([(0, 1, 1, 1, 0.0)], final=[1])
    padded = jax.tree_util.tree_map(lambda field: field[0], sj.stack([short, transducer()]))
    assert padded.num_arcs == 3
    lines = arc_lines(padded.to_dot(arc_values=jnp.array([0.5, 7.0, 9.0]), width=False))
    assert lines == ['0 -> 1 [label = "1:1/0\\n0.5", color = "#08306b", fontcolor = "#08306b"];']


def test_bad_options_name_the_culprit():
    fsa = transducer()
    with pytest.raises(ValueError, match="to_dot: arc 2 has label 3, which isymbols does not"):
        fsa.to_dot(isymbols=SYMBOLS[:3])
    with pytest.raises(ValueError, match="to_dot: arc 0 has label 2, which osymbols"):
        fsa.to_dot(osymbols=FindTable(["<eps>", "a"]))
    with pytest.raises(TypeError, match="isymbols must be a symbol table"):
        fsa.to_dot(isymbols="abc")
    with pytest.raises(ValueError, match=r"arc_values must have shape \[A\] = \(3,\)"):
        fsa.to_dot(arc_values=np.zeros(2))
    with pytest.raises(ValueError, match="to_dot: precision must be an int >= 1"):
        fsa.to_dot(precision=0)
    with pytest.raises(ValueError, match="to_dot: takes an unbatched Fsa"):
        sj.stack([fsa]).to_dot()
    with pytest.raises(ValueError, match="arc_values is a traced value"):
        jax.jit(lambda w: fsa.to_dot(arc_values=w) and w)(fsa.weight)


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz dot is not installed")
def test_svg_rendering():
    fsa = transducer()
    svg = fsa._repr_svg_()
    root = ElementTree.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    bundle = fsa._repr_mimebundle_()
    assert bundle["image/svg+xml"] == svg and bundle["text/plain"] == repr(fsa)
    assert fsa._repr_mimebundle_(include=["text/plain"]) == {"text/plain": repr(fsa)}
    for source in [
        fsa.to_dot(isymbols=SYMBOLS, osymbols=SYMBOLS, title='a "t"'),
        sj.ctc_topo(3).to_dot(arc_values=np.arange(9.0), value_name="v"),
        sj.Fsa.from_arcs([], final=[], num_states=1).to_dot(),
    ]:
        svg_of(source)


def test_no_dot_falls_back_to_the_source(monkeypatch):
    fsa = transducer()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert fsa._repr_svg_() is None
    assert fsa._repr_mimebundle_() == {"text/plain": fsa.to_dot()}


def test_failing_or_hanging_dot_falls_back(monkeypatch, tmp_path):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert transducer()._repr_svg_() is None

    def hang(*args, **kwargs):
        raise subprocess.TimeoutExpired(cmd="dot", timeout=kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    assert dot.render_svg("digraph { 0 -> 1; }") is None


def test_batched_and_traced_reprs_never_raise():
    batch = sj.stack([transducer(), transducer()])
    assert batch._repr_svg_() is None
    assert batch._repr_mimebundle_() == {"text/plain": repr(batch)}

    def inside(weight):
        fsa = transducer().replace(weight=weight)
        assert fsa._repr_svg_() is None
        assert fsa._repr_mimebundle_() == {"text/plain": repr(fsa)}
        return weight

    jax.jit(inside)(transducer().weight)


def test_pynini_and_sj_symbol_tables():
    pynini = pytest.importorskip("pynini")
    table = pynini.SymbolTable()
    for symbol in ["<eps>", "a", "b"]:
        table.add_symbol(symbol)
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 2, 0.0)], final=[1])
    assert arc_lines(fsa.to_dot(isymbols=table, osymbols=table)) == ['0 -> 1 [label = "a:b/0"];']
    with pytest.raises(ValueError, match="arc 0 has label 2, which osymbols does not hold"):
        fsa.to_dot(osymbols=pynini.SymbolTable())  # pynini's find answers "" when missing
    symbols = pytest.importorskip("semiring_jax._src.io.host.symbols")
    ours = symbols.SymbolTable(["<eps>", "a", "b"])
    assert fsa.to_dot(isymbols=ours, osymbols=ours) == fsa.to_dot(isymbols=table, osymbols=table)
