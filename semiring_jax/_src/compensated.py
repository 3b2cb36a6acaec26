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

import jax
import jax.numpy as jnp

__all__ = ["two_sum", "add", "log_sum_shifted", "log_sum", "softmax"]


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


def _log_sum_terms(hi: jax.Array, lo: jax.Array, axis: int):
    """(top [..], log Σ exp(x - top) [..]) of x = hi + lo along `axis`; top
    is the max of hi (0 where it is -inf) and the log is -inf for an empty
    or all -inf slice."""
    top = jnp.max(hi, axis=axis, initial=-jnp.inf)
    safe_top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top)))
    # hi - top is exact (Sterbenz) for the terms that matter, those within
    # a factor of two of the top; the others are tiny after exp.
    exps = jnp.exp((hi - jnp.expand_dims(safe_top, axis)) + lo)
    total = jnp.sum(exps, axis=axis)
    nonempty = total > 0
    log_total = jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1)), -jnp.inf)
    return top, safe_top, log_total


def log_sum_shifted(hi: jax.Array, lo: jax.Array, axis: int
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """log Σ exp(hi + lo) along `axis`, minus a shift that keeps the
    results O(1): (new_hi, new_lo, shift), shift = the largest top over
    the remaining axis (a scalar for [S, K] input; 0 if none is finite)."""
    top, safe_top, log_total = _log_sum_terms(hi, lo, axis)
    shift = jnp.max(top, initial=-jnp.inf)
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))
    new_hi, new_lo = two_sum(safe_top, -shift)
    new_hi, new_lo = add(new_hi, new_lo, log_total)
    return new_hi, new_lo, shift


def log_sum(hi: jax.Array, lo: jax.Array, axis: int) -> jax.Array:
    """log Σ exp(hi + lo) along `axis`, as one float."""
    _, safe_top, log_total = _log_sum_terms(hi, lo, axis)
    return safe_top + log_total


def softmax(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """exp(x) / Σ exp(x) over all entries of x = hi + lo; all zeros when
    every entry is -inf."""
    top = jnp.max(hi, initial=-jnp.inf)
    safe_top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top)))
    exps = jnp.exp((hi - safe_top) + lo)
    total = jnp.sum(exps)
    return jnp.where(total > 0, exps / jnp.where(total > 0, total, 1), jnp.zeros_like(exps))
