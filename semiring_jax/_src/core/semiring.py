"""Semirings: the (⊕, ⊗, 0̄, 1̄) structures that score recursions run in.

A `Semiring` is a frozen record of pure functions. It is registered as a
static pytree, so it can be passed to `jax.jit`-ed functions as an ordinary
argument. Functions hash by identity: build each semiring once, at module
level, or every fresh instance costs a recompile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import compensated, records

__all__ = ["LOG", "TROPICAL", "Semiring", "check_float_semiring", "lifted", "semiring"]


_ARITHMETICS = (None, "log", "tropical")


@dataclasses.dataclass(frozen=True, eq=False)
class Semiring:
    """A semiring, given by its operations and what ops may assume of them.

    Build one rather than subclass it (pytree registration ignores subclasses).

    Structured weights: when `zero` and `one` are pytrees (e.g. a numpy
    [k] vector, a pair of floats), each weight is a *record* of that
    structure and shape, and an array of n weights is the same pytree
    with leaves [n, *record shape]: `plus`, `times` and `sum` take and
    return such pytrees (leading axes first, record axes trailing). An
    Fsa still holds float scores; `lift` maps them to records (arc
    weights, final weights and dense emissions alike), so any Fsa can be
    scored in the semiring. `sj.check_semiring_laws` tests a semiring on
    sample weights.

    Fsas are built with scores (LOG/TROPICAL weights). For a semiring whose
    weights mean something else (e.g. the real one, zero 0.0), build the
    structure with the right final states and give the weights in its
    domain with `fsa.replace(weight=w, final_weight=f)`; the score ops read
    the semiring's `zero` on padding and at non-final states (`final_mask`
    False), whatever is stored there.

    The first six fields define the semiring; every op works from them
    alone (the level scans, plain autodiff for gradients). The optional
    fields are capabilities: each is a promise about the first six that
    lets ops take a faster or better-defined path, and ops read only these
    fields, never which object a semiring is. A semiring that copies LOG's
    functions but declares nothing runs the generic paths.

    Attributes:
        name: a short name, used in messages and by `sj.semiring`.
        plus: ⊕, elementwise on two arrays.
        times: ⊗, elementwise on two arrays.
        sum: ⊕-reduction, `sum(x, axis)`; the reduction of an empty axis is
            `zero`. `axis` is a non-negative leading axis.
        zero: the identity of ⊕ and annihilator of ⊗: a Python float, or
            for a semiring with structured weights a pytree of floats and
            numpy arrays, one leaf per record field (see below).
        one: the identity of ⊗, of the same form as `zero`.
        sum_grad: optional; `sum_grad(x, total, axis)`, given `total =
            sum(x, axis)`, is the derivative of `sum(x, axis)` with respect
            to each entry of `x` (same shape as `x`); it must be all zeros
            along a slice whose entries are all `zero`. Only for semirings
            whose ⊗ is addition (it implies `times_is_addition`): when it
            is given, `tot_score` gets a custom backward pass built on it
            and `arc_posteriors` is defined by it; otherwise gradients come
            from autodiff through the recursion.
        argsum: optional, for selective semirings (⊕ returns one of its
            arguments, as max does): `argsum(x, total, axis)`, given `total =
            sum(x, axis)`, is the int32 index along `axis` of the entry that
            `sum` returns (the tie rule). It implies `times_is_addition`:
            the gradient of `tot_score` is then the indicator of one path,
            found by tracing back the saved choices instead of a backward
            recursion.
        times_is_addition: whether ⊗ is float addition (a ⊗ b = a + b,
            except that `zero` annihilates even an infinity of the other
            sign), so that `one` is 0.0, ⊘ is
            subtraction, and (by distributivity) ⊕ commutes with a common
            shift: `sum(x + c) = sum(x) + c`. Dense scans then keep scores
            near 0 by shifting them per frame, and `determinize` (which
            divides by ⊘) needs it. None (the default) stands for True
            when `sum_grad`, `argsum` or `arithmetic` is given (their
            contracts say ⊗ is +) and False otherwise; after construction
            it is always a bool.
        arithmetic: None (the default), "log" or "tropical": a promise that
            ⊕ and ⊗ are exactly those of `sj.LOG` (logaddexp, +) or
            `sj.TROPICAL` (max, +), with zero -inf and one 0.0. It lets
            LOG's or TROPICAL's own implementations stand in: the compiled
            CPU kernels, the compensated (hi, lo) level and dense scans,
            their custom gradients and LOG's NaN gradient of a +inf total.
            "log" needs `sum_grad` and "tropical" `argsum` (`sj.LOG.sum_grad`,
            `sj.TROPICAL.argsum`), so that every op agrees on the gradient.
        segment_sum: optional; `segment_sum(values, segment_ids,
            num_segments)` is the ⊕ of `values` [N] by segment, float
            [num_segments], `zero` for an empty segment (`segment_ids` [N]
            int in [0, num_segments), any order; `num_segments` a static
            int). NaN in a segment gives NaN there, as `sum` does.
            `determinize` uses it; without it, it ⊕-folds each segment
            with `plus` (a segmented scan, slower).
        lift: for structured weights (and optional otherwise): `lift(scores)`
            maps float scores [...] (arc weights, final weights,
            emissions) to records [..., *r]. It should map a score to the
            record of its path of one arc, so that lift(a + b) = lift(a) ⊗
            lift(b); the score ops call it only on real arcs and final
            states (others get `zero`), with finite or -inf scores. A
            structured semiring without a lift raises when scored.

    Capabilities (`sum_grad`, `argsum`, `times_is_addition`,
    `arithmetic`, `segment_sum`) speak of float weights: a structured
    semiring declares none (its gradients come from autodiff).

    Raises:
        ValueError: if `arithmetic` is not None, "log" or "tropical", or a
            declared capability contradicts the operations or another field
            (the message names the field).
    Examples:
        >>> import jax.numpy as jnp
        >>> import semiring_jax as sj
        >>> real = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply,
        ...                    sum=jnp.sum, zero=0.0, one=1.0)
        >>> print(float(real.sum(jnp.array([0.5, 0.25]), axis=0)))
        0.75
        >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 2, 2, 0.0)], final=[1, 2])
        >>> fsa = fsa.replace(weight=jnp.array([0.5, 0.25]),
        ...                   final_weight=jnp.array([0.0, 1.0, 2.0]))  # real values
        >>> print(float(sj.tot_score(fsa, real)))  # 0.5 * 1 + 0.25 * 2
        1.0
        >>> real.times_is_addition, real.arithmetic, sj.LOG.arithmetic
        (False, None, 'log')
    """

    name: str
    # Any: float semirings take and return arrays, structured ones records.
    plus: Callable[[Any, Any], Any]
    times: Callable[[Any, Any], Any]
    sum: Callable[..., Any]
    zero: Any
    one: Any
    sum_grad: Callable[..., jax.Array] | None = None
    argsum: Callable[..., jax.Array] | None = None
    times_is_addition: bool | None = None
    arithmetic: str | None = None
    segment_sum: Callable[[jax.Array, jax.Array, int], jax.Array] | None = None
    lift: Callable[[jax.Array], Any] | None = None

    @property
    def structured(self) -> bool:
        """Whether weights are records (`zero` is not a single number)."""
        return not records.is_plain(self.zero)

    def _key(self) -> tuple[Any, ...]:
        # Constants as hashable values: (structure, shapes and values).
        def constant(value: Any) -> Any:
            leaves, treedef = jax.tree_util.tree_flatten(value)
            return treedef, tuple(
                (np.shape(leaf), tuple(np.ravel(leaf).tolist())) for leaf in leaves
            )

        return tuple(
            constant(getattr(self, field.name))
            if field.name in ("zero", "one")
            else getattr(self, field.name)
            for field in dataclasses.fields(self)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semiring) and self.__dict__["_hashed"] == other.__dict__["_hashed"]

    def __hash__(self) -> int:
        return hash(self.__dict__["_hashed"])

    def __post_init__(self) -> None:
        self._check()
        # Jit caches hash and compare semirings on every call: the key once.
        object.__setattr__(self, "_hashed", self._key())

    def _check(self) -> None:
        where = f"Semiring {self.name!r}"
        if not records.is_plain(self.one) and records.is_plain(self.zero):
            raise ValueError(f"{where}: zero is a number but one is {self.one!r}")
        if self.structured:
            _check_structured(self, where)
            return
        if self.arithmetic not in _ARITHMETICS:
            raise ValueError(
                f"{where}: arithmetic must be one of {_ARITHMETICS}, got {self.arithmetic!r}"
            )
        # What each declared rule promises of ⊗ (see the docstring).
        implied = [
            field
            for field in ("sum_grad", "argsum", "arithmetic")
            if getattr(self, field) is not None
        ]
        if self.times_is_addition is None:
            object.__setattr__(self, "times_is_addition", bool(implied))
        elif not isinstance(self.times_is_addition, bool):
            raise ValueError(
                f"{where}: times_is_addition must be a bool or None, got {self.times_is_addition!r}"
            )
        if implied and not self.times_is_addition:
            raise ValueError(
                f"{where}: times_is_addition=False contradicts {implied[0]}, which "
                f"is only for semirings whose ⊗ is addition"
            )
        if self.times_is_addition and self.one != 0.0:
            raise ValueError(
                f"{where}: times_is_addition=True needs one = 0.0 (the identity of +), "
                f"got one = {self.one!r}"
            )
        if self.arithmetic is not None:
            if self.zero != -float("inf"):
                raise ValueError(
                    f"{where}: arithmetic={self.arithmetic!r} needs zero = -inf, "
                    f"got zero = {self.zero!r}"
                )
            needed = "sum_grad" if self.arithmetic == "log" else "argsum"
            if getattr(self, needed) is None:
                raise ValueError(
                    f"{where}: arithmetic={self.arithmetic!r} needs {needed} (e.g. "
                    f"sj.{self.arithmetic.upper()}.{needed}), so that every op agrees "
                    f"on the gradient"
                )

    def __repr__(self) -> str:
        return f"Semiring({self.name!r})"


def _check_structured(semiring: Semiring, where: str) -> None:
    """A structured semiring: constants of one structure, no capability."""
    zero_tree: Any = jax.tree_util.tree_structure(semiring.zero)
    one_tree: Any = jax.tree_util.tree_structure(semiring.one)
    if zero_tree != one_tree:
        raise ValueError(f"{where}: zero ({zero_tree}) and one ({one_tree}) differ in structure")
    for zero_leaf, one_leaf in zip(
        records.leaves_of(semiring.zero), records.leaves_of(semiring.one)
    ):
        if np.shape(zero_leaf) != np.shape(one_leaf):
            raise ValueError(
                f"{where}: zero and one have record fields of shapes "
                f"{np.shape(zero_leaf)} and {np.shape(one_leaf)}"
            )
    declared = [
        field
        for field in ("sum_grad", "argsum", "arithmetic", "segment_sum")
        if getattr(semiring, field) is not None
    ]
    if semiring.times_is_addition:
        declared.append("times_is_addition")
    if declared:
        raise ValueError(
            f"{where}: {declared[0]} is a capability of float weights; a semiring "
            f"with structured weights declares none"
        )
    object.__setattr__(semiring, "times_is_addition", False)


jax.tree_util.register_static(Semiring)


def _shifted_exp(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """exp(x - shift) and the shift, the max along `axis` (0 where that is
    not finite, so an all -inf slice gives zeros, not NaN). The shift
    carries no gradient: results do not depend on it."""
    shift = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))
    return jnp.exp(x - shift), shift


def _log_sum(x: jax.typing.ArrayLike, axis: int) -> jax.Array:
    exps, shift = _shifted_exp(jnp.asarray(x), axis)
    total = jnp.sum(exps, axis=axis, keepdims=True)
    return jnp.squeeze(compensated.log_total(total) + shift, axis=axis)


def _log_plus(a: jax.typing.ArrayLike, b: jax.typing.ArrayLike) -> jax.Array:
    # jnp.logaddexp computes (-inf) - (-inf) = NaN internally and selects it
    # away; this form never makes a NaN, so jax_debug_nans stays quiet.
    a, b = jnp.asarray(a), jnp.asarray(b)
    shift = jax.lax.stop_gradient(jnp.maximum(a, b))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))
    return compensated.log_total(jnp.exp(a - shift) + jnp.exp(b - shift)) + shift


def _log_sum_grad(x: jax.typing.ArrayLike, total: jax.typing.ArrayLike, axis: int) -> jax.Array:
    # softmax exp(x - total), as exp(x - shift) * exp(shift - total): the
    # first factor is the one `_log_sum` made, so XLA computes it once. A
    # slice whose total is -inf gets weight 0, not NaN.
    exps, shift = _shifted_exp(jnp.asarray(x), axis)
    total = jnp.expand_dims(total, axis)
    found = jnp.isfinite(total)
    scale = jnp.where(found, jnp.exp(shift - jnp.where(found, total, 0)), 0)
    return (exps * scale).astype(exps.dtype)


def _max_sum(x: jax.typing.ArrayLike, axis: int) -> jax.Array:
    return jnp.max(x, axis=axis, initial=-jnp.inf)


def _max_argsum(x: jax.typing.ArrayLike, total: jax.typing.ArrayLike, axis: int) -> jax.Array:
    # Tie rule: the first maximal entry along `axis` wins. A min over
    # positions is cheaper than argmax on CPU.
    x = jnp.asarray(x)
    positions = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis % x.ndim)
    return jnp.min(
        jnp.where(x == jnp.expand_dims(total, axis), positions, x.shape[axis]), axis=axis
    )


def _max_sum_grad(x: jax.typing.ArrayLike, total: jax.typing.ArrayLike, axis: int) -> jax.Array:
    # The one-hot of `_max_argsum`; zero where every entry is -inf.
    x = jnp.asarray(x)
    total = jnp.expand_dims(total, axis)
    positions = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis % x.ndim)
    first = jnp.expand_dims(_max_argsum(x, jnp.squeeze(total, axis), axis), axis)
    return ((positions == first) & (total > -jnp.inf)).astype(x.dtype)


def _segment_top(
    values: jax.Array, segment_ids: jax.typing.ArrayLike, num_segments: int
) -> jax.Array:
    """Each segment's max, -inf for an empty one, NaN where a value is NaN
    (a scatter-max need not propagate NaN on every backend: the NaNs are
    added back, as a sum that is 0 where there are none)."""
    top = jax.ops.segment_max(values, segment_ids, num_segments)
    nans = jnp.where(jnp.isnan(values), values, jnp.zeros_like(values))
    return top + jax.ops.segment_sum(nans, segment_ids, num_segments)


def _log_segment_sum(
    values: jax.typing.ArrayLike, segment_ids: jax.typing.ArrayLike, num_segments: int
) -> jax.Array:
    # `_log_sum` by segment: the shift is each segment's max (0 where that is
    # not finite: -inf stays -inf, +inf stays +inf, NaN stays NaN).
    values = jnp.asarray(values)
    shift = jax.lax.stop_gradient(_segment_top(values, segment_ids, num_segments))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))
    exps = jnp.exp(values - shift[segment_ids])
    total = jax.ops.segment_sum(exps, segment_ids, num_segments)
    return compensated.log_total(total) + shift


def _max_segment_sum(
    values: jax.typing.ArrayLike, segment_ids: jax.typing.ArrayLike, num_segments: int
) -> jax.Array:
    # An all -inf segment ties everywhere, and a scatter-max spreads its
    # gradient over the ties: select -inf there, so that it gets none.
    top = _segment_top(jnp.asarray(values), segment_ids, num_segments)
    return jnp.where(top == -jnp.inf, jnp.full_like(top, -jnp.inf), top)


LOG = Semiring(
    name="log",
    plus=_log_plus,
    times=compensated.times,
    sum=_log_sum,
    zero=-float("inf"),
    one=0.0,
    sum_grad=_log_sum_grad,
    arithmetic="log",
    segment_sum=_log_segment_sum,
)
"""The log semiring: ⊕ = logaddexp, ⊗ = +, 0̄ = -inf, 1̄ = 0.

⊗ keeps the zero absorbing: -inf ⊗ +inf = -inf (not NaN), so a +inf weight
shows as +inf wherever a path uses it. NaN in any operand gives NaN.
Capabilities: `sum_grad` (softmax), `arithmetic="log"` (the compiled
kernels and compensated scans), `segment_sum` (log-sum-exp by segment)."""

TROPICAL = Semiring(
    name="tropical",
    plus=jnp.maximum,
    times=compensated.times,
    sum=_max_sum,
    zero=-float("inf"),
    one=0.0,
    sum_grad=_max_sum_grad,
    argsum=_max_argsum,
    arithmetic="tropical",
    segment_sum=_max_segment_sum,
)
"""The tropical (max, +) semiring: 0̄ = -inf, 1̄ = 0; first maximum wins ties.

⊗ is LOG's (-inf ⊗ +inf = -inf); ⊕ = max propagates NaN. Capabilities:
`argsum` (the first maximum), `sum_grad` (its one-hot),
`arithmetic="tropical"`, `segment_sum` (max by segment)."""


def lifted(semiring: Semiring, scores: jax.typing.ArrayLike, mask: jax.typing.ArrayLike) -> Any:
    """`scores` where `mask` holds, the semiring's zero elsewhere, through
    the semiring's `lift` if it has one. The lift sees 0.0 where `mask` is
    False, so that a lift undefined at -inf (padding) cannot make a NaN
    value or gradient there."""
    if semiring.lift is None:
        if semiring.structured:
            raise ValueError(
                f"semiring {semiring.name!r} has structured weights but no lift, so "
                f"an Fsa's scores cannot be read as its weights"
            )
        return jnp.where(mask, scores, semiring.zero)
    safe = jnp.where(mask, scores, jnp.zeros_like(scores))
    return records.where(mask, semiring.lift(safe), semiring.zero)


def check_float_semiring(semiring: Semiring, fn: str) -> None:
    """Raises for a semiring with structured weights, which `fn` does not take."""
    if isinstance(semiring, Semiring) and semiring.structured:
        raise ValueError(
            f"{fn}: semiring {semiring.name!r} has structured weights; {fn} takes "
            f"semirings with float weights (tot_score, forward_scores, backward_scores "
            f"and dense_tot_score take structured ones)"
        )


_BY_NAME = {"log": LOG, "tropical": TROPICAL}


def semiring(name: str) -> Semiring:
    """Looks up a built-in semiring by name.

    Args:
        name: "log" or "tropical" (case-insensitive).
    Returns:
        The module-level `Semiring` instance (`sj.LOG` or `sj.TROPICAL`).
    Raises:
        ValueError: if `name` is not a known semiring.
    Examples:
        >>> import semiring_jax as sj
        >>> sj.semiring("tropical") is sj.TROPICAL
        True
    """
    if not isinstance(name, str) or name.lower() not in _BY_NAME:
        raise ValueError(f"semiring: unknown semiring {name!r}; expected one of {sorted(_BY_NAME)}")
    return _BY_NAME[name.lower()]
