"""Levenshtein distances of padded label sequences, batched (traced)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.inputs import as_array, dtype_of
from semiring_jax._src.core.sharding import per_device, varying_like

__all__ = ["edit_distance"]


def _check_labels(labels: Any, name: str, shape: str) -> Any:
    """`labels` as an integer array of rank 1 or 2; a ValueError otherwise."""
    labels = as_array(labels, name, "edit_distance")
    if np.ndim(labels) not in (1, 2):
        raise ValueError(
            f"edit_distance: {name} must have rank 2, {shape}, or rank 1 for one "
            f"sequence, got shape {tuple(np.shape(labels))}"
        )
    if not np.issubdtype(dtype_of(labels), np.integer):
        raise ValueError(f"edit_distance: {name} must hold integers, got {dtype_of(labels)}")
    return labels


def _check_lengths(lengths: Any, batch: tuple[int, ...], limit: int, name: str) -> jax.Array:
    """int32 lengths of shape `batch` in [0, limit]: values checked when
    concrete (before any cast, so that 2**32 + 5 never wraps to 5), clamped
    when traced."""
    lengths = as_array(lengths, name, "edit_distance")
    described = "[B]" if batch else "[] (a scalar, as the sequences are unbatched)"
    checks.check_shape(lengths, name, "edit_distance", batch, described)
    if not np.issubdtype(dtype_of(lengths), np.integer):
        raise ValueError(f"edit_distance: {name} must hold integers, got {dtype_of(lengths)}")
    if checks.is_traced(lengths):
        return jnp.clip(lengths, 0, limit).astype(jnp.int32)
    values = np.asarray(lengths).reshape(-1)
    bad = np.flatnonzero((values < 0) | (values > limit))
    if bad.size:
        b = int(bad[0])
        where = f"{name}[{b}]" if batch else name
        raise ValueError(
            f"edit_distance: {where} = {values[b]} is outside [0, {limit}] (the padded length)"
        )
    return jnp.asarray(lengths).astype(jnp.int32)


def check_label_range(
    labels: Any,
    lengths: Any,
    name: str,
    dtype: Any,
    fn: str = "edit_distance",
    why: str = "int32 unless jax_enable_x64 is on",
) -> None:
    """Raises unless each concrete label before its sequence's length
    (labels int [B, N] or [N], lengths [B] or []) fits `dtype`, at full
    width: the labels are compared as `dtype`, where a wider value would
    wrap (2**32 + 1 to 1 as int32). Traced labels are already in JAX's
    dtype; traced lengths check every entry."""
    if checks.is_traced(labels) or np.can_cast(dtype_of(labels), dtype):
        return  # no value of the labels' dtype can be outside (no host copy)
    values = np.asarray(labels)
    info = np.iinfo(dtype)
    outside = (values < info.min) | (values > info.max)
    if not checks.is_traced(lengths):
        position = np.arange(values.shape[-1])
        outside &= position < np.asarray(lengths)[..., None]  # entries past a length are ignored
    bad = np.argwhere(outside)
    if bad.size:
        where = ", ".join(str(int(i)) for i in bad[0])
        raise ValueError(
            f"{fn}: {name}[{where}] = {values[tuple(bad[0])]} is outside {np.dtype(dtype)}, "
            f"the dtype the labels are compared in ({why})"
        )


@jax.jit
@per_device(lambda *args: [True] * len(args))
def _distances(
    hyp: jax.Array, hyp_lengths: jax.Array, ref: jax.Array, ref_lengths: jax.Array
) -> jax.Array:
    """The row DP over ref, scanned over hyp positions; int32 [B]."""
    batch, ref_size = ref.shape
    columns = jnp.arange(ref_size + 1, dtype=jnp.int32)  # [M + 1]
    first_row = jnp.broadcast_to(columns, (batch, ref_size + 1))  # [B, M + 1]

    def step(row: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        index, labels = xs  # [], [B]
        substitute = row[:, :-1] + (labels[:, None] != ref).astype(jnp.int32)  # [B, M]
        delete = row[:, 1:] + 1
        start = jnp.full((batch, 1), index + 1, jnp.int32)
        candidate = jnp.concatenate([start, jnp.minimum(substitute, delete)], axis=1)
        # Insertions chain along the row: new[j] = min over k <= j of
        # candidate[k] + (j - k), a cumulative min of candidate - j.
        new = jax.lax.cummin(candidate - columns[None, :], axis=1) + columns[None, :]
        # Past a hypothesis's length the row stays; columns past the
        # reference's length never feed the ones before it.
        return jnp.where((index < hyp_lengths)[:, None], new, row), None

    positions = jnp.arange(hyp.shape[1], dtype=jnp.int32)
    # Inside jax.shard_map the sequences are per device, the first row not.
    first_row = varying_like(first_row, hyp, ref, hyp_lengths)
    row, _ = jax.lax.scan(step, first_row, (positions, hyp.T))
    return jnp.take_along_axis(row, ref_lengths[:, None], axis=1)[:, 0]


def edit_distance(
    hyp: jax.typing.ArrayLike,
    hyp_lengths: jax.typing.ArrayLike,
    ref: jax.typing.ArrayLike,
    ref_lengths: jax.typing.ArrayLike,
) -> jax.Array:
    """Levenshtein distances of padded label sequences.

    The least number of insertions, deletions and substitutions (each
    costing 1) that turn `hyp[b, :hyp_lengths[b]]` into
    `ref[b, :ref_lengths[b]]`. Entries past a length are ignored, whatever
    they hold. Runs under `jax.jit` and `jax.vmap` (traced lengths are
    clamped to [0, N] and [0, M] instead of checked).

    Args:
      hyp: int [B, N], the hypotheses, padded; or [N], one sequence. N may be 0.
      hyp_lengths: int [B] in [0, N]; a scalar for an unbatched `hyp`.
      ref: int [B, M], the references, padded; or [M] (with [N] `hyp`). M may be 0.
      ref_lengths: int [B] in [0, M]; a scalar for an unbatched `ref`.
    Returns:
      int32 [B], or [] for unbatched sequences.
    Raises:
      ValueError: for labels that are not integers of rank 2 (or both rank
        1), batch sizes that differ, lengths of the wrong shape, a length
        outside [0, N] / [0, M] (naming the entry b and its value), or a
        concrete label before its length that does not fit the dtype the
        labels are compared in (int32 unless jax_enable_x64 is on; checked
        at full width, naming the entry).
    Examples:
      >>> import semiring_jax as sj
      >>> hyp = [[1, 2, 3, 0], [4, 4, 0, 0]]
      >>> ref = [[1, 3, 3], [5, 0, 0]]
      >>> print(sj.edit_distance(hyp, [3, 2], ref, [3, 1]))
      [1 2]
      >>> print(sj.edit_distance([7, 8], 2, [8], 1))
      1
    """
    hyp = _check_labels(hyp, "hyp", "[B, N]")
    ref = _check_labels(ref, "ref", "[B, M]")
    hyp_shape, ref_shape = tuple(np.shape(hyp)), tuple(np.shape(ref))
    if len(hyp_shape) != len(ref_shape):
        raise ValueError(
            f"edit_distance: hyp has shape {hyp_shape} but ref has shape {ref_shape}; "
            f"pass both batched ([B, N] and [B, M]) or both unbatched ([N] and [M])"
        )
    batch = hyp_shape[:-1]
    if ref_shape[:-1] != batch:
        raise ValueError(
            f"edit_distance: hyp has B = {hyp_shape[0]} sequences but ref has B = {ref_shape[0]}"
        )
    hyp_lengths = _check_lengths(hyp_lengths, batch, hyp_shape[-1], "hyp_lengths")
    ref_lengths = _check_lengths(ref_lengths, batch, ref_shape[-1], "ref_lengths")
    common = np.promote_types(dtype_of(hyp), dtype_of(ref))  # uint64 with int64: float64
    label_dtype = jax.dtypes.canonicalize_dtype(common if common.kind in "iu" else np.int64)
    check_label_range(hyp, hyp_lengths, "hyp", label_dtype)
    check_label_range(ref, ref_lengths, "ref", label_dtype)
    size = batch[0] if batch else 1
    hyp = jnp.asarray(hyp).astype(label_dtype).reshape((size, hyp_shape[-1]))
    ref = jnp.asarray(ref).astype(label_dtype).reshape((size, ref_shape[-1]))
    distances = _distances(hyp, hyp_lengths.reshape(size), ref, ref_lengths.reshape(size))
    return distances.reshape(batch)
