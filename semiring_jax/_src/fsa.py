"""`Fsa`: a weighted acceptor or transducer as a registered JAX pytree.

Arrays are leaves, the precomputed `Schedule` tables included, so an Fsa
passes through `jax.jit`, `jax.vmap`, `jax.grad` and `jax.device_put`. The
only static metadata are two small Python values (whether it is an acceptor,
and a cycle if it has one); padded sizes are read from array shapes.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from typing import Any, Mapping, Optional, Sequence, Union

import jax
import numpy as np

from semiring_jax._src import checks
from semiring_jax._src.schedule import Schedule
from semiring_jax._src.host import arc_tables, build, dot, levels, schedule, text_io

__all__ = ["Fsa", "assemble"]


_STRUCTURE_FIELDS = ("src", "dst", "arc_mask")
_FREE_FIELDS = ("ilabel", "olabel", "weight", "final_weight")


# eq=False: comparing or hashing arrays field by field is ill-defined;
# compare pytrees with chex.assert_trees_all_equal instead.
@dataclasses.dataclass(frozen=True, eq=False)
class Fsa:
    """A weighted finite-state acceptor or transducer; start state 0.

    Weights are scores (log domain, higher is better). Build one with
    `Fsa.from_arcs`, `Fsa.from_openfst`, `Fsa.from_k2` or `sj.linear_fsa`;
    change weights with `replace`. A batched Fsa (from `sj.stack`) has a
    leading batch axis [B] on every array.

    Attributes:
      src, dst: int32 [A], arc source and destination states.
      ilabel, olabel: int32 [A], input and output labels.
      weight: float [A], arc scores (-inf on padding arcs).
      final_weight: float [S], stopping scores, -inf where not final.
      arc_mask: bool [A], False on padding arcs.
      schedule: the index tables the score recursions gather through.
      cycle: static; () if acyclic, else the states of one cycle.
      is_acceptor: static; True for an acceptor (olabel == ilabel).

    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 3, 0.5), (1, 2, 4, -1.0)], final=[2])
      >>> fsa
      Fsa(acceptor, num_states=3, num_arcs=2)
      >>> print(fsa.weight)
      [ 0.5 -1. ]
    """

    src: jax.Array
    dst: jax.Array
    ilabel: jax.Array
    olabel: jax.Array
    weight: jax.Array
    final_weight: jax.Array
    arc_mask: jax.Array
    schedule: Schedule
    cycle: tuple[int, ...] = ()
    is_acceptor: bool = True

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
    def label(self) -> jax.Array:
        """The input label, int32 [A] (an acceptor's only label)."""
        return self.ilabel

    @property
    def dtype(self) -> np.dtype:
        """The float dtype of the weights."""
        return np.dtype(self.weight.dtype)

    # -- constructors ----------------------------------------------------------

    @classmethod
    def from_arcs(cls, arcs: Any, final: Union[Mapping[int, float], Sequence[int]], *,
                  num_states: Optional[int] = None, start: int = 0,
                  dtype: Any = np.float32) -> "Fsa":
        """Builds an Fsa from arc tuples and final states.

        Args:
          arcs: a sequence (or [A, 4] / [A, 5] array) of `(src, dst, label,
            weight)` acceptor arcs or `(src, dst, ilabel, olabel, weight)`
            transducer arcs. Weights are scores; -inf is allowed.
          final: `{state: weight}`, or a sequence of states (weight 0.0).
          num_states: S; by default one more than the largest state named.
          start: the start state; states `start` and 0 are swapped so that
            the start becomes state 0.
          dtype: float32 (default) or float64 (needs jax_enable_x64).
        Returns:
          An unbatched Fsa that keeps the given arc order.
        Raises:
          ValueError: naming the arc or state at fault, for an out-of-range
            state, a negative or non-integer label, a NaN or +inf weight, or
            arcs of mixed arity.
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
        arrays = build.arcs_from_rows(arcs, final, num_states=num_states, start=start,
                                      dtype=dtype, fn="from_arcs")
        return assemble(arrays)

    @classmethod
    def from_openfst(cls, text: str, *, acceptor: Optional[bool] = None,
                     dtype: Any = np.float32) -> "Fsa":
        """Reads OpenFst's AT&T text format; costs become scores (negated).

        Arc lines are `src dst ilabel olabel [cost]` (transducer) or
        `src dst label [cost]` (acceptor); final lines are `state [cost]`.
        The first line's source is the start state (renumbered to 0 as in
        `from_arcs`). With `acceptor=None`, 3-field arc lines are acceptor
        arcs and 5-field lines transducer arcs; a 4-field line is a
        transducer arc without cost (as `fstcompile` reads it) unless its
        last field is not an integer, in which case it is an acceptor cost.
        Empty text is the empty FSA (one state, not final).

        Args:
          text: the text, one arc or final state per line.
          acceptor: force acceptor (True) or transducer (False) reading.
          dtype: float32 (default) or float64.
        Returns:
          An unbatched Fsa.
        Raises:
          ValueError: for a malformed line, naming its line number.
        Examples:
          >>> import semiring_jax as sj
          >>> fsa = sj.Fsa.from_openfst("0 1 7 0.5\\n1 2 8 1.0\\n2\\n")
          >>> print(fsa.weight, fsa.final_weight)
          [-0.5 -1. ] [-inf -inf   0.]
        """
        dtype = checks.check_float_dtype(dtype, "dtype", "from_openfst")
        return assemble(text_io.parse_openfst(text, acceptor=acceptor, dtype=dtype))

    @classmethod
    def from_k2(cls, text: str, *, dtype: Any = np.float32) -> "Fsa":
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
          ValueError: for a malformed line (with its number), a -1 arc that
            does not enter the final state, an arc leaving the final state,
            or two -1 arcs from one state.
        Examples:
          >>> import semiring_jax as sj
          >>> fsa = sj.Fsa.from_k2("0 1 5 0.5\\n1 2 -1 0.25\\n2\\n")
          >>> print(fsa.num_states, fsa.final_weight)
          2 [-inf 0.25]
        """
        dtype = checks.check_float_dtype(dtype, "dtype", "from_k2")
        return assemble(text_io.parse_k2(text, dtype=dtype))

    # -- conversions -----------------------------------------------------------

    def _host_arrays(self, fn: str) -> build.ArcArrays:
        if self.batch_shape:
            raise ValueError(
                f"{fn}: takes an unbatched Fsa, got batch_shape={self.batch_shape}; "
                f"use sj.unstack(batch)[i]")
        real = checks.concrete(self.arc_mask, "arc_mask", fn).astype(bool)
        pick = lambda field: checks.concrete(getattr(self, field), field, fn)[real]
        return build.ArcArrays(
            self.num_states, pick("src"), pick("dst"), pick("ilabel"), pick("olabel"),
            pick("weight"), checks.concrete(self.final_weight, "final_weight", fn),
            self.is_acceptor)

    def to_openfst(self) -> str:
        """Writes OpenFst's AT&T text format (scores negated to costs).

        Arcs leaving state 0 come first, so that `fstcompile` takes it as the
        start; otherwise arc order is kept. Padding arcs are left out.

        Returns:
          The text, ending in a newline.
        Examples:
          >>> import semiring_jax as sj
          >>> text = sj.Fsa.from_arcs([(0, 1, 7, 0.5)], final=[1]).to_openfst()
          >>> print(text, end="")  # doctest: +NORMALIZE_WHITESPACE
          0	1	7	-0.5
          1	0.0
        """
        return text_io.format_openfst(self._host_arrays("to_openfst"))

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
        return text_io.format_k2(self._host_arrays("to_k2"))

    def to_dot(self, *, title: str = "") -> str:
        """Graphviz source of the drawing: arcs `label:olabel/score`.

        Args:
          title: an optional graph title.
        Returns:
          `digraph` source; final states are double circles `state/score`.
        Examples:
          >>> import semiring_jax as sj
          >>> print(sj.linear_fsa([5]).to_dot().splitlines()[0])
          digraph FSA {
        """
        return dot.to_dot(self._host_arrays("to_dot"), title=title)

    def _repr_svg_(self) -> Optional[str]:
        """SVG for Jupyter, through Graphviz's `dot`; None if it is missing."""
        if self.batch_shape or shutil.which("dot") is None:
            return None
        result = subprocess.run(["dot", "-Tsvg"], input=self.to_dot(), text=True,
                                capture_output=True, check=False)
        return result.stdout if result.returncode == 0 else None

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        svg = self._repr_svg_()
        if svg is not None:
            return {"image/svg+xml": svg}
        return {"text/plain": self.to_dot() if not self.batch_shape else repr(self)}

    def __repr__(self) -> str:
        kind = "acceptor" if self.is_acceptor else "transducer"
        batch = f", batch_shape={self.batch_shape}" if self.batch_shape else ""
        cyclic = ", cyclic" if self.cycle else ""
        return f"Fsa({kind}, num_states={self.num_states}, num_arcs={self.num_arcs}{batch}{cyclic})"

    # -- functional update -----------------------------------------------------

    def replace(self, **fields: Any) -> "Fsa":
        """A copy with some fields replaced; the input is unchanged.

        `weight`, `final_weight`, `ilabel` and `olabel` may be traced (this is
        how a jitted function feeds in weights); their shapes and dtypes are
        checked, their values only when concrete. Replacing `src`, `dst` or
        `arc_mask` changes the structure: they must be concrete and the
        schedule is rebuilt.

        Args:
          **fields: new values, by field name.
        Returns:
          A new Fsa.
        Raises:
          TypeError: for an unknown field name.
          ValueError: for a wrong shape or dtype, a NaN or +inf weight, or a
            traced structure field.
        Examples:
          >>> import jax.numpy as jnp
          >>> import semiring_jax as sj
          >>> weight = jnp.array([0.5, 0.25], dtype=jnp.float32)
          >>> fsa = sj.linear_fsa([1, 2]).replace(weight=weight)
          >>> print(float(sj.tot_score(fsa)))
          0.75
        """
        unknown = set(fields) - set(_STRUCTURE_FIELDS) - set(_FREE_FIELDS)
        if unknown:
            raise TypeError(
                f"replace: unknown field(s) {sorted(unknown)}; expected some of "
                f"{list(_FREE_FIELDS + _STRUCTURE_FIELDS)}")
        arc_shape = self.batch_shape + (self.num_arcs,)
        for name, value in fields.items():
            expected = self.batch_shape + (self.num_states,) if name == "final_weight" else arc_shape
            checks.check_shape(value, name, "replace", expected,
                               "[..., S]" if name == "final_weight" else "[..., A]")
        for name in set(fields) & {"ilabel", "olabel", "src", "dst"}:
            if not np.issubdtype(np.result_type(fields[name]), np.integer):
                raise ValueError(f"replace: {name} must hold integers, got "
                                 f"{np.result_type(fields[name])}")
        new = dataclasses.replace(self, **{name: _as_array(v) for name, v in fields.items()})
        _check_weight_dtypes(new)
        for name in ("weight", "final_weight"):
            value = getattr(new, name)
            if name in fields and not checks.is_traced(value):
                build.check_weights(np.asarray(value).reshape(-1), "replace",
                                    "arc" if name == "weight" else "final state")
        if set(fields) & set(_STRUCTURE_FIELDS):
            new = _rebuild(new)
        return new


jax.tree_util.register_dataclass(
    Fsa, data_fields=["src", "dst", "ilabel", "olabel", "weight", "final_weight",
                      "arc_mask", "schedule"],
    meta_fields=["cycle", "is_acceptor"])


def _as_array(value: Any) -> Any:
    return value if isinstance(value, (jax.Array, np.ndarray)) else np.asarray(value)


def _check_weight_dtypes(fsa: Fsa) -> None:
    weight_dtype = checks.check_float_dtype(fsa.weight.dtype, "weight", "replace")
    final_dtype = checks.check_float_dtype(fsa.final_weight.dtype, "final_weight", "replace")
    if weight_dtype != final_dtype:
        raise ValueError(
            f"replace: weight is {weight_dtype} but final_weight is {final_dtype}; "
            f"both must have the same dtype")


def _rebuild(fsa: Fsa) -> Fsa:
    """Recomputes the schedule after a structural `replace`."""
    if fsa.batch_shape:
        raise ValueError(
            "replace: src, dst and arc_mask of a batched Fsa cannot be replaced; "
            "replace them per entry and sj.stack again")
    src = checks.concrete(fsa.src, "src", "replace").astype(np.int32)
    dst = checks.concrete(fsa.dst, "dst", "replace").astype(np.int32)
    arc_mask = checks.concrete(fsa.arc_mask, "arc_mask", "replace").astype(bool)
    for name, values in (("src", src), ("dst", dst)):
        bad = np.flatnonzero((values < 0) | (values >= fsa.num_states))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"replace: arc {i} has {name}={values[i]} but num_states={fsa.num_states}")
    rebuilt = _schedule_fields(fsa.num_states, src, dst, arc_mask, None,
                         np.array([fsa.num_states, fsa.num_arcs], np.int32))
    return dataclasses.replace(fsa, src=src, dst=dst, arc_mask=arc_mask, **rebuilt)


def _schedule_fields(num_states: int, src: np.ndarray, dst: np.ndarray, arc_mask: np.ndarray,
               shape: Optional[schedule.ScheduleShape], real_sizes: np.ndarray
               ) -> dict[str, Any]:
    """The `schedule` and `cycle` fields for the given structure."""
    real_src, real_dst = src[arc_mask], dst[arc_mask]
    cycle = levels.find_cycle(num_states, real_src, real_dst)
    if cycle:
        tables = schedule.empty_schedule_arrays(num_states, src.shape[0])
    else:
        tables = schedule.build_schedule_arrays(num_states, src, dst, arc_mask, shape)
    by_state = dict(state_in_arcs=arc_tables.arcs_by_state(num_states, dst, arc_mask),
                    state_out_arcs=arc_tables.arcs_by_state(num_states, src, arc_mask))
    return dict(schedule=Schedule(**tables, real_sizes=real_sizes, **by_state), cycle=cycle)


def assemble(arrays: build.ArcArrays, *, arc_mask: Optional[np.ndarray] = None,
             shape: Optional[schedule.ScheduleShape] = None,
             real_sizes: Optional[tuple[int, int]] = None) -> Fsa:
    """An Fsa from validated host arrays, with its schedule computed.

    Args:
      arrays: validated structure and weights.
      arc_mask: bool [A]; all True by default.
      shape: pad the schedule to at least these sizes (for stacking).
      real_sizes: (states, arcs) before padding; the array sizes by default.
    """
    num_arcs = arrays.src.shape[0]
    if arc_mask is None:
        arc_mask = np.ones(num_arcs, dtype=bool)
    if real_sizes is None:
        real_sizes = (arrays.num_states, num_arcs)
    structure = _schedule_fields(arrays.num_states, arrays.src, arrays.dst, arc_mask, shape,
                           np.asarray(real_sizes, np.int32))
    return Fsa(src=arrays.src, dst=arrays.dst, ilabel=arrays.ilabel, olabel=arrays.olabel,
               weight=arrays.weight, final_weight=arrays.final_weight, arc_mask=arc_mask,
               is_acceptor=arrays.is_acceptor, **structure)

