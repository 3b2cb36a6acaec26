"""Pruning for k2's pruned transducer loss: the label positions each frame
keeps, from the simple loss's posteriors (`rnnt_prune_ranges`), and the
joiner's inputs there (`rnnt_prune`: [B, T, s_range, C]).

Each frame keeps the `s_range` consecutive positions with the most
posterior mass; the starts are then made non-decreasing and such that the
kept positions hold a complete path. `rnnt_loss_pruned`
(`transducer/pruned.py`) is the loss over them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.inputs import as_array, check_float_array, dtype_of
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import grid
from semiring_jax._src.transducer.simple import check_am_lm, simple_moves

__all__ = ["check_ranges", "rnnt_prune", "rnnt_prune_ranges"]


def _monotonic_lower_bound(values: jax.Array) -> jax.Array:
    """Each entry the least of itself and every later one along the last axis."""
    return jnp.flip(jax.lax.cummin(jnp.flip(values, -1), axis=values.ndim - 1), -1)


def _adjusted_lower_bound(s_begin: jax.Array, s_range: int) -> jax.Array:
    """k2's `_adjust_pruning_lower_bound`: non-decreasing starts that rise by
    at most s_range - 1 a frame and start at 0."""
    frames = (s_range - 1) * jnp.arange(s_begin.shape[1], dtype=s_begin.dtype)[None, :]
    s_begin = _monotonic_lower_bound(s_begin)
    s_begin = _monotonic_lower_bound(frames - s_begin)
    return frames - jnp.maximum(s_begin, 0)


@functools.partial(jax.jit, static_argnames=("s_range", "blank"))
@per_device(lambda *args: [True] * len(args))
def _prune_ranges(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    s_range: int,
    blank: int,
) -> jax.Array:
    blank_lp, emit_lp = simple_moves(am, lm, labels, blank)
    band = bands.full_grid(*blank_lp.shape)
    _, (blank_post, emit_post) = grid.total_and_posteriors(
        band, blank_lp, emit_lp, frame_lengths, label_lengths
    )
    num_positions = blank_post.shape[2]
    starts = num_positions - s_range + 1
    # Blank mass in each window [s0, s0 + s_range) less the label mass into
    # s0. The window sums are a product with a 0/1 band matrix: as a sum of
    # s_range shifted reads, XLA fused the posteriors into each and
    # computed them s_range times.
    position = jnp.arange(num_positions)[:, None]
    first = jnp.arange(starts)[None, :]
    in_window = ((position >= first) & (position < first + s_range)).astype(blank_post.dtype)
    # HIGHEST: at the default (one bfloat16 pass on a TPU, TF32 on recent
    # GPUs) 1-3 % of the windows' argmaxes moved.
    windows = jnp.einsum("btu,us->bts", blank_post, in_window, precision=jax.lax.Precision.HIGHEST)
    into_start = jnp.concatenate(
        [jnp.zeros_like(emit_post[:, :, :1]), emit_post[:, :, : starts - 1]], axis=2
    )
    s_begin = jnp.argmax(windows - into_start, axis=2).astype(jnp.int32)  # [B, T]
    frame = jnp.arange(am.shape[1], dtype=jnp.int32)[None, :]
    last_start = jnp.maximum(label_lengths - s_range + 1, 0)[:, None]
    s_begin = jnp.where(frame < frame_lengths[:, None] - 1, s_begin, last_start)
    s_begin = _adjusted_lower_bound(s_begin, s_range)
    return s_begin[:, :, None] + jnp.arange(s_range, dtype=jnp.int32)[None, None, :]


def rnnt_prune_ranges(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    s_range: int,
    *,
    blank: int = 0,
) -> jax.Array:
    """For each frame, the `s_range` consecutive label positions to keep
    (k2's `get_rnnt_prune_ranges`), from the simple loss's posteriors.

    Each frame's window starts where its blank posterior mass, less the
    label mass entering the window, is largest; the starts are then made
    non-decreasing, rising by at most s_range - 1 a frame from 0, and the
    frames from T_b - 1 on end at U_b, so that the windows contain a
    complete path. `s_range` is capped at U + 1; with concrete lengths it
    widens, as k2's does, to the least size that admits a path, max over
    the batch of (U_b - 1) // T_b + 2 (traced lengths keep the size given).

    Args:
      am, lm, frame_lengths, labels, label_lengths, blank: as in
        `rnnt_loss_simple` (no gradient flows through the ranges).
      s_range: the positions kept per frame, an int >= 2.
    Returns:
      int32 [B, T, s_range'], the kept positions, each in [0, U]. They
      lie in [0, U_b] only where s_range' <= U_b + 1: an utterance with
      fewer positions keeps 0, 1, ..., s_range' - 1 at every frame, and
      those past U_b hold no node of its grid (`rnnt_loss_pruned` gives
      them no move; `rnnt_prune` reads `lm`'s padding rows there).
    Raises:
      ValueError: as `rnnt_loss_simple`, or for `s_range` < 2.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> am, lm = jnp.zeros((1, 3, 4)), jnp.zeros((1, 3, 4))
      >>> ranges = sj.rnnt_prune_ranges(am, lm, jnp.array([3]), jnp.array([[1, 2]]),
      ...                               jnp.array([2]), 2)
      >>> ranges.shape
      (1, 3, 2)
    """
    fn = "rnnt_prune_ranges"
    s_range = _check_s_range(s_range, fn)
    args = check_am_lm(am, lm, frame_lengths, labels, label_lengths, blank, fn)
    frames, label_counts = args[2], args[4]
    if not checks.is_traced(frames) and not checks.is_traced(label_counts):
        frame_values = np.maximum(np.asarray(frames), 1)
        least = int(((np.asarray(label_counts) - 1) // frame_values + 2).max(initial=2))
        s_range = max(s_range, least)
    s_range = min(s_range, args[1].shape[1])
    return _prune_ranges(*jax.lax.stop_gradient(args), s_range=s_range, blank=int(blank))


def _check_s_range(s_range: Any, fn: str) -> int:
    value = checks.check_int(s_range, "s_range", fn)
    if value < 2:
        raise ValueError(f"{fn}: s_range must be >= 2 (a window must hold a path), got {value}")
    return value


def check_ranges(
    ranges: npt.ArrayLike, batch: int, num_frames: int, num_labels: int, fn: str
) -> np.ndarray | jax.Array:
    """`ranges` [B, T, s_range] as int32, concrete values checked to lie in
    [0, U] at their own width first (int64 2**32 + k would wrap to k) and
    returned as numpy (the callers' host checks read them there; the
    jitted ops take them as they are)."""
    ranges = as_array(ranges, "ranges", fn)
    if np.ndim(ranges) != 3 or tuple(np.shape(ranges)[:2]) != (batch, num_frames):
        raise ValueError(
            f"{fn}: ranges must have shape [B, T, s_range] = [{batch}, {num_frames}, s_range], "
            f"got {tuple(np.shape(ranges))}"
        )
    if not np.issubdtype(dtype_of(ranges), np.integer):
        raise ValueError(f"{fn}: ranges must hold integers, got {dtype_of(ranges)}")
    if not checks.is_traced(ranges):
        values = np.asarray(ranges)
        if values.size and (values.min() < 0 or values.max() > num_labels):
            raise ValueError(
                f"{fn}: ranges must lie in [0, U] = [0, {num_labels}], "
                f"got values in [{values.min()}, {values.max()}]"
            )
        return values.astype(np.int32)  # in [0, U]: no value changes
    traced, dtype = jnp.asarray(ranges), dtype_of(ranges)
    if np.can_cast(dtype, np.int32):
        return traced.astype(jnp.int32)
    # Traced wider ones are clipped to int32 before the cast, not wrapped:
    # past it, consecutive positions collapse into one (the pruned loss's
    # NaN), where 2**32 + k would have become k. The bounds are cast to the
    # ranges' dtype, so an unsigned one is clipped from 0.
    int32 = np.iinfo(np.int32)
    low = 0 if np.issubdtype(dtype, np.unsignedinteger) else int32.min
    return jnp.clip(traced, low, int32.max).astype(jnp.int32)


def rnnt_prune(
    am: npt.ArrayLike, lm: npt.ArrayLike, ranges: npt.ArrayLike
) -> tuple[jax.Array, jax.Array]:
    """The joiner's inputs at the kept positions (k2's `do_rnnt_pruning`).

    Args:
      am: float [B, T, C]; lm: float [B, U+1, C]; ranges: int [B, T, s_range]
        (`rnnt_prune_ranges`).
    Returns:
      (am_pruned, lm_pruned), each [B, T, s_range, C]: `am` repeated over
      the kept positions, and `lm` at them.
    Raises:
      ValueError: for shapes that do not match, or concrete ranges outside
        [0, U] (checked at their own width, before any cast to int32).
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> am, lm = jnp.zeros((1, 3, 5)), jnp.arange(15.0).reshape(1, 3, 5)
      >>> ranges = jnp.array([[[0, 1], [1, 2], [1, 2]]])
      >>> am_p, lm_p = sj.rnnt_prune(am, lm, ranges)
      >>> am_p.shape, float(lm_p[0, 1, 0, 0])
      ((1, 3, 2, 5), 5.0)
    """
    fn = "rnnt_prune"
    am = check_float_array(am, 3, "[B, T, C]", "am", fn)
    lm = check_float_array(lm, 3, "[B, U+1, C]", "lm", fn)
    ranges = check_ranges(ranges, am.shape[0], am.shape[1], lm.shape[1] - 1, fn)
    if lm.shape[0] != am.shape[0] or lm.shape[2] != am.shape[2]:
        raise ValueError(f"{fn}: lm {lm.shape} does not match am {am.shape}: expected [B, U+1, C]")
    return _prune(am, lm, ranges)


@jax.jit
@per_device(lambda *args: [True] * len(args))
def _prune(am: jax.Array, lm: jax.Array, ranges: jax.Array) -> tuple[jax.Array, jax.Array]:
    # One gather straight to [B, T, s_range, C]: through a flat [B, T·s_range]
    # index, XLA computed the gradient twice, once per shape. Per utterance
    # (batching dims): an index of entries (arange(B)) would gather the whole
    # lm onto each device of a sharded batch.
    lm_pruned = jax.vmap(lambda rows, kept: rows[kept])(lm, jnp.clip(ranges, 0, lm.shape[1] - 1))
    return _repeated(am, ranges.shape[2]), lm_pruned


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _repeated(am: jax.Array, s_range: int) -> jax.Array:
    """am [B, T, C] repeated over the kept positions: [B, T, s_range, C]."""
    batch, num_frames, channels = am.shape
    return jnp.broadcast_to(am[:, :, None, :], (batch, num_frames, s_range, channels))


def _repeated_forward(am: jax.Array, s_range: int) -> tuple[jax.Array, None]:
    return _repeated(am, s_range), None


def _repeated_backward(s_range: int, _: None, cotangent: jax.Array) -> tuple[jax.Array]:
    # A sum of s_range slices, elementwise (one pass, fused with whatever
    # makes the cotangent); a reduction over the axis ran ~2x slower on a CPU.
    return (functools.reduce(jnp.add, (cotangent[:, :, k] for k in range(s_range))),)


_repeated.defvjp(_repeated_forward, _repeated_backward)
