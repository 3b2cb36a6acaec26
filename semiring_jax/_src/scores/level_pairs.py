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


def _reduce(hi: jax.Array, lo: jax.Array, axis: int, tropical: bool) -> tuple[Pair, Any]:
    """⊕ along `axis`: log-sum-exp, or the largest pair and its index."""
    if tropical:
        return compensated.max_pair(hi, lo, axis)
    return compensated.log_sum_pair(hi, lo, axis), None


def forward(schedule: Schedule, weight: ArrayLeaf, *, tropical: bool) -> tuple[Pair, Any]:
    """Forward scores α as pairs [P + 2], and for TROPICAL the choices
    (int32 [N, C] slots) that `level_scan.trace_back` reads."""
    weight = jnp.asarray(weight)
    steps, width = schedule.levels.pos_state.shape
    in_weight = level_scan.augmented(schedule, weight, _NEG_INF, 0.0)[schedule.levels.in_arc]

    def step(alpha: Pair, xs: tuple[jax.Array, Any]) -> tuple[Pair, Any]:
        index, (in_src_pos, in_weight_step) = xs
        entering = compensated.add(alpha[0][in_src_pos], alpha[1][in_src_pos], in_weight_step)
        new, choice = _reduce(*entering, 1, tropical)  # [C]
        start = (index * width,)
        alpha = (
            jax.lax.dynamic_update_slice(alpha[0], new[0], start),
            jax.lax.dynamic_update_slice(alpha[1], new[1], start),
        )
        return alpha, choice

    hi = _append(jnp.full((steps * width,), _NEG_INF, weight.dtype), _NEG_INF, 0.0)
    xs = (schedule.levels.in_src_pos, in_weight)
    alpha, choices = jax.lax.scan(
        step,
        varying_like((hi, jnp.zeros_like(hi)), xs),  # inside jax.shard_map xs are per device
        (jnp.arange(steps, dtype=jnp.int32), xs),
    )
    return alpha, choices


def backward(
    schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf, *, tropical: bool
) -> Pair:
    """Backward scores β (final weights included) as pairs [P + 1]."""
    weight = jnp.asarray(weight)
    steps, width = schedule.levels.pos_state.shape
    out_weight = level_scan.augmented(schedule, weight, _NEG_INF, 0.0)[schedule.levels.out_arc]
    final = _append(final_weight, _NEG_INF)[schedule.levels.pos_state]  # [N, C]

    def step(beta: Pair, xs: tuple[jax.Array, Any]) -> tuple[Pair, None]:
        index, (out_dst_pos, out_weight_step, final_step) = xs
        leaving = compensated.add(beta[0][out_dst_pos], beta[1][out_dst_pos], out_weight_step)
        # The final weight is one more term of each position's ⊕.
        terms_hi = jnp.concatenate([final_step[:, None], leaving[0]], axis=1)
        terms_lo = jnp.concatenate([jnp.zeros_like(final_step)[:, None], leaving[1]], axis=1)
        new, _ = _reduce(terms_hi, terms_lo, 1, tropical)
        start = (index * width,)
        beta = (
            jax.lax.dynamic_update_slice(beta[0], new[0], start),
            jax.lax.dynamic_update_slice(beta[1], new[1], start),
        )
        return beta, None

    hi = jnp.full((steps * width + 1,), _NEG_INF, weight.dtype)
    xs = (schedule.levels.out_dst_pos, out_weight, final)
    beta, _ = jax.lax.scan(
        step,
        varying_like((hi, jnp.zeros_like(hi)), xs),  # inside jax.shard_map xs are per device
        (jnp.arange(steps, dtype=jnp.int32), xs),
        reverse=True,
    )
    return beta


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
    alpha, _ = forward(schedule, weight, tropical=False)
    beta = backward(schedule, weight, final_weight, tropical=False)
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
