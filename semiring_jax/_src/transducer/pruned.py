"""The pruned transducer loss, k2's recipe: the simple and smoothed losses,
the pruning ranges they give, the joiner's inputs at those ranges, and the
loss over the kept positions.

The simple loss's joiner is additive, `am[b, t] + lm[b, u]`, so its
log-normaliser over V at every node is a matrix product of exponentials
(shifted by each row's maximum), never a [B, T, U+1, V] array. Its move
posteriors say where the paths go; each frame keeps the `s_range`
consecutive label positions with the most posterior mass
(`rnnt_prune_ranges`), the user's joiner runs there only
(`rnnt_prune`: [B, T, s_range, C]), and `rnnt_loss_pruned` is the loss of
the grid restricted to the kept positions. Every loss here goes through
`grid.lattice_nll`: the recursion's gradient is the moves' posteriors, and
autodiff carries it through each loss's own gathers.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.dense.ctc import check_int, check_labels
from semiring_jax._src.dense.dense import as_array, check_float_array, check_lengths, dtype_of
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import fused, grid
from semiring_jax._src.transducer.band import Band

__all__ = [
    "rnnt_loss_pruned",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
    "rnnt_prune",
    "rnnt_prune_ranges",
]


def _check_am_lm(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    blank: Any,
    fn: str,
) -> tuple[jax.Array, ...]:
    am = check_float_array(am, 3, "[B, T, V]", "am", fn)
    lm = check_float_array(lm, 3, "[B, U+1, V]", "lm", fn)
    batch, num_frames, vocab = am.shape
    if lm.shape[0] != batch or lm.shape[2] != vocab or lm.dtype != am.dtype:
        raise ValueError(
            f"{fn}: lm {lm.shape} {lm.dtype} does not match am {am.shape} {am.dtype}: "
            f"expected [B, U+1, V] = [{batch}, U+1, {vocab}] of {am.dtype}"
        )
    frame_lengths = check_lengths(frame_lengths, batch, num_frames, fn, "frame_lengths", "T")
    labels, label_lengths = check_labels(labels, label_lengths, batch, vocab, blank, fn)
    if labels.shape[1] + 1 != lm.shape[1]:
        raise ValueError(
            f"{fn}: lm has U + 1 = {lm.shape[1]} label positions, but labels has room "
            f"for U = {labels.shape[1]} labels (expected {labels.shape[1] + 1})"
        )
    return am, lm, frame_lengths, labels, label_lengths


def _delay_penalty(emit_lp: jax.Array, frame_lengths: jax.Array, delay_penalty: float) -> Any:
    """k2's delay penalty on the label moves [B, T, U+1] (`fused.delay_offset`)."""
    offset = fused.delay_offset(emit_lp.shape[1], frame_lengths, delay_penalty, emit_lp.dtype)
    return emit_lp + offset


def _full_nll(
    blank_lp: jax.Array, emit_lp: jax.Array, frame_lengths: jax.Array, label_lengths: jax.Array
) -> jax.Array:
    """`grid.lattice_nll` of move log-probs [B, T, U+1] over the full grid."""
    band = bands.full_grid(*blank_lp.shape)
    return grid.lattice_nll(blank_lp, emit_lp, frame_lengths, label_lengths, band)


def _label_columns(values: jax.Array, labels: jax.Array) -> jax.Array:
    """values[b, i, labels[b, u]] [B, I, U] of values [B, I, V]."""
    index = jnp.broadcast_to(labels[:, None, :], (*values.shape[:2], labels.shape[1]))
    return jnp.take_along_axis(values, index, axis=2)


def _normalisers(am: jax.Array, lm: jax.Array) -> jax.Array:
    """log Σ_v exp(am[b, t, v] + lm[b, u, v]) [B, T, U+1], as k2 computes it:
    a matrix product of the exponentials shifted by each row's maximum
    (plus the dtype's tiny, so that an all-zero row logs to a finite value)."""
    am_max = jax.lax.stop_gradient(jnp.max(am, axis=2, keepdims=True))
    lm_max = jax.lax.stop_gradient(jnp.max(lm, axis=2, keepdims=True))
    products = jnp.einsum("btv,buv->btu", jnp.exp(am - am_max), jnp.exp(lm - lm_max))
    tiny = jnp.finfo(am.dtype).tiny
    return jnp.log(products + tiny) + am_max + jnp.moveaxis(lm_max, 1, 2)


def _simple_moves(
    am: jax.Array, lm: jax.Array, labels: jax.Array, blank: int
) -> tuple[jax.Array, jax.Array]:
    """(blank, label) move log-probs [B, T, U+1] of the additive joiner."""
    normalisers = _normalisers(am, lm)
    blank_lp = am[:, :, blank][:, :, None] + lm[:, :, blank][:, None, :] - normalisers
    label_am = _label_columns(am, labels)  # [B, T, U]
    label_lm = jnp.take_along_axis(lm[:, :-1], labels[:, :, None], axis=2)[..., 0]  # [B, U]
    emit_lp = label_am + label_lm[:, None, :] - normalisers[:, :, :-1]
    return blank_lp, _with_last_position(emit_lp)


def _with_last_position(emit_lp: jax.Array) -> jax.Array:
    """[B, T, U] → [B, T, U+1]: no label move out of u = U."""
    return jnp.concatenate(
        [emit_lp, jnp.full((*emit_lp.shape[:2], 1), -jnp.inf, emit_lp.dtype)], axis=2
    )


@functools.partial(jax.jit, static_argnames=("blank", "delay_penalty"))
def _simple_loss(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    delay_penalty: float,
) -> jax.Array:
    blank_lp, emit_lp = _simple_moves(am, lm, labels, blank)
    emit_lp = _delay_penalty(emit_lp, frame_lengths, delay_penalty)
    return _full_nll(blank_lp, emit_lp, frame_lengths, label_lengths)


def rnnt_loss_simple(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    *,
    blank: int = 0,
    delay_penalty: float = 0.0,
) -> jax.Array:
    """k2's "simple" transducer loss: the joiner is `am[b, t] + lm[b, u]`.

    Normalised over V at every node (t, u) without a [B, T, U+1, V] array:
    log Σ_v exp(am + lm) is a matrix product of the shifted exponentials.
    Differentiable with respect to `am` and `lm`.

    Args:
      am: float [B, T, V], the encoder's projections.
      lm: float [B, U+1, V], the prediction network's.
      frame_lengths, labels, label_lengths, blank: as in `rnnt_loss`.
      delay_penalty: k2's: delay_penalty · ((T_b - 1)/2 - t) is added to
        every label emission at frame t (nothing for a value <= 0).
    Returns:
      float [B], the negative log-likelihoods (+inf without a path).
    Raises:
      ValueError: for shapes that do not match, lengths out of range, or a
        used label outside [0, V) or equal to `blank`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> am, lm = jnp.zeros((1, 2, 3)), jnp.zeros((1, 2, 3))  # uniform over 3
      >>> loss = sj.rnnt_loss_simple(am, lm, jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-loss), 4))
      [0.0741]
    """
    args = _check_am_lm(am, lm, frame_lengths, labels, label_lengths, blank, "rnnt_loss_simple")
    return _simple_loss(*args, blank=int(blank), delay_penalty=float(delay_penalty))


def _smoothed_moves(
    am: jax.Array,
    lm: jax.Array,
    labels: jax.Array,
    blank: int,
    lm_only_scale: float,
    am_only_scale: float,
) -> tuple[jax.Array, jax.Array]:
    """k2's smoothed move log-probs: the simple ones, the LM's alone and the
    AM's with a unigram LM (the mean of the LM's distributions over the
    whole padded batch, as k2 takes it), interpolated."""
    blank_lp, emit_lp = _simple_moves(am, lm, labels, blank)
    am_max = jax.lax.stop_gradient(jnp.max(am, axis=2, keepdims=True))
    lm_max = jax.lax.stop_gradient(jnp.max(lm, axis=2, keepdims=True))
    am_probs, lm_probs = jnp.exp(am - am_max), jnp.exp(lm - lm_max)
    lm_totals = jnp.sum(lm_probs, axis=2, keepdims=True)  # [B, U+1, 1]
    tiny = jnp.finfo(am.dtype).tiny
    unigram = jnp.mean(lm_probs / lm_totals, axis=(0, 1)) + tiny  # [V]
    am_only_norm = jnp.log(am_probs @ unigram)[:, :, None] + am_max  # [B, T, 1]
    log_unigram = jnp.log(unigram)
    lm_only_norm = jnp.log(lm_totals) + lm_max  # [B, U+1, 1]
    label_am = _label_columns(am, labels)  # [B, T, U]
    label_lm = jnp.take_along_axis(lm[:, :-1], labels[:, :, None], axis=2)[..., 0]  # [B, U]
    emit_am_only = _with_last_position(label_am + log_unigram[labels][:, None, :] - am_only_norm)
    emit_lm_only = _with_last_position(
        jnp.broadcast_to((label_lm - lm_only_norm[:, :-1, 0])[:, None, :], label_am.shape)
    )
    blank_am_only = am[:, :, blank][:, :, None] + log_unigram[blank] - am_only_norm
    blank_lm_only = (lm[:, :, blank] - lm_only_norm[:, :, 0])[:, None, :]
    combined = 1.0 - lm_only_scale - am_only_scale
    # As k2: a zero scale is 1e-20, so that a -inf term stays -inf, not NaN.
    lm_only_scale, am_only_scale = lm_only_scale or 1e-20, am_only_scale or 1e-20
    blank_lp = combined * blank_lp + lm_only_scale * blank_lm_only + am_only_scale * blank_am_only
    emit_lp = combined * emit_lp + lm_only_scale * emit_lm_only + am_only_scale * emit_am_only
    return blank_lp, emit_lp


@functools.partial(
    jax.jit, static_argnames=("blank", "lm_only_scale", "am_only_scale", "delay_penalty")
)
def _smoothed_loss(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    lm_only_scale: float,
    am_only_scale: float,
    delay_penalty: float,
) -> jax.Array:
    blank_lp, emit_lp = _smoothed_moves(am, lm, labels, blank, lm_only_scale, am_only_scale)
    emit_lp = _delay_penalty(emit_lp, frame_lengths, delay_penalty)
    return _full_nll(blank_lp, emit_lp, frame_lengths, label_lengths)


def rnnt_loss_smoothed(
    am: npt.ArrayLike,
    lm: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    *,
    lm_only_scale: float = 0.25,
    am_only_scale: float = 0.0,
    blank: int = 0,
    delay_penalty: float = 0.0,
) -> jax.Array:
    """k2's smoothed simple loss: the simple loss's move log-probs
    interpolated with the LM's alone (`lm_only_scale`) and the AM's with a
    unigram LM (`am_only_scale`; the unigram is the mean of the LM's
    distributions over the whole padded batch, as in k2).

    Args:
      am, lm, frame_lengths, labels, label_lengths, blank, delay_penalty: as
        in `rnnt_loss_simple`.
      lm_only_scale, am_only_scale: the interpolation weights (the simple
        loss's is 1 minus both).
    Returns:
      float [B].
    Raises:
      ValueError: as `rnnt_loss_simple`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> am, lm = jnp.zeros((1, 2, 3)), jnp.zeros((1, 2, 3))
      >>> args = (jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-sj.rnnt_loss_smoothed(am, lm, *args)), 4))
      [0.0741]
    """
    args = _check_am_lm(am, lm, frame_lengths, labels, label_lengths, blank, "rnnt_loss_smoothed")
    return _smoothed_loss(
        *args,
        blank=int(blank),
        lm_only_scale=float(lm_only_scale),
        am_only_scale=float(am_only_scale),
        delay_penalty=float(delay_penalty),
    )


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
def _prune_ranges(
    am: jax.Array,
    lm: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    s_range: int,
    blank: int,
) -> jax.Array:
    blank_lp, emit_lp = _simple_moves(am, lm, labels, blank)
    band = bands.full_grid(*blank_lp.shape)
    _, (moves, alpha) = grid.forward(band, blank_lp, emit_lp, frame_lengths, label_lengths)
    blank_post, emit_post = grid.move_posteriors(
        band, moves, alpha, frame_lengths, label_lengths, am.shape[1]
    )
    num_positions = blank_post.shape[2]
    starts = num_positions - s_range + 1
    # Blank mass in each window [s0, s0 + s_range) less the label mass into s0.
    windows = sum(blank_post[:, :, k : k + starts] for k in range(s_range))
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
      int32 [B, T, s_range'], the kept positions, each in [0, U].
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
    args = _check_am_lm(am, lm, frame_lengths, labels, label_lengths, blank, fn)
    frames, label_counts = args[2], args[4]
    if not checks.is_traced(frames) and not checks.is_traced(label_counts):
        frame_values = np.maximum(np.asarray(frames), 1)
        least = int(((np.asarray(label_counts) - 1) // frame_values + 2).max(initial=2))
        s_range = max(s_range, least)
    s_range = min(s_range, args[1].shape[1])
    return _prune_ranges(*jax.lax.stop_gradient(args), s_range=s_range, blank=int(blank))


def _check_s_range(s_range: Any, fn: str) -> int:
    value = check_int(s_range, "s_range", fn)
    if value < 2:
        raise ValueError(f"{fn}: s_range must be >= 2 (a window must hold a path), got {value}")
    return value


def _check_ranges(ranges: npt.ArrayLike, batch: int, num_frames: int, fn: str) -> jax.Array:
    ranges = as_array(ranges, "ranges", fn)
    if np.ndim(ranges) != 3 or tuple(np.shape(ranges)[:2]) != (batch, num_frames):
        raise ValueError(
            f"{fn}: ranges must have shape [B, T, s_range] = [{batch}, {num_frames}, s_range], "
            f"got {tuple(np.shape(ranges))}"
        )
    if not np.issubdtype(dtype_of(ranges), np.integer):
        raise ValueError(f"{fn}: ranges must hold integers, got {dtype_of(ranges)}")
    return jnp.asarray(ranges).astype(jnp.int32)


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
      ValueError: for shapes that do not match.
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
    ranges = _check_ranges(ranges, am.shape[0], am.shape[1], fn)
    if lm.shape[0] != am.shape[0] or lm.shape[2] != am.shape[2]:
        raise ValueError(f"{fn}: lm {lm.shape} does not match am {am.shape}: expected [B, U+1, C]")
    batch, num_frames, s_range = ranges.shape
    am_pruned = jnp.broadcast_to(am[:, :, None, :], (batch, num_frames, s_range, am.shape[2]))
    flat = jnp.clip(ranges, 0, lm.shape[1] - 1).reshape(batch, num_frames * s_range, 1)
    lm_pruned = jnp.take_along_axis(lm, flat, axis=1).reshape(batch, num_frames, s_range, -1)
    return am_pruned, lm_pruned


def _pruned_band(
    ranges: jax.Array, frame_lengths: jax.Array, num_positions: int
) -> tuple[Band, jax.Array]:
    """The band of the kept positions, and whether each utterance's ranges
    make one (bool [B]): consecutive positions, starts >= 0 that do not
    decrease over its frames. Frames from T_b on (and the end row) keep
    the start of frame T_b - 1; starts that fall are raised (the layout
    needs that), and the utterance is marked."""
    _, num_frames, width = ranges.shape
    starts = ranges[:, :, 0]
    frame = jnp.arange(num_frames, dtype=jnp.int32)[None, :]
    real = frame < frame_lengths[:, None]
    last_frame = jnp.clip(frame_lengths - 1, 0, num_frames - 1)[:, None]
    last = jnp.take_along_axis(starts, last_frame, axis=1)
    starts = jnp.concatenate([jnp.where(real, starts, last), last], axis=1)  # [B, T + 1]
    consecutive = ranges == ranges[:, :, :1] + jnp.arange(width, dtype=jnp.int32)[None, None, :]
    rising = jnp.diff(starts, axis=1) >= 0  # the padded frames repeat: no fall there
    ok = (
        jnp.all(consecutive | ~real[..., None], axis=(1, 2))
        & jnp.all(rising, axis=1)
        & jnp.all((starts >= 0) | ~jnp.pad(real, ((0, 0), (0, 1))), axis=1)
    )
    starts = jax.lax.cummax(jnp.maximum(starts, 0), axis=1)
    return bands.from_starts(starts, num_positions, width), ok


@functools.partial(jax.jit, static_argnames=("blank", "delay_penalty"))
def _pruned_loss(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    ranges: jax.Array,
    blank: int,
    delay_penalty: float,
) -> jax.Array:
    batch = logits.shape[0]
    num_positions = labels.shape[1] + 1
    band, ok = _pruned_band(ranges, frame_lengths, num_positions)
    # Label u+1 at each kept position u (blank at u = U: no label move).
    with_end = jnp.concatenate([labels, jnp.full((batch, 1), blank, labels.dtype)], axis=1)
    flat = jnp.clip(ranges, 0, num_positions - 1).reshape(batch, -1)
    label_at = jnp.take_along_axis(with_end, flat, axis=1).reshape(ranges.shape)
    nll = fused.logits_nll(
        logits, label_at, frame_lengths, label_lengths, band, blank, 0.0, delay_penalty
    )
    return jnp.where(ok, nll, jnp.nan)


def _check_band(ranges: np.ndarray, frame_lengths: np.ndarray, fn: str) -> None:
    """ValueError naming the first utterance and frame whose ranges are not
    consecutive positions with non-decreasing starts."""
    for b, t_b in enumerate(frame_lengths):
        kept = ranges[b, :t_b]
        gaps = np.nonzero(np.any(np.diff(kept, axis=1) != 1, axis=1))[0]
        if gaps.size:
            raise ValueError(
                f"{fn}: ranges[{b}, {gaps[0]}] = {kept[gaps[0]].tolist()} are not consecutive "
                "positions (rnnt_prune_ranges keeps s, s + 1, ..., s + s_range - 1)"
            )
        falls = np.nonzero(np.diff(kept[:, 0]) < 0)[0]
        if falls.size:
            t = falls[0] + 1
            raise ValueError(
                f"{fn}: ranges[{b}, {t}] starts at {kept[t, 0]}, below frame {t - 1}'s "
                f"{kept[t - 1, 0]}: the starts must not decrease over the frames"
            )


def rnnt_loss_pruned(
    logits: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    ranges: npt.ArrayLike,
    *,
    blank: int = 0,
    delay_penalty: float = 0.0,
) -> jax.Array:
    """The transducer loss over the kept positions only (k2's
    `rnnt_loss_pruned`): the grid's nodes outside `ranges` have no move.
    With `s_range` >= U + 1 (every position kept) it equals `rnnt_loss`.

    Args:
      logits: float [B, T, s_range, V], the joiner's outputs at `ranges`
        (from the inputs `rnnt_prune` gives).
      frame_lengths, labels, label_lengths, blank: as in `rnnt_loss`.
      ranges: int [B, T, s_range], from `rnnt_prune_ranges`.
      delay_penalty: as in `rnnt_loss_simple`.
    Returns:
      float [B] (+inf where the kept positions hold no path).
    Raises:
      ValueError: for shapes that do not match, lengths out of range, or a
        used label outside [0, V) or equal to `blank`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> logits = jnp.zeros((1, 2, 2, 3))
      >>> ranges = jnp.array([[[0, 1], [0, 1]]])
      >>> loss = sj.rnnt_loss_pruned(logits, jnp.array([2]), jnp.array([[1]]),
      ...                            jnp.array([1]), ranges)
      >>> print(jnp.round(jnp.exp(-loss), 4))  # all of the grid kept
      [0.0741]
    """
    fn = "rnnt_loss_pruned"
    logits = check_float_array(logits, 4, "[B, T, s_range, V]", "logits", fn)
    batch, num_frames, s_range, vocab = logits.shape
    frame_lengths = check_lengths(frame_lengths, batch, num_frames, fn, "frame_lengths", "T")
    labels, label_lengths = check_labels(labels, label_lengths, batch, vocab, blank, fn)
    ranges = _check_ranges(ranges, batch, num_frames, fn)
    if ranges.shape[2] != s_range:
        raise ValueError(
            f"{fn}: ranges keeps {ranges.shape[2]} positions a frame but logits has {s_range}"
        )
    if not checks.is_traced(ranges):
        values = np.asarray(ranges)
        if values.size and (values.min() < 0 or values.max() > labels.shape[1]):
            raise ValueError(f"{fn}: ranges must lie in [0, U] = [0, {labels.shape[1]}]")
        if not checks.is_traced(frame_lengths):
            _check_band(values, np.asarray(frame_lengths), fn)
    return _pruned_loss(
        logits,
        frame_lengths,
        labels,
        label_lengths,
        ranges,
        blank=int(blank),
        delay_penalty=float(delay_penalty),
    )
