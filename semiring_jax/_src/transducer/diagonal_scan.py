"""The transducer lattice's recursions, one anti-diagonal per step.

A transducer's [T, U+1] grid has a node (t, u) per frame t and number u
of labels emitted; the blank moves (t, u) → (t+1, u), label u+1 moves
(t, u) → (t, u+1), and a path ends with a blank from (T_b - 1, U_b). Every
node of the anti-diagonal n = t + u depends only on diagonal n - 1, so a
`lax.scan` over the T + U + 1 diagonals computes a whole diagonal per step,
vectorised over the batch and the U + 1 positions: T + U steps rather
than T (U + 1), and each step two shifted ⊕'s of [B, U+1] vectors.

Arrays on the grid are *skewed* for the scan: `skew` lays [B, T, U+1] out
as [T + U + 1, B, U+1], diagonal n holding node (n - u, u) at position u
(the semiring's zero where n - u is not a frame), and `unskew` reads the
grid back. Row t = T of the skewed layout is the end: node (T, u) there
holds the score of the paths that have left the grid from (T - 1, u).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import compensated
from semiring_jax._src.dense.slots import varying_like

Pair = tuple[jax.Array, jax.Array]

__all__ = ["backward", "best_forward", "forward", "skew", "unskew"]


def _diagonal_index(num_frames: int, num_positions: int) -> tuple[jax.Array, jax.Array]:
    """(frame [N, U+1], valid [N, U+1]) of each skewed cell, N = T + U + 1."""
    diagonal = jnp.arange(num_frames + num_positions)[:, None]
    frame = diagonal - jnp.arange(num_positions)[None, :]
    return frame, (frame >= 0) & (frame < num_frames)


def skew(grid: jax.Array, fill: float) -> jax.Array:
    """[B, T, U+1] → [T + U + 1, B, U+1]: diagonal n holds node (n - u, u)
    at position u, `fill` where n - u is outside [0, T)."""
    _, num_frames, num_positions = grid.shape
    frame, valid = _diagonal_index(num_frames, num_positions)
    position = jnp.broadcast_to(jnp.arange(num_positions), frame.shape)
    gathered = grid[:, jnp.clip(frame, 0, num_frames - 1), position]  # [B, N, U+1]
    return jnp.moveaxis(jnp.where(valid[None], gathered, fill), 1, 0)


def unskew(diagonals: jax.Array, num_frames: int) -> jax.Array:
    """[N, B, U+1] → [B, num_frames, U+1]: node (t, u) from diagonal t + u
    (num_frames may be T + 1, to read the end row t = T)."""
    num_positions = diagonals.shape[-1]
    frame = jnp.arange(num_frames)[:, None]
    position = jnp.arange(num_positions)[None, :]
    index = jnp.clip(frame + position, 0, diagonals.shape[0] - 1)
    return jnp.moveaxis(diagonals[index, :, position], 2, 0)  # [B, t, U+1]


def _shift_right(values: jax.Array, fill: float) -> jax.Array:
    """values[..., u - 1] at u (fill at u = 0)."""
    return jnp.concatenate([jnp.full_like(values[..., :1], fill), values[..., :-1]], axis=-1)


def _shift_left(values: jax.Array, fill: float) -> jax.Array:
    """values[..., u + 1] at u (fill at the last u)."""
    return jnp.concatenate([values[..., 1:], jnp.full_like(values[..., :1], fill)], axis=-1)


def _start(blank: jax.Array) -> jax.Array:
    """α on diagonal 0: one (0) at (0, 0), zero (-inf) elsewhere, [B, U+1]."""
    return jnp.full(blank.shape[1:], -jnp.inf, blank.dtype).at[:, 0].set(0.0)


def _pair_shifted(pair: Pair, shift: Any) -> Pair:
    """Both halves of a pair shifted along the positions (hi filled with
    -inf, lo with 0)."""
    return shift(pair[0], -jnp.inf), shift(pair[1], 0.0)


def forward(blank: jax.Array, emit: jax.Array) -> Pair:
    """α on the skewed grid: the log-sum of the paths from (0, 0) into each
    node, [T + U + 1, B, U+1] (row T: the paths that have left the grid),
    as compensated (hi, lo) pairs (`core/compensated.py`): α reaches
    thousands at T = 1,000, where float32 rounding at every step would
    leave posteriors off by 1e-3.

    Args:
      blank: [N, B, U+1] skewed log-probs of the blank move out of each
        node (-inf where there is none).
      emit: [N, B, U+1] skewed log-probs of the label move out of each
        node (-inf at u = U and where there is none).
    """
    start_hi = varying_like(blank, _start(blank))
    start = (start_hi, jnp.zeros_like(start_hi))

    def step(alpha: Pair, moves: tuple[jax.Array, jax.Array]) -> tuple[Pair, Pair]:
        blank_n, emit_n = moves
        by_blank = compensated.add(*alpha, blank_n)
        by_label = _pair_shifted(compensated.add(*alpha, emit_n), _shift_right)
        following = compensated.log_sum_columns(
            [by_blank[0], by_label[0]], [by_blank[1], by_label[1]]
        )
        return following, alpha

    last, alphas = jax.lax.scan(step, start, (blank[:-1], emit[:-1]))
    return jnp.concatenate([alphas[0], last[0][None]]), jnp.concatenate([alphas[1], last[1][None]])


def backward(blank: jax.Array, emit: jax.Array, is_end: jax.Array) -> Pair:
    """β on the skewed grid: the log-sum of the paths from each node to
    the end, [N, B, U+1], as compensated pairs (see `forward`).

    Args:
      blank, emit: as in `forward`, masked to each utterance's lengths.
      is_end: bool [N, B, U+1], True at the end node (T_b, U_b) of each
        utterance: where the paths go (β = 0 there; it has no move, so
        setting it costs a `where`, not a third term in every ⊕).
    """

    def step(beta: Pair, moves: tuple[jax.Array, ...]) -> tuple[Pair, Pair]:
        blank_n, emit_n, is_end_n = moves
        by_blank = compensated.add(*beta, blank_n)
        by_label = compensated.add(*_pair_shifted(beta, _shift_left), emit_n)
        hi, lo = compensated.log_sum_columns([by_blank[0], by_label[0]], [by_blank[1], by_label[1]])
        here = (jnp.where(is_end_n, jnp.zeros_like(hi), hi), jnp.where(is_end_n, 0.0, lo))
        return here, here

    last_hi = jnp.where(is_end[-1], 0.0, -jnp.inf).astype(blank.dtype)
    start = (varying_like(blank, last_hi), jnp.zeros_like(last_hi))
    _, betas = jax.lax.scan(step, start, (blank[:-1], emit[:-1], is_end[:-1]), reverse=True)
    return jnp.concatenate([betas[0], start[0][None]]), jnp.concatenate([betas[1], start[1][None]])


def best_forward(blank: jax.Array, emit: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`forward` in the max-plus (TROPICAL) semiring, and each node's best
    move into it: (scores [N, B, U+1], came_by_label bool [N, B, U+1];
    False on diagonal 0, which nothing enters). Ties go to the blank move.
    """
    start = varying_like(blank, _start(blank))

    def step(alpha: jax.Array, moves: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, Any]:
        blank_n, emit_n = moves
        by_blank = alpha + blank_n
        by_label = _shift_right(alpha + emit_n, -jnp.inf)
        came_by_label = by_label > by_blank
        return jnp.where(came_by_label, by_label, by_blank), (alpha, came_by_label)

    last, (scores, choices) = jax.lax.scan(step, start, (blank[:-1], emit[:-1]))
    first_choice = jnp.zeros_like(choices[:1])
    return jnp.concatenate([scores, last[None]]), jnp.concatenate([first_choice, choices])
