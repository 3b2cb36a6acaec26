"""The transducer grid of move log-probs: masks, skewed layout, α at the
end, move posteriors, and the negative log-likelihood with its gradient.

Every transducer loss here reduces to two [B, T, U+1] arrays, the
log-probs of the blank move and of the label move out of each node (-inf
where there is none), and lengths: `rnnt_loss` gathers them from the
joiner's full logits, the simple and smoothed losses from `am` + `lm`, the
pruned loss from the logits at the kept positions. `lattice_nll` is the
negative log-likelihood of such a grid, differentiable in both arrays by
the moves' posteriors (a `jax.custom_vjp`), so the losses differentiate
through their own gathers by autodiff and through the recursion never.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import compensated
from semiring_jax._src.transducer import diagonal_scan

__all__ = ["lattice", "lattice_nll", "log_likelihood", "masks", "move_posteriors"]

Pair = tuple[jax.Array, jax.Array]


def masks(
    shape: tuple[int, ...], frame_lengths: jax.Array, label_lengths: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Which nodes (t, u) of each utterance's grid have a blank move and
    which a label move (bool [B, T, U+1]): t < T_b and u <= U_b, resp. u < U_b."""
    _, num_frames, num_positions = shape
    frame = jnp.arange(num_frames, dtype=jnp.int32)[None, :, None]
    position = jnp.arange(num_positions, dtype=jnp.int32)[None, None, :]
    in_frames = frame < frame_lengths[:, None, None]
    has_blank = in_frames & (position <= label_lengths[:, None, None])
    has_label = in_frames & (position < label_lengths[:, None, None])
    return has_blank, has_label


def lattice(
    blank_lp: jax.Array, emit_lp: jax.Array, frame_lengths: jax.Array, label_lengths: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The skewed move log-probs, -inf outside each utterance's grid."""
    has_blank, has_label = masks(blank_lp.shape, frame_lengths, label_lengths)
    blank = diagonal_scan.skew(jnp.where(has_blank, blank_lp, -jnp.inf), -jnp.inf)
    emit = diagonal_scan.skew(jnp.where(has_label, emit_lp, -jnp.inf), -jnp.inf)
    return blank, emit


def end_node(
    skewed_shape: tuple[int, ...], frame_lengths: jax.Array, label_lengths: jax.Array
) -> jax.Array:
    """bool [N, B, U+1]: True at each utterance's end node (T_b, U_b) on the
    skewed grid."""
    num_diagonals, _, num_positions = skewed_shape
    diagonal = jnp.arange(num_diagonals, dtype=jnp.int32)[:, None, None]
    position = jnp.arange(num_positions, dtype=jnp.int32)[None, None, :]
    return (diagonal == (frame_lengths + label_lengths)[None, :, None]) & (
        position == label_lengths[None, :, None]
    )


def at_nodes(skewed: jax.Array, diagonal: jax.Array, position: jax.Array) -> jax.Array:
    """skewed[diagonal[b], b, position[b]] [B], gathered within each batch
    entry (batch-aligned gathers keep a batch sharded: no collective)."""
    by_batch = jnp.moveaxis(skewed, 1, 0)  # [B, N, U+1]
    rows = jnp.take_along_axis(by_batch, diagonal[:, None, None], axis=1)[:, 0]
    return jnp.take_along_axis(rows, position[:, None], axis=1)[:, 0]


def log_likelihood(alpha: Pair, frame_lengths: jax.Array, label_lengths: jax.Array) -> Pair:
    """α at each utterance's end node (T_b, U_b): its log-likelihood [B] as
    a pair; -inf without frames (a path ends with a blank from frame T_b - 1)."""
    hi, lo = (at_nodes(x, frame_lengths + label_lengths, label_lengths) for x in alpha)
    has_frames = frame_lengths > 0
    return jnp.where(has_frames, hi, -jnp.inf), jnp.where(has_frames, lo, 0.0)


def posterior(alpha: Pair, move: jax.Array, beta: Pair, total: Pair) -> jax.Array:
    """exp(α + move + β - log P) [N, B, U+1], from pairs; 0 without a path."""
    hi, lo = compensated.add(*compensated.add_pairs(alpha, beta), move)
    shape = (1, total[0].shape[0], 1)
    return compensated.exp_difference(hi, lo, total[0].reshape(shape), total[1].reshape(shape))


def next_nodes(pair: Pair, label: bool) -> Pair:
    """A skewed pair's value at each node's blank successor (t + 1, u), or
    with `label` its label successor (t, u + 1): both one diagonal on."""
    hi, lo = (
        jnp.concatenate([x[1:], jnp.full_like(x[:1], fill)])
        for x, fill in zip(pair, (-jnp.inf, 0.0))
    )
    if label:
        hi = jnp.concatenate([hi[..., 1:], jnp.full_like(hi[..., :1], -jnp.inf)], axis=-1)
        lo = jnp.concatenate([lo[..., 1:], jnp.zeros_like(lo[..., :1])], axis=-1)
    return hi, lo


def move_posteriors(
    moves: tuple[jax.Array, jax.Array],
    alpha: Pair,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
    num_frames: int,
) -> tuple[jax.Array, jax.Array]:
    """The posterior of the blank and of the label move out of each node,
    [B, T, U+1] each, from the skewed moves and α; 0 without a path."""
    blank_moves, emit_moves = moves
    end = end_node(alpha[0].shape, frame_lengths, label_lengths)
    beta = diagonal_scan.backward(blank_moves, emit_moves, end)
    total = log_likelihood(alpha, frame_lengths, label_lengths)
    blank_post = posterior(alpha, blank_moves, next_nodes(beta, False), total)
    emit_post = posterior(alpha, emit_moves, next_nodes(beta, True), total)
    return diagonal_scan.unskew(blank_post, num_frames), diagonal_scan.unskew(emit_post, num_frames)


@jax.custom_vjp
def lattice_nll(
    blank_lp: jax.Array, emit_lp: jax.Array, frame_lengths: jax.Array, label_lengths: jax.Array
) -> jax.Array:
    """-log of the sum over the grid's paths [B], from the blank and label
    move log-probs [B, T, U+1] (read only inside each utterance's grid);
    +inf without a path. Its gradient is minus the moves' posteriors."""
    return _lattice_forward(blank_lp, emit_lp, frame_lengths, label_lengths)[0]


def _lattice_forward(
    blank_lp: jax.Array, emit_lp: jax.Array, frame_lengths: jax.Array, label_lengths: jax.Array
) -> tuple[jax.Array, Any]:
    moves = lattice(blank_lp, emit_lp, frame_lengths, label_lengths)
    alpha = diagonal_scan.forward(*moves)
    hi, lo = log_likelihood(alpha, frame_lengths, label_lengths)
    return -(hi + lo), (moves, alpha, frame_lengths, label_lengths)


def _lattice_backward(residuals: Any, cotangent: jax.Array) -> Any:
    moves, alpha, frame_lengths, label_lengths = residuals
    num_frames = moves[0].shape[0] - moves[0].shape[2]
    blank_post, emit_post = move_posteriors(moves, alpha, frame_lengths, label_lengths, num_frames)
    has_blank, has_label = masks(blank_post.shape, frame_lengths, label_lengths)
    scale = -cotangent[:, None, None]
    blank_grad = jnp.where(has_blank, blank_post * scale, 0.0)
    emit_grad = jnp.where(has_label, emit_post * scale, 0.0)
    return blank_grad, emit_grad, None, None


lattice_nll.defvjp(_lattice_forward, _lattice_backward)
