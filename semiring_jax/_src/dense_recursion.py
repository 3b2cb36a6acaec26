"""The scan over frames behind dense intersection (one utterance; vmapped).

A graph enters as *slots*: for each state s, K incoming slots, each with a
source state `src[s, k]`, an emission column `label[s, k]` and a weight
`slot_weight[s, k]` (-inf on unused slots). One frame t maps forward scores
α_t [S] to

    α_{t+1}[s] = ⊕_k α_t[src[s, k]] ⊗ slot_weight[s, k] ⊗ emissions[t, label[s, k]].

`label` may be [S, 1] when all slots of a state share one column (CTC): the
emission is then gathered once per state, not once per slot.

For LOG and TROPICAL (⊗ = +) each frame's scores are shifted so that their
maximum is 0 and the shifts are summed apart (the scaled forward-backward
algorithm): scores stay O(1) however long the utterance, so that float32
posteriors keep ~1e-6 accuracy at T = 5,000 (DESIGN.md, Precision).

Gradients: LOG posteriors are formed frame by frame in a reverse scan and
reduced into [T, V] and [S, K] as it goes, so no [T, S, K] array is held.
TROPICAL saves each state's best slot per frame and traces one path back.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from semiring_jax._src.semiring import Semiring

__all__ = ["Slots", "total", "dense_total", "best_frames", "forward_with_choices"]


class Slots(NamedTuple):
    """Integer tables of a graph's incoming slots (see the module docstring).

    Attributes:
      src: int32 [S, K], the source state of each slot (any state if unused).
      label: int32 [S, K] or [S, 1], the emission column of each slot.
      leaving: int32 [S, Ko], flat indices into [S * K] of the slots whose
        source is each state; S * K where unused.
    """

    src: jax.Array
    label: jax.Array
    leaving: jax.Array


def _shift(scores: jax.Array) -> jax.Array:
    """The max of `scores` [S], or 0 when none is finite."""
    top = jnp.max(scores, initial=-jnp.inf)
    return jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))


def _normalises(semiring: Semiring) -> bool:
    # sum_grad / argsum are only given for semirings with ⊗ = + (semiring.py),
    # and for those ⊕ commutes with a common shift.
    return semiring.sum_grad is not None or semiring.argsum is not None


def _forward(semiring: Semiring, slots: Slots, slot_weight: jax.Array,
             emissions: jax.Array, length: jax.Array, *, with_choice: bool = False):
    """Forward scan. Returns (α_length [S], per-frame saves, shifts [T])."""
    num_states = slot_weight.shape[0]
    normalise = _normalises(semiring)
    dtype = slot_weight.dtype
    alpha = jnp.full(num_states, semiring.zero, dtype).at[0].set(semiring.one)

    def step(alpha, inputs):
        t, frame = inputs  # frame: [V]
        terms = semiring.times(semiring.times(alpha[slots.src], slot_weight),
                               frame[slots.label])  # [S, K]
        new = semiring.sum(terms, axis=1)  # [S]
        shift = _shift(new) if normalise else jnp.zeros((), dtype)
        active = t < length
        saved = semiring.argsum(terms, new, axis=1) if with_choice else alpha
        new_alpha = jnp.where(active, new - shift if normalise else new, alpha)
        return new_alpha, (saved, jnp.where(active, shift, 0).astype(dtype))

    frames = jnp.arange(emissions.shape[0])
    alpha, (saved, shifts) = jax.lax.scan(step, alpha, (frames, emissions))
    return alpha, saved, shifts


def _ends(semiring: Semiring, alpha: jax.Array, final_weight: jax.Array) -> jax.Array:
    return semiring.times(alpha, final_weight)


def _plain_total(semiring, slots, slot_weight, final_weight, emissions, length):
    alpha, _, shifts = _forward(semiring, slots, slot_weight, emissions, length)
    total = semiring.sum(_ends(semiring, alpha, final_weight), axis=0)
    return total + jnp.sum(shifts) if _normalises(semiring) else total


dense_total = jax.custom_vjp(_plain_total, nondiff_argnums=(0,))
dense_total.__doc__ = """⊕ over paths of exactly `length` frames, one utterance.

Args (after the static semiring):
  slots: `Slots` of the graph.
  slot_weight: float [S, K], -inf on unused slots.
  final_weight: float [S].
  emissions: float [T, V].
  length: int [], the number of frames that count (0 <= length <= T).
Returns:
  float []; -inf where no path ends in a final state after `length` frames.
"""


def _total_fwd(semiring, slots, slot_weight, final_weight, emissions, length):
    selective = semiring.argsum is not None
    alpha, saved, shifts = _forward(semiring, slots, slot_weight, emissions, length,
                                    with_choice=selective)
    ends = _ends(semiring, alpha, final_weight)
    total = semiring.sum(ends, axis=0) + jnp.sum(shifts)
    return total, (slots, slot_weight, final_weight, emissions, length, alpha, saved)


def _total_bwd(semiring, residuals, cotangent):
    # | total | gradients                                                    |
    # | -inf  | exactly 0: every frame's normaliser is -inf, and sum_grad    |
    # |       | gives 0 there; TROPICAL traces no path                        |
    # | +inf  | a +inf weight or emission: NaN (LOG) or a path through it;   |
    # |       | the +inf total stays visible either way                       |
    slots, slot_weight, final_weight, emissions, length, alpha, saved = residuals
    if semiring.argsum is not None:
        grads = _best_path_grads(semiring, slots, slot_weight, final_weight, emissions,
                                 length, alpha, saved)
    else:
        grads = _posterior_grads(semiring, slots, slot_weight, final_weight, emissions,
                                 length, alpha, saved)
    slot_grad, final_grad, emission_grad = (g * cotangent for g in grads)
    return None, slot_grad, final_grad, emission_grad, None


dense_total.defvjp(_total_fwd, _total_bwd)


def _scatter_columns(label: jax.Array, mass: jax.Array, num_columns: int) -> jax.Array:
    """Sums `mass` [S, K] into [V] by emission column `label` [S, K] or [S, 1]."""
    if label.shape[1] == 1 and mass.shape[1] != 1:
        mass = jnp.sum(mass, axis=1, keepdims=True)
    return jnp.zeros(num_columns, mass.dtype).at[label.reshape(-1)].add(mass.reshape(-1))


def _posterior_grads(semiring, slots, slot_weight, final_weight, emissions, length,
                     alpha_end, alphas):
    """LOG: per-frame slot posteriors, from normalised α and β."""
    num_states, num_slots = slot_weight.shape
    num_columns = emissions.shape[1]
    ends = _ends(semiring, alpha_end, final_weight)
    final_grad = semiring.sum_grad(ends, semiring.sum(ends, axis=0), axis=0)
    beta = final_weight - _shift(final_weight)
    no_slot = jnp.full((1,), semiring.zero, slot_weight.dtype)

    def step(carry, inputs):
        beta, slot_grad = carry  # β after frame t (normalised), [S, K] so far
        t, frame, alpha = inputs  # α before frame t (normalised)
        to_dst = slot_weight + frame[slots.label] + beta[:, None]  # [S, K]
        terms = (alpha[slots.src] + to_dst).reshape(-1)
        # Each frame's posteriors sum to one: normalise by this frame's own
        # total rather than by exp(α + β - Z) from unnormalised scores.
        posterior = semiring.sum_grad(terms, semiring.sum(terms, axis=0), axis=0)
        active = t < length
        posterior = jnp.where(active, posterior, 0).reshape(num_states, num_slots)
        leaving = jnp.concatenate([to_dst.reshape(-1), no_slot])[slots.leaving]
        new_beta = semiring.sum(leaving, axis=1)
        new_beta = jnp.where(active, new_beta - _shift(new_beta), beta)
        emission_grad = _scatter_columns(slots.label, posterior, num_columns)
        return (new_beta, slot_grad + posterior), emission_grad

    frames = jnp.arange(emissions.shape[0])
    (_, slot_grad), emission_grad = jax.lax.scan(
        step, (beta, jnp.zeros_like(slot_weight)), (frames, emissions, alphas), reverse=True)
    return slot_grad, final_grad, emission_grad


def best_frames(semiring: Semiring, slots: Slots, final_weight: jax.Array,
                alpha_end: jax.Array, choices: jax.Array, length: jax.Array):
    """TROPICAL trace-back of the best path.

    Tie rule: the lowest-numbered best final state, then at each frame the
    lowest-numbered best slot (slots are in arc-index order).

    Args:
      choices: int32 [T, S], the best slot of each state at each frame.
    Returns:
      `(flat_slots, columns, found)`: int32 [T], the flat slot index
      `s * K + k` taken at each frame (S * K past `length` or when no path
      is found); int32 [T], its emission column (-1 there); bool [].
      Also the final state, int32 [].
    """
    num_states, num_slots = slots.src.shape
    ends = _ends(semiring, alpha_end, final_weight)
    best = semiring.sum(ends, axis=0)
    found = best > semiring.zero
    last = semiring.argsum(ends, best, axis=0)

    def step(state, inputs):
        t, choice = inputs
        active = (t < length) & found
        slot = jnp.minimum(choice[state], num_slots - 1)
        column = slots.label[state, jnp.minimum(slot, slots.label.shape[1] - 1)]
        previous = slots.src[state, slot]
        flat = jnp.where(active, state * num_slots + slot, num_states * num_slots)
        return jnp.where(active, previous, state), (flat, jnp.where(active, column, -1))

    frames = jnp.arange(choices.shape[0])
    _, (flat_slots, columns) = jax.lax.scan(step, last, (frames, choices), reverse=True)
    return flat_slots, columns, found, last


def _best_path_grads(semiring, slots, slot_weight, final_weight, emissions, length,
                     alpha_end, saved):
    """TROPICAL: the indicator of the traced-back best path."""
    choices = saved
    flat_slots, columns, found, last = best_frames(semiring, slots, final_weight, alpha_end,
                                                   choices, length)
    dtype = slot_weight.dtype
    num_frames, num_columns = emissions.shape
    slot_grad = jnp.zeros(slot_weight.size + 1, dtype).at[flat_slots].add(1)
    slot_grad = slot_grad[:-1].reshape(slot_weight.shape)
    emission_grad = jnp.zeros((num_frames, num_columns), dtype).at[
        jnp.arange(num_frames), jnp.where(columns < 0, num_columns, columns)].set(
            1, mode="drop")
    final_grad = jnp.zeros_like(final_weight).at[last].set(found.astype(dtype))
    return slot_grad, final_grad, emission_grad


def forward_with_choices(semiring: Semiring, slots: Slots, slot_weight: jax.Array,
                         emissions: jax.Array, length: jax.Array):
    """(α_length [S], choices [T, S], shifts [T]) for a trace-back."""
    alpha, choices, shifts = _forward(semiring, slots, slot_weight, emissions, length,
                                           with_choice=True)
    return alpha, choices, shifts


def total(semiring: Semiring, slots: Slots, slot_weight: jax.Array, final_weight: jax.Array,
          emissions: jax.Array, length: jax.Array) -> jax.Array:
    """`dense_total` for LOG and TROPICAL (custom gradients); plain autodiff
    through the unnormalised scan for any other semiring."""
    core = dense_total if _normalises(semiring) else _plain_total
    return core(semiring, slots, slot_weight, final_weight, emissions, length)
