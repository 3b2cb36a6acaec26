"""Records: the weights of a semiring, one array or a pytree of arrays.

A float semiring (LOG, TROPICAL, the real one) weighs each arc and state
with one number, so its weights are float arrays [A] and [S] and its
`zero` and `one` are Python floats. A *structured* semiring weighs them
with a fixed-shape record: a [k] vector, a pair, any pytree of arrays. A
record array of `n` records is then the same pytree with each leaf of
shape [n, *r], the leaf's record shape r trailing (leading axes first,
always), and the semiring's `zero` and `one` are pytrees of that structure
whose leaves have the record shapes (floats or numpy arrays).

The helpers here apply one array operation to every leaf, so that the
recursions are written once for both kinds; on a float semiring each is
the plain array operation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

__all__ = [
    "append",
    "dtype_of",
    "full",
    "is_plain",
    "leaves_of",
    "take",
    "update_slice",
    "where",
]

Record = Any  # an array, or a pytree of arrays with common leading axes


def is_plain(value: Any) -> bool:
    """Whether a semiring constant (`zero` or `one`) is a single number:
    the semiring's weights are then plain float arrays."""
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def leaves_of(value: Any) -> list[Any]:
    """The leaves of a record or constant, in pytree order."""
    return jax.tree_util.tree_leaves(value)


def dtype_of(record: Record) -> np.dtype:
    """The dtype of a record's first leaf (every leaf shares it)."""
    return np.dtype(leaves_of(record)[0].dtype)


def full(value: Any, shape: tuple[int, ...], dtype: DTypeLike) -> Record:
    """A record array of `shape` records, each equal to `value` (a
    semiring constant): leaves [*shape, *r]."""
    return jax.tree_util.tree_map(
        lambda leaf: jnp.broadcast_to(jnp.asarray(leaf, dtype), (*shape, *np.shape(leaf))),
        value,
    )


def take(record: Record, index: Any) -> Record:
    """`record[index]` on every leaf (a gather along the leading axes)."""
    return jax.tree_util.tree_map(lambda leaf: leaf[index], record)


def append(record: Record, *values: Any) -> Record:
    """A record array [N] followed by the constants `values`: [N + len]."""
    dtype = dtype_of(record)
    extra = [full(value, (1,), dtype) for value in values]
    return jax.tree_util.tree_map(lambda *leaves: jnp.concatenate(leaves), record, *extra)


def where(mask: Any, on: Record, off: Record) -> Record:
    """`on` where `mask` (bool over the leading axes) holds, else `off`;
    either may be a constant, broadcast to the other's shape and dtype."""
    mask = jnp.asarray(mask)

    def pick(leaf_on: Any, leaf_off: Any) -> jax.Array:
        leaf_on, leaf_off = jnp.asarray(leaf_on), jnp.asarray(leaf_off)
        like = leaf_on if leaf_on.ndim >= leaf_off.ndim else leaf_off
        grown = mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))
        return jnp.where(grown, leaf_on.astype(like.dtype), leaf_off.astype(like.dtype))

    return jax.tree_util.tree_map(pick, on, off)


def update_slice(record: Record, new: Record, start: Any) -> Record:
    """`record` with `new` written from leading index `start` (one axis)."""
    start = jnp.asarray(start)
    origin = jnp.zeros((), start.dtype)  # index types must match under x64
    return jax.tree_util.tree_map(
        lambda leaf, part: jax.lax.dynamic_update_slice(
            leaf, part.astype(leaf.dtype), (start,) + (origin,) * (leaf.ndim - 1)
        ),
        record,
        new,
    )
