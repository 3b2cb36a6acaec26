"""`rnnt_loss` and `rnnt_align`: the transducer loss and its best alignment.

The joiner's logits [B, T, U+1, V] give, at every node (t, u) of the
[T, U+1] grid, the log-softmax over V; only two of its columns enter the
recursions: the blank's and label u+1's. The loss is `fused.logits_nll`
over the full grid (the band of every node): -log of the sum over the
grid's paths, its gradient formed from the occupation posteriors and the
logits in one pass. The alignment is the max-plus recursion over the same
grid and a walk back from the end.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.inputs import check_float_array, check_labels, check_lengths
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import diagonal_scan, fused, grid

__all__ = ["rnnt_align", "rnnt_loss"]


def _check_inputs(
    logits: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    blank: Any,
    fn: str,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    logits = check_float_array(logits, 4, "[B, T, U+1, V]", "logits", fn)
    batch, num_frames, num_positions, vocab_size = logits.shape
    frame_lengths = check_lengths(frame_lengths, batch, num_frames, fn, "frame_lengths", "T")
    labels, label_lengths = check_labels(labels, label_lengths, batch, vocab_size, blank, fn)
    if labels.shape[1] + 1 != num_positions:
        raise ValueError(
            f"{fn}: logits has U + 1 = {num_positions} label positions, but labels "
            f"has room for U = {labels.shape[1]} labels (expected {labels.shape[1] + 1})"
        )
    return logits, frame_lengths, labels, label_lengths


@functools.partial(jax.jit, static_argnames=("blank", "fastemit_lambda"))
@per_device(lambda *args: [True] * len(args))
def _rnnt_loss(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    fastemit_lambda: float,
) -> jax.Array:
    batch, num_frames, num_positions, _ = logits.shape
    return fused.logits_nll(
        logits,
        fused.labels_by_position(labels, blank)[:, None, :],
        frame_lengths,
        label_lengths,
        bands.full_grid(batch, num_frames, num_positions),
        blank,
        fastemit_lambda,
        0.0,
    )


def rnnt_loss(
    logits: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    *,
    blank: int = 0,
    fastemit_lambda: float = 0.0,
) -> jax.Array:
    """The transducer (RNN-T) loss per utterance: -log P(labels | logits).

    The log-softmax over V is taken inside (fused, as torchaudio's and k2's
    are), so the gradient is with respect to the joiner's `logits`; it is
    computed from the grid's occupation posteriors (a `jax.custom_vjp`:
    reverse mode only), never by autodiff through the recursion. Nodes past
    `frame_lengths[b]` or `label_lengths[b]` get a gradient of exactly 0.

    Args:
      logits: float [B, T, U+1, V], joiner outputs.
      frame_lengths: int [B], frames per utterance in [0, T].
      labels: int [B, U], padded; entries past `label_lengths` are ignored.
      label_lengths: int [B], in [0, U] (0: an empty label sequence).
      blank: the blank symbol, an int in [0, V).
      fastemit_lambda: FastEmit's finite λ >= 0 (NeMo's rule): the value is the
        plain negative log-likelihood, and the gradient with respect to the
        label emissions' log-probabilities is scaled by 1 + λ.
    Returns:
      float [B]: +inf where an utterance has no path (no frame, or a -inf
      blank or label log-prob on every path), with gradient 0; NaN for a
      NaN logit the utterance reads.
    Raises:
      ValueError: for logits not [B, T, U+1, V] with U + 1 matching labels,
        lengths out of range, a used label outside [0, V) or equal to
        `blank`, or a `fastemit_lambda` that is negative or not finite.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> logits = jnp.zeros((1, 2, 2, 3))  # uniform over 3 symbols
      >>> loss = sj.rnnt_loss(logits, jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-loss), 4))  # two paths of three moves each
      [0.0741]
    """
    lam = checks.check_finite_float(fastemit_lambda, "fastemit_lambda", "rnnt_loss", 0.0)
    args = _check_inputs(logits, frame_lengths, labels, label_lengths, blank, "rnnt_loss")
    return _rnnt_loss(*args, blank=int(blank), fastemit_lambda=lam)


@functools.partial(jax.jit, static_argnames="blank")
@per_device(lambda *args: [True] * len(args))
def _rnnt_align(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
) -> tuple[jax.Array, jax.Array]:
    if logits.shape[0] == 0 or logits.shape[1] == 0:  # no path; nothing for the scans to read
        no_frames = jnp.full((logits.shape[0], labels.shape[1]), -1, jnp.int32)
        return no_frames, jnp.full(logits.shape[:1], -jnp.inf, logits.dtype)
    band = bands.full_grid(*logits.shape[:3])
    _, blank_lp, emit_lp = fused.move_log_probs(
        logits, fused.labels_by_position(labels, blank)[:, None, :], blank
    )
    blank_moves, emit_moves = grid.lattice(band, blank_lp, emit_lp, frame_lengths, label_lengths)
    scores, came_by_label = diagonal_scan.best_forward(
        blank_moves, emit_moves, grid.start(band, logits.dtype)
    )
    best, _ = grid.log_likelihood(
        band, (scores, jnp.zeros_like(scores)), frame_lengths, label_lengths
    )
    num_labels = labels.shape[1]

    def back(position: jax.Array, diagonal: jax.Array) -> tuple[jax.Array, Any]:
        # At the node (diagonal - u, u) of each utterance's best path.
        here_on_path = diagonal <= frame_lengths + label_lengths
        came = jnp.take_along_axis(came_by_label[diagonal], position[:, None], axis=1)[:, 0]
        by_label = came & here_on_path & (position > 0)
        # The label that moved into (t, u) was label u, emitted at frame t.
        frame = diagonal - position
        emitted = jnp.where(by_label, frame, -1)
        return jnp.where(by_label, position - 1, position), (position, emitted)

    diagonals = jnp.arange(came_by_label.shape[0], dtype=jnp.int32)
    _, (positions, emitted) = jax.lax.scan(back, label_lengths, diagonals, reverse=True)
    # emitted[n, b] is the frame of label positions[n, b] (1-based) or -1.
    slot = jnp.where(emitted >= 0, positions - 1, num_labels)  # [N, B]
    frames = jnp.full((logits.shape[0], num_labels + 1), -1, jnp.int32)
    # A scatter per utterance (batching dims): through an index of entries
    # a sharded batch would be summed over devices.
    frames = jax.vmap(lambda row, at, value: row.at[at].max(value), in_axes=(0, 1, 1))(
        frames, slot, emitted.astype(jnp.int32)
    )
    frames = frames[:, :num_labels]
    reachable = jnp.isfinite(best)
    return jnp.where(reachable[:, None], frames, -1), best


def rnnt_align(
    logits: npt.ArrayLike,
    frame_lengths: npt.ArrayLike,
    labels: npt.ArrayLike,
    label_lengths: npt.ArrayLike,
    *,
    blank: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """The best alignment of each utterance's labels on the transducer grid.

    The max-plus (TROPICAL) recursion over the same grid as `rnnt_loss`
    (log-softmax over V taken inside), then a walk back from the end.
    Ties go to the blank move.

    Args:
      logits, frame_lengths, labels, label_lengths, blank: as in `rnnt_loss`.
    Returns:
      (label_frames int32 [B, U], the frame at which each label is emitted
      on the best alignment, -1 past `label_lengths[b]` and for an
      utterance with no path or a NaN score; scores [B], the best
      alignment's log-probability, -inf where there is none, NaN for a
      NaN logit the utterance reads, on the best path or not, as in
      `rnnt_loss`).
    Raises:
      ValueError: as `rnnt_loss`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> logits = jnp.zeros((1, 3, 2, 3)).at[0, 1, 0, 2].set(5.0)  # label 2 likely at t = 1
      >>> frames, score = sj.rnnt_align(logits, jnp.array([3]), jnp.array([[2]]), jnp.array([1]))
      >>> frames
      Array([[1]], dtype=int32)
    """
    args = _check_inputs(logits, frame_lengths, labels, label_lengths, blank, "rnnt_align")
    return _rnnt_align(*args, blank=int(blank))
