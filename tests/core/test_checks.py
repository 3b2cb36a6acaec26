"""`check_int`, the one check of an int argument (sizes, counts, the blank)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from semiring_jax._src.core.checks import check_int


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.array(3), jnp.array(3)])
def test_python_and_numpy_ints_and_0d_integer_arrays_are_ints(value):
    checked = check_int(value, "n", "f", 1)
    assert checked == 3 and type(checked) is int


@pytest.mark.parametrize(
    "value, shown",
    [
        (True, "bool True"),
        (np.bool_(False), "bool False"),
        (2.0, "float 2.0"),
        (np.float32(0), "float32 0.0"),
        ("3", "str '3'"),
        (np.array([3]), "ndarray [3]"),
    ],
)
def test_bools_floats_strings_and_arrays_are_refused_by_name(value, shown):
    with pytest.raises(ValueError, match=f"^f: n must be an int, got {re.escape(shown)}$"):
        check_int(value, "n", "f")


def test_traced_values_are_refused_by_name():
    with pytest.raises(ValueError, match="f: n must be an int, got a traced value"):
        jax.jit(lambda n: check_int(n, "n", "f"))(3)


def test_the_range_is_checked_only_with_a_low_bound_and_up_to_int32():
    assert check_int(-5, "n", "f") == -5
    assert check_int(2**31 - 1, "n", "f", 0) == 2**31 - 1
    with pytest.raises(ValueError, match=r"f: n = 0 is outside \[1, 2\*\*31 - 1\]"):
        check_int(0, "n", "f", 1)
    with pytest.raises(ValueError, match=r"f: n = 2147483648 is outside \[0, 2\*\*31 - 1\]"):
        check_int(np.int64(2**31), "n", "f", 0)
