"""Level-scheduled score recursions of one unbatched, acyclic Fsa (traced).

Scores live on the schedule's flat grid of P = N * C positions, followed by
two dummy positions: P holds the semiring's zero and P + 1 its one (see
core/host/schedule_tables.py). Each recursion is one `lax.scan` over the N steps; a
step gathers the scores at its positions' arc ends (pull style, no
scatter) and writes its C new scores with a `dynamic_update_slice`.

The forward and backward recursions take any semiring, structured
weights included: scores and weights are then records (`core/records.py`),
a pytree whose leaves carry the record's axes after the leading ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import records
from semiring_jax._src.core.array_types import ArrayLeaf
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.semiring import Semiring
from semiring_jax._src.core.sharding import varying_like

__all__ = [
    "augmented",
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


def augmented(schedule: Schedule, values: Any, zero: Any, one: Any) -> Any:
    """Per-arc `values` [A] (a record array) extended to the schedule's
    augmented arcs [A + 2 + H]: `zero` for the dummy arc A, `one` for the
    start's pseudo-arc A + 1 and for every helper arc."""
    values = jax.tree_util.tree_map(jnp.asarray, values)
    helpers = records.full(
        one, (schedule.levels.helper_grad_index.shape[-1],), records.dtype_of(values)
    )
    return jax.tree_util.tree_map(
        lambda *parts: jnp.concatenate(parts), records.append(values, zero, one), helpers
    )


# A step: (carry [N], (step, per-step tables)) -> (new carry, saved).
StepFn = Callable[[jax.Array, tuple[jax.Array, Any]], tuple[jax.Array, Any]]


def _step_scan(step: StepFn, init: Any, xs: Any, *, reverse: bool) -> tuple[Any, Any]:
    steps = jax.tree_util.tree_leaves(xs)[0].shape[0]
    init = varying_like(init, xs)  # inside jax.shard_map, xs are per device
    return jax.lax.scan(step, init, (jnp.arange(steps, dtype=jnp.int32), xs), reverse=reverse)


def endings(
    semiring: Semiring, schedule: Schedule, alpha: jax.Array, final_weight: ArrayLeaf
) -> jax.Array:
    """α ⊗ final weight per state, [S]: the terms of the total score."""
    return semiring.times(records.take(alpha, schedule.levels.state_pos), final_weight)


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
      with_local: also return each in-slot's local derivative (by
        `semiring.sum_grad`, which it needs), for `path_gradients`.
      with_choice: also return what ⊕ chose (by `semiring.argsum`, which it
        needs): each position's slot, for `best_path_arcs`.
    Returns:
      α, float [P + 2] (entries P, P + 1 are zero and one), and the saved
      derivatives, float [N, C, K_in]; or the choices, int32 [N, C]; or None.
    """
    steps, width = schedule.levels.pos_state.shape
    in_weight = records.take(
        augmented(schedule, weight, semiring.zero, semiring.one), schedule.levels.in_arc
    )

    def step(alpha: Any, xs: tuple[jax.Array, Any]) -> tuple[Any, Any]:
        index, (in_src_pos, in_weight_step) = xs
        entering = semiring.times(records.take(alpha, in_src_pos), in_weight_step)  # [C, K]
        new = semiring.sum(entering, axis=1)
        saved: Any = None
        if with_local:
            sum_grad = semiring.sum_grad
            assert sum_grad is not None  # with_local needs it (see Args)
            saved = sum_grad(entering, new, axis=1)
        if with_choice:
            argsum = semiring.argsum
            assert argsum is not None  # with_choice needs it (see Args)
            saved = argsum(entering, new, axis=1)
        return records.update_slice(alpha, new, index * width), saved

    dtype = records.dtype_of(weight)
    alpha = records.full(semiring.zero, (steps * width,), dtype)
    alpha = records.append(alpha, semiring.zero, semiring.one)
    return _step_scan(step, alpha, (schedule.levels.in_src_pos, in_weight), reverse=False)


def backward_positions(
    semiring: Semiring, schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> jax.Array:
    """Backward scores β: ⊕ over paths to a final state (final weight included).

    Returns:
      float [P + 1]; entry P (the dummy) is `zero`.
    """
    steps, width = schedule.levels.pos_state.shape
    out_weight = records.take(
        augmented(schedule, weight, semiring.zero, semiring.one), schedule.levels.out_arc
    )
    final = records.take(
        records.append(final_weight, semiring.zero), schedule.levels.pos_state
    )  # [N, C]

    def step(beta: Any, xs: tuple[jax.Array, Any]) -> tuple[Any, None]:
        index, (out_dst_pos, out_weight_step, final_step) = xs
        leaving = semiring.times(out_weight_step, records.take(beta, out_dst_pos))  # [C, K_out]
        new = semiring.plus(final_step, semiring.sum(leaving, axis=1))
        return records.update_slice(beta, new, index * width), None

    beta = records.full(semiring.zero, (steps * width + 1,), records.dtype_of(weight))
    beta, _ = _step_scan(step, beta, (schedule.levels.out_dst_pos, out_weight, final), reverse=True)
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
    first-maximum indicator for TROPICAL), run as its own scan over
    outgoing arcs (helper arcs included: their local derivatives chain a
    fan tree's). Valid when ⊗ is addition. The adjoint of a position is
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
    steps, width = schedule.levels.pos_state.shape
    flat_local = _append(local.reshape(-1), 0)
    arc_local = flat_local[schedule.levels.arc_grad_index]  # [A]
    helper_local = flat_local[schedule.levels.helper_grad_index]  # [H]
    zeros = jnp.zeros(2, arc_local.dtype)  # the dummy arc and the pseudo-arc
    out_local = jnp.concatenate([arc_local, zeros, helper_local])[schedule.levels.out_arc]
    # Over states, not positions, so that TROPICAL ties go to the lowest state.
    ending = endings(semiring, schedule, alpha, final_weight)
    assert semiring.sum_grad is not None  # see Args
    final_local = semiring.sum_grad(ending, semiring.sum(ending, axis=0), axis=0)
    final_local_grid = _append(final_local, 0)[schedule.levels.pos_state]  # [N, C]

    def step(adjoint: jax.Array, xs: tuple[jax.Array, Any]) -> tuple[jax.Array, None]:
        index, (out_dst_pos, out_local_step, final_step) = xs
        new = final_step + jnp.sum(adjoint[out_dst_pos] * out_local_step, axis=1)  # [C]
        return jax.lax.dynamic_update_slice(adjoint, new, (index * width,)), None

    adjoint = jnp.zeros((steps * width + 1,), final_weight.dtype)
    adjoint, _ = _step_scan(
        step, adjoint, (schedule.levels.out_dst_pos, out_local, final_local_grid), reverse=True
    )
    return adjoint[schedule.levels.arc_dst_pos] * arc_local, final_local


def best_path_arcs(
    semiring: Semiring,
    schedule: Schedule,
    final_weight: ArrayLeaf,
    alpha: jax.Array,
    choices: jax.Array,
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
      The path's arcs, int32 [N], last arc first, then A (none) in the
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
    schedule: Schedule, choices: jax.Array, final_state: jax.Array, found: jax.Array
) -> jax.Array:
    """The real arcs of the path that ⊕ chose, from `final_state` back to
    the start (through the helper arcs of fan trees, which are left out).

    Args:
      schedule: the tables of an unbatched Fsa.
      choices: int32 [N, C], each position's chosen slot
        (`forward_positions(..., with_choice=True)`).
      final_state: int32 [], where the path ends.
      found: bool [], whether a path succeeds (none is traced otherwise).
    Returns:
      int32 [N]: the path's arcs, last arc first, then A (none).
    """
    steps, width = schedule.levels.pos_state.shape
    num_arcs = schedule.levels.arc_src_pos.shape[0]

    def step(
        carry: tuple[jax.Array, jax.Array], _: None
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        position, walking = carry
        index, rank = position // width, position % width
        slot = choices[index, rank]
        arc = schedule.levels.in_arc[index, rank, slot]
        # A (none) and A + 1 (the start) end the walk; helper arcs go on.
        walking = walking & (arc != num_arcs) & (arc != num_arcs + 1)
        real = jnp.where(walking & (arc < num_arcs), arc, num_arcs)
        return (schedule.levels.in_src_pos[index, rank, slot], walking), real

    start = (schedule.levels.state_pos[final_state], found)
    _, arcs = jax.lax.scan(step, start, None, length=steps)
    # The real arcs first, in the order walked.
    return arcs[jnp.argsort(arcs >= num_arcs, stable=True)]
