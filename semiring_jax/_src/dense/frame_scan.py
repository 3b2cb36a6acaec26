"""The scan over frames behind dense intersection (one utterance; vmapped).

A graph enters as *slots*: its incoming arcs in rows of K slots, each slot
with a source state `src[r, k]`, an emission column `label[r, k]` and a
weight `slot_weight[r, k]` (the semiring's zero on unused slots). Row s < S
is state s's first row; a state with more than K incoming arcs has further
rows, which a tree of reductions combines (`core/host/dense_tables.py`,
`dense_slots.to_states`). One frame t maps forward scores α_t [S] to

    α_{t+1}[s] = ⊕ over the slots (r, k) of s's rows:
                 α_t[src[r, k]] ⊗ slot_weight[r, k] ⊗ emissions[t, label[r, k]],

so the tables grow with the arcs, not with S times the largest degree.
The backward pass reads the outgoing arcs, in rows of their own, through
each one's incoming slot (`Slots.leaving`).

Two shortcuts serve CTC-like graphs: `label` None means that all slots of a
state share one column and the caller passed emissions per state, [T, S]
(gathered once, outside the scan); `src` None means a *banded* graph, slot k
of state s coming from state s - k, so pulling and pushing scores are
shifts rather than gathers.

LOG runs in `log_frame_scan.py` on compensated (hi, lo) scores. The scan here
serves TROPICAL, whose scores are shifted per frame so that their maximum
is 0 (the shifts summed apart), and any user semiring (unshifted).

Gradients (`derivatives.score`, a custom JVP whose tangent is ⟨gradient,
tangent⟩): LOG's come from `log_frame_scan.py`, which forms posteriors frame by
frame in a reverse scan and reduces them into [T, V] (or [T, S]) and
[R, K] as it goes, so no [T, R, K] array is held; per-state emissions
without slot gradients (CTC) need only the states' occupancies, and get
them from one scan that runs α and β together (`state_posteriors`). TROPICAL saves each
state's best slot per frame ([T, S], a flat index into the [R, K] slots,
carried up the tree with its score) and traces one path back. Other
semirings are differentiated by autodiff through the plain scan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from semiring_jax._src.core import derivatives, records
from semiring_jax._src.core.semiring import Semiring
from semiring_jax._src.core.sharding import varying_like
from semiring_jax._src.dense import log_frame_scan
from semiring_jax._src.dense.slots import (
    Slots,
    frame_scores,
    max_or_zero,
    num_states,
    pull,
    to_states,
)

__all__ = ["Slots", "best_frames", "forward_with_choices", "total"]


def _normalises(semiring: Semiring) -> bool:
    # Where ⊗ is +, ⊕ commutes with a common shift (core/semiring.py), so each
    # frame's scores can be shifted to keep them near 0.
    return bool(semiring.times_is_addition)


def _start(semiring: Semiring, size: int, dtype: DTypeLike, reference: jax.Array) -> Any:
    """α before the first frame: one at the start state, zero elsewhere."""
    start = records.where(
        jnp.arange(size) == 0,
        records.full(semiring.one, (size,), dtype),
        records.full(semiring.zero, (size,), dtype),
    )
    return varying_like(start, reference)


def _sum_rows(semiring: Semiring, treedef: Any) -> Callable[[list[jax.Array]], list[jax.Array]]:
    """⊕ along axis 1 of a record's leaves (one leaf: a plain array), for
    `to_states`."""

    def reduce(leaves: list[jax.Array]) -> list[jax.Array]:
        total = semiring.sum(jax.tree_util.tree_unflatten(treedef, leaves), axis=1)
        return records.leaves_of(total)

    return reduce


def _states_of_rows(semiring: Semiring, slots: Slots, rows: Any) -> Any:
    """`to_states` of rows [R] of records (or plain scores)."""
    leaves, treedef = jax.tree_util.tree_flatten(rows)
    fills = records.leaves_of(semiring.zero)
    return jax.tree_util.tree_unflatten(
        treedef, to_states(leaves, slots.in_tree, fills, _sum_rows(semiring, treedef))
    )


def _best_rows(semiring: Semiring) -> Callable[[list[jax.Array]], list[jax.Array]]:
    """⊕ along axis 1 of (scores, their best slots), keeping the slot of
    the entry that ⊕ returns (`argsum`: the first best), for `to_states`."""
    argsum = semiring.argsum
    assert argsum is not None  # choices are for selective semirings

    def reduce(values: list[jax.Array]) -> list[jax.Array]:
        scores, choices = values
        best = semiring.sum(scores, axis=1)
        index = argsum(scores, best, axis=1)
        return [best, jnp.take_along_axis(choices, index[:, None], axis=1)[:, 0]]

    return reduce


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
    `with_choice` the best slot of each state: k for a banded graph, else
    the flat index r * K + k of the slot among the [R, K].
    """
    num_rows, num_slots = records.leaves_of(slot_weight)[0].shape[:2]
    size = num_states(slots, num_rows)
    normalise = _normalises(semiring)
    dtype = records.dtype_of(slot_weight)
    argsum = semiring.argsum
    if with_choice:
        assert argsum is not None  # with_choice is for selective semirings
    row_start = jnp.arange(num_rows, dtype=jnp.int32) * num_slots

    def step(
        alpha: jax.Array, inputs: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        t, frame = inputs  # frame: [V] or [S]
        pulled = jax.tree_util.tree_map(
            lambda leaf, fill: pull(leaf, slots, num_slots, fill), alpha, semiring.zero
        )
        framed = jax.tree_util.tree_map(lambda leaf: frame_scores(leaf, slots), frame)
        terms = semiring.times(semiring.times(pulled, slot_weight), framed)  # [R, K]
        rows = semiring.sum(terms, axis=1)  # [R]
        if argsum is not None and with_choice:
            best = argsum(terms, rows, axis=1)
            if slots.src is not None:
                best = row_start + best
            new, saved = to_states(
                [rows, best],
                slots.in_tree,
                (semiring.zero, num_rows * num_slots),
                _best_rows(semiring),
            )
        else:
            new = _states_of_rows(semiring, slots, rows)
        shift = max_or_zero(new) if normalise else jnp.zeros((), dtype)
        active = t < length
        new_alpha = records.where(active, new - shift if normalise else new, alpha)
        if not with_choice:
            saved = new_alpha
        return new_alpha, (saved, jnp.where(active, shift, 0).astype(dtype))

    reference = records.leaves_of(emissions)[0]
    frames = jnp.arange(reference.shape[0], dtype=jnp.int32)
    alpha, (saved, shifts) = jax.lax.scan(
        step, _start(semiring, size, dtype, reference), (frames, emissions)
    )
    return alpha, saved, shifts


def _ends(semiring: Semiring, alpha: jax.Array, final_weight: jax.Array) -> jax.Array:
    return semiring.times(alpha, final_weight)


def _is_log(semiring: Semiring) -> bool:
    # The compensated scan of log_frame_scan.py computes log-sum-exp itself, so
    # it stands in only for a semiring that declares LOG's arithmetic.
    return semiring.arithmetic == "log"


def _plain_total(
    semiring: Semiring,
    slots: Slots,
    slot_weight: jax.Array,
    final_weight: jax.Array,
    emissions: jax.Array,
    length: jax.Array,
) -> jax.Array:
    if _is_log(semiring):
        alpha_pair, _ = log_frame_scan.forward(slots, slot_weight, emissions, length)
        total_hi, total_lo = log_frame_scan.total_pair(alpha_pair, final_weight)
        return total_hi + total_lo
    alpha, _, shifts = _forward(semiring, slots, slot_weight, emissions, length)
    total = semiring.sum(_ends(semiring, alpha, final_weight), axis=0)
    return total + jnp.sum(shifts) if _normalises(semiring) else total


# diff = (slot_weight [R, K], final_weight [S], emissions [T, V] or [T, S]);
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
    if _is_log(semiring) and slots.label is None and not slot_grads:
        # α and β in one scan: the emission gradient is the states' occupancy.
        (total_hi, total_lo), final_grad, emission_grad = log_frame_scan.state_posteriors(
            slots, slot_weight, final_weight, emissions, length
        )
        total = total_hi + total_lo
        grads = (jnp.zeros_like(slot_weight), final_grad, emission_grad)
    elif _is_log(semiring):
        pair, pairs = log_frame_scan.forward(slots, slot_weight, emissions, length)
        total_hi, total_lo = log_frame_scan.total_pair(pair, final_weight)
        total = total_hi + total_lo
        grads = log_frame_scan.posterior_grads(
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
    slot_shape: tuple[int, ...],
    final_weight: jax.Array,
    alpha_end: jax.Array,
    choices: jax.Array,
    length: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """TROPICAL trace-back of the best path.

    Tie rule: the lowest-numbered best final state, then at each frame the
    lowest-numbered best slot (a state's slots are in arc-index order).

    Args:
      slot_shape: (R, K) of the slots.
      choices: int32 [T, S], the best slot of each state at each frame (as
        `_forward` saves them: k if banded, else a flat index).
    Returns:
      `(flat_slots, columns, found, last)`: int32 [T], the flat slot index
      `r * K + k` taken at each frame (R * K past `length` or when no path
      is found); int32 [T], its emission column, or its state when the
      emissions are per state (-1 there); bool [], whether a path exists;
      int32 [], the final state it ends in.
    """
    num_rows, num_slots = slot_shape
    no_slot = num_rows * num_slots
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
        if slots.src is None:  # banded: slot k of s comes from s - k
            flat, previous = state * num_slots + slot, state - slot
        else:  # `slot` is flat; an unused one (no path) reads the last
            flat, previous = slot, slots.src.reshape(-1).at[slot].get(mode="clip")
        column = state if slots.label is None else slots.label.reshape(-1).at[flat].get(mode="clip")
        flat = jnp.where(active, flat, no_slot)
        return jnp.where(active, previous, state), (flat, jnp.where(active, column, -1))

    frames = jnp.arange(choices.shape[0], dtype=jnp.int32)
    last = varying_like(last, choices)
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
        semiring, slots, slot_weight.shape, final_weight, alpha_end, choices, length
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
      slot_weight: float [R, K], the semiring's zero on unused slots.
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
    slot_weight = varying_like(slot_weight, emissions)
    final_weight = varying_like(final_weight, emissions)
    return derivatives.score(
        _op(semiring, slot_grads), (slot_weight, final_weight, emissions), (slots, length)
    )
