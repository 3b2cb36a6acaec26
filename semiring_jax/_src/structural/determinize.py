"""`determinize`: a deterministic acceptor with the same weighted language.

The structure (weighted subsets, merged only where that holds for every
weight: singletons) comes from `structural/host/subsets.py`; the arc weights and
residuals are computed here depth by depth: in JAX, so they differentiate
back to the input's weights, or in numpy where the weights are concrete and
the semiring declares LOG's or TROPICAL's arithmetic (nothing to
differentiate, and no device round trip).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import LOG, Semiring
from semiring_jax._src.structural.arc_map import (
    check_operands,
    map_entries,
    parts_of,
    trimmed_fsa,
    weights_on_host,
)
from semiring_jax._src.structural.host import plus
from semiring_jax._src.structural.host import subsets as host_determinize

__all__ = ["determinize"]


def _segment_plus(
    values: jax.Array, segments: jax.Array, num_segments: int, semiring: Semiring
) -> jax.Array:
    """⊕ of `values` [N] by segment [num_segments]; the semiring's zero for
    an empty one. The semiring's own `segment_sum` where it has one."""
    if semiring.segment_sum is not None:
        return semiring.segment_sum(values, segments, num_segments)
    return _folded_segment_plus(values, segments, num_segments, semiring)


def _folded_segment_plus(
    values: jax.Array, segments: jax.Array, num_segments: int, semiring: Semiring
) -> jax.Array:
    """⊕ by segment from `semiring.plus` alone: a segmented scan over the
    values in segment order (O(N log N)); each segment's last running ⊕ is
    its total."""
    result = jnp.full(num_segments, semiring.zero, values.dtype)
    if values.shape[0] == 0:
        return result
    order = jnp.argsort(segments, stable=True)
    segments, values = segments[order], values[order]
    boundary = segments[1:] != segments[:-1]
    starts = jnp.concatenate([jnp.ones(1, bool), boundary])

    def fold(left: tuple[jax.Array, jax.Array], right: tuple[jax.Array, jax.Array]) -> Any:
        (left_start, left_value), (right_start, right_value) = left, right
        # A segment start discards what came before it (associative).
        merged = jnp.where(right_start, right_value, semiring.plus(left_value, right_value))
        return left_start | right_start, merged

    _, running = jax.lax.associative_scan(fold, (starts, values))
    ends = jnp.concatenate([boundary, jnp.ones(1, bool)])
    return result.at[jnp.where(ends, segments, num_segments)].set(running, mode="drop")


@functools.partial(jax.jit, static_argnames=("semiring", "sizes"))
def _weights(
    semiring: Semiring,
    sizes: tuple[Any, ...],
    weight: jax.Array,
    final_weight: jax.Array,
    depths: list[tuple[jax.Array, ...]],
    members: tuple[jax.Array, jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array]:
    """Arc weights [A'] and final weights [S'] of the result, depth by depth
    in one compiled program (the tables are arguments, their sizes static:
    one compile serves every call on the same structure's sizes)."""
    num_residuals, num_states, depth_sizes = sizes
    zero = jnp.asarray(semiring.zero, weight.dtype)
    residuals = jnp.full(num_residuals + 1, semiring.one, weight.dtype)  # the last one is one
    arc_weights = []
    for (term_residual, term_arc, term_slot, slot_transition, slot_residual), (
        num_slots,
        num_transitions,
    ) in zip(depths, depth_sizes):
        terms = semiring.times(residuals[term_residual], weight[term_arc])
        values = _segment_plus(terms, term_slot, num_slots, semiring)
        total = _segment_plus(values, slot_transition, num_transitions, semiring)
        arc_weights.append(total)
        # r = v ⊘ W, ⊘ being - (times_is_addition); zero where W is not finite.
        found = jnp.isfinite(total)[slot_transition]
        shift = jnp.where(found, total[slot_transition], 0)
        residual = jnp.where(found, values - shift, zero)
        # Singleton slots (-1) write past the end, where mode="drop" ignores them.
        residuals = residuals.at[
            jnp.where(slot_residual >= 0, slot_residual, num_residuals + 1)
        ].set(residual, mode="drop")
    arc_weight = jnp.concatenate(arc_weights) if arc_weights else jnp.zeros(0, weight.dtype)
    member_state, member_input, member_residual = members
    final_terms = semiring.times(residuals[member_residual], final_weight[member_input])
    return arc_weight, _segment_plus(final_terms, member_state, num_states, semiring)


def determinize(fsa: Fsa, semiring: Semiring = LOG, *, max_states: int = 100_000) -> Fsa:
    """A deterministic acceptor with the same weighted language.

    Weighted subset construction (LOG: each string's weight is the log-sum
    over its paths; TROPICAL: the best of them). No result structure may
    depend on weight values, so only subsets that are equal for every
    weight are merged: singletons. The result can therefore be larger than
    OpenFst's, never smaller; it accepts the same strings with the same
    weights. Label 0 is an ordinary label here (remove epsilons first if
    they mean epsilon). The result is trimmed to states on a successful path.

    Args:
      fsa: an acceptor, single or batched; structure concrete, weights may
        be traced.
      semiring: LOG (default), TROPICAL or any `Semiring` whose ⊗ is
        addition (`times_is_addition`; the residuals divide by ⊘ = -).
        Each subset's ⊕ is the semiring's `segment_sum`, or without one
        a fold of its `plus`.
      max_states: the budget of result states (and of 16 times as many
        subset members); a cyclic input whose cycles keep making new
        (non-singleton) subsets would never stop, and an acyclic one can
        make exponentially many, so the construction stops there with an
        error.
    Returns:
      A deterministic acceptor: no state has two arcs with one label.
    Raises:
      ValueError: for a transducer, a semiring whose ⊗ is not addition,
        or more than `max_states` result states.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 2, 5, 1.0), (1, 3, 6, 0.0),
      ...                         (2, 3, 6, 0.0)], final=[3])
      >>> out = sj.determinize(fsa)
      >>> out.num_arcs, round(float(sj.tot_score(out)), 4) == round(float(sj.tot_score(fsa)), 4)
      (2, True)
    """
    check_operands([fsa], "determinize")
    if not fsa.is_acceptor:
        raise ValueError("determinize: takes an acceptor; project the transducer first")
    if not semiring.times_is_addition:
        raise ValueError(
            f"determinize: needs a semiring whose ⊗ is addition (times_is_addition=True), "
            f"got {semiring!r}"
        )
    if fsa.batch_shape:
        return map_entries(
            lambda entry: determinize(entry, semiring, max_states=max_states),
            fsa,
            fn="determinize",
        )
    parts = parts_of(fsa, "determinize")
    try:
        tables = host_determinize.determinize(parts, max_states)
    except OverflowError:
        raise ValueError(
            f"determinize: more than max_states = {max_states} result states; only "
            f"singleton subsets are merged (weight-independent), so a cyclic input whose "
            f"cycles keep making new subsets would never stop"
        ) from None
    real = np.flatnonzero(np.asarray(fsa.arc_mask))
    weights: tuple[Any, Any]
    if weights_on_host(fsa, semiring):
        assert semiring.arithmetic is not None  # see `weights_on_host`
        weights = _host_weights(tables, fsa, real, semiring.arithmetic)
    else:
        weights = _traced_weights(tables, fsa, real, semiring)
    arc_weight, final_weight = weights
    return trimmed_fsa(
        tables.num_states,
        tables.src,
        tables.dst,
        tables.label,
        tables.label,
        tables.is_final,
        arc_weight,
        final_weight,
        True,
    )


def _traced_weights(
    tables: host_determinize.Determinized, fsa: Fsa, real: np.ndarray, semiring: Semiring
) -> tuple[jax.Array, jax.Array]:
    """The result's arc [A'] and final [S'] weights in JAX (`_weights`)."""
    depths = [
        (
            depth.term_residual.astype(np.int32),
            depth.term_arc.astype(np.int32),
            depth.term_slot.astype(np.int32),
            depth.slot_transition.astype(np.int32),
            depth.slot_residual.astype(np.int32),
        )
        for depth in tables.depths
    ]
    sizes = (
        tables.num_residuals,
        tables.num_states,
        tuple((d.slot_transition.shape[0], d.num_transitions) for d in tables.depths),
    )
    members = tuple(
        m.astype(np.int32)
        for m in (tables.member_state, tables.member_input, tables.member_residual)
    )
    return _weights(
        semiring,
        sizes,
        jnp.asarray(fsa.weight)[real],
        # Members that are not final stop with zero, whatever they store.
        jnp.where(fsa.final_mask, fsa.final_weight, semiring.zero),
        depths,
        members,
    )


def _host_weights(
    tables: host_determinize.Determinized, fsa: Fsa, real: np.ndarray, arithmetic: str
) -> tuple[np.ndarray, np.ndarray]:
    """`_traced_weights` in numpy (float64 within), for concrete weights in
    a semiring of LOG's or TROPICAL's `arithmetic` (zero -inf, one 0, ⊗ +)."""
    dtype = fsa.dtype
    weight = np.asarray(fsa.weight, np.float64)[real]
    residuals = np.zeros(tables.num_residuals + 1)  # the last one is one
    arc_weights = []
    for depth in tables.depths:
        terms = residuals[depth.term_residual] + weight[depth.term_arc]
        num_slots = depth.slot_transition.shape[0]
        values = plus.segment_plus(terms, depth.term_slot, num_slots, arithmetic)
        total = plus.segment_plus(values, depth.slot_transition, depth.num_transitions, arithmetic)
        arc_weights.append(total)
        found = np.isfinite(total)[depth.slot_transition]
        shift = np.where(found, total[depth.slot_transition], 0.0)
        kept = depth.slot_residual >= 0  # singleton slots (-1) keep no residual
        residual = np.where(found, values - shift, -np.inf)
        residuals[depth.slot_residual[kept]] = residual[kept]
    arc_weight = np.concatenate(arc_weights) if arc_weights else np.zeros(0)
    final = np.where(np.asarray(fsa.final_mask), np.asarray(fsa.final_weight, np.float64), -np.inf)
    final_terms = residuals[tables.member_residual] + final[tables.member_input]
    final_weight = plus.segment_plus(
        final_terms, tables.member_state, tables.num_states, arithmetic
    )
    return arc_weight.astype(dtype), final_weight.astype(dtype)
