"""`Fsa`: a weighted acceptor or transducer as a registered JAX pytree.

Arrays are leaves, the precomputed `Schedule` tables included, so an Fsa
passes through `jax.jit`, `jax.vmap`, `jax.grad` and `jax.device_put`. The
only static metadata are small Python values (whether it is an acceptor, a
cycle if it has one, and the sizes its tables were built at); padded sizes
are read from array shapes.

The tables (`schedule`, `cycle`, `shapes`) are one explicit field,
`tables` (`core/tables.py`): built by `assemble` where the Fsa is made, or,
for the Fsas that often never need them (structural ops' results, a
batch's entries: `assemble(..., defer=True)`), deferred and built from the
structure when first read. The reading and writing of other formats are
the methods of the base class `Conversions` (`io/conversions.py`); the
host-side table builders are `core/host/fsa_tables.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.array_types import ArrayLeaf
from semiring_jax._src.core.host import build, fsa_tables, schedule_tables
from semiring_jax._src.core.host.fsa_tables import Entry, Shapes
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.tables import Tables
from semiring_jax._src.io.conversions import Conversions

__all__ = ["Fsa", "assemble"]


_STRUCTURE_FIELDS = ("src", "dst", "arc_mask")
_FREE_FIELDS = ("ilabel", "olabel", "weight", "final_weight", "final_mask")


# eq=False: comparing or hashing arrays field by field is ill-defined;
# compare pytrees with chex.assert_trees_all_equal instead.
@dataclasses.dataclass(frozen=True, eq=False)
class Fsa(Conversions):
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
      tables: the tables below, built once from the structure (`Tables`):
        when the Fsa is made, or, for a structural op's result, when first
        read (by a score op, `jax.jit` or any other flattening, or
        `sj.save`; `sj.stack` builds its entries' at the batch's sizes
        instead), so the intermediate results of a chain of structural
        ops never build any.
      is_acceptor: static; True for an acceptor (olabel == ilabel).
      schedule: `tables.schedule`, the index tables the score recursions
        gather through.
      cycle: static, `tables.cycle`; () if acyclic, else the states of one
        cycle.
      shapes: static, `tables.shapes`; the padded sizes the tables were
        built at (`Shapes`), which `sj.save` stores.

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
    tables: Tables
    is_acceptor: bool = True

    # -- the tables, built once ------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        """`tables.schedule`: the index tables the score recursions gather through."""
        return self.tables.schedule

    @property
    def cycle(self) -> tuple[int, ...]:
        """`tables.cycle`: () if acyclic, else the states of one cycle."""
        return self.tables.cycle

    @property
    def shapes(self) -> Shapes:
        """`tables.shapes`: the padded sizes the tables were built at."""
        return self.tables.shapes

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
    def _from_arrays(cls, arrays: build.ArcArrays) -> Fsa:
        # What the readers of other formats (`Conversions`) return.
        return assemble(arrays)

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
        # Copies that keep the structure share its tables (built or not).
        new = dataclasses.replace(self, **fields)
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
        "tables",
    ],
    meta_fields=["is_acceptor"],
)


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
    built = fsa_tables.build_tables([Entry(fsa.num_states, src, dst, arc_mask)])
    real_sizes = np.array([fsa.num_states, fsa.num_arcs], np.int32)
    return dataclasses.replace(
        fsa, src=src, dst=dst, arc_mask=arc_mask, tables=Tables.of(built, real_sizes)
    )


def assemble(
    arrays: build.ArcArrays,
    *,
    arc_mask: np.ndarray | None = None,
    shape: schedule_tables.ScheduleShape | None = None,
    real_sizes: tuple[int, int] | None = None,
    known_levels: np.ndarray | None = None,
    defer: bool = False,
) -> Fsa:
    """An Fsa from validated host arrays, with its tables built (or deferred).

    Args:
      arrays: validated structure and weights.
      arc_mask: bool [A]; all True by default.
      shape: pad the schedule to these sizes (e.g. a batch's).
      real_sizes: (states, arcs) before padding; the array sizes by default.
      known_levels: int [S], levels that every arc goes up, for internal
        graphs whose builder knows them (no longest-path or balancing
        passes; a ValueError if an arc does not go up).
      defer: build nothing yet: the Fsa's tables are deferred, built when
        first read (see `Tables`), or `sj.stack` builds every entry's at
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
    sizes = np.asarray(real_sizes, np.int32)
    entry = Entry(arrays.num_states, arrays.src, arrays.dst, arc_mask)
    if defer:
        tables = Tables.deferred(entry, sizes)
    elif known_levels is not None:
        tables = Tables.of(fsa_tables.at_levels(entry, known_levels), sizes)
    else:
        tables = Tables.of(fsa_tables.build_tables([entry], shapes=Shapes(shape)), sizes)
    return Fsa(
        src=arrays.src,
        dst=arrays.dst,
        ilabel=arrays.ilabel,
        olabel=arrays.olabel,
        weight=arrays.weight,
        final_weight=arrays.final_weight,
        arc_mask=arc_mask,
        final_mask=np.asarray(final_mask, bool),
        tables=tables,
        is_acceptor=arrays.is_acceptor,
    )
