"""Compensated (hi, lo) pair arithmetic: exact sums at any magnitude, no
overflow in the shifted exponentials, and the ±inf / NaN contract."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from semiring_jax._src.core import compensated


def pairs(values, dtype=jnp.float32):
    """Pairs of float64 values rounded to `dtype`."""
    values = np.asarray(values, np.float64)
    hi = values.astype(dtype)
    lo = (values - hi.astype(np.float64)).astype(dtype)
    return jnp.asarray(hi), jnp.asarray(lo)


def test_times_absorbs_infinity_into_zero_and_keeps_nan():
    a = jnp.array([-jnp.inf, jnp.inf, -jnp.inf, jnp.nan, 1.0])
    b = jnp.array([jnp.inf, -jnp.inf, jnp.nan, -jnp.inf, 2.0])
    np.testing.assert_array_equal(
        compensated.times(a, b), [-jnp.inf, -jnp.inf, jnp.nan, jnp.nan, 3.0]
    )


@pytest.mark.parametrize(
    ("scale", "parts"),
    [
        # At |score| ~ 3.2e9 a float32's half spacing is 128: a normalised
        # lo of ~100 is common there, and exp(lo) alone overflows.
        (-3221225472.0, [100.25, 99.5, 101.0]),
        (3221225472.0, [-100.25, -99.5, -101.0]),
        (-(2.0**100), [0.25, -0.5, 1.0]),
    ],
)
def test_log_sum_of_huge_pairs_keeps_their_o1_part(scale, parts):
    hi = jnp.full(3, scale, jnp.float32)
    lo = jnp.asarray(parts, jnp.float32)
    top_hi, top_lo = compensated.log_sum_pair(hi, lo, axis=0)
    expected = float(np.log(np.sum(np.exp(np.asarray(parts, np.float64)))))
    assert float(top_hi) == scale  # the O(1) part lives in lo, whole
    np.testing.assert_allclose(float(top_lo), expected, atol=1e-5)
    # Columns (the dense scan's form) agree.
    col_hi, col_lo = compensated.log_sum_columns(list(hi), list(lo))
    assert float(col_hi) == scale
    np.testing.assert_allclose(float(col_lo), expected, atol=1e-5)


def test_log_sum_contract_for_inf_and_nan():
    def total(values):
        hi, lo = compensated.log_sum_pair(jnp.asarray(values), jnp.zeros(len(values)), axis=0)
        return float(hi + lo)

    assert total([-np.inf, -np.inf]) == -np.inf
    assert total([np.inf, 1.0]) == np.inf
    assert np.isnan(total([np.nan, 1.0]))
    assert np.isnan(total([np.nan, -np.inf]))


def test_exp_difference_is_a_probability():
    hi, lo = pairs([-1e9, -1e9 - 1.0])
    z_hi, z_lo = compensated.log_sum_pair(hi, lo, axis=0)
    posterior = np.asarray(compensated.exp_difference(hi, lo, z_hi, z_lo))
    np.testing.assert_allclose(posterior, [1 / (1 + np.exp(-1)), 1 / (1 + np.e)], atol=1e-5)
    assert np.all(posterior <= 1)
    assert float(compensated.exp_difference(hi[0], lo[0], -jnp.inf, 0.0)) == 0.0
    assert np.isnan(float(compensated.exp_difference(hi[0], lo[0], jnp.inf, 0.0)))


def test_log_add_below_inf_has_the_log_add_derivative_at_ties_and_huge_scores():
    # The transducer scans' step: its derivative (the scan is the kernel's)
    # is the softmax of the two scores, a half each at a tie.
    def log_add(a, b):
        return sum(compensated.log_add_below_inf((a, jnp.zeros_like(a)), (b, jnp.zeros_like(b))))

    grads = jax.grad(log_add, argnums=(0, 1))(jnp.float64(0.3), jnp.float64(0.3))
    np.testing.assert_allclose(grads, (0.5, 0.5))
    grads = jax.grad(log_add, argnums=(0, 1))(jnp.float64(1.0), jnp.float64(0.0))
    np.testing.assert_allclose(grads, (1 / (1 + np.exp(-1)), 1 / (1 + np.exp(1))))
    # A lo of ~1e3 beside a hi of -1e10 (float32): no overflow.
    a = (jnp.float32(-1e10), jnp.float32(700.0))
    b = (jnp.float32(-1e10), jnp.float32(-300.0))
    hi, lo = compensated.log_add_below_inf(a, b)
    assert float(hi) + float(lo) == -1e10 + 700.0
