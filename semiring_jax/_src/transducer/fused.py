"""The transducer loss straight from the joiner's logits over a band, with
the log-softmax over V fused into its gradient.

`rnnt_loss` (the full grid) and `rnnt_loss_pruned` (the kept positions)
both read logits [B, T, W, V] over a band (`transducer/band.py`): each
cell's log-softmax enters the recursion through two columns only, the
blank's and its label move's (`label_at`). The gradient is a
`jax.custom_vjp` whose backward pass forms the moves' posteriors from α
and β (`grid.move_posteriors`), never autodiff through the scan:

    ∂L/∂logits[t, k, v] = softmax[t, k, v] · (b(t, k) + (1 + λ) e(t, k))
                          - b(t, k) [v = blank] - (1 + λ) e(t, k) [v = label_at],

b and e being the posteriors of the blank and the label move out of the
cell, λ FastEmit's (NeMo's rule: the label moves' gradient scaled by
1 + λ; the value stays the plain negative log-likelihood). It is written
once, as the output, from the logits and the [B, T, W] log-normaliser: no
other [B, T, W, V] array.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.transducer import grid
from semiring_jax._src.transducer.band import Band

__all__ = [
    "labels_by_position",
    "logits_nll",
    "move_log_probs",
    "with_delay_penalty",
]


def with_delay_penalty(
    emit_lp: jax.Array, frame_lengths: jax.Array, delay_penalty: float
) -> jax.Array:
    """k2's delay penalty: delay_penalty · ((T_b - 1) / 2 - t) added to the
    label moves [B, T, W] at frame t. A penalty <= 0 leaves them as they
    are, not + 0 (XLA keeps x + 0.0, which is -0.0's +0.0, and the copy
    would stop it merging the simple loss's recursion with the pruning
    ranges' same one)."""
    if delay_penalty <= 0.0:
        return emit_lp
    frame = jnp.arange(emit_lp.shape[1], dtype=emit_lp.dtype)[None, :, None]
    middle = ((frame_lengths.astype(emit_lp.dtype) - 1) / 2)[:, None, None]
    return emit_lp + delay_penalty * (middle - frame)


def labels_by_position(labels: jax.Array, blank: int) -> jax.Array:
    """int [B, U+1]: the label the label move out of position u emits,
    label u+1 (blank at u = U, which has no label move: the masks drop it)."""
    last = jnp.full((labels.shape[0], 1), blank, labels.dtype)
    return jnp.concatenate([labels, last], axis=1)


def move_log_probs(
    logits: jax.Array, label_at: jax.Array, blank: int
) -> tuple[tuple[jax.Array, jax.Array], jax.Array, jax.Array]:
    """(log-normaliser as (row max, log-sum less it), blank log-probs, label
    log-probs), each [B, T, W], reading the logits once for the normaliser
    and gathering two columns.

    Each log-prob is (logit - row max) - log-sum: the row max, not the
    normaliser, is subtracted from the logits, so a common offset cancels
    exactly (logits at 1e9 are multiples of 64 in float32: logit minus a
    normaliser rounded to that grid was -2.3 for a loss of 7.4). A row max
    that is not finite shifts by 0, so ±inf and NaN stay visible.

    Args:
      logits: [B, T, W, V].
      label_at: int [B, T or 1, W], the label each cell's label move
        emits (any symbol where there is no move: the masks drop it).
    """
    row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, jnp.zeros_like(row_max))
    log_sum = jnp.log(jnp.sum(jnp.exp(logits - row_max[..., None]), axis=-1))
    blank_lp = (logits[..., blank] - row_max) - log_sum
    label_logit = jnp.take_along_axis(logits, label_at[..., None], axis=-1)[..., 0]
    return (row_max, log_sum), blank_lp, (label_logit - row_max) - log_sum


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def logits_nll(
    logits: jax.Array,
    label_at: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
    band: Band,
    blank: int,
    fastemit_lambda: float,
    delay_penalty: float,
) -> jax.Array:
    """-log P [B] of the band's paths, from logits [B, T, W, V]: +inf
    without a path. `delay_penalty` (k2's) is added to the label moves."""
    args = (logits, label_at, frame_lengths, label_lengths, band)
    return _value(*args, blank, fastemit_lambda, delay_penalty)


def _move_log_probs(
    logits: jax.Array,
    label_at: jax.Array,
    frame_lengths: jax.Array,
    blank: int,
    delay_penalty: float,
) -> tuple[tuple[jax.Array, jax.Array], jax.Array, jax.Array]:
    """`move_log_probs`, the delay penalty added to the label moves."""
    normaliser, blank_lp, emit_lp = move_log_probs(logits, label_at, blank)
    return normaliser, blank_lp, with_delay_penalty(emit_lp, frame_lengths, delay_penalty)


def _value(
    logits: jax.Array,
    label_at: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
    band: Band,
    blank: int,
    fastemit_lambda: float,
    delay_penalty: float,
) -> jax.Array:
    del fastemit_lambda  # it scales the gradient only
    _, blank_lp, emit_lp = _move_log_probs(logits, label_at, frame_lengths, blank, delay_penalty)
    return -grid.total(band, blank_lp, emit_lp, frame_lengths, label_lengths)


def _forward(
    logits: jax.Array,
    label_at: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
    band: Band,
    blank: int,
    fastemit_lambda: float,
    delay_penalty: float,
) -> tuple[jax.Array, Any]:
    del fastemit_lambda
    normaliser, blank_lp, emit_lp = _move_log_probs(
        logits, label_at, frame_lengths, blank, delay_penalty
    )
    log_p, posteriors = grid.total_and_posteriors(
        band, blank_lp, emit_lp, frame_lengths, label_lengths
    )
    residuals = (logits, label_at, frame_lengths, label_lengths, band, normaliser, posteriors)
    return -log_p, residuals


def _backward(
    blank: int, fastemit_lambda: float, delay_penalty: float, residuals: Any, cotangent: jax.Array
) -> Any:
    del delay_penalty  # a constant: it changes the posteriors, not their derivative
    logits, label_at, frame_lengths, label_lengths, band, normaliser, posteriors = residuals
    blank_post, emit_post = posteriors
    scale = cotangent[:, None, None]
    blank_post, emit_post = blank_post * scale, emit_post * (scale * (1.0 + fastemit_lambda))
    # -∂ log P / ∂ logits, times the cotangent, written once.
    row_max, log_sum = normaliser
    softmax = jnp.exp((logits - row_max[..., None]) - log_sum[..., None])
    vocab = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, None, None, :]
    grad = softmax * (blank_post + emit_post)[..., None]
    grad = grad - jnp.where(vocab == blank, blank_post[..., None], 0.0)
    grad = grad - jnp.where(vocab == label_at[..., None], emit_post[..., None], 0.0)
    has_blank, _ = grid.masks(band, log_sum.shape, frame_lengths, label_lengths)
    grad = jnp.where(has_blank[..., None], grad, 0.0)  # padding: exactly 0, NaN or not
    return grad.astype(logits.dtype), None, None, None, None


logits_nll.defvjp(_forward, _backward)
