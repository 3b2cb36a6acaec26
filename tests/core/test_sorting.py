"""host/sorting.stable_argsort equals numpy's stable argsort on every key width."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_jax._src.core.host.sorting import stable_argsort


@settings(max_examples=60, deadline=None)
@given(
    top=st.sampled_from([1, 2, 300, 2**16 - 1, 2**16, 2**20, 2**32 - 1, 2**40]),
    size=st.integers(0, 400),
    seed=st.integers(0, 2**31),
)
def test_matches_numpy_stable_argsort(top, size, seed):
    keys = np.random.default_rng(seed).integers(0, top + 1, size)
    np.testing.assert_array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))


def test_negative_and_int32_keys():
    for keys in (np.array([3, -1, 3, 0], np.int64), np.array([7, 7, 1, 70000], np.int32)):
        np.testing.assert_array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))
