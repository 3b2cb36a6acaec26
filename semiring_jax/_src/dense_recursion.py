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

LOG runs in `dense_log.py` on compensated (hi, lo) scores. The scan here
serves TROPICAL, whose scores are shifted per frame so that their maximum
is 0 (the shifts summed apart), and any user semiring (unshifted).

Gradients (`derivatives.score`, a custom JVP whose tangent is ⟨gradient,
tangent⟩): LOG's come from `dense_log.py`, which forms posteriors frame by
frame in a reverse scan and reduces them into [T, V] (or [T, S]) and
[S, K] as it goes, so no [T, S, K] array is held. TROPICAL saves each
state's best slot per frame and traces one path back. Other semirings are
differentiated by autodiff through the plain scan.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from semiring_jax._src import dense_log, derivatives
from semiring_jax._src.dense_slots import Slots, frame_scores, max_or_zero, pull, varying_like
from semiring_jax._src.semiring import LOG, Semiring

__all__ = ["Slots", "best_frames", "forward_with_choices", "total"]


def _normalises(semiring: Semiring) -> bool:
    # sum_grad / argsum are only given for semirings with ⊗ = + (semiring.py),
    # and for those ⊕ commutes with a common shift.
    return semiring.sum_grad is not None or semiring.argsum is not None


def _start(
    semiring: Semiring, num_states: int, dtype: DTypeLike, reference: jax.Array
) -> jax.Array:
    """α before the first frame: one at the start state, zero elsewhere."""
    start = jnp.full(num_states, semiring.zero, dtype).at[0].set(semiring.one)
    return varying_like(reference, start)


def _forward(
    semiring: Semiring,
    slots: Slots,
    slot_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    *,
    with_choice: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Forward scan: (α after `length` frames [S], saves [T, S], shifts [T]).

    The saves are, per frame, α after it (normalised), or with
    `with_choice` the best slot of each state.
    """
    num_states, num_slots = slot_weight.shape
    normalise = _normalises(semiring)
    dtype = slot_weight.dtype
    argsum = semiring.argsum
    if with_choice:
        assert argsum is not None  # with_choice is for selective semirings

    def step(
        alpha: jax.Array, inputs: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        t, frame = inputs  # frame: [V] or [S]
        terms = semiring.times(
            semiring.times(pull(alpha, slots, num_slots, semiring.zero), slot_weight),
            frame_scores(frame, slots.label),
        )  # [S, K]
        new = semiring.sum(terms, axis=1)  # [S]
        shift = max_or_zero(new) if normalise else jnp.zeros((), dtype)
        active = t < length
        new_alpha = jnp.where(active, new - shift if normalise else new, alpha)
        saved = argsum(terms, new, axis=1) if argsum is not None and with_choice else new_alpha
        return new_alpha, (saved, jnp.where(active, shift, 0).astype(dtype))

    frames = jnp.arange(emissions.shape[0], dtype=jnp.int32)
    alpha, (saved, shifts) = jax.lax.scan(
        step, _start(semiring, num_states, dtype, emissions), (frames, emissions)
    )
    return alpha, saved, shifts


def _ends(semiring: Semiring, alpha: jax.Array, final_weight: jax.Array) -> jax.Array:
    return semiring.times(alpha, final_weight)


def _is_log(semiring: Semiring) -> bool:
    # The compensated scan of dense_log.py computes log-sum-exp itself, so
    # it stands in for LOG's ⊕ only.
    return semiring.sum is LOG.sum


def _plain_total(
    semiring: Semiring,
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
) -> jax.Array:
    if _is_log(semiring):
        alpha_pair, _ = dense_log.forward(slots, slot_weight, emissions, length)
        total_hi, total_lo = dense_log.total_pair(alpha_pair, final_weight)
        return total_hi + total_lo
    alpha, _, shifts = _forward(semiring, slots, slot_weight, emissions, length)
    total = semiring.sum(_ends(semiring, alpha, final_weight), axis=0)
    return total + jnp.sum(shifts) if _normalises(semiring) else total


# diff = (slot_weight [S, K], final_weight [S], emissions [T, V] or [T, S]);
# aux = (slots, length).
Diff = tuple[jax.Array, jax.Array, jax.Array]
Aux = tuple[Slots, jax.Array]


def _value_and_grads(
    semiring: Semiring, slot_grads: bool, diff: Diff, aux: Aux
) -> tuple[jax.Array, Diff]:
    """(total [], (slot, final, emission) gradients) of LOG (posteriors) or
    a selective semiring (the best path's indicator).

    | total | gradients                                                |
    | -inf  | exactly 0: LOG posteriors exp(α + β - Z) are 0 where Z is |
    |       | -inf, and TROPICAL traces no path                         |
    | +inf  | LOG: NaN; TROPICAL: a path through the +inf weight or    |
    |       | emission; the +inf total stays visible either way         |
    | NaN   | NaN (NaN in a weight or an emission that the scan reads)  |
    """
    (slot_weight, final_weight, emissions), (slots, length) = diff, aux
    if _is_log(semiring):
        pair, pairs = dense_log.forward(slots, slot_weight, emissions, length)
        total_hi, total_lo = dense_log.total_pair(pair, final_weight)
        total = total_hi + total_lo
        grads = dense_log.posterior_grads(
            slot_grads, slots, slot_weight, final_weight, emissions, length, pair, pairs
        )
    else:
        alpha, choices, shifts = _forward(
            semiring, slots, slot_weight, emissions, length, with_choice=True
        )
        total = semiring.sum(_ends(semiring, alpha, final_weight), axis=0) + jnp.sum(shifts)
        grads = _best_path_grads(
            semiring, slots, slot_weight, final_weight, emissions, length, alpha, choices
        )
    return total, derivatives.undefined_to_nan(total, grads, inf_undefined=_is_log(semiring))


@functools.cache
def _op(semiring: Semiring, slot_grads: bool) -> derivatives.ScoreOp:
    """The dense total and its gradient as a `derivatives.ScoreOp`; cached,
    so that traces share one static argument."""

    def value(diff: Diff, aux: Aux) -> jax.Array:
        return _plain_total(semiring, aux[0], *diff, aux[1])

    return derivatives.ScoreOp(value, functools.partial(_value_and_grads, semiring, slot_grads))


def best_frames(
    semiring: Semiring,
    slots: Slots,
    num_slots: int,
    final_weight: jax.Array,
    alpha_end: jax.Array,
    choices: jax.Array,
    length: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
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
    assert semiring.argsum is not None  # a trace-back needs a selective semiring
    last = semiring.argsum(ends, best, axis=0)

    def step(
        state: jax.Array, inputs: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        t, choice = inputs
        active = (t < length) & found
        slot = choice[state]
        column = state if slots.label is None else slots.label[state, slot]
        previous = state - slot if slots.src is None else slots.src[state, slot]
        flat = jnp.where(active, state * num_slots + slot, num_states * num_slots)
        return jnp.where(active, previous, state), (flat, jnp.where(active, column, -1))

    frames = jnp.arange(choices.shape[0], dtype=jnp.int32)
    last = varying_like(choices, last)
    _, (flat_slots, columns) = jax.lax.scan(step, last, (frames, choices), reverse=True)
    return flat_slots, columns, found, last


def _best_path_grads(
    semiring: Semiring,
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    alpha_end: jax.Array,
    choices: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """TROPICAL: the indicator of the traced-back best path."""
    flat_slots, columns, found, last = best_frames(
        semiring, slots, slot_weight.shape[1], final_weight, alpha_end, choices, length
    )
    dtype = slot_weight.dtype
    num_frames, num_columns = emissions.shape
    slot_grad = jnp.zeros(slot_weight.size + 1, dtype).at[flat_slots].add(1)
    slot_grad = slot_grad[:-1].reshape(slot_weight.shape)
    emission_grad = (
        jnp.zeros((num_frames, num_columns), dtype)
        .at[jnp.arange(num_frames), jnp.where(columns < 0, num_columns, columns)]
        .set(1, mode="drop")
    )
    final_grad = jnp.zeros_like(final_weight).at[last].set(found.astype(dtype))
    return slot_grad, final_grad, emission_grad


def forward_with_choices(
    semiring: Semiring,
    slots: Slots,
    slot_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(α_length [S], choices [T, S], shifts [T]) for a trace-back."""
    alpha, choices, shifts = _forward(
        semiring, slots, slot_weight, emissions, length, with_choice=True
    )
    return alpha, choices, shifts


def total(
    semiring: Semiring,
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
    *,
    slot_grads: bool = True,
) -> jax.Array:
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
    if not (_is_log(semiring) or semiring.argsum is not None):
        return _plain_total(semiring, slots, slot_weight, final_weight, emissions, length)
    # Inside jax.shard_map a graph shared by the batch is replicated while
    # the emissions vary per device; the custom JVP's rule mixes the two, so
    # the weights enter it as varying values, as the emissions are (and
    # autodiff of that conversion sums their gradients over devices).
    slot_weight = varying_like(emissions, slot_weight)
    final_weight = varying_like(emissions, final_weight)
    return derivatives.score(
        _op(semiring, slot_grads), (slot_weight, final_weight, emissions), (slots, length)
    )
