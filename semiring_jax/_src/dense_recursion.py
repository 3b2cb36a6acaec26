"""The scan over frames behind dense intersection (one utterance; vmapped).

A graph enters as *slots*: for each state s, K incoming slots, each with a
source state `src[s, k]`, an emission column `label[s, k]` and a weight
`slot_weight[s, k]` (-inf on unused slots). One frame t maps forward scores
α_t [S] to

    α_{t+1}[s] = ⊕_k α_t[src[s, k]] ⊗ slot_weight[s, k] ⊗ emissions[t, label[s, k]].

Two shortcuts serve CTC-like graphs: `label` None means that all slots of a
state share one column and the caller passed emissions per state, [T, S]
(gathered once, outside the scan); `src` None means a *banded* graph, slot k
of state s coming from state s - k, so pulling and pushing scores are
shifts rather than gathers.

For LOG and TROPICAL (⊗ = +) each frame's scores are shifted so that their
maximum is 0 and the shifts are summed apart (the scaled forward-backward
algorithm): scores stay O(1) however long the utterance, so that float32
posteriors keep ~1e-6 accuracy at T = 5,000 (DESIGN.md, Precision).

Gradients: LOG posteriors are formed frame by frame in a reverse scan from
the saved normalised α and a normalised β, and reduced into [T, V] (or
[T, S]) and [S, K] as it goes, so no [T, S, K] array is held. TROPICAL
saves each state's best slot per frame and traces one path back.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from semiring_jax._src.semiring import Semiring

__all__ = ["Slots", "total", "dense_total", "best_frames", "forward_with_choices"]


class Slots(NamedTuple):
    """Integer tables of a graph's incoming slots (see the module docstring).

    Attributes:
      src: int32 [S, K], the source state of each slot (any state if
        unused); None for a banded graph (slot k of s comes from s - k).
      label: int32 [S, K], the emission column of each slot; None when the
        emissions are given per state, [T, S].
      leaving: int32 [S, Ko], flat indices into [S * K] of the slots whose
        source is each state, S * K where unused; None for a banded graph.
    """

    src: Optional[jax.Array]
    label: Optional[jax.Array]
    leaving: Optional[jax.Array]


def _shifted(values: jax.Array, offset: int, fill: float) -> jax.Array:
    """`values` [S] moved by `offset`: out[s] = values[s - offset], else fill."""
    if offset == 0:
        return values
    pad = jnp.full((abs(offset),), fill, values.dtype)
    if offset > 0:
        return jnp.concatenate([pad, values[:-offset]])
    return jnp.concatenate([values[-offset:], pad])


def _pull(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> jax.Array:
    """[S, K]: the score at each slot's source state."""
    if slots.src is None:
        return jnp.stack([_shifted(scores, k, fill) for k in range(num_slots)], axis=1)
    return scores[slots.src]


def _push(slot_scores: jax.Array, slots: Slots, fill: float) -> jax.Array:
    """[S, Ko]: for each state, the scores of the slots leaving it."""
    if slots.src is None:
        return jnp.stack([_shifted(slot_scores[:, k], -k, fill)
                          for k in range(slot_scores.shape[1])], axis=1)
    flat = jnp.concatenate([slot_scores.reshape(-1), jnp.full((1,), fill, slot_scores.dtype)])
    return flat[slots.leaving]


def _frame_scores(frame: jax.Array, label: Optional[jax.Array]) -> jax.Array:
    """This frame's emission per slot, [S, K], or per state, [S, 1]."""
    return frame[:, None] if label is None else frame[label]


def _shift(scores: jax.Array) -> jax.Array:
    """The max of `scores` [S], or 0 when none is finite."""
    top = jnp.max(scores, initial=-jnp.inf)
    return jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))


def _normalises(semiring: Semiring) -> bool:
    # sum_grad / argsum are only given for semirings with ⊗ = + (semiring.py),
    # and for those ⊕ commutes with a common shift.
    return semiring.sum_grad is not None or semiring.argsum is not None


def _varying_like(reference: jax.Array, values: jax.Array) -> jax.Array:
    """`values`, typed as varying wherever `reference` varies (inside
    `jax.shard_map`, a scan's carry must keep one type: a constant initial
    carry that meets per-device data in the body would change it)."""
    return values + jax.lax.full_like(reference, 0, values.dtype, shape=values.shape)


def _start(semiring: Semiring, num_states: int, dtype, reference: jax.Array) -> jax.Array:
    """α before the first frame: one at the start state, zero elsewhere."""
    start = jnp.full(num_states, semiring.zero, dtype).at[0].set(semiring.one)
    return _varying_like(reference, start)


def _forward(semiring: Semiring, slots: Slots, slot_weight: jax.Array,
             emissions: jax.Array, length: jax.Array, *, with_choice: bool = False):
    """Forward scan: (α after `length` frames [S], saves [T, S], shifts [T]).

    The saves are, per frame, α after it (normalised), or with
    `with_choice` the best slot of each state.
    """
    num_states, num_slots = slot_weight.shape
    normalise = _normalises(semiring)
    dtype = slot_weight.dtype

    def step(alpha, inputs):
        t, frame = inputs  # frame: [V] or [S]
        terms = semiring.times(
            semiring.times(_pull(alpha, slots, num_slots, semiring.zero), slot_weight),
            _frame_scores(frame, slots.label))  # [S, K]
        new = semiring.sum(terms, axis=1)  # [S]
        shift = _shift(new) if normalise else jnp.zeros((), dtype)
        active = t < length
        new_alpha = jnp.where(active, new - shift if normalise else new, alpha)
        saved = semiring.argsum(terms, new, axis=1) if with_choice else new_alpha
        return new_alpha, (saved, jnp.where(active, shift, 0).astype(dtype))

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    alpha, (saved, shifts) = jax.lax.scan(
        step, _start(semiring, num_states, dtype, emissions), (frames, emissions))
    return alpha, saved, shifts


def _ends(semiring: Semiring, alpha: jax.Array, final_weight: jax.Array) -> jax.Array:
    return semiring.times(alpha, final_weight)


def _plain_total(semiring, slot_grads, slots, slot_weight, final_weight, emissions, length):
    alpha, _, shifts = _forward(semiring, slots, slot_weight, emissions, length)
    total = semiring.sum(_ends(semiring, alpha, final_weight), axis=0)
    return total + jnp.sum(shifts) if _normalises(semiring) else total


dense_total = jax.custom_vjp(_plain_total, nondiff_argnums=(0, 1))


def _total_fwd(semiring, slot_grads, slots, slot_weight, final_weight, emissions, length):
    selective = semiring.argsum is not None
    alpha, saved, shifts = _forward(semiring, slots, slot_weight, emissions, length,
                                    with_choice=selective)
    ends = _ends(semiring, alpha, final_weight)
    total = semiring.sum(ends, axis=0) + jnp.sum(shifts)
    return total, (slots, slot_weight, final_weight, emissions, length, alpha, saved)


def _total_bwd(semiring, slot_grads, residuals, cotangent):
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
        grads = _posterior_grads(semiring, slot_grads, slots, slot_weight, final_weight,
                                 emissions, length, alpha, saved)
    slot_grad, final_grad, emission_grad = (g * cotangent for g in grads)
    return None, slot_grad, final_grad, emission_grad, None


dense_total.defvjp(_total_fwd, _total_bwd)


def _scatter_columns(label: Optional[jax.Array], mass: jax.Array,
                     num_columns: int) -> jax.Array:
    """Sums `mass` [S, K] into [V] by emission column `label` [S, K], or
    into [S] when the emissions are per state (label None)."""
    if label is None:
        return jnp.sum(mass, axis=1)
    return jnp.zeros(num_columns, mass.dtype).at[label.reshape(-1)].add(mass.reshape(-1))


def _posterior_grads(semiring, slot_grads, slots, slot_weight, final_weight, emissions,
                     length, alpha_end, alphas_after):
    """LOG: per-frame posteriors, from normalised α and β.

    Each frame's posteriors sum to one, so they are normalised by that
    frame's own total rather than formed as exp(α + β - Z) from large
    unnormalised scores.
    """
    num_states, num_slots = slot_weight.shape
    num_columns = emissions.shape[1]
    zero = semiring.zero
    ends = _ends(semiring, alpha_end, final_weight)
    final_grad = semiring.sum_grad(ends, semiring.sum(ends, axis=0), axis=0)
    # Per-state emissions and no slot gradient: the state occupancies
    # softmax(α after t + β after t) are the emission gradient, [S] per
    # frame; otherwise the slot posteriors are needed, from α before t.
    by_state = slots.label is None and not slot_grads
    alphas_before = jnp.concatenate(
        [_start(semiring, num_states, slot_weight.dtype, emissions)[None], alphas_after[:-1]])
    alphas = alphas_after if by_state else alphas_before

    def step(carry, inputs):
        beta, slot_grad = carry  # β after frame t (normalised), [S, K] so far
        t, frame, alpha = inputs
        active = t < length
        to_dst = slot_weight + _frame_scores(frame, slots.label) + beta[:, None]  # [S, K]
        if by_state:
            terms = alpha + beta
            posterior = semiring.sum_grad(terms, semiring.sum(terms, axis=0), axis=0)
            emission_grad = jnp.where(active, posterior, 0)
        else:
            terms = (_pull(alpha, slots, num_slots, zero) + to_dst).reshape(-1)
            posterior = semiring.sum_grad(terms, semiring.sum(terms, axis=0), axis=0)
            posterior = jnp.where(active, posterior, 0).reshape(num_states, num_slots)
            slot_grad = slot_grad + posterior
            emission_grad = _scatter_columns(slots.label, posterior, num_columns)
        new_beta = semiring.sum(_push(to_dst, slots, zero), axis=1)
        new_beta = jnp.where(active, new_beta - _shift(new_beta), beta)
        return (new_beta, slot_grad), emission_grad

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    beta = _varying_like(emissions, final_weight - _shift(final_weight))
    slot_grad = _varying_like(emissions, jnp.zeros_like(slot_weight))
    (_, slot_grad), emission_grad = jax.lax.scan(
        step, (beta, slot_grad), (frames, emissions, alphas), reverse=True)
    return slot_grad, final_grad, emission_grad


def best_frames(semiring: Semiring, slots: Slots, num_slots: int, final_weight: jax.Array,
                alpha_end: jax.Array, choices: jax.Array, length: jax.Array):
    """TROPICAL trace-back of the best path.

    Tie rule: the lowest-numbered best final state, then at each frame the
    lowest-numbered best slot (slots are in arc-index order).

    Args:
      num_slots: K.
      choices: int32 [T, S], the best slot of each state at each frame.
    Returns:
      `(flat_slots, columns, found, last)`: int32 [T], the flat slot index
      `s * K + k` taken at each frame (S * K past `length` or when no path
      is found); int32 [T], its emission column, or its state when the
      emissions are per state (-1 there); bool [], whether a path exists;
      int32 [], the final state it ends in.
    """
    num_states = choices.shape[1]
    ends = _ends(semiring, alpha_end, final_weight)
    best = semiring.sum(ends, axis=0)
    found = best > semiring.zero
    last = semiring.argsum(ends, best, axis=0)

    def step(state, inputs):
        t, choice = inputs
        active = (t < length) & found
        slot = choice[state]
        column = state if slots.label is None else slots.label[state, slot]
        previous = state - slot if slots.src is None else slots.src[state, slot]
        flat = jnp.where(active, state * num_slots + slot, num_states * num_slots)
        return jnp.where(active, previous, state), (flat, jnp.where(active, column, -1))

    frames = jnp.arange(choices.shape[0], dtype=jnp.int32)
    last = _varying_like(choices, last)
    _, (flat_slots, columns) = jax.lax.scan(step, last, (frames, choices), reverse=True)
    return flat_slots, columns, found, last


def _best_path_grads(semiring, slots, slot_weight, final_weight, emissions, length,
                     alpha_end, choices):
    """TROPICAL: the indicator of the traced-back best path."""
    flat_slots, columns, found, last = best_frames(
        semiring, slots, slot_weight.shape[1], final_weight, alpha_end, choices, length)
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
          emissions: jax.Array, length: jax.Array, *, slot_grads: bool = True) -> jax.Array:
    """⊕ over paths of exactly `length` frames, one utterance.

    Custom gradients for LOG and TROPICAL; plain autodiff through the
    unnormalised scan for any other semiring.

    Args:
      semiring: the semiring.
      slots: `Slots` of the graph.
      slot_weight: float [S, K], -inf on unused slots.
      final_weight: float [S].
      emissions: float [T, V], or [T, S] when `slots.label` is None.
      length: int [], the number of frames that count (0 <= length <= T).
      slot_grads: False when `slot_weight` needs no gradient (it then
        gets zeros), which saves work in the LOG backward pass.
    Returns:
      float []; -inf where no path ends in a final state after `length` frames.
    """
    core = dense_total if _normalises(semiring) else _plain_total
    return core(semiring, slot_grads, slots, slot_weight, final_weight, emissions, length)
