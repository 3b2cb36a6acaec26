"""`determinize`: a deterministic acceptor with the same weighted language.

The structure (weighted subsets, merged only where that holds for every
weight: singletons) comes from `host/determinize.py`; the arc weights and
residuals are computed here in JAX, depth by depth, so they differentiate
back to the input's weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.algorithms import check_operands, parts_of, trimmed_fsa
from semiring_jax._src.batch import stack, unstack
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.host import determinize as host_determinize
from semiring_jax._src.semiring import LOG, Semiring

__all__ = ["determinize"]


def _segment_plus(
    values: jax.Array, segments: np.ndarray, num_segments: int, semiring: Semiring
) -> jax.Array:
    """⊕ of `values` by segment; the semiring's zero (-inf) for an empty one."""
    top = jax.ops.segment_max(values, segments, num_segments)
    if semiring.argsum is not None:  # selective: ⊕ is the max
        return top
    top = jax.lax.stop_gradient(top)
    safe_top = jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
    total = jax.ops.segment_sum(jnp.exp(values - safe_top[segments]), segments, num_segments)
    nonempty = total > 0
    return jnp.where(nonempty, jnp.log(jnp.where(nonempty, total, 1)), -jnp.inf) + safe_top


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
      semiring: LOG (default) or TROPICAL.
      max_states: the budget of result states (and of 16 times as many
        subset members); a cyclic input whose cycles keep making new
        (non-singleton) subsets would never stop, and an acyclic one can
        make exponentially many, so the construction stops there with an
        error.
    Returns:
      A deterministic acceptor: no state has two arcs with one label.
    Raises:
      ValueError: for a transducer, another semiring, or more than
        `max_states` result states.
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
    if semiring.sum_grad is None:
        raise ValueError(f"determinize: supports LOG and TROPICAL, got {semiring!r}")
    if fsa.batch_shape:
        return stack(
            [determinize(entry, semiring, max_states=max_states) for entry in unstack(fsa)]
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
    dtype = fsa.dtype
    real = np.flatnonzero(np.asarray(fsa.arc_mask))
    weight = jnp.asarray(fsa.weight)[real]
    residuals = jnp.zeros(tables.num_residuals + 1, dtype)  # the last one is one
    arc_weights = []
    for depth in tables.depths:
        terms = residuals[depth.term_residual] + weight[depth.term_arc]
        values = _segment_plus(terms, depth.term_slot, depth.slot_transition.shape[0], semiring)
        total = _segment_plus(values, depth.slot_transition, depth.num_transitions, semiring)
        arc_weights.append(total)
        found = jnp.isfinite(total)[depth.slot_transition]
        shift = jnp.where(found, total[depth.slot_transition], 0)
        residual = jnp.where(found, values - shift, -jnp.inf)
        new = depth.slot_residual >= 0
        residuals = residuals.at[depth.slot_residual[new]].set(residual[new])
    arc_weight = jnp.concatenate(arc_weights) if arc_weights else jnp.zeros(0, dtype)
    final_terms = (
        residuals[tables.member_residual] + jnp.asarray(fsa.final_weight)[tables.member_input]
    )
    final_weight = _segment_plus(final_terms, tables.member_state, tables.num_states, semiring)
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
