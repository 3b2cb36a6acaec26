"""Slot tables of a graph for the dense scan, and the moves along them.

See `dense_recursion.py` for what the slots are. `pull` gathers, for every
slot, the score at its source state; `push` gathers, for every state, the
scores of the slots leaving it. A banded graph (src None) does both with
shifts, a general one with gathers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "COLUMNS_UP_TO",
    "Slots",
    "by_columns",
    "frame_columns",
    "frame_scores",
    "max_or_zero",
    "pull",
    "pull_columns",
    "push",
    "push_columns",
    "push_destinations",
    "varying_like",
]


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

    src: jax.Array | None
    label: jax.Array | None
    leaving: jax.Array | None


def _shifted(values: jax.Array, offset: int, fill: float) -> jax.Array:
    """`values` [S] moved by `offset`: out[s] = values[s - offset], else fill."""
    if offset == 0:
        return values
    size = values.shape[0]
    pad = jnp.full((abs(offset),), fill, values.dtype)
    if offset > 0:
        return jnp.concatenate([pad, values])[:size]
    return jnp.concatenate([values, pad])[-offset:]


def pull(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> jax.Array:
    """[S, K]: the score at each slot's source state."""
    if slots.src is None:
        return jnp.stack([_shifted(scores, k, fill) for k in range(num_slots)], axis=1)
    return scores[slots.src]


def push(slot_scores: jax.Array, slots: Slots, fill: float) -> jax.Array:
    """[S, Ko]: for each state, the scores of the slots leaving it."""
    if slots.src is None:
        return jnp.stack(
            [_shifted(slot_scores[:, k], -k, fill) for k in range(slot_scores.shape[1])], axis=1
        )
    flat = jnp.concatenate([slot_scores.reshape(-1), jnp.full((1,), fill, slot_scores.dtype)])
    return flat[slots.leaving]


# Up to this many slots, per-slot work is written column by column: the
# elementwise ops fuse into one kernel per step, where [S, K] arrays and
# reductions over K would not. Wider graphs keep [S, K] arrays: their steps
# are big enough that one reduction beats K unrolled columns.
COLUMNS_UP_TO = 8

Slotwise = list[jax.Array] | jax.Array  # K columns [S], or one [S, K] array


def by_columns(slots: Slots, num_slots: int) -> bool:
    """Whether per-slot values are handled as a list of columns."""
    return slots.src is None or num_slots <= COLUMNS_UP_TO


def _split(values: jax.Array, slots: Slots) -> Slotwise:
    if by_columns(slots, values.shape[1]):
        return [values[:, k] for k in range(values.shape[1])]
    return values


def pull_columns(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> Slotwise:
    """`pull`, as columns (see COLUMNS_UP_TO)."""
    if slots.src is None:
        return [_shifted(scores, k, fill) for k in range(num_slots)]
    return _split(scores[slots.src], slots)


def push_columns(slot_values: jax.Array, slots: Slots, fill: float) -> Slotwise:
    """`push` of slot values [S, K], as columns (see COLUMNS_UP_TO)."""
    if slots.src is None:
        return [_shifted(slot_values[:, k], -k, fill) for k in range(slot_values.shape[1])]
    return _split(push(slot_values, slots, fill), slots)


def push_destinations(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> Slotwise:
    """For each state and each slot leaving it, the score [S] at the slot's
    own state (its destination), as Ko columns. Shifting or gathering the
    [S] scores themselves, not an expression of them, keeps XLA from
    recomputing that expression once per column."""
    if slots.src is None:
        return [_shifted(scores, -k, fill) for k in range(num_slots)]
    num_states = scores.shape[0]
    assert slots.leaving is not None  # only a banded graph (src None) has none
    destination = jnp.where(
        slots.leaving < num_states * num_slots, slots.leaving // num_slots, num_states
    )
    return _split(jnp.append(scores, jnp.full((1,), fill, scores.dtype))[destination], slots)


def frame_columns(frame: jax.Array, slots: Slots, num_slots: int) -> Slotwise:
    """This frame's emission per slot, as columns (see COLUMNS_UP_TO)."""
    if slots.label is None:
        return [frame] * num_slots if by_columns(slots, num_slots) else frame[:, None]
    return _split(frame[slots.label], slots)


def frame_scores(frame: jax.Array, label: jax.Array | None) -> jax.Array:
    """This frame's emission per slot, [S, K], or per state, [S, 1]."""
    return frame[:, None] if label is None else frame[label]


def max_or_zero(scores: jax.Array) -> jax.Array:
    """The max of `scores` [S], or 0 when none is finite."""
    top = jnp.max(scores, initial=-jnp.inf)
    return jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))


def varying_like(reference: jax.Array, values: jax.Array) -> jax.Array:
    """`values`, typed as varying wherever `reference` varies (inside
    `jax.shard_map`, a scan's carry must keep one type: a constant initial
    carry that meets per-device data in the body would change it)."""
    return values + jax.lax.full_like(reference, 0, values.dtype, shape=values.shape)
