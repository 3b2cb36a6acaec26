"""`Fsa`: a weighted acceptor or transducer as a registered JAX pytree.

Arrays are leaves, the precomputed `Schedule` tables included, so an Fsa
passes through `jax.jit`, `jax.vmap`, `jax.grad` and `jax.device_put`. The
only static metadata are small Python values (whether it is an acceptor, a
cycle if it has one, and the sizes its tables were built at); padded sizes
are read from array shapes.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.array_types import ArrayLeaf
from semiring_jax._src.core.host import build, dense_tables, levels, schedule_tables
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.io.host import dot, openfst_text
from semiring_jax._src.io.host.symbols import SymbolTable

__all__ = ["Built", "Entry", "Fsa", "Shapes", "assemble", "build_tables", "from_tables"]


_STRUCTURE_FIELDS = ("src", "dst", "arc_mask")
_FREE_FIELDS = ("ilabel", "olabel", "weight", "final_weight", "final_mask")


class Shapes(NamedTuple):
    """The padded sizes an Fsa's tables were built at, as the builders chose
    them: static metadata, which `sj.save` stores so that `sj.load` builds
    the same tables again.

    Attributes:
      schedule: the level tables' `ScheduleShape`; None for a cyclic Fsa
        (it has none) or where the sizes are not known.
      dense: the dense-intersection tables' `DenseShape`; None where the
        sizes are not known.
    """

    schedule: Any = None
    dense: Any = None


# No sizes known (or chosen): the builders choose them.
UNKNOWN_SHAPES = Shapes()


# eq=False: comparing or hashing arrays field by field is ill-defined;
# compare pytrees with chex.assert_trees_all_equal instead.
@dataclasses.dataclass(frozen=True, eq=False)
class Fsa:
    """A weighted finite-state acceptor or transducer; start state 0.

    Weights are scores (log domain, higher is better). Build one with
    `Fsa.from_arcs`, `Fsa.from_openfst`, `Fsa.from_k2` or `sj.linear_fsa`;
    change weights with `replace`. A batched Fsa (from `sj.stack`) has a
    leading batch axis [B] on every array.

    Which states are final is structure, `final_mask`, as which arcs exist
    is `arc_mask`: the score ops read `final_weight` only where
    `final_mask` is True and `weight` only where `arc_mask` is True, and
    take the semiring's zero elsewhere. So the values stored there (-inf)
    never matter, and another semiring's weights (e.g. the real semiring,
    zero 0.0) are given with `replace(weight=..., final_weight=...)` on an
    Fsa built with the right final states.

    Attributes:
      src, dst: int32 [A], arc source and destination states.
      ilabel, olabel: int32 [A], input and output labels.
      weight: float [A], arc scores (-inf on padding arcs).
      final_weight: float [S], stopping scores, -inf where not final.
      arc_mask: bool [A], False on padding arcs.
      final_mask: bool [S], True on final states (False on padding states).
      schedule: the index tables the score recursions gather through.
        A structural op's result builds them (and finds `cycle` and
        `shapes`) when first needed, once: by a score op, `jax.jit` or any
        other flattening, `sj.stack` or `sj.save`; so the intermediate
        results of a chain of structural ops never build any.
      cycle: static; () if acyclic, else the states of one cycle.
      is_acceptor: static; True for an acceptor (olabel == ilabel).
      shapes: static; the padded sizes the tables were built at (`Shapes`),
        which `sj.save` stores.

    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 3, 0.5), (1, 2, 4, -1.0)], final=[2])
      >>> fsa
      Fsa(acceptor, num_states=3, num_arcs=2)
      >>> print(fsa.weight)
      [ 0.5 -1. ]
    """

    src: ArrayLeaf
    dst: ArrayLeaf
    ilabel: ArrayLeaf
    olabel: ArrayLeaf
    weight: ArrayLeaf
    final_weight: ArrayLeaf
    arc_mask: ArrayLeaf
    final_mask: ArrayLeaf
    schedule: Schedule
    cycle: tuple[int, ...] = ()
    is_acceptor: bool = True
    shapes: Shapes = UNKNOWN_SHAPES

    if not TYPE_CHECKING:  # (mypy would take every attribute name for one of these)

        def __getattr__(self, name: str) -> Any:
            # Reached only for an attribute the instance lacks: the tables of
            # an Fsa made with `assemble(..., defer=True)`, built here, once.
            pending = self.__dict__.get("_pending")
            if pending is None or name not in _BUILT_FIELDS:
                raise AttributeError(f"'Fsa' object has no attribute {name!r}")
            _build_pending(self, pending)
            return self.__dict__[name]

    # -- shape information, read from the arrays -------------------------------

    @property
    def num_states(self) -> int:
        """Padded number of states S."""
        return int(np.shape(self.final_weight)[-1])

    @property
    def num_arcs(self) -> int:
        """Padded number of arcs A."""
        return int(np.shape(self.src)[-1])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading batch axes: () for a single Fsa, (B,) for a stacked one."""
        return tuple(np.shape(self.src)[:-1])

    @property
    def label(self) -> ArrayLeaf:
        """The input label, int32 [A] (an acceptor's only label)."""
        return self.ilabel

    @property
    def dtype(self) -> np.dtype:
        """The float dtype of the weights."""
        return np.dtype(self.weight.dtype)

    # -- constructors ----------------------------------------------------------

    @classmethod
    def from_arcs(
        cls,
        arcs: Any,
        final: Mapping[int, float] | Sequence[int],
        *,
        num_states: int | None = None,
        start: int = 0,
        dtype: Any = np.float32,
    ) -> Fsa:
        """Builds an Fsa from arc tuples and final states.

        Args:
          arcs: a sequence (or [A, 4] / [A, 5] array) of `(src, dst, label,
            weight)` acceptor arcs or `(src, dst, ilabel, olabel, weight)`
            transducer arcs. Weights are scores; -inf is allowed.
          final: `{state: weight}`, or a sequence of states (weight 0.0):
            the final states (`final_mask`), a weight of -inf included.
          num_states: S, at most `2**31 - 1`; by default one more than the
            largest state named, which must then be below 2 A + F + 1 +
            `2**20` (A arcs, F final states), so that memory stays
            proportional to the input; pass it for a sparser numbering.
          start: the start state; states `start` and 0 are swapped so that
            the start becomes state 0.
          dtype: float32 (default) or float64 (needs jax_enable_x64).
        Returns:
          An unbatched Fsa that keeps the given arc order.
        Raises:
          ValueError: naming the arc or state at fault, for an out-of-range
            state, a negative or non-integer label, a state or label above
            `2**31 - 1` (int32), a NaN or +inf weight, a finite weight that
            rounds to +inf or -inf in `dtype`, or arcs of mixed arity.
        Examples:
          >>> import semiring_jax as sj
          >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 2, 0.5)], final={1: -0.25})
          >>> fsa.is_acceptor, fsa.num_states, fsa.num_arcs
          (False, 2, 1)
        """
        dtype = checks.check_float_dtype(dtype, "dtype", "from_arcs")
        # The first row stands for all: checking every value would cost a
        # Python loop over the arcs.
        first_row = arcs[0] if isinstance(arcs, (list, tuple)) and len(arcs) else ()
        for value in [arcs, *first_row]:
            checks.check_not_traced(value, "arcs", "from_arcs")
        checks.check_not_traced(final, "final", "from_arcs")
        arrays = build.arcs_from_rows(
            arcs, final, num_states=num_states, start=start, dtype=dtype, fn="from_arcs"
        )
        return assemble(arrays)

    @classmethod
    def from_openfst(
        cls,
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
        return assemble(arrays)

    @classmethod
    def read_openfst(
        cls,
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
        return assemble(arrays)

    @classmethod
    def from_k2(cls, text: str, *, dtype: Any = np.float32) -> Fsa:
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
        return assemble(openfst_text.parse_k2(text, dtype=dtype))

    # -- conversions -----------------------------------------------------------

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
    def from_pynini(cls, fst: Any, *, dtype: Any = np.float32) -> Fsa:
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
        return assemble(pynini_fst.from_pynini(fst, dtype=dtype))

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

    def __repr__(self) -> str:
        kind = "acceptor" if self.is_acceptor else "transducer"
        batch = f", batch_shape={self.batch_shape}" if self.batch_shape else ""
        cyclic = ", cyclic" if self.cycle else ""
        return f"Fsa({kind}, num_states={self.num_states}, num_arcs={self.num_arcs}{batch}{cyclic})"

    # -- functional update -----------------------------------------------------

    def replace(self, **fields: Any) -> Fsa:
        """A copy with some fields replaced; the input is unchanged.

        `weight`, `final_weight`, `ilabel` and `olabel` may be traced (this is
        how a jitted function feeds in weights); their shapes and dtypes are
        checked, their values only when concrete. Replacing `src`, `dst` or
        `arc_mask` changes the structure: they must be concrete and the
        schedule is rebuilt.

        Replacing `final_weight` keeps which states are final, as replacing
        `weight` keeps the arcs, whether the new values are traced or not:
        a -inf value leaves a state final with weight zero, and a value at a
        non-final state is ignored (read as the semiring's zero). To change
        which states are final, replace `final_mask` (bool [..., S]; the
        structural ops need it concrete).

        Args:
          **fields: new values, by field name.
        Returns:
          A new Fsa.
        Raises:
          TypeError: for an unknown field name.
          ValueError: for a wrong shape or dtype, a NaN or +inf weight, a
            state or label outside [0, 2**31 - 1] in a numpy array or a
            concrete one of another dtype than int32 (checked at its full
            width, e.g. int64, then stored as int32; naming the arc), or a
            traced structure field.
        Examples:
          >>> import jax.numpy as jnp
          >>> import semiring_jax as sj
          >>> weight = jnp.array([0.5, 0.25], dtype=jnp.float32)
          >>> fsa = sj.linear_fsa([1, 2]).replace(weight=weight)
          >>> print(float(sj.tot_score(fsa)))
          0.75
          >>> real = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply,
          ...                    sum=jnp.sum, zero=0.0, one=1.0)
          >>> fsa = fsa.replace(final_weight=jnp.array([0, 0, 0.5], jnp.float32))  # real
          >>> print(float(sj.tot_score(fsa, real)))
          0.0625
        """
        unknown = set(fields) - set(_STRUCTURE_FIELDS) - set(_FREE_FIELDS)
        if unknown:
            raise TypeError(
                f"replace: unknown field(s) {sorted(unknown)}; expected some of "
                f"{list(_FREE_FIELDS + _STRUCTURE_FIELDS)}"
            )
        arc_shape = (*self.batch_shape, self.num_arcs)
        for name, value in fields.items():
            per_state = name in ("final_weight", "final_mask")
            expected = (*self.batch_shape, self.num_states) if per_state else arc_shape
            checks.check_shape(
                value, name, "replace", expected, "[..., S]" if per_state else "[..., A]"
            )
        fields = {name: _as_array(v) for name, v in fields.items()}
        if "final_mask" in fields and fields["final_mask"].dtype != np.bool_:
            raise ValueError(f"replace: final_mask must be bool, got {fields['final_mask'].dtype}")
        for name in set(fields) & {"ilabel", "olabel", "src", "dst"}:
            if not np.issubdtype(fields[name].dtype, np.integer):
                raise ValueError(f"replace: {name} must hold integers, got {fields[name].dtype}")
            # At full width before the cast to int32, so that int64
            # 2**32 + 1 is not state 1. Traced values cannot be checked, and
            # a JAX int32 array (as eager `best_path` makes) is not copied to
            # the host for it: it needs no cast.
            value = fields[name]
            is_jax_int32 = isinstance(value, jax.Array) and value.dtype == np.int32
            if not checks.is_traced(value) and not is_jax_int32:
                fields[name] = build.check_int32_field(np.asarray(value), "replace", name)
        new = _with_fields(self, fields)
        _check_weight_dtypes(new)
        for name in ("weight", "final_weight"):
            value = getattr(new, name)
            if name in fields and not checks.is_traced(value):
                build.check_weights(
                    np.asarray(value).reshape(-1),
                    "replace",
                    "arc" if name == "weight" else "final state",
                )
        if set(fields) & set(_STRUCTURE_FIELDS):
            new = _rebuild(new)
        return new


jax.tree_util.register_dataclass(
    Fsa,
    data_fields=[
        "src",
        "dst",
        "ilabel",
        "olabel",
        "weight",
        "final_weight",
        "arc_mask",
        "final_mask",
        "schedule",
    ],
    meta_fields=["cycle", "is_acceptor", "shapes"],
)


# A dataclass default is a class attribute, which would answer for an
# unbuilt Fsa's `cycle` and `shapes` before `__getattr__` could build them;
# `__init__` keeps the defaults.
del Fsa.cycle, Fsa.shapes

# What `_build_pending` sets on an Fsa made unbuilt.
_BUILT_FIELDS = ("schedule", "cycle", "shapes")


class _Pending(NamedTuple):
    """What an unbuilt Fsa builds its tables from."""

    entry: Entry
    real_sizes: np.ndarray  # int32 [2]


def _build_pending(fsa: Fsa, pending: _Pending) -> None:
    """Builds an unbuilt Fsa's tables and sets them on it (memoised derived
    data: the Fsa's value does not change)."""
    built = build_tables([pending.entry])
    schedule = Schedule(**built.tables[0], real_sizes=pending.real_sizes)
    for name, value in zip(_BUILT_FIELDS, (schedule, built.cycle, built.shapes)):
        object.__setattr__(fsa, name, value)
    fsa.__dict__.pop("_pending", None)


def _with_fields(fsa: Fsa, fields: dict[str, Any]) -> Fsa:
    """`dataclasses.replace`, but an unbuilt Fsa whose structure stays
    stays unbuilt (replace reads every field, which would build it)."""
    if "_pending" not in fsa.__dict__ or set(fields) & set(_STRUCTURE_FIELDS):
        return dataclasses.replace(fsa, **fields)
    new = copy.copy(fsa)
    for name, value in fields.items():
        object.__setattr__(new, name, value)
    return new


def _as_array(value: Any) -> Any:
    return value if isinstance(value, (jax.Array, np.ndarray)) else np.asarray(value)


def _check_weight_dtypes(fsa: Fsa) -> None:
    weight_dtype = checks.check_float_dtype(fsa.weight.dtype, "weight", "replace")
    final_dtype = checks.check_float_dtype(fsa.final_weight.dtype, "final_weight", "replace")
    if weight_dtype != final_dtype:
        raise ValueError(
            f"replace: weight is {weight_dtype} but final_weight is {final_dtype}; "
            f"both must have the same dtype"
        )


def _rebuild(fsa: Fsa) -> Fsa:
    """Recomputes the schedule after a structural `replace`."""
    if fsa.batch_shape:
        raise ValueError(
            "replace: src, dst and arc_mask of a batched Fsa cannot be replaced; "
            "replace them per entry and sj.stack again"
        )
    src = checks.concrete(fsa.src, "src", "replace").astype(np.int32)
    dst = checks.concrete(fsa.dst, "dst", "replace").astype(np.int32)
    arc_mask = checks.concrete(fsa.arc_mask, "arc_mask", "replace").astype(bool)
    for name, values in (("src", src), ("dst", dst)):
        bad = np.flatnonzero((values < 0) | (values >= fsa.num_states))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"replace: arc {i} has {name}={values[i]} but num_states={fsa.num_states}"
            )
    built = build_tables([Entry(fsa.num_states, src, dst, arc_mask)])
    real_sizes = np.array([fsa.num_states, fsa.num_arcs], np.int32)
    return dataclasses.replace(
        fsa,
        src=src,
        dst=dst,
        arc_mask=arc_mask,
        schedule=Schedule(**built.tables[0], real_sizes=real_sizes),
        cycle=built.cycle,
        shapes=built.shapes,
    )


class Entry(NamedTuple):
    """One FSA's structure as the table builders take it."""

    num_states: int  # S (padded)
    src: np.ndarray  # int32 [A] (padded)
    dst: np.ndarray  # int32 [A]
    arc_mask: np.ndarray  # bool [A]


class Built(NamedTuple):
    """The tables of a batch's entries, each built once, at common sizes."""

    tables: list[dict[str, np.ndarray]]  # per entry, every Schedule field but real_sizes
    cycle: tuple[int, ...]  # the first cyclic entry's cycle; () if none
    shapes: Shapes


def _identity(size: int) -> int:
    return size


def _path_lengths(entry: Entry) -> levels.PathLengths | None:
    return levels.path_lengths(
        entry.num_states, entry.src[entry.arc_mask], entry.dst[entry.arc_mask], height=False
    )


def build_tables(
    entries: Sequence[Entry],
    *,
    round_up: Callable[[int], int] = _identity,
    shapes: Shapes = UNKNOWN_SHAPES,
    lengths: Sequence[levels.PathLengths | None] | None = None,
    cycle: tuple[int, ...] = (),
) -> Built:
    """Every entry's tables, each built once, at sizes common to all.

    The longest paths of each entry are found once (unless given) and both
    prove it acyclic and seed its levels. One cyclic entry leaves every
    entry without level tables (zero-sized) and gives the batch its cycle;
    the dense tables are built for cyclic entries too.

    Args:
      entries: each entry's structure, all of one S and A (padded).
      round_up: applied to every size the builders choose (a bucketing
        ladder); not to given `shapes`.
      shapes: sizes to build at instead of choosing them (either may be
        None: chosen); `sj.load` gives a file's.
      lengths: `levels.path_lengths` of each entry's real arcs, if known.
      cycle: a cycle the caller knows the batch to have (a file's): no
        longest paths are sought and no level tables built.
    Returns:
      The tables of each entry, the batch's cycle, and the sizes used.
    Raises:
      ValueError: from the builders, if given level sizes are too small.
    """
    found = list(lengths) if lengths is not None else []
    if not cycle and lengths is None:
        for entry in entries:
            found.append(_path_lengths(entry))
            if found[-1] is None:  # the batch is cyclic: no level tables for any
                break
    cyclic = next((i for i, entry_lengths in enumerate(found) if entry_lengths is None), None)
    if not cycle and cyclic is not None:
        entry = entries[cyclic]
        cycle = levels.find_cycle(
            entry.num_states, entry.src[entry.arc_mask], entry.dst[entry.arc_mask]
        )
    level_shape = None
    if cycle:
        level_tables = [
            schedule_tables.empty_schedule_arrays(e.num_states, e.src.shape[0]) for e in entries
        ]
    elif shapes.schedule is not None:
        level_shape = shapes.schedule
        level_tables = [
            schedule_tables.build_schedule_arrays(*entry, shape=level_shape, lengths=entry_lengths)
            for entry, entry_lengths in zip(entries, found)
        ]
    else:
        common = schedule_tables.build_common(entries, round_up, found)
        assert common is not None  # every entry is acyclic
        level_shape, level_tables = common
    dense, dense_shape = _dense_tables(entries, shapes.dense)
    tables = [dict(level, **by_state) for level, by_state in zip(level_tables, dense)]
    return Built(tables, cycle, Shapes(level_shape, dense_shape))


def _dense_tables(entries: Sequence[Entry], shape: Any) -> tuple[list[dict[str, np.ndarray]], Any]:
    """Each entry's dense-intersection tables at `shape` (the entries'
    common sizes if None), and the shape."""
    if shape is None:
        shape = dense_tables.common_dense_shape(
            [dense_tables.dense_shape(*entry) for entry in entries]
        )
    return [dense_tables.build_dense_tables(*entry, shape=shape) for entry in entries], shape


def _at_levels(entry: Entry, known_levels: np.ndarray) -> Built:
    """The tables of an internal graph at levels its builder knows (every
    arc goes up them): no longest paths, no balancing; its level sizes are
    not recorded (the builder chooses them from the levels)."""
    level = schedule_tables.build_schedule_arrays(*entry, levels=known_levels)
    (by_state,), dense_shape = _dense_tables([entry], None)
    return Built([dict(level, **by_state)], (), Shapes(None, dense_shape))


def from_tables(
    arrays: build.ArcArrays,
    arc_mask: np.ndarray,
    final_mask: np.ndarray,
    real_sizes: np.ndarray,
    built: Built | None,
) -> Fsa:
    """The Fsa of validated arrays and their prebuilt tables (entry 0 of
    `built`); with `built` None, an unbuilt one, which builds its tables
    when first needed (`Fsa.schedule`) or has `sj.stack` build them."""
    fsa = Fsa(
        src=arrays.src,
        dst=arrays.dst,
        ilabel=arrays.ilabel,
        olabel=arrays.olabel,
        weight=arrays.weight,
        final_weight=arrays.final_weight,
        arc_mask=arc_mask,
        final_mask=np.asarray(final_mask, bool),
        # An unbuilt Fsa's `schedule` is removed below, for `__getattr__` to build.
        schedule=None if built is None else Schedule(**built.tables[0], real_sizes=real_sizes),  # type: ignore[arg-type]
        cycle=() if built is None else built.cycle,
        is_acceptor=arrays.is_acceptor,
        shapes=UNKNOWN_SHAPES if built is None else built.shapes,
    )
    if built is None:
        for name in _BUILT_FIELDS:
            object.__delattr__(fsa, name)
        entry = Entry(arrays.num_states, arrays.src, arrays.dst, arc_mask)
        object.__setattr__(fsa, "_pending", _Pending(entry, real_sizes))
    return fsa


def is_built(fsa: Fsa) -> bool:
    """False for an Fsa made with `assemble(..., defer=True)` whose tables
    nothing has needed yet."""
    return "_pending" not in fsa.__dict__


def assemble(
    arrays: build.ArcArrays,
    *,
    arc_mask: np.ndarray | None = None,
    shape: schedule_tables.ScheduleShape | None = None,
    real_sizes: tuple[int, int] | None = None,
    known_levels: np.ndarray | None = None,
    defer: bool = False,
) -> Fsa:
    """An Fsa from validated host arrays, with its schedule computed.

    Args:
      arrays: validated structure and weights.
      arc_mask: bool [A]; all True by default.
      shape: pad the schedule to these sizes (e.g. a batch's).
      real_sizes: (states, arcs) before padding; the array sizes by default.
      known_levels: int [S], levels that every arc goes up, for internal
        graphs whose builder knows them (no longest-path or balancing
        passes; a ValueError if an arc does not go up).
      defer: build nothing yet: the Fsa builds its tables when first
        needed (see `Fsa.schedule`), or `sj.stack` builds every entry's at
        once, at the batch's sizes; what structural ops return.
    """
    num_arcs = arrays.src.shape[0]
    if arc_mask is None:
        arc_mask = np.ones(num_arcs, dtype=bool)
    final_mask = arrays.final_mask
    if final_mask is None:  # the format's own rule: a weight > -inf is final
        final_mask = checks.concrete(arrays.final_weight, "final_weight", "assemble") > -np.inf
    if real_sizes is None:
        real_sizes = (arrays.num_states, num_arcs)
    if defer:
        return from_tables(arrays, arc_mask, final_mask, np.asarray(real_sizes, np.int32), None)
    entry = Entry(arrays.num_states, arrays.src, arrays.dst, arc_mask)
    if known_levels is not None:
        built = _at_levels(entry, known_levels)
    else:
        built = build_tables([entry], shapes=Shapes(shape))
    return from_tables(arrays, arc_mask, final_mask, np.asarray(real_sizes, np.int32), built)
