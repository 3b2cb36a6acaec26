"""Level-scheduled score recursions of one unbatched, acyclic Fsa (traced).

Scores live on the schedule's flat grid of P = L * W positions, followed by
two dummy positions: P holds the semiring's zero and P + 1 its one (see
host/schedule.py). Each recursion is one `lax.scan` over the L levels; a
step gathers the scores of a level's arc ends (pull style, no scatter) and
writes the level's W new scores with a `dynamic_update_slice`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.array_types import ArrayLeaf
from semiring_jax._src.schedule import Schedule
from semiring_jax._src.semiring import Semiring

__all__ = [
    "backward_positions",
    "best_path_arcs",
    "endings",
    "forward_positions",
    "path_gradients",
    "trace_back",
]


def _append(values: ArrayLeaf, *fills: float) -> jax.Array:
    """`values` [N] followed by `fills`, for the dummy indices N, N + 1, ..."""
    return jnp.concatenate([values, jnp.asarray(fills, values.dtype)])


# A level step: (carry [N], (level, per-level tables)) -> (new carry, saved).
LevelStep = Callable[[jax.Array, tuple[jax.Array, Any]], tuple[jax.Array, Any]]


def _level_scan(
    step: LevelStep, init: jax.Array, xs: Any, *, reverse: bool
) -> tuple[jax.Array, Any]:
    levels = jax.tree_util.tree_leaves(xs)[0].shape[0]
    return jax.lax.scan(step, init, (jnp.arange(levels, dtype=jnp.int32), xs), reverse=reverse)


def _combine(
    reduce: Callable[..., jax.Array], zero: float, row_values: jax.Array, combine: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """`reduce` of each state's rows: [R] -> [W], and the [W, C] parts (or
    None); empty combine slots read `zero`."""
    if combine.shape[-1] == 1 and row_values.shape[0] == combine.shape[0]:
        return row_values, None  # one row per state: nothing to combine
    parts = _append(row_values, zero)[combine]  # [W, C]
    return reduce(parts, axis=1), parts


def endings(
    semiring: Semiring, schedule: Schedule, alpha: jax.Array, final_weight: ArrayLeaf
) -> jax.Array:
    """α ⊗ final weight per state, [S]: the terms of the total score."""
    return semiring.times(alpha[schedule.state_pos], final_weight)


def forward_positions(
    semiring: Semiring,
    schedule: Schedule,
    weight: ArrayLeaf,
    *,
    with_local: bool = False,
    with_choice: bool = False,
) -> tuple[jax.Array, Any]:
    """Forward scores α: ⊕ over paths from the start, per position.

    Args:
      semiring: the semiring.
      schedule: the tables of an unbatched Fsa.
      weight: float [A].
      with_local: also return each in-arc slot's local derivative (by
        `semiring.sum_grad`, which it needs), for `path_gradients`.
      with_choice: also return what ⊕ chose (by `semiring.argsum`, which it
        needs): each row's slot and each state's row, for `best_path_arcs`.
    Returns:
      α, float [P + 2] (entries P, P + 1 are zero and one), and the saved
      derivatives, float [L, R, K]; or the choices, (int32 [L, R], int32
      [L, W]); or None.
    """
    levels, width = schedule.pos_state.shape
    # Dummy arcs: A has weight zero (padding), A + 1 weight one (start).
    in_weight = _append(weight, semiring.zero, semiring.one)[schedule.in_arc]  # [L, R, K]

    def step(alpha: jax.Array, xs: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
        level, (in_src_pos, in_weight_level, combine, row_part) = xs
        entering = semiring.times(alpha[in_src_pos], in_weight_level)  # [R, K]
        rows = semiring.sum(entering, axis=1)
        new, parts = _combine(semiring.sum, semiring.zero, rows, combine)
        saved: Any = None
        if with_local:
            sum_grad = semiring.sum_grad
            assert sum_grad is not None  # with_local needs it (see Args)
            saved = sum_grad(entering, rows, axis=1)
            if parts is not None:  # chain rule through the combine step
                part_local = sum_grad(parts, new, axis=1).reshape(-1)
                saved = saved * _append(part_local, 0)[row_part][:, None]
        if with_choice:
            argsum = semiring.argsum
            assert argsum is not None  # with_choice needs it (see Args)
            part_choice = (
                jnp.zeros(new.shape, jnp.int32) if parts is None else argsum(parts, new, axis=1)
            )
            saved = argsum(entering, rows, axis=1), part_choice
        return jax.lax.dynamic_update_slice(alpha, new, (level * width,)), saved

    alpha = jnp.full((levels * width,), semiring.zero, weight.dtype)
    alpha = _append(alpha, semiring.zero, semiring.one)
    return _level_scan(
        step,
        alpha,
        (schedule.in_src_pos, in_weight, schedule.in_combine, schedule.in_row_part),
        reverse=False,
    )


def backward_positions(
    semiring: Semiring, schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> jax.Array:
    """Backward scores β: ⊕ over paths to a final state (final weight included).

    Returns:
      float [P + 1]; entry P (the dummy) is `zero`.
    """
    levels, width = schedule.pos_state.shape
    out_weight = _append(weight, semiring.zero)[schedule.out_arc]  # [L, R, K_out]
    final = _append(final_weight, semiring.zero)[schedule.pos_state]  # [L, W]

    def step(beta: jax.Array, xs: tuple[jax.Array, Any]) -> tuple[jax.Array, None]:
        level, (out_dst_pos, out_weight_level, combine, final_level) = xs
        leaving = semiring.times(out_weight_level, beta[out_dst_pos])  # [R, K_out]
        rows = semiring.sum(leaving, axis=1)
        new = semiring.plus(final_level, _combine(semiring.sum, semiring.zero, rows, combine)[0])
        return jax.lax.dynamic_update_slice(beta, new, (level * width,)), None

    beta = jnp.full((levels * width + 1,), semiring.zero, weight.dtype)
    beta, _ = _level_scan(
        step, beta, (schedule.out_dst_pos, out_weight, schedule.out_combine, final), reverse=True
    )
    return beta


def path_gradients(
    semiring: Semiring,
    schedule: Schedule,
    final_weight: jax.Array,
    alpha: jax.Array,
    local: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """∂ total / ∂ weight and ∂ total / ∂ final_weight, from the forward pass.

    Reverse-mode differentiation of the forward recursion with each step's
    local derivative given by `semiring.sum_grad` (softmax for LOG, the
    first-maximum indicator for TROPICAL), run as its own level scan over
    outgoing arcs. Valid when ⊗ is addition. The adjoint of a position is
    the probability (LOG) or the indicator (TROPICAL) that the chosen paths
    pass through it, a number in [0, 1], so no large scores are
    exponentiated here.

    ±inf cases: a state whose candidates are all -inf gets local weights 0
    (sum_grad's contract), so a -inf total, an unreachable state or a
    padding arc gets gradient exactly 0; a +inf weight yields NaN (a bug to
    keep visible).

    Args:
      semiring: a semiring with `sum_grad`.
      schedule: the tables of an unbatched Fsa.
      final_weight: float [S].
      alpha, local: `forward_positions(..., with_local=True)`.
    Returns:
      (float [A], float [S]).
    """
    levels, width = schedule.pos_state.shape
    arc_local = _append(local.reshape(-1), 0)[schedule.arc_grad_index]  # [A]
    # Over states, not positions, so that TROPICAL ties go to the lowest state.
    ending = endings(semiring, schedule, alpha, final_weight)
    assert semiring.sum_grad is not None  # see Args
    final_local = semiring.sum_grad(ending, semiring.sum(ending, axis=0), axis=0)
    final_local_grid = _append(final_local, 0)[schedule.pos_state]  # [L, W]
    out_local = _append(arc_local, 0)[schedule.out_arc]  # [L, R, K_out]

    def step(adjoint: jax.Array, xs: tuple[jax.Array, Any]) -> tuple[jax.Array, None]:
        level, (out_dst_pos, out_local_level, combine, final_level) = xs
        rows = jnp.sum(adjoint[out_dst_pos] * out_local_level, axis=1)  # [R]
        new = final_level + _combine(jnp.sum, 0, rows, combine)[0]
        return jax.lax.dynamic_update_slice(adjoint, new, (level * width,)), None

    adjoint = jnp.zeros((levels * width + 1,), final_weight.dtype)
    adjoint, _ = _level_scan(
        step,
        adjoint,
        (schedule.out_dst_pos, out_local, schedule.out_combine, final_local_grid),
        reverse=True,
    )
    return adjoint[schedule.arc_dst_pos] * arc_local, final_local


def best_path_arcs(
    semiring: Semiring,
    schedule: Schedule,
    final_weight: ArrayLeaf,
    alpha: jax.Array,
    choices: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The path that ⊕ chose, traced back through the saved choices.

    For selective semirings (TROPICAL): from the final state that `argsum`
    picks, follow each state's chosen row and slot back to the start's
    pseudo-arc. One cheap step per arc of the path instead of a backward
    recursion over every state.

    Args:
      semiring: a semiring with `argsum`.
      schedule: the tables of an unbatched Fsa.
      final_weight: float [S].
      alpha, choices: `forward_positions(..., with_choice=True)`.
    Returns:
      The path's arcs, int32 [L], last arc first, then A (none) in the
      slots past its start; the chosen final state, int32 []; and whether a
      path succeeds, bool [].
    """
    ending = endings(semiring, schedule, alpha, final_weight)
    total = semiring.sum(ending, axis=0)
    argsum = semiring.argsum
    assert argsum is not None  # see Args
    final_state = argsum(ending, total, axis=0)
    found = total != semiring.zero
    return trace_back(schedule, choices, final_state, found), final_state, found


def trace_back(
    schedule: Schedule,
    choices: tuple[jax.Array, jax.Array],
    final_state: jax.Array,
    found: jax.Array,
) -> jax.Array:
    """The arcs of the path that ⊕ chose, from `final_state` back to the start.

    Args:
      schedule: the tables of an unbatched Fsa.
      choices: each row's chosen slot, int32 [L, R], and each state's chosen
        row, int32 [L, W] (`forward_positions(..., with_choice=True)`).
      final_state: int32 [], where the path ends.
      found: bool [], whether a path succeeds (none is traced otherwise).
    Returns:
      int32 [L]: the path's arcs, last arc first, then A (none).
    """
    levels, width = schedule.pos_state.shape
    num_arcs = schedule.arc_src_pos.shape[0]
    row_choice, part_choice = choices

    def step(
        carry: tuple[jax.Array, jax.Array], _: None
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        position, walking = carry
        level, rank = position // width, position % width
        row = schedule.in_combine[level, rank, part_choice[level, rank]]
        slot = row_choice[level, row]
        arc = schedule.in_arc[level, row, slot]
        walking = walking & (arc < num_arcs)  # arc A + 1 is the start
        return (schedule.in_src_pos[level, row, slot], walking), jnp.where(walking, arc, num_arcs)

    start = (schedule.state_pos[final_state], found)
    _, arcs = jax.lax.scan(step, start, None, length=levels)
    return arcs
