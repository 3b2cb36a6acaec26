"""Argument checks shared by the public functions; each names its culprit."""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import numpy as np

__all__ = [
    "check_finite_float",
    "check_float_dtype",
    "check_int",
    "check_not_traced",
    "check_shape",
    "concrete",
    "is_traced",
]


def is_traced(value: Any) -> bool:
    """True if `value` is an abstract JAX value (inside jit, vmap or grad)."""
    return isinstance(value, jax.core.Tracer)


def check_not_traced(value: Any, name: str, fn: str) -> None:
    """Raises a clear error if `value` is traced (host-only functions)."""
    if is_traced(value):
        raise ValueError(
            f"{fn}: {name} is a traced value; {fn} works on the host from concrete "
            f"structure, so call it outside jax.jit / jax.vmap / jax.grad"
        )


def concrete(value: Any, name: str, fn: str) -> np.ndarray:
    """`value` as a numpy array; a clear error if it is traced."""
    check_not_traced(value, name, fn)
    return np.asarray(value)


def check_float_dtype(dtype: Any, name: str, fn: str) -> np.dtype:
    """A float32 or float64 dtype, float64 only when jax_enable_x64 is on."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"{fn}: {name} must be float32 or float64, got {dtype}")
    # JAX sets its flags as Config attributes at run time; its stubs omit them.
    if dtype == np.float64 and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        raise ValueError(
            f"{fn}: {name} is float64 but jax_enable_x64 is off; enable it with "
            f"jax.config.update('jax_enable_x64', True) or pass float32"
        )
    return dtype


def check_shape(value: Any, name: str, fn: str, expected: tuple[int, ...], described: str) -> None:
    """Raises unless `value.shape == expected` (`described`, e.g. '[A]')."""
    shape = tuple(np.shape(value))
    if shape != tuple(expected):
        raise ValueError(
            f"{fn}: {name} must have shape {described} = {tuple(expected)}, got {shape}"
        )


def check_int(value: Any, name: str, fn: str, low: int | None = None) -> int:
    """`value` as a Python int: a Python or numpy integer, or a 0-d integer
    array (numpy, or concrete JAX); with `low`, one in [low, 2**31 - 1]
    (ids and sizes are int32). A ValueError naming `name` for anything else:
    bools (an int subclass, but never meant as a count), floats (even
    integral ones: 2.0 hides a mistake), strings and traced values."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{fn}: {name} must be an int, got bool {bool(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        shown = (
            "a traced value"
            if is_traced(value)
            else f"{type(value).__name__} {repr(value) if isinstance(value, str) else value}"
        )
        raise ValueError(f"{fn}: {name} must be an int, got {shown}") from None
    if low is not None and not low <= number <= np.iinfo(np.int32).max:
        raise ValueError(f"{fn}: {name} = {number} is outside [{low}, 2**31 - 1]")
    return number


def check_finite_float(value: Any, name: str, fn: str, low: float | None = None) -> float:
    """A hyper-parameter as a finite Python float (>= `low` if given); a
    ValueError naming `name` otherwise. inf and NaN are refused: they would
    not fail, only turn every result into inf or NaN (an infinite FastEmit
    λ gave a finite loss with NaN gradients)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{fn}: {name} must be finite, got {value}")
    if low is not None and number < low:
        raise ValueError(f"{fn}: {name} must be >= {low:g}, got {value}")
    return number
