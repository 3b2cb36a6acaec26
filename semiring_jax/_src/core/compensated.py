"""Scores as compensated (hi, lo) float pairs, for long LOG and TROPICAL scans.

A scan that adds a weight to a score at every step rounds the score to the
float grid each time: at |score| ~ 30 that is ~1e-6 per step in float32, a
random walk that reaches ~1e-4 in the posteriors at T = 5,000 frames or
levels, and at |score| ~ 1e5 (a 30,000-level chain) each step's rounding
is ~0.004. Carrying each score as an unevaluated sum hi + lo, with the
rounding error of every addition captured exactly by TwoSum (Knuth),
removes that walk; what remains is the ~1e-7 error of exp and log on O(1)
numbers.

A pair is a number of about twice the float's precision (48 bits for
float32, 106 for float64), relative to its magnitude M: its O(1) part is
exact while it fits, to ~M * 2^-48 in float32 otherwise (1e-5 at the
-3.2e9 of three frames of -1e9 log-probs). Sums that hi itself holds
exactly (two frames of a -1e30 mask: 2^100-scale numbers with few
significant bits) keep every O(1) part; beyond that, path differences
below M * 2^-48 are lost, as in any fixed-precision arithmetic.

Pairs are kept normalised (|lo| <= half an ulp of hi), so that comparing
(hi, lo) lexicographically orders the scores they stand for, and the
largest of several pairs, subtracted from each, leaves exponents <= 0
(no overflow, whatever the magnitude).

±inf and NaN: an infinite hi has lo 0. NaN in gives NaN out. -inf is the
semiring zero: -inf ⊗ +inf is -inf (zero annihilates), not the NaN that
-inf + inf gives in floats, so a +inf weight stays visible (+inf) wherever
a path uses it and changes nothing where none does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = [
    "add",
    "add_below_inf",
    "add_pairs",
    "exp_difference",
    "log_add_below_inf",
    "log_sum_columns",
    "log_sum_pair",
    "log_total",
    "max_pair",
    "times",
    "two_sum",
]

Pair = tuple[jax.Array, jax.Array]


def times(a: jax.typing.ArrayLike, b: jax.typing.ArrayLike) -> jax.Array:
    """a + b, with -inf + inf = -inf (LOG and TROPICAL ⊗: zero annihilates);
    NaN inputs stay NaN."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    total = a + b
    from_infinities = jnp.isnan(total) & ~jnp.isnan(a) & ~jnp.isnan(b)
    return jnp.where(from_infinities, -jnp.inf, total)


def _finite_or_zero(error: jax.Array, total: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(total), error, jnp.zeros_like(error))


def two_sum(a: jax.Array, b: jax.Array) -> Pair:
    """(s, e) with s = fl(a ⊗ b) (`times`) and s + e = a + b exactly; e = 0
    where s is not finite (an infinite score has no rounding error)."""
    total = times(a, b)
    b_part = total - a
    error = (a - (total - b_part)) + (b - b_part)
    return total, _finite_or_zero(error, total)


def _normalise(hi: jax.Array, lo: jax.Array) -> Pair:
    """The same sum with |lo| <= half an ulp of hi (Fast2Sum: |hi| >= |lo|)."""
    total = hi + lo
    error = lo - (total - hi)
    total = jnp.where(jnp.isfinite(hi), total, hi)  # inf + NaN residue: keep inf
    return total, _finite_or_zero(error, total)


def add(hi: jax.Array, lo: jax.Array, value: jax.Array) -> Pair:
    """(hi + lo) ⊗ value, as a normalised pair."""
    total, error = two_sum(hi, value)
    return _normalise(total, lo + error)


def _plain_two_sum(a: jax.Array, b: jax.Array) -> Pair:
    """TwoSum without `times`'s infinity handling: for a, b < +inf."""
    total = a + b
    b_part = total - a
    error = (a - (total - b_part)) + (b - b_part)
    return total, _finite_or_zero(error, total)


def add_below_inf(hi: jax.Array, lo: jax.Array, value: jax.Array) -> Pair:
    """(hi + lo) + value for a pair and a value < +inf (a score and a
    log-probability): `add` without its +inf handling and its final
    normalisation (lo stays within a few ulps of hi), about half the work,
    for the transducer's scans, whose every step does it per node."""
    total, error = _plain_two_sum(hi, value)
    return total, lo + error


def log_add_below_inf(a: Pair, b: Pair) -> Pair:
    """log(exp(a) + exp(b)) of two pairs < +inf (`log_sum_columns` of two
    columns, without its +inf handling): -inf where both are, NaN where
    either is."""
    # The larger pair plus log1p(exp(smaller - larger)): no exponent is
    # positive. Shifting by the larger hi alone left each lo in an exponent,
    # and a lo is a few ulps of its hi: hundreds at scores of 1e10 (logits
    # x 1e9), 1e23 at 1e30, where exp overflowed to NaN or inf. (Written
    # without abs, the derivative is the two scores' softmax, a half each
    # at a tie, whatever abs's derivative at 0.)
    both_empty = (a[0] == -jnp.inf) & (b[0] == -jnp.inf)
    # hi - hi is exact (Sterbenz) where the smaller term matters at all.
    a_larger = (a[0] - b[0]) + (a[1] - b[1]) >= 0  # False for NaN: b carries it
    top_hi, top_lo = jnp.where(a_larger, a[0], b[0]), jnp.where(a_larger, a[1], b[1])
    other_hi, other_lo = jnp.where(a_larger, b[0], a[0]), jnp.where(a_larger, b[1], a[1])
    gap = (other_hi - top_hi) + (other_lo - top_lo)  # <= 0; NaN where both are -inf
    gap = jnp.where(both_empty, jnp.zeros_like(gap), gap)
    hi, error = _plain_two_sum(top_hi, jnp.log1p(jnp.exp(gap)))
    return _normalise(hi, top_lo + error)


def add_pairs(a: Pair, b: Pair) -> Pair:
    """(a_hi + a_lo) ⊗ (b_hi + b_lo), as a normalised pair."""
    total, error = two_sum(a[0], b[0])
    return _normalise(total, error + (a[1] + b[1]))


def _top(hi: jax.Array, lo: jax.Array, axis: int) -> Pair:
    """The lexicographic maximum of the pairs along `axis`, with finite hi
    (0, 0 where the maximum is ±inf or NaN, so that subtracting it keeps
    those entries as they are); no gradient (results do not depend on it)."""
    top_hi = jnp.max(hi, axis=axis, initial=-jnp.inf)
    at_top = hi == jnp.expand_dims(top_hi, axis)
    top_lo = jnp.max(jnp.where(at_top, lo, -jnp.inf), axis=axis, initial=-jnp.inf)
    finite = jnp.isfinite(top_hi)
    return (
        jax.lax.stop_gradient(jnp.where(finite, top_hi, jnp.zeros_like(top_hi))),
        jax.lax.stop_gradient(jnp.where(finite, top_lo, jnp.zeros_like(top_lo))),
    )


def log_total(total: jax.Array) -> jax.Array:
    """log(total): -inf for 0 (with a NaN-free gradient), NaN for NaN."""
    empty = total == 0
    return jnp.where(empty, -jnp.inf, jnp.log(jnp.where(empty, jnp.ones_like(total), total)))


def _shifted_log(top: Pair, log_of_sum: jax.Array) -> Pair:
    """top + log_of_sum as a pair; log_of_sum is O(1), or ±inf / NaN."""
    hi, error = two_sum(top[0], log_of_sum)
    return _normalise(hi, error + top[1])


def log_sum_pair(hi: jax.Array, lo: jax.Array, axis: int) -> Pair:
    """log Σ exp(hi + lo) along `axis`, as a pair (-inf, 0 for an empty or
    all -inf slice; +inf if any term is +inf; NaN if any is NaN)."""
    top = _top(hi, lo, axis)
    # hi - top is exact (Sterbenz) for the terms that matter, those within
    # a factor of two of the top; the others are tiny after exp.
    exponent = (hi - jnp.expand_dims(top[0], axis)) + (lo - jnp.expand_dims(top[1], axis))
    return _shifted_log(top, log_total(jnp.sum(jnp.exp(exponent), axis=axis)))


def log_sum_columns(his: list[jax.Array], los: list[jax.Array]) -> Pair:
    """log Σ_k exp(his[k] + los[k]), elementwise over columns, as a pair."""
    # Elementwise over the K columns: XLA fuses it into one kernel, where a
    # reduction over a [S, K] array would start a new one.
    top_hi = functools.reduce(jnp.maximum, his, jnp.full_like(his[0], -jnp.inf))
    top_lo = functools.reduce(
        jnp.maximum,
        [jnp.where(h == top_hi, lo, -jnp.inf) for h, lo in zip(his, los)],
        jnp.full_like(his[0], -jnp.inf),
    )
    finite = jnp.isfinite(top_hi)
    top = (
        jax.lax.stop_gradient(jnp.where(finite, top_hi, jnp.zeros_like(top_hi))),
        jax.lax.stop_gradient(jnp.where(finite, top_lo, jnp.zeros_like(top_lo))),
    )
    total = functools.reduce(
        jnp.add, [jnp.exp((h - top[0]) + (lo - top[1])) for h, lo in zip(his, los)]
    )
    return _shifted_log(top, log_total(total))


def max_pair(hi: jax.Array, lo: jax.Array, axis: int) -> tuple[Pair, jax.Array]:
    """The largest pair along `axis` (TROPICAL ⊕) and its index, the first
    largest (int32; the axis length where the slice is empty, or NaN)."""
    top_hi = jnp.max(hi, axis=axis, initial=-jnp.inf)
    at_top = hi == jnp.expand_dims(top_hi, axis)
    top_lo = jnp.max(jnp.where(at_top, lo, -jnp.inf), axis=axis, initial=-jnp.inf)
    top_lo = jnp.where(jnp.isfinite(top_hi), top_lo, jnp.zeros_like(top_lo))
    chosen = at_top & (lo == jnp.expand_dims(top_lo, axis))
    positions = jax.lax.broadcasted_iota(jnp.int32, hi.shape, axis % hi.ndim)
    index = jnp.min(jnp.where(chosen, positions, hi.shape[axis]), axis=axis)
    return (top_hi, top_lo), index


def exp_difference(
    hi: jax.Array, lo: jax.Array, total_hi: jax.Array, total_lo: jax.Array
) -> jax.Array:
    """exp((hi + lo) - (total_hi + total_lo)), accurate when the two are
    large and close (a posterior exp(α + β - Z)), at most 1; 0 where the
    total is -inf, NaN where it is NaN or +inf (a +inf score is a bug to keep
    visible, and its posteriors are undefined)."""
    empty = total_hi == -jnp.inf
    safe_hi = jnp.where(jnp.isfinite(total_hi), total_hi, jnp.zeros_like(total_hi))
    difference = (hi - safe_hi) + (lo - total_lo)
    # Rounding can put a certain event a hair above 1; a probability is not.
    posterior = jnp.minimum(jnp.exp(difference), 1)
    posterior = jnp.where(total_hi == jnp.inf, jnp.nan, posterior)
    return jnp.where(empty, jnp.zeros_like(difference), posterior)


def pack(a: Pair, b: Pair) -> jax.Array:
    """[4, N]: a's hi and lo, then b's, for a scan that carries two pairs
    of [N] scores (α and β) as one array: on a GPU a loop iteration
    launches a kernel for each carried array it copies back and each it
    saves. Selected row by row, not stacked: XLA compiles a stack into one
    kernel branch per row, each recomputing its pair (twice the code and
    the compile time), where a select computes each pair once."""
    row = jnp.arange(4)[:, None]
    a_hi, a_lo, b_hi, b_lo = (x[None] for x in (*a, *b))
    return jnp.where(row < 2, jnp.where(row == 0, a_hi, a_lo), jnp.where(row == 2, b_hi, b_lo))


def unpack(packed: jax.Array) -> tuple[Pair, Pair]:
    """The two pairs of a `pack`ed [4, N] array."""
    return (packed[0], packed[1]), (packed[2], packed[3])
