"""The LOG dense scan: forward scores and per-frame posteriors, compensated.

Scores are normalised per frame (their per-frame shifts summed apart) and
carried as (hi, lo) pairs (`compensated.py`), so that float32 posteriors
stay accurate to ~1e-5 at T = 5,000 frames (API.md, Precision). The
posteriors of a frame are normalised by that frame's own total (they sum to
one over the frame) rather than formed as exp(α + β - Z) from large scores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from semiring_jax._src import compensated
from semiring_jax._src.dense_slots import (Slots, frame_scores, max_or_zero, pull, push,
                                           varying_like)

__all__ = ["forward", "total", "posterior_grads"]

_ZERO = -jnp.inf


def _start(num_states: int, dtype, reference: jax.Array) -> tuple[jax.Array, jax.Array]:
    hi = jnp.full(num_states, _ZERO, dtype).at[0].set(0)
    return varying_like(reference, hi), varying_like(reference, jnp.zeros(num_states, dtype))


def _to_dst(slots: Slots, slot_weight: jax.Array, frame: jax.Array, hi: jax.Array,
            lo: jax.Array) -> tuple[jax.Array, jax.Array]:
    """slot weight + emission + (hi, lo) [S, K] as a pair."""
    hi, lo = compensated.add(hi, lo, slot_weight)
    return compensated.add(hi, lo, frame_scores(frame, slots.label))


def forward(slots: Slots, slot_weight: jax.Array, emissions: jax.Array, length: jax.Array):
    """((α_hi, α_lo) after `length` frames, saved (hi, lo) [T, S] after each
    frame, per-frame shifts [T])."""
    num_states, num_slots = slot_weight.shape

    def step(carry, inputs):
        hi, lo = carry
        t, frame = inputs
        from_hi = pull(hi, slots, num_slots, _ZERO)
        from_lo = pull(lo, slots, num_slots, 0.0)
        new_hi, new_lo, shift = compensated.log_sum_shifted(
            *_to_dst(slots, slot_weight, frame, from_hi, from_lo), axis=1)
        active = t < length
        hi, lo = jnp.where(active, new_hi, hi), jnp.where(active, new_lo, lo)
        return (hi, lo), (hi, lo, jnp.where(active, shift, jnp.zeros_like(shift)))

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    alpha, (saved_hi, saved_lo, shifts) = jax.lax.scan(
        step, _start(num_states, slot_weight.dtype, emissions), (frames, emissions))
    return alpha, (saved_hi, saved_lo), shifts


def total(alpha: tuple[jax.Array, jax.Array], final_weight: jax.Array,
          shifts: jax.Array) -> jax.Array:
    ends = compensated.add(*alpha, final_weight)
    return compensated.log_sum(*ends, axis=0) + jnp.sum(shifts)


def posterior_grads(slot_grads: bool, slots: Slots, slot_weight: jax.Array,
                    final_weight: jax.Array, emissions: jax.Array, length: jax.Array,
                    alpha_end, saved):
    """(slot [S, K], final [S], emission [T, V] or [T, S]) gradients of the
    total: expected uses of each slot, stopping posteriors, and per-frame
    column (or state) posteriors."""
    num_states, num_slots = slot_weight.shape
    num_columns = emissions.shape[1]
    final_grad = compensated.softmax(*compensated.add(*alpha_end, final_weight))
    saved_hi, saved_lo = saved
    # Per-state emissions and no slot gradient: the state occupancies
    # softmax(α after t + β after t) are the emission gradient, [S] per
    # frame; otherwise the slot posteriors are needed, from α before t.
    by_state = slots.label is None and not slot_grads
    if not by_state:
        start_hi, start_lo = _start(num_states, slot_weight.dtype, emissions)
        saved_hi = jnp.concatenate([start_hi[None], saved_hi[:-1]])
        saved_lo = jnp.concatenate([start_lo[None], saved_lo[:-1]])

    def step(carry, inputs):
        beta_hi, beta_lo, slot_grad = carry  # β after frame t; [S, K] so far
        t, frame, alpha_hi, alpha_lo = inputs
        active = t < length
        to_hi, to_lo = _to_dst(slots, slot_weight, frame, beta_hi[:, None], beta_lo[:, None])
        if by_state:
            terms_hi, terms_lo = compensated.add(alpha_hi, alpha_lo, beta_hi)
            posterior = compensated.softmax(terms_hi, terms_lo + beta_lo)
            emission_grad = jnp.where(active, posterior, jnp.zeros_like(posterior))
        else:
            terms_hi, terms_lo = compensated.add(pull(alpha_hi, slots, num_slots, _ZERO),
                                                 pull(alpha_lo, slots, num_slots, 0.0), to_hi)
            posterior = compensated.softmax(terms_hi, terms_lo + to_lo)
            posterior = jnp.where(active, posterior, jnp.zeros_like(posterior))
            slot_grad = slot_grad + posterior
            emission_grad = _columns(slots.label, posterior, num_columns)
        new_hi, new_lo, _ = compensated.log_sum_shifted(
            push(to_hi, slots, _ZERO), push(to_lo, slots, 0.0), axis=1)
        beta_hi = jnp.where(active, new_hi, beta_hi)
        beta_lo = jnp.where(active, new_lo, beta_lo)
        return (beta_hi, beta_lo, slot_grad), emission_grad

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    beta_hi, beta_lo = compensated.two_sum(final_weight, -max_or_zero(final_weight))
    init = (varying_like(emissions, beta_hi), varying_like(emissions, beta_lo),
            varying_like(emissions, jnp.zeros_like(slot_weight)))
    (_, _, slot_grad), emission_grad = jax.lax.scan(
        step, init, (frames, emissions, saved_hi, saved_lo), reverse=True)
    return slot_grad, final_grad, emission_grad


def _columns(label, mass: jax.Array, num_columns: int) -> jax.Array:
    """Sums slot posteriors `mass` [S, K] into [V] by emission column, or
    into [S] when the emissions are per state (label None)."""
    if label is None:
        return jnp.sum(mass, axis=1)
    return jnp.zeros(num_columns, mass.dtype).at[label.reshape(-1)].add(mass.reshape(-1))
