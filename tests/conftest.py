"""Test-wide JAX settings and fixtures.

x64 is enabled so float32 and float64 can both be tested (float32 inputs
stay float32); strict promotion makes accidental broadcasting or f32/f64
mixing fail.
"""

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(params=["eager", "jit"])
def transform(request):
    """Runs a function as-is, or under jax.jit (semirings are static)."""
    if request.param == "eager":
        return lambda fn: fn
    return jax.jit


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    return request.param
