"""`rnnt_loss` and `rnnt_align`: the transducer loss and its best alignment.

The joiner's logits [B, T, U+1, V] give, at every node (t, u) of the
[T, U+1] grid, the log-softmax over V; only two of its columns enter the
recursions: the blank's and label u+1's. The loss is -log of the sum over
the grid's paths (`diagonal_scan.forward`), and its gradient comes from a
`jax.custom_vjp` whose backward pass forms the occupation posteriors from
α and β (`diagonal_scan.backward`), never from autodiff through the scan:

    ∂L/∂logits[t, u, v] = softmax[t, u, v] · (b(t, u) + (1 + λ) e(t, u))
                          - b(t, u) [v = blank] - (1 + λ) e(t, u) [v = label u+1],

b and e being the posteriors of the blank and the label move out of
(t, u), λ FastEmit's (NeMo's rule: the label moves' gradient scaled by
1 + λ; the value stays the plain negative log-likelihood). That is written
once, as the output, from the logits and the [B, T, U+1] log-normaliser:
no other [B, T, U+1, V] array.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy.typing as npt

from semiring_jax._src.dense.ctc import check_labels
from semiring_jax._src.dense.dense import check_float_array, check_lengths
from semiring_jax._src.transducer import diagonal_scan, grid

__all__ = ["rnnt_align", "rnnt_loss"]

Pair = tuple[jax.Array, jax.Array]


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


def _move_log_probs(
    logits: jax.Array, labels: jax.Array, blank: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log-normaliser [B, T, U+1], blank log-probs [B, T, U+1], label
    log-probs [B, T, U+1]: label u+1's at u, -inf at u = U), reading the
    logits once for the normaliser and gathering two columns."""
    normaliser = jax.nn.logsumexp(logits, axis=-1)
    blank_lp = logits[..., blank] - normaliser
    index = labels[:, None, :, None]  # [B, 1, U, 1]
    label_logit = jnp.take_along_axis(logits[:, :, :-1], index, axis=-1)[..., 0]
    emit_lp = label_logit - normaliser[:, :, :-1]
    no_label = jnp.full((*emit_lp.shape[:2], 1), -jnp.inf, emit_lp.dtype)  # at u = U
    emit_lp = jnp.concatenate([emit_lp, no_label], axis=-1)
    return normaliser, blank_lp, emit_lp


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _rnnt_nll(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    fastemit_lambda: float,
) -> jax.Array:
    nll, _ = _rnnt_forward(logits, frame_lengths, labels, label_lengths, blank, fastemit_lambda)
    return nll


def _rnnt_forward(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    fastemit_lambda: float,
) -> tuple[jax.Array, Any]:
    normaliser, blank_lp, emit_lp = _move_log_probs(logits, labels, blank)
    moves = grid.lattice(blank_lp, emit_lp, frame_lengths, label_lengths)
    alpha = diagonal_scan.forward(*moves)
    hi, lo = grid.log_likelihood(alpha, frame_lengths, label_lengths)
    residuals = (logits, frame_lengths, labels, label_lengths, normaliser, moves, alpha)
    return -(hi + lo), residuals


def _rnnt_backward(blank: int, fastemit_lambda: float, residuals: Any, cotangent: jax.Array) -> Any:
    logits, frame_lengths, labels, label_lengths, normaliser, moves, alpha = residuals
    blank_post, emit_post = grid.move_posteriors(
        moves, alpha, frame_lengths, label_lengths, logits.shape[1]
    )
    scale = cotangent[:, None, None]
    blank_post, emit_post = blank_post * scale, emit_post * (scale * (1.0 + fastemit_lambda))
    # -∂ log P / ∂ logits, times the cotangent, written once.
    softmax = jnp.exp(logits - normaliser[..., None])
    vocab = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, None, None, :]
    label_at = jnp.concatenate([labels, jnp.full((labels.shape[0], 1), -1, labels.dtype)], axis=1)
    grad = softmax * (blank_post + emit_post)[..., None]
    grad = grad - jnp.where(vocab == blank, blank_post[..., None], 0.0)
    grad = grad - jnp.where(vocab == label_at[:, None, :, None], emit_post[..., None], 0.0)
    has_blank, _ = grid.masks(normaliser.shape, frame_lengths, label_lengths)
    grad = jnp.where(has_blank[..., None], grad, 0.0)  # padding: exactly 0, NaN or not
    return grad.astype(logits.dtype), None, None, None


_rnnt_nll.defvjp(_rnnt_forward, _rnnt_backward)


@functools.partial(jax.jit, static_argnames=("blank", "fastemit_lambda"))
def _rnnt_loss(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
    fastemit_lambda: float,
) -> jax.Array:
    return _rnnt_nll(logits, frame_lengths, labels, label_lengths, blank, fastemit_lambda)


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
      fastemit_lambda: FastEmit's λ >= 0 (NeMo's rule): the value is the
        plain negative log-likelihood, and the gradient with respect to the
        label emissions' log-probabilities is scaled by 1 + λ.
    Returns:
      float [B]: +inf where an utterance has no path (no frame, or a -inf
      blank or label log-prob on every path), with gradient 0; NaN for a
      NaN logit the utterance reads.
    Raises:
      ValueError: for logits not [B, T, U+1, V] with U + 1 matching labels,
        lengths out of range, a used label outside [0, V) or equal to
        `blank`, or a negative `fastemit_lambda`.
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> logits = jnp.zeros((1, 2, 2, 3))  # uniform over 3 symbols
      >>> loss = sj.rnnt_loss(logits, jnp.array([2]), jnp.array([[1]]), jnp.array([1]))
      >>> print(jnp.round(jnp.exp(-loss), 4))  # two paths of three moves each
      [0.0741]
    """
    lam = float(fastemit_lambda)
    if not lam >= 0.0:
        raise ValueError(f"rnnt_loss: fastemit_lambda must be >= 0, got {fastemit_lambda}")
    args = _check_inputs(logits, frame_lengths, labels, label_lengths, blank, "rnnt_loss")
    return _rnnt_loss(*args, blank=int(blank), fastemit_lambda=lam)


@functools.partial(jax.jit, static_argnames="blank")
def _rnnt_align(
    logits: jax.Array,
    frame_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    blank: int,
) -> tuple[jax.Array, jax.Array]:
    _, blank_lp, emit_lp = _move_log_probs(logits, labels, blank)
    blank_moves, emit_moves = grid.lattice(blank_lp, emit_lp, frame_lengths, label_lengths)
    scores, came_by_label = diagonal_scan.best_forward(blank_moves, emit_moves)
    best, _ = grid.log_likelihood((scores, jnp.zeros_like(scores)), frame_lengths, label_lengths)
    batch = jnp.arange(logits.shape[0])
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
    frames = frames.at[batch[None, :], slot].max(emitted.astype(jnp.int32))
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
      utterance with no path; scores [B], the best alignment's
      log-probability, -inf where there is none).
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
