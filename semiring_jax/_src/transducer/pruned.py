"""k2's pruned transducer loss: the loss over the label positions each
frame keeps (`rnnt_prune_ranges`), from the joiner's logits there.

The kept positions are a band of the grid (`transducer/band.py`): s_t,
s_t + 1, ..., s_t + s_range - 1 at frame t, with non-decreasing starts.
The recursion runs on the band's own [T + U + 1, B, s_range] layout, not
on the full grid, and the log-softmax over V is fused into the gradient
(`transducer/fused.py`), as in `rnnt_loss`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.inputs import check_float_array, check_labels, check_lengths
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import fused
from semiring_jax._src.transducer.band import Band
from semiring_jax._src.transducer.pruning import check_ranges

__all__ = ["rnnt_loss_pruned"]


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
@per_device(lambda *args: [True] * len(args))
def _pruned_loss(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    ranges: jax.Array,
    blank: int,
    delay_penalty: float,
) -> jax.Array:
    num_positions = labels.shape[1] + 1
    band, ok = _pruned_band(ranges, frame_lengths, num_positions)
    by_position = fused.labels_by_position(labels, blank)
    # Per utterance (batching dims): an index of entries would gather the
    # whole batch onto each device of a sharded batch.
    label_at = jax.vmap(lambda row, kept: row[kept])(
        by_position, jnp.clip(ranges, 0, num_positions - 1)
    )  # [B, T, s_range]
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
      ranges: int [B, T, s_range], from `rnnt_prune_ranges`: at each frame
        consecutive positions s_t, ..., s_t + s_range - 1 in [0, U], the
        starts not decreasing over the utterance's frames (k2's pruned
        loss assumes the same; frames past `frame_lengths[b]` are ignored).
      delay_penalty: as in `rnnt_loss_simple`.
    Returns:
      float [B]: +inf where the kept positions hold no path; NaN where
      traced `ranges` (inside `jax.jit`) are not consecutive with
      non-decreasing starts, which concrete ones are refused for (traced
      values past int32 are clipped to it first, never wrapped).
    Raises:
      ValueError: for shapes that do not match, lengths out of range, a
        used label outside [0, V) or equal to `blank`, a `delay_penalty`
        that is not finite, or concrete ranges outside [0, U] (checked at
        their own width), not consecutive, or with a falling start (naming
        the utterance and frame).
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
    ranges = check_ranges(ranges, batch, num_frames, labels.shape[1], fn)
    if ranges.shape[2] != s_range:
        raise ValueError(
            f"{fn}: ranges keeps {ranges.shape[2]} positions a frame but logits has {s_range}"
        )
    if not checks.is_traced(ranges) and not checks.is_traced(frame_lengths):
        _check_band(np.asarray(ranges), np.asarray(frame_lengths), fn)
    return _pruned_loss(
        logits,
        frame_lengths,
        labels,
        label_lengths,
        ranges,
        blank=int(blank),
        delay_penalty=checks.check_finite_float(delay_penalty, "delay_penalty", fn),
    )
