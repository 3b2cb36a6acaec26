"""Level-scheduled score recursions of one unbatched, acyclic Fsa (traced).

Scores live on the schedule's flat grid of P = L * W positions plus a dummy
position P that always holds the semiring's zero (see host/schedule.py).
Each recursion is one `lax.scan` over the L levels; a step gathers the
scores of a level's arc ends (pull style, no scatter) and writes the level's
W new scores with a `dynamic_update_slice`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from semiring_jax._src.fsa import Schedule
from semiring_jax._src.semiring import Semiring

__all__ = ["forward_positions", "backward_positions", "start_terms", "final_terms",
           "path_gradients"]


def _append(values: jax.Array, fill: float) -> jax.Array:
    """`values` [N] with one more entry, `fill`, for dummy indices."""
    return jnp.concatenate([values, jnp.full((1,), fill, values.dtype)])


def start_terms(semiring: Semiring, schedule: Schedule, dtype) -> jax.Array:
    """[L, W]: `one` at the start state's position, `zero` elsewhere."""
    grid = schedule.pos_state.shape
    positions = jnp.arange(grid[0] * grid[1], dtype=jnp.int32).reshape(grid)
    return jnp.where(positions == schedule.state_pos[0],
                     jnp.asarray(semiring.one, dtype), jnp.asarray(semiring.zero, dtype))


def final_terms(semiring: Semiring, schedule: Schedule, final_weight: jax.Array) -> jax.Array:
    """[L, W]: the final weight of the state at each position."""
    return _append(final_weight, semiring.zero)[schedule.pos_state]


def _level_scan(step, init: jax.Array, xs, *, reverse: bool) -> jax.Array:
    levels = jax.tree_util.tree_leaves(xs)[0].shape[0]
    carry, _ = jax.lax.scan(lambda c, x: (step(c, x), None), init,
                            (jnp.arange(levels, dtype=jnp.int32), xs), reverse=reverse)
    return carry


def forward_positions(semiring: Semiring, schedule: Schedule, weight: jax.Array) -> jax.Array:
    """Forward scores α: ⊕ over paths from the start, per position.

    Args:
      semiring: the semiring.
      schedule: the tables of an unbatched Fsa.
      weight: float [A].
    Returns:
      float [P + 1]; entry P (the dummy) is `zero`.
    """
    levels, width, max_in = schedule.in_arc.shape
    arc_weight = _append(weight, semiring.zero)[schedule.in_arc]  # [L, W, K]
    start = start_terms(semiring, schedule, weight.dtype)

    def step(alpha, xs):
        level, (in_src_pos, in_weight, start_level) = xs
        new = start_level
        if max_in:
            entering = semiring.times(alpha[in_src_pos], in_weight)  # [W, K]
            new = semiring.plus(new, semiring.sum(entering, axis=1))
        return jax.lax.dynamic_update_slice(alpha, new, (level * width,))

    alpha = jnp.full((levels * width + 1,), semiring.zero, weight.dtype)
    return _level_scan(step, alpha,
                       (schedule.in_src_pos, arc_weight, start), reverse=False)


def backward_positions(semiring: Semiring, schedule: Schedule, weight: jax.Array,
                       final_weight: jax.Array) -> jax.Array:
    """Backward scores β: ⊕ over paths to a final state (final weight included).

    Returns:
      float [P + 1]; entry P (the dummy) is `zero`.
    """
    levels, width, max_out = schedule.out_arc.shape
    arc_weight = _append(weight, semiring.zero)[schedule.out_arc]  # [L, W, K_out]
    final = final_terms(semiring, schedule, final_weight)

    def step(beta, xs):
        level, (out_dst_pos, out_weight, final_level) = xs
        new = final_level
        if max_out:
            leaving = semiring.times(out_weight, beta[out_dst_pos])  # [W, K_out]
            new = semiring.plus(new, semiring.sum(leaving, axis=1))
        return jax.lax.dynamic_update_slice(beta, new, (level * width,))

    beta = jnp.full((levels * width + 1,), semiring.zero, weight.dtype)
    return _level_scan(step, beta, (schedule.out_dst_pos, arc_weight, final), reverse=True)


def path_gradients(semiring: Semiring, schedule: Schedule, weight: jax.Array,
                   final_weight: jax.Array, alpha: jax.Array) -> tuple[jax.Array, jax.Array]:
    """∂ total / ∂ weight and ∂ total / ∂ final_weight, from saved α.

    Reverse-mode differentiation of the forward recursion with each step's
    local derivative given by `semiring.sum_grad` (softmax for LOG, the
    first-argmax indicator for TROPICAL), run as its own level scan. Valid
    when ⊗ is addition. The adjoint of a position is the probability (LOG)
    or the indicator (TROPICAL) that the chosen paths pass through it, a
    number in [0, 1], so no large scores are exponentiated here.

    ±inf cases: a position whose candidates are all -inf gets local weights
    0 (sum_grad's contract), so a -inf total, an unreachable state or a
    padding arc gets gradient exactly 0; a +inf weight yields NaN (a bug to
    keep visible).

    Args:
      semiring: a semiring with `sum_grad`.
      schedule: the tables of an unbatched Fsa.
      weight: float [A]; final_weight: float [S]; alpha: float [P + 1].
    Returns:
      (float [A], float [S]).
    """
    levels, width = schedule.pos_state.shape
    entering = semiring.times(alpha[schedule.in_src_pos],
                              _append(weight, semiring.zero)[schedule.in_arc])  # [L, W, K]
    start = start_terms(semiring, schedule, weight.dtype)
    candidates = jnp.concatenate([start[..., None], entering], axis=-1)  # [L, W, 1 + K]
    local = _append(semiring.sum_grad(candidates, axis=-1).reshape(-1), 0.0)
    arc_local = local[schedule.arc_grad_index]  # [A]
    # Over states, not positions, so that TROPICAL ties go to the lowest state.
    ending = semiring.times(alpha[schedule.state_pos], final_weight)  # [S]
    final_local = semiring.sum_grad(ending, axis=0)
    final_local_grid = _append(final_local, 0.0)[schedule.pos_state]  # [L, W]
    out_local = _append(arc_local, 0.0)[schedule.out_arc]  # [L, W, K_out]

    def step(adjoint, xs):
        level, (out_dst_pos, out_local_level, final_level) = xs
        new = final_level + jnp.sum(adjoint[out_dst_pos] * out_local_level, axis=1)
        return jax.lax.dynamic_update_slice(adjoint, new, (level * width,))

    adjoint = _level_scan(step, jnp.zeros((levels * width + 1,), weight.dtype),
                          (schedule.out_dst_pos, out_local, final_local_grid), reverse=True)
    return adjoint[schedule.arc_dst_pos] * arc_local, final_local
