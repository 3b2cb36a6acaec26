"""`nbest`'s compiled search (`_src/kernels/kshortest.cc`) against the
Python one (`decoding/host/kshortest.py`): the same paths in the same
order, field for field, on random DAGs with integer weights (ties
everywhere), parallel arcs, epsilon and repeated output labels, several
final states, with and without `unique`.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_jax._src.decoding.host import kshortest
from semiring_jax._src.kernels import kshortest_ops, loader

pytestmark = pytest.mark.skipif(not loader.enabled(), reason="the CPU kernels are not built")


def _dag(seed: int):
    rng = np.random.default_rng(seed)
    num_states = int(rng.integers(1, 9))
    count = int(rng.integers(0, 25))
    src = rng.integers(0, num_states, count)
    dst = rng.integers(0, num_states, count)
    forward = src < dst  # acyclic: arcs go to higher states
    src, dst = src[forward], dst[forward]
    olabel = rng.integers(0, 3, src.size)  # 0: epsilon
    weight = rng.integers(-2, 1, src.size).astype(np.float64)
    final = np.where(rng.random(num_states) < 0.4, rng.integers(-1, 1, num_states), -np.inf)
    return num_states, src, dst, olabel, weight, final.astype(np.float64)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([1, 2, 5, 40]), unique=st.booleans())
def test_compiled_search_finds_the_same_paths_in_the_same_order(seed, n, unique):
    num_states, src, dst, olabel, weight, final = _dag(seed)
    args = (num_states, src, dst, olabel, np.arange(src.size), weight, final, n, num_states)
    expected = kshortest.k_shortest(*args, unique=unique)
    found = kshortest.k_shortest(*args, unique=unique, compiled=kshortest_ops.k_shortest)
    for name, want, got in zip(expected._fields, expected, found, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)
