"""The transducer grid of move log-probs over a band: masks, skewed layout,
α at the end, move posteriors, and the negative log-likelihood with its
gradient.

Every transducer loss here reduces to two [B, T, W] arrays over a band
(`transducer/band.py`: the full grid, or the pruned loss's ranges), the
log-probs of the blank move and of the label move out of each node (-inf
where there is none), and lengths: `rnnt_loss` gathers them from the
joiner's full logits, the simple and smoothed losses from `am` + `lm`, the
pruned loss from the logits at the kept positions. `lattice_nll` is the
negative log-likelihood of such a grid, differentiable in both arrays by
the moves' posteriors (`derivatives.score`), so the losses differentiate
through their own gathers by autodiff and through the recursion never.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import compensated, derivatives, route_table, routes
from semiring_jax._src.kernels import rnnt_ops
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import diagonal_scan
from semiring_jax._src.transducer.band import Band
from semiring_jax._src.transducer.diagonal_scan import Scores

__all__ = [
    "end_node",
    "lattice",
    "lattice_nll",
    "log_likelihood",
    "masks",
    "move_posteriors",
    "start",
    "total",
    "total_and_posteriors",
]

Pair = tuple[jax.Array, jax.Array]
# The blank and the label moves' arrays, [B, T, W] each.
Moves = tuple[jax.Array, jax.Array]


def masks(
    band: Band, shape: tuple[int, ...], frame_lengths: jax.Array, label_lengths: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Which cells (t, k) of a [B, T, W] band array have a blank move and
    which a label move (bool [B, T, W]): t < T_b and u <= U_b, resp.
    u < U_b, for the cell's position u = s_t + k."""
    num_frames = shape[1]
    frame = jnp.arange(num_frames, dtype=jnp.int32)[None, :, None]
    position = bands.positions(band, num_frames)
    in_frames = frame < frame_lengths[:, None, None]
    has_blank = in_frames & (position <= label_lengths[:, None, None])
    has_label = in_frames & (position < label_lengths[:, None, None])
    return has_blank, has_label


def lattice(
    band: Band,
    blank_lp: jax.Array,
    emit_lp: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The skewed move log-probs [N, B, W], -inf outside each utterance's grid."""
    has_blank, has_label = masks(band, blank_lp.shape, frame_lengths, label_lengths)
    blank = bands.skew(band, jnp.where(has_blank, blank_lp, -jnp.inf), -jnp.inf)
    emit = bands.skew(band, jnp.where(has_label, emit_lp, -jnp.inf), -jnp.inf)
    return blank, emit


def start(band: Band, dtype: Any) -> jax.Array:
    """α on diagonal 0, [B, W]: 0 at cell k = 0 where it is node (0, 0)."""
    first = band.valid[0] & (jnp.arange(band.width) == 0)[None, :]
    return jnp.where(first, 0.0, -jnp.inf).astype(dtype)


def _end_position(band: Band, frame_lengths: jax.Array, label_lengths: jax.Array) -> jax.Array:
    """The position k of each utterance's end node (T_b, U_b) on its
    diagonal T_b + U_b (may lie outside [0, W): no path)."""
    if band.starts is None:
        return label_lengths
    return label_lengths - jnp.take_along_axis(band.starts, frame_lengths[:, None], axis=1)[:, 0]


def end_node(band: Band, frame_lengths: jax.Array, label_lengths: jax.Array) -> jax.Array:
    """bool [N, B, W]: True at each utterance's end node (T_b, U_b)."""
    num_diagonals = band.frame.shape[0]
    diagonal = jnp.arange(num_diagonals, dtype=jnp.int32)[:, None, None]
    position = jnp.arange(band.width, dtype=jnp.int32)[None, None, :]
    at_end = (diagonal == (frame_lengths + label_lengths)[None, :, None]) & (
        position == _end_position(band, frame_lengths, label_lengths)[None, :, None]
    )
    return at_end & band.valid


def _at_nodes(skewed: jax.Array, diagonal: jax.Array, position: jax.Array) -> jax.Array:
    """skewed[diagonal[b], b, position[b]] [B], gathered within each batch
    entry (batch-aligned gathers keep a batch sharded: no collective)."""
    by_batch = jnp.moveaxis(skewed, 1, 0)  # [B, N, W]
    rows = jnp.take_along_axis(by_batch, diagonal[:, None, None], axis=1)[:, 0]
    return jnp.take_along_axis(rows, position[:, None], axis=1)[:, 0]


def log_likelihood(
    band: Band, alpha: Scores, frame_lengths: jax.Array, label_lengths: jax.Array
) -> Pair:
    """α at each utterance's end node (T_b, U_b): its log-likelihood [B] as
    a pair; -inf without frames (a path ends with a blank from frame
    T_b - 1) or where the band leaves out the end node."""
    diagonal = frame_lengths + label_lengths
    position = _end_position(band, frame_lengths, label_lengths)
    in_band = (position >= 0) & (position < band.width)
    position = jnp.clip(position, 0, band.width - 1)
    hi, lo = (_at_nodes(x, diagonal, position) for x in alpha)
    has_path = (frame_lengths > 0) & in_band
    return jnp.where(has_path, hi, -jnp.inf), jnp.where(has_path, lo, 0.0)


def _posterior(alpha: Scores, move: jax.Array, beta_next: Scores, total: Pair) -> jax.Array:
    """exp(α + move + β(successor) - log P) [N, B, W], from pairs; 0
    without a path."""
    hi, lo = compensated.add(*compensated.add_pairs(alpha, beta_next), move)
    shape = (1, total[0].shape[0], 1)
    return compensated.exp_difference(hi, lo, total[0].reshape(shape), total[1].reshape(shape))


def move_posteriors(
    band: Band,
    moves: tuple[jax.Array, jax.Array],
    alpha: Scores,
    beta: Scores,
    total: Pair,
    num_frames: int,
) -> tuple[jax.Array, jax.Array]:
    """The posterior of the blank and of the label move out of each cell,
    [B, T, W] each, from the skewed moves, α, β and log P [B] (a pair); 0
    without a path."""
    blank_moves, emit_moves = moves
    after_blank = diagonal_scan.following(beta, band.blank_to, label=False)
    after_label = diagonal_scan.following(beta, band.blank_to, label=True)
    blank_post = _posterior(alpha, blank_moves, after_blank, total)
    emit_post = _posterior(alpha, emit_moves, after_label, total)
    return (
        bands.unskew(band, blank_post, num_frames),
        bands.unskew(band, emit_post, num_frames),
    )


def forward(
    band: Band,
    blank_lp: jax.Array,
    emit_lp: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
) -> tuple[Pair, tuple[tuple[jax.Array, jax.Array], Scores]]:
    """(log-likelihood [B] as a pair, (the skewed moves, α)) of a band's
    move log-probs [B, T, W], by the scan."""
    moves = lattice(band, blank_lp, emit_lp, frame_lengths, label_lengths)
    alpha = diagonal_scan.forward(*moves, start(band, blank_lp.dtype), band.blank_from)
    return log_likelihood(band, alpha, frame_lengths, label_lengths), (moves, alpha)


def _scan_posteriors(moves: Moves, aux: tuple[Any, ...]) -> tuple[jax.Array, Moves]:
    """(log P [B], the moves' posteriors [B, T, W]) by the scans (α and β
    in one, `diagonal_scan.forward_backward`): the kernel's reference,
    differentiable by autodiff."""
    _, frame_lengths, label_lengths, band = aux
    skewed = lattice(band, *moves, frame_lengths, label_lengths)
    is_end = end_node(band, frame_lengths, label_lengths)
    alpha, beta = diagonal_scan.forward_backward(
        *skewed, start(band, moves[0].dtype), is_end, band.blank_from, band.blank_to
    )
    hi, lo = log_likelihood(band, alpha, frame_lengths, label_lengths)
    posteriors = move_posteriors(band, skewed, alpha, beta, (hi, lo), moves[0].shape[1])
    # A NaN log P makes every posterior of the utterance NaN, as the
    # kernel's are: the cells whose α or β is -inf came out 0 (finite
    # gradients beside a NaN loss), and the two routes disagreed.
    is_nan = jnp.isnan(hi)[:, None, None]
    blank_post, emit_post = (jnp.where(is_nan, jnp.nan, x) for x in posteriors)
    return hi + lo, (blank_post, emit_post)


def _kernel_aux(
    band: Band, blank_lp: jax.Array, frame_lengths: jax.Array, label_lengths: jax.Array
) -> tuple[Any, ...]:
    """(starts [B, T + 1], lengths..., band): the kernel's and the scan's inputs."""
    starts = band.starts
    if starts is None:
        starts = jnp.zeros((blank_lp.shape[0], blank_lp.shape[1] + 1), jnp.int32)
    return starts, frame_lengths, label_lengths, band


def _num_positions(band: Band) -> int:
    """U + 1: the layout has T + U + 1 diagonals."""
    return band.frame.shape[0] - band.num_frames


def _no_utterance_or_frame(blank_lp: jax.Array) -> bool:
    """Whether [B, T, W] has B = 0 or T = 0 (static): no path anywhere, and
    the scans' gathers have nothing to read (they failed on an empty axis)."""
    return blank_lp.shape[0] == 0 or blank_lp.shape[1] == 0


def _no_path(blank_lp: jax.Array) -> jax.Array:
    """log P [B] of a grid without paths: -inf."""
    return jnp.full(blank_lp.shape[:1], -jnp.inf, blank_lp.dtype)


def _scan_total(moves: Moves, aux: tuple[Any, ...]) -> jax.Array:
    """log P [B] by the diagonal scan."""
    _, frame_lengths, label_lengths, band = aux
    (hi, lo), _ = forward(band, *moves, frame_lengths, label_lengths)
    return hi + lo


def total(
    band: Band,
    blank_lp: jax.Array,
    emit_lp: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
) -> jax.Array:
    """log P [B] of a band's move log-probs [B, T, W] (-inf without a
    path), by the routes of `route_table.TRANSDUCER_GRID` (the CPU kernel
    or the diagonal scan). For values only: gradients come from
    `total_and_posteriors`."""
    if _no_utterance_or_frame(blank_lp):
        return _no_path(blank_lp)
    aux = _kernel_aux(band, blank_lp, frame_lengths, label_lengths)
    impls: dict[str, Callable[..., Any]] = {
        "cpu_kernel": lambda moves, aux: rnnt_ops.log_likelihood(moves, aux, _num_positions(band)),
        "diagonal_scan": _scan_total,
    }
    moves = (blank_lp, emit_lp)
    return routes.dispatch(route_table.TRANSDUCER_GRID, impls, moves, aux, dtype=blank_lp.dtype)


def total_and_posteriors(
    band: Band,
    blank_lp: jax.Array,
    emit_lp: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
) -> tuple[jax.Array, Moves]:
    """(log P [B], the posteriors of the blank and the label move out of
    each cell [B, T, W], 0 without a path), by the routes of
    `route_table.TRANSDUCER_GRID` (the kernel is differentiable through the
    scan's)."""
    if _no_utterance_or_frame(blank_lp):
        return _no_path(blank_lp), (jnp.zeros_like(blank_lp), jnp.zeros_like(emit_lp))
    aux = _kernel_aux(band, blank_lp, frame_lengths, label_lengths)
    impls: dict[str, Callable[..., Any]] = {
        "cpu_kernel": lambda moves, aux: rnnt_ops.log_likelihood_and_posteriors(
            _scan_posteriors, moves, aux, _num_positions(band)
        ),
        "diagonal_scan": _scan_posteriors,
    }
    moves = (blank_lp, emit_lp)
    return routes.dispatch(route_table.TRANSDUCER_GRID, impls, moves, aux, dtype=blank_lp.dtype)


def _nll(moves: Moves, aux: tuple[Any, ...]) -> jax.Array:
    return -total(aux[2], *moves, *aux[:2])


def _nll_and_grads(moves: Moves, aux: tuple[Any, ...]) -> tuple[jax.Array, Moves]:
    """(-log P [B], minus the moves' posteriors [B, T, W] inside each
    utterance's grid, 0 elsewhere)."""
    frame_lengths, label_lengths, band = aux
    log_p, (blank_post, emit_post) = total_and_posteriors(band, *moves, *aux[:2])
    has_blank, has_label = masks(band, blank_post.shape, frame_lengths, label_lengths)
    blank_grad = jnp.where(has_blank, -blank_post, 0.0)
    emit_grad = jnp.where(has_label, -emit_post, 0.0)
    return -log_p, (blank_grad, emit_grad)


_NLL = derivatives.ScoreOp(_nll, _nll_and_grads)


def lattice_nll(
    blank_lp: jax.Array,
    emit_lp: jax.Array,
    frame_lengths: jax.Array,
    label_lengths: jax.Array,
    band: Band,
) -> jax.Array:
    """-log of the sum over the band's paths [B], from the blank and label
    move log-probs [B, T, W] (read only inside each utterance's grid);
    +inf without a path. Its gradient is minus the moves' posteriors
    (`derivatives.score`, as every score op's)."""
    return derivatives.score(_NLL, (blank_lp, emit_lp), (frame_lengths, label_lengths, band))
