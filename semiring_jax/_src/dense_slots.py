"""Slot tables of a graph for the dense scan, and the moves along them.

See `dense_recursion.py` for what the slots are. `pull` gathers, for every
slot, the score at its source state; `push` gathers, for every state, the
scores of the slots leaving it. A banded graph (src None) does both with
shifts, a general one with gathers.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

__all__ = ["Slots", "pull", "push", "frame_scores", "max_or_zero", "varying_like"]


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


def pull(scores: jax.Array, slots: Slots, num_slots: int, fill: float) -> jax.Array:
    """[S, K]: the score at each slot's source state."""
    if slots.src is None:
        return jnp.stack([_shifted(scores, k, fill) for k in range(num_slots)], axis=1)
    return scores[slots.src]


def push(slot_scores: jax.Array, slots: Slots, fill: float) -> jax.Array:
    """[S, Ko]: for each state, the scores of the slots leaving it."""
    if slots.src is None:
        return jnp.stack([_shifted(slot_scores[:, k], -k, fill)
                          for k in range(slot_scores.shape[1])], axis=1)
    flat = jnp.concatenate([slot_scores.reshape(-1), jnp.full((1,), fill, slot_scores.dtype)])
    return flat[slots.leaving]


def frame_scores(frame: jax.Array, label: Optional[jax.Array]) -> jax.Array:
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
