"""Log-sum-exp on compensated (hi + lo) float pairs, for long LOG scans.

A dense LOG scan keeps every score normalised per frame, yet a state that
stays 30 nats below the frame's best for thousands of frames (a CTC state
waiting its turn) is rounded to the float32 grid at |score| ~ 30 on every
frame: ~1e-6 per frame, a random walk that reaches ~1e-4 in the posteriors
at T = 5,000. Carrying each score as an unevaluated sum hi + lo, with the
rounding error of every large addition captured exactly by TwoSum (Knuth),
removes that walk; what remains is the ~1e-7 error of exp and log on O(1)
numbers. It costs a few extra adds per slot.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["add", "exp_difference", "log_sum_columns", "log_sum_pair", "two_sum"]


def two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(s, e) with s = fl(a + b) and s + e = a + b exactly; e = 0 where s is
    not finite (an -inf score has no rounding error to keep)."""
    total = a + b
    b_part = total - a
    error = (a - (total - b_part)) + (b - b_part)
    return total, jnp.where(jnp.isfinite(total), error, jnp.zeros_like(error))


def add(hi: jax.Array, lo: jax.Array, value: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(hi + lo) + value, as a new (hi, lo) pair."""
    total, error = two_sum(hi, value)
    return total, lo + error


def _safe(top: jax.Array) -> jax.Array:
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top)))


def _log_total(total: jax.Array) -> jax.Array:
    """log(total), -inf for 0, with a NaN-free gradient."""
    nonempty = total > 0
    return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1)), -jnp.inf)


def log_sum_pair(hi: jax.Array, lo: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """log Σ exp(hi + lo) along `axis`, as a (hi, lo) pair (-inf, 0 for an
    empty or all -inf slice)."""
    # hi - top is exact (Sterbenz) for the terms that matter, those within
    # a factor of two of the top; the others are tiny after exp.
    safe_top = _safe(jnp.max(hi, axis=axis, initial=-jnp.inf))
    total = jnp.sum(jnp.exp((hi - jnp.expand_dims(safe_top, axis)) + lo), axis=axis)
    return two_sum(safe_top, _log_total(total))


def log_sum_columns(his: list[jax.Array], los: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
    """log Σ_k exp(his[k] + los[k]), elementwise over columns, as a pair."""
    # Elementwise over the K columns: XLA fuses it into one kernel, where a
    # reduction over a [S, K] array would start a new one.
    safe_top = _safe(functools.reduce(jnp.maximum, his, jnp.full_like(his[0], -jnp.inf)))
    total = functools.reduce(jnp.add, [jnp.exp((h - safe_top) + lo) for h, lo in zip(his, los)])
    return two_sum(safe_top, _log_total(total))


def exp_difference(
    hi: jax.Array, lo: jax.Array, total_hi: jax.Array, total_lo: jax.Array
) -> jax.Array:
    """exp((hi + lo) - (total_hi + total_lo)), accurate when the two are
    large and close (a posterior exp(α + β - Z)); 0 where the total is
    -inf."""
    found = jnp.isfinite(total_hi)
    safe_hi = jnp.where(found, total_hi, jnp.zeros_like(total_hi))
    difference = (hi - safe_hi) + (lo - total_lo)
    return jnp.where(found, jnp.exp(difference), jnp.zeros_like(difference))
