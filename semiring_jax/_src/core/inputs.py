"""Checks of the array inputs that the dense, transducer, MMI and decoding
ops share: emissions and logits, lengths, graphs, padded label sequences.

Each names the argument and the first bad entry, and checks values at
their own width before any cast to int32 (an int64 2**32 + 5 must not wrap
to 5); traced values, which cannot be checked, are clamped into range
before the cast instead.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.host import messages

__all__ = [
    "as_array",
    "check_blank",
    "check_emissions",
    "check_float_array",
    "check_graph",
    "check_inputs",
    "check_labels",
    "check_lengths",
    "dtype_of",
]


def as_array(values: Any, name: str, fn: str) -> Any:
    """`values` as an array: an array (numpy, JAX, traced) unchanged; Python
    lists, tuples and scalars as numpy, floats in JAX's default float dtype
    (float32 unless jax_enable_x64: what `jnp.asarray` makes of them) and
    integers at full width, so that their values are checked before any
    cast to int32. A ValueError for ragged or non-numeric data."""
    if hasattr(values, "dtype") and hasattr(values, "shape"):
        return values
    try:
        array = np.asarray(values)
    except jax.errors.TracerArrayConversionError:
        return jnp.asarray(values)  # e.g. a list of traced scalars
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(
            f"{fn}: {name} must be an array, or a rectangular list or tuple, of numbers: "
            f"{messages.cut(str(err), 120)}"
        ) from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"{fn}: {name} must hold numbers (integers within int64), got dtype {array.dtype}"
        )
    if array.dtype.kind == "f":
        array = array.astype(jax.dtypes.canonicalize_dtype(array.dtype))
    return array


def dtype_of(values: Any) -> np.dtype:
    """The dtype of an array or of array-like data (lists, tuples, scalars:
    the dtype `as_array` gives them)."""
    if hasattr(values, "dtype"):
        return np.dtype(values.dtype)
    return np.dtype(as_array(values, "values", "dtype_of").dtype)


def check_float_array(values: Any, rank: int, shape: str, name: str, fn: str) -> jax.Array:
    """`values` as a float array of `rank` (its axes described by `shape`,
    e.g. "[B, T, V]"); a ValueError otherwise."""
    values = as_array(values, name, fn)
    if np.ndim(values) != rank:
        raise ValueError(
            f"{fn}: {name} must have rank {rank}, {shape}, got shape {tuple(np.shape(values))}"
        )
    dtype = dtype_of(values)
    if not np.issubdtype(dtype, np.floating):
        raise ValueError(f"{fn}: {name} must be float32 or float64, got {dtype}")
    checks.check_float_dtype(dtype, name, fn)
    return jnp.asarray(values)


def check_emissions(emissions: Any, fn: str, name: str = "emissions") -> jax.Array:
    """`emissions` as a float [B, T, V] array; a ValueError otherwise."""
    return check_float_array(emissions, 3, "[B, T, V]", name, fn)


def check_lengths(
    lengths: Any, batch: int, limit: int, fn: str, name: str, limit_name: str
) -> jax.Array:
    """int32 [B] lengths in [0, limit]: values checked when concrete (before
    the cast), clamped to [0, limit] when traced (before the cast, so that
    an int64 length of 2**32 + 5 never wraps to 5)."""
    if lengths is None:
        return jnp.full((batch,), limit, jnp.int32)
    lengths = as_array(lengths, name, fn)
    if tuple(np.shape(lengths)) != (batch,):
        raise ValueError(
            f"{fn}: {name} must have shape [B] = ({batch},), got {tuple(np.shape(lengths))}"
        )
    if not np.issubdtype(dtype_of(lengths), np.integer):
        raise ValueError(f"{fn}: {name} must hold integers, got {dtype_of(lengths)}")
    if not checks.is_traced(lengths):
        values = np.asarray(lengths)
        bad = np.flatnonzero((values < 0) | (values > limit))
        if bad.size:
            b = int(bad[0])
            raise ValueError(
                f"{fn}: {name}[{b}] = {values[b]} is outside [0, {limit_name}] = [0, {limit}]"
            )
        return jnp.asarray(lengths).astype(jnp.int32)
    return jnp.clip(lengths, 0, limit).astype(jnp.int32)


def check_inputs(
    graph: Any, emissions: Any, lengths: Any, fn: str, *, host: bool = False
) -> tuple[jax.Array, Any]:
    """The checks every dense op makes of (graph, emissions [B, T, V],
    lengths [B] or None for T): (emissions, int32 lengths), the lengths as
    numpy values with `host` (they must be concrete: the op builds on the
    host), else a JAX array."""
    emissions = check_emissions(emissions, fn)
    batch, num_frames, num_columns = emissions.shape
    if host:
        lengths = np.full(batch, num_frames) if lengths is None else lengths
        lengths = checks.concrete(lengths, "lengths", fn)
    checked = check_lengths(lengths, batch, num_frames, fn, "lengths", "T")
    check_graph(graph, batch, num_columns, emissions.dtype, fn)
    return emissions, np.asarray(lengths, np.int32) if host else checked


def check_graph(graph: Any, batch: int, num_columns: int, dtype: np.dtype, fn: str) -> None:
    """Raises unless `graph` is an Fsa shared by the batch or one per entry,
    with labels in [0, V) (checked when concrete) and the emissions' dtype."""
    if not isinstance(graph, Fsa):
        raise TypeError(f"{fn}: graph must be an Fsa, got {type(graph).__name__}")
    if graph.batch_shape not in ((), (batch,)):
        raise ValueError(
            f"{fn}: graph has batch_shape {graph.batch_shape} but emissions "
            f"has B = {batch}; pass one graph or a batch of B graphs"
        )
    if graph.dtype != dtype:
        raise ValueError(f"{fn}: graph weights are {graph.dtype} but emissions are {dtype}")
    if checks.is_traced(graph.ilabel) or checks.is_traced(graph.arc_mask):
        return
    labels = np.atleast_2d(np.asarray(graph.ilabel))  # [B or 1, A]
    real = np.atleast_2d(np.asarray(graph.arc_mask))
    bad = np.argwhere(real & ((labels < 0) | (labels >= num_columns)))
    if bad.size:
        entry, arc = (int(i) for i in bad[0])
        where = f"graph entry {entry}, arc {arc}" if graph.batch_shape else f"graph arc {arc}"
        raise ValueError(
            f"{fn}: {where} has label {labels[entry, arc]}, outside the "
            f"emission columns [0, V) = [0, {num_columns})"
        )


def check_blank(blank: Any, vocab_size: int | None, fn: str) -> int:
    """The blank as an int in [0, V) ([0, 2**31) without a V: tokens are
    int32)."""
    if vocab_size is None:
        return checks.check_int(blank, "blank", fn, 0)
    blank = checks.check_int(blank, "blank", fn)
    if not 0 <= blank < vocab_size:
        raise ValueError(f"{fn}: blank = {blank} is outside [0, V) = [0, {vocab_size})")
    return blank


def check_labels(
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    batch: int,
    vocab_size: int,
    blank: Any,
    fn: str,
) -> tuple[jax.Array, jax.Array]:
    """Padded label sequences int [B, U] and their lengths int [B] (in
    [0, U]), as int32: every used label in [0, V) and not `blank` (an int
    in [0, V)); values checked when concrete, traced ones clamped into
    range before the cast (never wrapped). The CTC and transducer losses'
    labels."""
    # Both as arrays first, so that a ragged list or None among them is
    # refused by name before anything is read.
    labels = as_array(labels, "labels", fn)
    label_lengths = as_array(label_lengths, "label_lengths", fn)
    if np.ndim(labels) != 2 or np.shape(labels)[0] != batch:
        raise ValueError(
            f"{fn}: labels must have shape [B, U] with B = {batch}, got {tuple(np.shape(labels))}"
        )
    if not np.issubdtype(dtype_of(labels), np.integer):
        raise ValueError(f"{fn}: labels must hold integers, got {dtype_of(labels)}")
    max_labels = np.shape(labels)[1]
    blank = check_blank(blank, vocab_size, fn)
    label_lengths = check_lengths(label_lengths, batch, max_labels, fn, "label_lengths", "U")
    if not checks.is_traced(labels) and not checks.is_traced(label_lengths):
        values = np.asarray(labels)
        used = np.arange(max_labels) < np.asarray(label_lengths)[:, None]
        bad = np.argwhere(used & ((values < 0) | (values >= vocab_size) | (values == blank)))
        if bad.size:
            b, u = (int(i) for i in bad[0])
            raise ValueError(
                f"{fn}: labels[{b}, {u}] = {values[b, u]} is outside [0, V) = "
                f"[0, {vocab_size}) or equals blank = {blank}"
            )
    # Padding (and, traced, anything) into [0, V) before the cast, so that
    # an int64 label never wraps to a small int32 one.
    labels = jnp.clip(jnp.asarray(labels), 0, vocab_size - 1).astype(jnp.int32)
    return labels, label_lengths
