"""`Conversions`: the methods by which an Fsa is read from and written to
other formats (OpenFst and k2 text, pynini, Graphviz, Jupyter's display).

A base class of `Fsa`, so that the class keeps these public methods while
`core/fsa.py` keeps the pytree itself; each method checks its arguments and
hands the host arrays to the `io/host` (or `io/pynini_fst.py`) function that
does the work. The Fsa is made by `Fsa._from_arrays`, so this module never
imports `core/fsa.py`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.host import build
from semiring_jax._src.io.host import dot, openfst_text
from semiring_jax._src.io.host.symbols import SymbolTable

if TYPE_CHECKING:
    from semiring_jax._src.core.array_types import ArrayLeaf

__all__ = ["Conversions"]

# The class a reader is called on, `Fsa`; so named for the signatures the
# reference shows.
Fsa = TypeVar("Fsa", bound="Conversions")


class Conversions:
    """Reading and writing other formats; mixed into `Fsa`."""

    if TYPE_CHECKING:  # what `Fsa` provides
        src: ArrayLeaf
        dst: ArrayLeaf
        ilabel: ArrayLeaf
        olabel: ArrayLeaf
        weight: ArrayLeaf
        final_weight: ArrayLeaf
        arc_mask: ArrayLeaf
        final_mask: ArrayLeaf
        is_acceptor: bool

        @property
        def num_states(self) -> int: ...

        @property
        def num_arcs(self) -> int: ...

        @property
        def batch_shape(self) -> tuple[int, ...]: ...

        @classmethod
        def _from_arrays(cls: type[Fsa], arrays: build.ArcArrays) -> Fsa:
            """The Fsa of validated host arrays (`Fsa` builds it)."""
            ...

    @classmethod
    def from_openfst(
        cls: type[Fsa],
        text: str,
        *,
        acceptor: bool | None = None,
        dtype: Any = np.float32,
        isymbols: SymbolTable | None = None,
        osymbols: SymbolTable | None = None,
    ) -> Fsa:
        """Reads OpenFst's AT&T text format; costs become scores (negated).

        Arc lines are `src dst ilabel olabel [cost]` (transducer) or
        `src dst label [cost]` (acceptor); final lines are `state [cost]`.
        The first line's source is the start state (renumbered to 0 as in
        `from_arcs`). With `acceptor=None`, 3-field arc lines are acceptor
        arcs and 5-field lines transducer arcs; a 4-field line is a
        transducer arc without cost (as `fstcompile` reads it) unless its
        last field is not an integer (with `osymbols`: not one of its
        symbols), in which case it is an acceptor cost.
        Empty text is the empty FSA (one state, not final).

        With a symbol table, that column's labels are its symbols (as
        `fstcompile --isymbols=... --osymbols=...` reads them); without one
        they are integers. An acceptor's one label column uses `isymbols`
        (`osymbols` defaults to it).

        Args:
          text: the text, one arc or final state per line.
          acceptor: force acceptor (True) or transducer (False) reading.
          dtype: float32 (default) or float64.
          isymbols: a `sj.SymbolTable` for the input labels, or None.
          osymbols: a `sj.SymbolTable` for the output labels, or None.
        Returns:
          An unbatched Fsa.
        Raises:
          ValueError: for a malformed line or a symbol not in its table,
            naming the line number (integers are ASCII digits within int32,
            weights ASCII decimals or infinities; a weight `dtype` cannot
            hold, or a state id past the bound of `from_arcs`, is refused
            too); for an acceptor given two different tables; for a file
            name instead of text (a path object, or one line that does not
            parse and is one field or names an existing file), naming
            `Fsa.read_openfst`, which reads files.
          TypeError: for a `text` that is not a str.
        Examples:
          >>> import semiring_jax as sj
          >>> fsa = sj.Fsa.from_openfst("0 1 7 0.5\\n1 2 8 1.0\\n2\\n")
          >>> print(fsa.weight, fsa.final_weight)
          [-0.5 -1. ] [-inf -inf   0.]
          >>> words = sj.SymbolTable(["<eps>", "hello", "world"])
          >>> fsa = sj.Fsa.from_openfst("0 1 hello\\n1 2 world\\n2\\n", isymbols=words)
          >>> print(fsa.label)
          [1 2]
        """
        dtype = checks.check_float_dtype(dtype, "dtype", "from_openfst")
        try:
            arrays = openfst_text.parse_openfst(
                text, acceptor=acceptor, dtype=dtype, isymbols=isymbols, osymbols=osymbols
            )
        except ValueError:
            # Checked only once parsing failed: valid text is never refused.
            if isinstance(text, str) and openfst_text.looks_like_a_path(text):
                raise openfst_text.path_error("from_openfst", text.strip()) from None
            raise
        return cls._from_arrays(arrays)

    @classmethod
    def read_openfst(
        cls: type[Fsa],
        path: str | os.PathLike[str],
        *,
        acceptor: bool | None = None,
        dtype: Any = np.float32,
        isymbols: SymbolTable | None = None,
        osymbols: SymbolTable | None = None,
    ) -> Fsa:
        """Reads a file of OpenFst's AT&T text: `from_openfst` of its contents.

        Args:
          path: the file's name; its text must be UTF-8.
          acceptor: force acceptor (True) or transducer (False) reading.
          dtype: float32 (default) or float64.
          isymbols: a `sj.SymbolTable` for the input labels, or None.
          osymbols: a `sj.SymbolTable` for the output labels, or None.
        Returns:
          An unbatched Fsa.
        Raises:
          ValueError: as `from_openfst`, with the file's name before the
            line number; for a file that is not UTF-8 (naming its line and
            column); for text given instead of a name (a str with a line
            break), naming `from_openfst`.
          OSError: for a file that cannot be read.
        Examples:
          >>> import os, tempfile
          >>> import semiring_jax as sj
          >>> path = os.path.join(tempfile.mkdtemp(), "lattice.txt")
          >>> with open(path, "w") as file:
          ...     _ = file.write("0 1 7 0.5\\n1 2 8 1.0\\n2\\n")
          >>> print(sj.Fsa.read_openfst(path).weight)
          [-0.5 -1. ]
        """
        dtype = checks.check_float_dtype(dtype, "dtype", "read_openfst")
        text, where = openfst_text.read_file(path, "read_openfst")
        arrays = openfst_text.parse_openfst(
            text, acceptor=acceptor, dtype=dtype, isymbols=isymbols, osymbols=osymbols, fn=where
        )
        return cls._from_arrays(arrays)

    @classmethod
    def from_k2(cls: type[Fsa], text: str, *, dtype: Any = np.float32) -> Fsa:
        """Reads k2's text format, mapping its final arcs to final weights.

        k2 lines are `src dst label score` (acceptor) or `src dst ilabel
        olabel score` (transducer), and a last line naming the single final
        state, the highest-numbered one, entered only by arcs labelled -1.
        Each -1 arc `s -> final` becomes `final_weight[s] = score`, and the
        final state itself is dropped. Scores are kept as scores.

        Args:
          text: k2 text.
          dtype: float32 (default) or float64.
        Returns:
          An unbatched Fsa with one state fewer than the k2 text names.
        Raises:
          ValueError: for a malformed line (with its number; fields as in
            `from_openfst`), a -1 arc that does not enter the final state,
            an arc leaving the final state, two -1 arcs from one state, or a
            final state past the bound of `from_arcs` on state ids.
        Examples:
          >>> import semiring_jax as sj
          >>> fsa = sj.Fsa.from_k2("0 1 5 0.5\\n1 2 -1 0.25\\n2\\n")
          >>> print(fsa.num_states, fsa.final_weight)
          2 [-inf 0.25]
        """
        dtype = checks.check_float_dtype(dtype, "dtype", "from_k2")
        return cls._from_arrays(openfst_text.parse_k2(text, dtype=dtype))

    def _host_arrays(self, fn: str) -> build.ArcArrays:
        if self.batch_shape:
            raise ValueError(
                f"{fn}: takes an unbatched Fsa, got batch_shape={self.batch_shape}; "
                f"use sj.unstack(batch)[i]"
            )
        real = checks.concrete(self.arc_mask, "arc_mask", fn).astype(bool)
        pick = lambda field: checks.concrete(getattr(self, field), field, fn)[real]
        final_mask = checks.concrete(self.final_mask, "final_mask", fn).astype(bool)
        final_weight = checks.concrete(self.final_weight, "final_weight", fn)
        return build.ArcArrays(
            self.num_states,
            pick("src"),
            pick("dst"),
            pick("ilabel"),
            pick("olabel"),
            pick("weight"),
            # The writers mark finals by a weight > -inf (OpenFst's finite
            # cost): a non-final state's stored value must not count.
            np.where(final_mask, final_weight, np.asarray(-np.inf, final_weight.dtype)),
            self.is_acceptor,
            final_mask,
        )

    def to_openfst(
        self, *, isymbols: SymbolTable | None = None, osymbols: SymbolTable | None = None
    ) -> str:
        """Writes OpenFst's AT&T text format (scores negated to costs).

        Arcs leaving state 0 come first, so that `fstcompile` takes it as the
        start; otherwise arc order is kept. Padding arcs are left out. With a
        symbol table, that column's labels are written as its symbols; an
        acceptor's one label column uses `isymbols` (`osymbols` defaults to
        it).

        Args:
          isymbols: a `sj.SymbolTable` for the input labels, or None.
          osymbols: a `sj.SymbolTable` for the output labels, or None.
        Returns:
          The text, ending in a newline.
        Raises:
          ValueError: for a batched Fsa, a label its table does not hold
            (naming the arc, counted over real arcs), or an acceptor given
            two different tables.
        Examples:
          >>> import semiring_jax as sj
          >>> text = sj.Fsa.from_arcs([(0, 1, 7, 0.5)], final=[1]).to_openfst()
          >>> print(text, end="")  # doctest: +NORMALIZE_WHITESPACE
          0	1	7	-0.5
          1	0.0
          >>> letters = sj.SymbolTable({"<eps>": 0, "a": 7})
          >>> fsa = sj.Fsa.from_arcs([(0, 1, 7, 0, 0.5)], final=[1])
          >>> print(fsa.to_openfst(isymbols=letters, osymbols=letters), end="")
          ... # doctest: +NORMALIZE_WHITESPACE
          0	1	a	<eps>	-0.5
          1	0.0
        """
        return openfst_text.format_openfst(
            self._host_arrays("to_openfst"), isymbols=isymbols, osymbols=osymbols
        )

    def to_k2(self) -> str:
        """Writes k2's text format: a -1 arc into a new last state per final.

        Returns:
          The text, ending in a newline.
        Examples:
          >>> import semiring_jax as sj
          >>> print(sj.Fsa.from_arcs([(0, 1, 7, 0.5)], final=[1]).to_k2(), end="")
          0 1 7 0.5
          1 2 -1 0.0
          2
        """
        return openfst_text.format_k2(self._host_arrays("to_k2"))

    @classmethod
    def from_pynini(cls: type[Fsa], fst: Any, *, dtype: Any = np.float32) -> Fsa:
        """Converts a `pynini.Fst` (arc type standard, log or log64).

        OpenFst costs become scores (negated); an infinite cost is a -inf
        score, and a state with infinite final cost is not final. The start
        state is renumbered to 0 as in `from_arcs`; an FST with no start
        state becomes one state with no final (no path). Arcs come grouped
        by source state, in OpenFst's order within a state; the weights are
        read exactly (float64 for log64). Symbol tables are not carried:
        read them with `sj.SymbolTable.from_pynini(fst.input_symbols())`.

        Args:
          fst: a pynini.Fst (or any pywrapfst FST).
          dtype: float32 (default) or float64.
        Returns:
          An unbatched Fsa; an acceptor if every arc has ilabel == olabel.
        Raises:
          ImportError: without pynini (`pip install 'semiring_jax[pynini]'`).
          TypeError: if `fst` is not a pynini or pywrapfst FST.
          ValueError: for another arc type, or a weight that is not a score
            (NaN, or a cost of -inf), naming the arc.
        Examples:
          >>> import pynini
          >>> import semiring_jax as sj
          >>> fst = pynini.accep("ab", weight=1.5)
          >>> fsa = sj.Fsa.from_pynini(fst)
          >>> print(fsa.label, round(float(sj.tot_score(fsa)), 4))
          [97 98] -1.5
        """
        from semiring_jax._src.io import pynini_fst

        dtype = checks.check_float_dtype(dtype, "dtype", "from_pynini")
        return cls._from_arrays(pynini_fst.from_pynini(fst, dtype=dtype))

    def to_pynini(
        self,
        *,
        arc_type: str = "standard",
        isymbols: SymbolTable | None = None,
        osymbols: SymbolTable | None = None,
    ) -> Any:
        """Converts to a `pynini.Fst`; scores become costs (negated).

        States keep their numbers and state 0 is the start; a -inf score
        becomes an infinite cost; padding arcs are left out. "standard" and
        "log" weights are float32 (a float64 Fsa is rounded), "log64"
        weights float64.

        Args:
          arc_type: "standard" (tropical), "log" or "log64".
          isymbols: a `sj.SymbolTable` attached as the input symbols.
          osymbols: one attached as the output symbols; an acceptor's
            defaults to `isymbols`.
        Returns:
          A pynini.Fst.
        Raises:
          ImportError: without pynini (`pip install 'semiring_jax[pynini]'`).
          ValueError: for a batched Fsa, an unknown arc type, or a label a
            given table does not hold (naming the arc).
        Examples:
          >>> import semiring_jax as sj
          >>> fst = sj.Fsa.from_arcs([(0, 1, 7, 0.5)], final=[1]).to_pynini(arc_type="log")
          >>> print(fst.arc_type(), fst.num_states(), float(fst.final(1)))
          log 2 0.0
        """
        from semiring_jax._src.io import pynini_fst

        return pynini_fst.to_pynini(
            self._host_arrays("to_pynini"), arc_type=arc_type, isymbols=isymbols, osymbols=osymbols
        )

    def to_dot(
        self,
        *,
        title: str = "",
        isymbols: Any = None,
        osymbols: Any = None,
        show_weights: bool = True,
        arc_values: Any = None,
        value_name: str = "",
        precision: int = 3,
        color: bool = True,
        width: bool = True,
    ) -> str:
        """Graphviz source of the drawing: arcs `ilabel:olabel/score`.

        States are circles, final ones double circles reading `state/score`;
        the start, state 0, is bold. An acceptor's arcs read `label/score`.
        With `arc_values` (any per-arc array, e.g. `sj.arc_posteriors(fsa)`)
        each arc gets a second line `value_name=value` and is coloured from
        light grey to dark blue and widened from the smallest to the largest
        finite value over the real arcs. Padding arcs are never drawn.

        Args:
          title: an optional graph title.
          isymbols, osymbols: symbol tables for the input and output labels:
            `sj.SymbolTable` or any object with `find(int) -> str`, a
            `Mapping[int, str]` or a `Sequence[str]` indexed by label. None
            (default) prints numbers. An acceptor uses only `isymbols`.
          show_weights: write arc and final scores (default True).
          arc_values: float [A] (numpy or concrete jax), one value per
            (padded) arc, or None.
          value_name: the name written before each value, e.g. "p".
          precision: significant digits of scores and values.
          color: colour the arcs by value (with `arc_values`).
          width: set the arcs' pen width by value (with `arc_values`).
        Returns:
          `digraph` source, ending in a newline.
        Raises:
          ValueError: for a batched or traced Fsa, an arc whose label a
            symbol table lacks (naming the arc), arc_values not of shape [A],
            or a precision below 1.
          TypeError: for a symbol table of an unsupported kind.
        Examples:
          >>> import semiring_jax as sj
          >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (0, 1, 2, -0.25)], final=[1])
          >>> print(fsa.to_dot(isymbols=["<eps>", "yes", "no"]).splitlines()[-3])
            0 -> 1 [label = "yes/0.5"];
          >>> source = fsa.to_dot(arc_values=sj.arc_posteriors(fsa), value_name="p",
          ...                     show_weights=False, color=False)
          >>> print(source.splitlines()[-3])
            0 -> 1 [label = "1\\np=0.679", penwidth = 4.00];
        """
        arrays = self._host_arrays("to_dot")
        if arc_values is not None:
            values = checks.concrete(arc_values, "arc_values", "to_dot")
            checks.check_shape(values, "arc_values", "to_dot", (self.num_arcs,), "[A]")
            arc_values = values[checks.concrete(self.arc_mask, "arc_mask", "to_dot").astype(bool)]
        return dot.to_dot(
            arrays,
            title=title,
            isymbols=isymbols,
            osymbols=osymbols,
            show_weights=show_weights,
            arc_values=arc_values,
            value_name=value_name,
            precision=precision,
            color=color,
            width=width,
            fn="to_dot",
        )

    def _repr_svg_(self) -> str | None:
        """SVG for Jupyter through Graphviz's `dot`; None when there is no
        picture (no `dot`, or a batched or traced Fsa): never raises."""
        source = self._dot_or_none()
        return None if source is None else dot.render_svg(source)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Jupyter's display: the SVG picture when `dot` can draw it, else
        the Graphviz source (or, batched or traced, the repr) as text."""
        source = self._dot_or_none()
        svg = None if source is None else dot.render_svg(source)
        if svg is not None:
            bundle = {"image/svg+xml": svg, "text/plain": repr(self)}
        else:
            bundle = {"text/plain": source if source is not None else repr(self)}
        return {
            kind: data
            for kind, data in bundle.items()
            if (not include or kind in include) and not (exclude and kind in exclude)
        }

    def _dot_or_none(self) -> str | None:
        # A display hook must not raise: a batched or traced Fsa (ValueError)
        # or one rebuilt with placeholder leaves (TypeError) has no drawing.
        try:
            return self.to_dot()
        except (ValueError, TypeError):
            return None
