"""`ArrayLeaf`: the type of an array field of an `Fsa` or `Schedule`.

The host constructors fill these fields with numpy arrays; `jax.jit`,
`jax.device_put`, `jax.vmap` and `jax.grad` hand back the same pytree with
`jax.Array` leaves. Code that reads a field must accept either.
"""

from __future__ import annotations

from typing import TypeAlias

import jax
import numpy as np

__all__ = ["ArrayLeaf"]

ArrayLeaf: TypeAlias = jax.Array | np.ndarray
