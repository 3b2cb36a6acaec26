"""The transducer lattice's recursions, one anti-diagonal per step.

A path on the transducer grid moves by blank (t, u) → (t+1, u) or by
label (t, u) → (t, u+1), so every node of the anti-diagonal n = t + u
depends only on diagonal n - 1: a `lax.scan` over the N = T + U + 1
diagonals of the skewed layout (`transducer/band.py`) computes a whole
diagonal per step, vectorised over the batch and the W positions, T + U
steps in all. β runs the other way in the same steps (`forward_backward`):
the posteriors cost T + U sequential steps, not twice that.

Scores are compensated (hi, lo) pairs (`core/compensated.py`): α reaches
thousands at T = 1,000, where float32 rounding at every step would leave
posteriors off by 1e-3 (normalising each diagonal by its largest score
still leaves ~3e-4: the nodes that matter can lie far below it). Moves
are log-probabilities, < +inf, so the steps use the pair arithmetic that
needs no +inf handling (`add_below_inf`, `log_add_below_inf`): per cell,
two compensated adds and one compensated log-add.

Moves are log-probabilities (< +inf): -inf is "no move", and NaN in any
move a path can use makes the utterance's scores NaN.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import compensated
from semiring_jax._src.core.sharding import varying_like

Pair = tuple[jax.Array, jax.Array]

__all__ = [
    "Scores",
    "best_forward",
    "following",
    "forward",
    "forward_backward",
    "shift_left",
    "shift_right",
]


Scores = Pair
"""Scores on the skewed layout [N, B, W], as a compensated (hi, lo) pair."""


def shift_right(values: jax.Array, fill: float) -> jax.Array:
    """values[..., k - 1] at k (fill at k = 0)."""
    return jnp.concatenate([jnp.full_like(values[..., :1], fill), values[..., :-1]], axis=-1)


def shift_left(values: jax.Array, fill: float) -> jax.Array:
    """values[..., k + 1] at k (fill at the last k)."""
    return jnp.concatenate([values[..., 1:], jnp.full_like(values[..., :1], fill)], axis=-1)


def _shifted_pair(pair: Pair, shift: Any) -> Pair:
    """Both halves of a pair shifted along the positions (hi filled with
    -inf, lo with 0)."""
    return shift(pair[0], -jnp.inf), shift(pair[1], 0.0)


def _gather(pair: Pair, index: jax.Array | None) -> Pair:
    """pair[..., index] along the positions, (-inf, 0) where index is W (no
    such cell); the identity for `index` None (the full grid)."""
    if index is None:
        return pair
    hi, lo = (
        jnp.take_along_axis(x, index, axis=-1, mode="fill", fill_value=fill)
        for x, fill in zip(pair, (-jnp.inf, 0.0))
    )
    return hi, lo


def _with_first(first: Pair, saved: Pair) -> Scores:
    """Scores of diagonal 0 and of diagonals 1 .. N - 1 (the scan's)."""
    hi, lo = (jnp.concatenate([x[None], y]) for x, y in zip(first, saved))
    return hi, lo


def _stacked(saved: Pair, last: Pair) -> Scores:
    """Scores of diagonals 0 .. N - 2 (the scan's) and of diagonal N - 1."""
    hi, lo = (jnp.concatenate([x, y[None]]) for x, y in zip(saved, last))
    return hi, lo


def _alpha_step(
    alpha: Pair, blank_n: jax.Array, emit_n: jax.Array, source: jax.Array | None
) -> Pair:
    """α on diagonal n + 1 [B, W] from α on diagonal n and its moves."""
    by_blank = _gather(compensated.add_below_inf(*alpha, blank_n), source)
    by_label = _shifted_pair(compensated.add_below_inf(*alpha, emit_n), shift_right)
    return compensated.log_add_below_inf(by_blank, by_label)


def _beta_step(
    beta: Pair,
    blank_n: jax.Array,
    emit_n: jax.Array,
    is_end_n: jax.Array,
    target: jax.Array | None,
) -> Pair:
    """β on diagonal n [B, W] from β on diagonal n + 1 and diagonal n's moves."""
    by_blank = compensated.add_below_inf(*_gather(beta, target), blank_n)
    by_label = compensated.add_below_inf(*_shifted_pair(beta, shift_left), emit_n)
    hi, lo = compensated.log_add_below_inf(by_blank, by_label)
    return jnp.where(is_end_n, jnp.zeros_like(hi), hi), jnp.where(is_end_n, 0.0, lo)


def _start_pair(start: jax.Array, blank: jax.Array) -> Pair:
    """α on diagonal 0 as a pair, varying as the moves are (shard_map)."""
    start_hi = varying_like(start, blank)
    return start_hi, jnp.zeros_like(start_hi)


def _end_pair(is_end: jax.Array, blank: jax.Array) -> Pair:
    """β on the last diagonal as a pair: 0 at an end node, -inf elsewhere."""
    last_hi = varying_like(jnp.where(is_end[-1], 0.0, -jnp.inf).astype(blank.dtype), blank)
    return last_hi, jnp.zeros_like(last_hi)


def forward(
    blank: jax.Array, emit: jax.Array, start: jax.Array, blank_from: jax.Array | None = None
) -> Scores:
    """α on the skewed layout: the log-sum of the paths from the start
    into each cell, [N, B, W] (row T: the paths that have left the grid),
    for the values alone (`forward_backward` for the posteriors).

    Args:
      blank: [N, B, W] skewed log-probs of the blank move out of each cell
        (-inf where there is none).
      emit: [N, B, W] skewed log-probs of the label move out of each cell
        (-inf at u = U and where there is none).
      start: [B, W] α on diagonal 0: 0 at node (0, 0), -inf elsewhere.
      blank_from: `Band.blank_from`, or None for the full grid.
    """
    initial = _start_pair(start, blank)
    sources = None if blank_from is None else blank_from[1:]

    def step(alpha: Pair, moves: tuple[Any, ...]) -> tuple[Pair, Pair]:
        following = _alpha_step(alpha, *moves)
        # The new diagonal as the step's output, not the carry it came
        # from: XLA then copies no carry per step (~5% of the scan).
        return following, following

    _, saved = jax.lax.scan(step, initial, (blank[:-1], emit[:-1], sources))
    return _with_first(initial, saved)


def forward_backward(
    blank: jax.Array,
    emit: jax.Array,
    start: jax.Array,
    is_end: jax.Array,
    blank_from: jax.Array | None = None,
    blank_to: jax.Array | None = None,
) -> tuple[Scores, Scores]:
    """(α, β) on the skewed layout, [N, B, W] each, from one scan whose
    step i computes α on diagonal i + 1 and β on diagonal N - 2 - i. β is
    the log-sum of the paths from each cell to the end.

    Neither recursion reads the other, so the posteriors take T + U
    sequential steps instead of 2 (T + U): on an accelerator, where a
    scan's time is its steps times the kernels each step launches, the two
    steps' elementwise work shares the launches of one.

    Args:
      blank, emit, start, blank_from: as in `forward`, the moves masked to
        each utterance's lengths.
      is_end: bool [N, B, W], True at each utterance's end node (T_b, U_b),
        where the paths go (β = 0 there; it has no move, so setting it
        costs a `where`, not a third term in every log-add).
      blank_to: `Band.blank_to`, or None for the full grid.
    """
    sources = None if blank_from is None else blank_from[1:]

    def reversed_rows(x: jax.Array | None) -> jax.Array | None:
        return None if x is None else jnp.flip(x[:-1], 0)

    backward_moves = tuple(reversed_rows(x) for x in (blank, emit, is_end))
    xs = (blank[:-1], emit[:-1], sources, *backward_moves, reversed_rows(blank_to))

    def step(carry: tuple[Pair, Pair], moves: tuple[Any, ...]) -> tuple[Any, Any]:
        alpha, beta = carry
        following = _alpha_step(alpha, *moves[:3])
        here = _beta_step(beta, *moves[3:])
        return (following, here), (following, here)

    first, last = _start_pair(start, blank), _end_pair(is_end, blank)
    _, (alphas, betas) = jax.lax.scan(step, (first, last), xs)
    beta = _stacked((jnp.flip(betas[0], 0), jnp.flip(betas[1], 0)), last)
    return _with_first(first, alphas), beta


def following(scores: Scores, blank_to: jax.Array | None, label: bool) -> Scores:
    """Each cell's successor's scores: by blank (`blank_to`'s position on
    the next diagonal) or, with `label`, by label (position k + 1); -inf
    past the last diagonal."""
    hi, lo = (
        jnp.concatenate([x[1:], jnp.full_like(x[:1], fill)])
        for x, fill in zip(scores, (-jnp.inf, 0.0))
    )
    pair = (hi, lo)
    if label:
        return _shifted_pair(pair, shift_left)
    return _gather(pair, blank_to)


def best_forward(
    blank: jax.Array, emit: jax.Array, start: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`forward` in the max-plus (TROPICAL) semiring on the full grid,
    unnormalised (a best path's score is a plain sum), and each cell's best
    move into it: (scores [N, B, U+1], came_by_label bool [N, B, U+1];
    False on diagonal 0, which nothing enters). Ties go to the blank move;
    NaN in a move propagates to every score after it.
    """

    def step(alpha: jax.Array, moves: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, Any]:
        blank_n, emit_n = moves
        by_blank = alpha + blank_n
        by_label = shift_right(alpha + emit_n, -jnp.inf)
        came_by_label = by_label > by_blank
        # A NaN label move is taken too: it compares False and was dropped,
        # a finite best score where the loss is NaN (a NaN blank move is
        # taken as it is). Not jnp.maximum: it splits the derivative at a
        # tie, and the score's gradient must be the indicator of the
        # returned (blank-first) alignment.
        best = jnp.where(came_by_label | jnp.isnan(by_label), by_label, by_blank)
        return best, (alpha, came_by_label)

    initial = varying_like(start, blank)
    last, (scores, choices) = jax.lax.scan(step, initial, (blank[:-1], emit[:-1]))
    first_choice = jnp.zeros_like(choices[:1])
    return jnp.concatenate([scores, last[None]]), jnp.concatenate([first_choice, choices])
