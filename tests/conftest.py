"""Test-wide JAX settings and fixtures.

x64 is enabled so float32 and float64 can both be tested (float32 inputs
stay float32); strict promotion makes accidental broadcasting or f32/f64
mixing fail.
"""

import os

import jax
import pytest

# The CPU kernels' build budget (90 s by default) is sized for a user's idle
# machine. In a full run on a 2-core CI host the other worker compiles XLA
# programs beside the build, which once took longer than that; the suite's
# own builds, and its subprocesses', get more time. Tests of the budget set
# or clear it themselves.
os.environ.setdefault("SEMIRING_JAX_BUILD_TIMEOUT", "280")

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
