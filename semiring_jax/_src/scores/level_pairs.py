"""LOG and TROPICAL level recursions on compensated scores (traced).

The level scans of `level_scan.py` round every score to the float grid at
every level: on a 30,000-level chain the scores reach ~1e5, where a
float32's spacing is 0.008, so the totals drift by tens and each state's
softmax weights by ~1e-3 (arc posteriors of 2.4 came out of such a chain).
Here the scores are (hi, lo) pairs (`core/compensated.py`), which keep their
O(1) part at any depth (to ~1e-7 while |score| < ~1e7), and the LOG
gradients are the
posteriors exp(α[src] + w + β[dst] - Z), each formed from pairs on its own:
their error does not grow with depth, as the product of per-level local
derivatives does.

Positions and slot tables are those of `level_scan.py` and
`core/host/schedule_tables.py`: α has P + 2 entries (P: zero, P + 1: one), β has P + 1.
The TROPICAL choices (each position's slot) are the first largest pair, as
the float recursions choose, so `level_scan.trace_back` follows them with
the same tie rule.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import compensated
from semiring_jax._src.core.array_types import ArrayLeaf
from semiring_jax._src.core.compensated import Pair
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.sharding import varying_like
from semiring_jax._src.scores import level_scan

__all__ = ["backward", "forward", "log_gradients", "total", "tropical_gradients"]

_NEG_INF = -jnp.inf


def _append(values: ArrayLeaf, *fills: float) -> jax.Array:
    values = jnp.asarray(values)
    return jnp.concatenate([values, jnp.asarray(fills, values.dtype)])


# A level's LOG ⊕ over at most this many slots runs as elementwise columns:
# one kernel per level on a GPU, where a reduction over an axis takes two
# (the maximum, then the sum). Levels are narrow (C positions), so the
# unrolled columns stay small; wider in-degrees reduce over the axis.
_COLUMNS_UP_TO = 16


def _reduce(hi: jax.Array, lo: jax.Array, axis: int, tropical: bool) -> tuple[Pair, Any]:
    """⊕ along `axis`: log-sum-exp, or the largest pair and its index."""
    if tropical:
        return compensated.max_pair(hi, lo, axis)
    return compensated.log_sum_pair(hi, lo, axis), None


def _log_sum_slots(hi: jax.Array, lo: jax.Array, first: Pair | None = None) -> Pair:
    """LOG ⊕ of a level's slots [C, K], and of `first` [C] if given."""
    his, los = [hi[:, k] for k in range(hi.shape[1])], [lo[:, k] for k in range(lo.shape[1])]
    if first is not None:
        his, los = [first[0], *his], [first[1], *los]
    if len(his) <= _COLUMNS_UP_TO:
        return compensated.log_sum_columns(his, los)
    return compensated.log_sum_pair(jnp.stack(his, 1), jnp.stack(los, 1), axis=1)


# The recursions carry each score array as one packed [2, N] array (hi,
# lo) and write each level into it with one dynamic_update_slice: on a GPU
# a loop iteration launches a kernel per array it updates.


def _packed(size: int, dtype: Any, last: tuple[float, ...], reference: Any) -> jax.Array:
    """[2, size]: hi -inf but `last` at the end, lo 0."""
    hi = _append(jnp.full((size - len(last),), _NEG_INF, dtype), *last)
    return varying_like(jnp.stack([hi, jnp.zeros_like(hi)]), reference)


def _written(packed: jax.Array, level: Pair, start: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(packed, jnp.stack(level), (jnp.int32(0), start))


def _unpacked(packed: jax.Array) -> Pair:
    return packed[0], packed[1]


def _forward_tables(schedule: Schedule, weight: jax.Array) -> tuple[Any, jax.Array]:
    """Per level: (entering slots' source positions [N, C, K], weights)."""
    in_weight = level_scan.augmented(schedule, weight, _NEG_INF, 0.0)[schedule.levels.in_arc]
    return schedule.levels.in_src_pos, in_weight


def _alpha_level(alpha: jax.Array, tables: Any, tropical: bool) -> tuple[Pair, Any]:
    """One level's α [C] (and TROPICAL choices) from the packed α."""
    in_src_pos, in_weight = tables
    entering = compensated.add(alpha[0][in_src_pos], alpha[1][in_src_pos], in_weight)
    if tropical:
        return compensated.max_pair(*entering, 1)
    return _log_sum_slots(*entering), None


def _backward_tables(
    schedule: Schedule, weight: jax.Array, final_weight: ArrayLeaf
) -> tuple[Any, jax.Array, jax.Array]:
    """Per level: (leaving slots' destination positions [N, C, K'], weights,
    final weights [N, C])."""
    out_weight = level_scan.augmented(schedule, weight, _NEG_INF, 0.0)[schedule.levels.out_arc]
    final = _append(final_weight, _NEG_INF)[schedule.levels.pos_state]
    return schedule.levels.out_dst_pos, out_weight, final


def _beta_level(beta: jax.Array, tables: Any, tropical: bool) -> Pair:
    """One level's β [C] from the packed β."""
    out_dst_pos, out_weight, final = tables
    leaving = compensated.add(beta[0][out_dst_pos], beta[1][out_dst_pos], out_weight)
    # The final weight is one more term of each position's ⊕.
    if tropical:
        terms_hi = jnp.concatenate([final[:, None], leaving[0]], axis=1)
        terms_lo = jnp.concatenate([jnp.zeros_like(final)[:, None], leaving[1]], axis=1)
        return compensated.max_pair(terms_hi, terms_lo, 1)[0]
    return _log_sum_slots(*leaving, first=(final, jnp.zeros_like(final)))


def forward(schedule: Schedule, weight: ArrayLeaf, *, tropical: bool) -> tuple[Pair, Any]:
    """Forward scores α as pairs [P + 2], and for TROPICAL the choices
    (int32 [N, C] slots) that `level_scan.trace_back` reads."""
    weight = jnp.asarray(weight)
    steps, width = schedule.levels.pos_state.shape
    xs = _forward_tables(schedule, weight)

    def step(alpha: jax.Array, inputs: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
        index, tables = inputs
        new, choice = _alpha_level(alpha, tables, tropical)
        return _written(alpha, new, index * width), choice

    init = _packed(steps * width + 2, weight.dtype, (_NEG_INF, 0.0), xs)
    alpha, choices = jax.lax.scan(step, init, (jnp.arange(steps, dtype=jnp.int32), xs))
    return _unpacked(alpha), choices


def backward(
    schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf, *, tropical: bool
) -> Pair:
    """Backward scores β (final weights included) as pairs [P + 1]."""
    weight = jnp.asarray(weight)
    steps, width = schedule.levels.pos_state.shape
    xs = _backward_tables(schedule, weight, final_weight)

    def step(beta: jax.Array, inputs: tuple[jax.Array, Any]) -> tuple[jax.Array, None]:
        index, tables = inputs
        return _written(beta, _beta_level(beta, tables, tropical), index * width), None

    init = _packed(steps * width + 1, weight.dtype, (_NEG_INF,), xs)
    indices = jnp.arange(steps, dtype=jnp.int32)
    beta, _ = jax.lax.scan(step, init, (indices, xs), reverse=True)
    return _unpacked(beta)


def _mirrored(positions: Any, steps: int, width: int) -> jax.Array:
    """Positions of level l moved to level N - 1 - l (an involution); the
    zero position P and beyond stay."""
    positions = jnp.asarray(positions)
    mirror = (steps - 1 - positions // width) * width + positions % width
    return jnp.where(positions < steps * width, mirror, positions)


def _log_scores(
    schedule: Schedule, weight: jax.Array, final_weight: jax.Array
) -> tuple[Pair, Pair]:
    """LOG α [P + 2] and β [P + 1] as pairs, from one scan: α of level i
    and β of level N - 1 - i read nothing of each other, so each iteration
    computes both (N sequential steps for the gradient, not 2 N; on a GPU
    a step's cost is mostly its launches).

    The scan carries one [4, P + 2] array: α's pair, then β's with its
    levels mirrored (`_mirrored`), so that the two levels an iteration
    computes sit at the same positions and one dynamic_update_slice writes
    both."""
    steps, width = schedule.levels.pos_state.shape
    forward_xs = _forward_tables(schedule, weight)
    out_dst_pos, out_weight, final = _backward_tables(schedule, weight, final_weight)
    backward_xs = (_mirrored(out_dst_pos, steps, width), out_weight, final)
    backward_xs = jax.tree_util.tree_map(lambda x: jnp.flip(x, 0), backward_xs)

    def step(scores: jax.Array, inputs: Any) -> tuple[jax.Array, None]:
        index, forward_tables, backward_tables = inputs
        new_alpha, _ = _alpha_level(scores[:2], forward_tables, False)
        new_beta = _beta_level(scores[2:], backward_tables, False)
        new = compensated.pack(new_alpha, new_beta)
        return jax.lax.dynamic_update_slice(scores, new, (jnp.int32(0), index * width)), None

    xs = (jnp.arange(steps, dtype=jnp.int32), forward_xs, backward_xs)
    size = steps * width + 2
    init = jnp.concatenate(
        [
            _packed(size, weight.dtype, (_NEG_INF, 0.0), xs),
            _packed(size, weight.dtype, (_NEG_INF, _NEG_INF), xs),
        ]
    )
    scores, _ = jax.lax.scan(step, init, xs)
    # Levels back in order by a flip, not a gather (a TPU loops over a gather's indices).
    levels = jnp.flip(scores[2:, : steps * width].reshape(2, steps, width), 1)
    beta = jnp.concatenate([levels.reshape(2, steps * width), scores[2:, -2:-1]], axis=1)
    return _unpacked(scores[:2]), _unpacked(beta)


def _endings(schedule: Schedule, alpha: Pair, final_weight: ArrayLeaf) -> Pair:
    """α ⊗ final weight per state, [S]."""
    return compensated.add(
        alpha[0][schedule.levels.state_pos],
        alpha[1][schedule.levels.state_pos],
        jnp.asarray(final_weight),
    )


def total(
    schedule: Schedule, alpha: Pair, final_weight: ArrayLeaf, *, tropical: bool
) -> tuple[Pair, Any]:
    """The total score as a pair, and for TROPICAL the best final state
    (the lowest-numbered one)."""
    return _reduce(*_endings(schedule, alpha, jnp.asarray(final_weight)), 0, tropical)


def log_gradients(
    schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """LOG: (total [], arc posteriors [A], stopping posteriors [S]).

    | total | posteriors                                              |
    | -inf  | exactly 0                                               |
    | +inf  | NaN (a +inf weight is a bug; its posteriors are undefined) |
    | NaN   | NaN                                                     |
    """
    weight, final_weight = jnp.asarray(weight), jnp.asarray(final_weight)
    alpha, beta = _log_scores(schedule, weight, final_weight)
    z, _ = total(schedule, alpha, final_weight, tropical=False)
    src, dst = schedule.levels.arc_src_pos, schedule.levels.arc_dst_pos
    path = compensated.add_pairs(
        compensated.add(alpha[0][src], alpha[1][src], weight), (beta[0][dst], beta[1][dst])
    )
    arc_grad = compensated.exp_difference(*path, *z)
    final_grad = compensated.exp_difference(*_endings(schedule, alpha, final_weight), *z)
    return z[0] + z[1], arc_grad, final_grad


def tropical_gradients(
    schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """TROPICAL: (total [], best-path indicator [A], stopping indicator [S]).

    Ties: the lowest best final state, then the start's empty prefix, then
    the lowest-numbered arc into each state.
    """
    weight, final_weight = jnp.asarray(weight), jnp.asarray(final_weight)
    alpha, choices = forward(schedule, weight, tropical=True)
    z, final_state = total(schedule, alpha, final_weight, tropical=True)
    found = z[0] > _NEG_INF
    assert choices is not None  # forward(..., tropical=True) makes them
    arcs = level_scan.trace_back(schedule, choices, final_state, found)
    num_arcs = weight.shape[0]
    on_path = jnp.zeros(num_arcs + 1, weight.dtype).at[arcs].set(1)[:num_arcs]
    stop = jnp.zeros_like(final_weight).at[final_state].set(found.astype(weight.dtype), mode="drop")
    return z[0] + z[1], on_path, stop
