"""`remove_epsilon`: an equivalent FSA without epsilon arcs (label 0 both sides).

The structure comes from `host/epsilon.py`; the epsilon-closure weights
d(p, q) are the forward scores of its pair graph (`tot_score`'s level
scan), so the result's weights are JAX expressions of the input's, under
`jax.grad` and `jax.jit` alike.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from semiring_jax._src.algorithms import check_operands, parts_of, placeholder, trimmed_fsa
from semiring_jax._src.batch import stack, unstack
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.host import epsilon
from semiring_jax._src.semiring import LOG, Semiring
from semiring_jax._src.tot_score import forward_scores

__all__ = ["remove_epsilon"]


def remove_epsilon(fsa: Fsa, semiring: Semiring = LOG) -> Fsa:
    """An equivalent FSA without epsilon arcs (label 0 on both sides).

    Each state p takes over the non-epsilon arcs and the final weights of the
    states q it reaches by epsilon arcs alone, weighted by d(p, q), the ⊕
    over those epsilon paths (LOG: log-sum; TROPICAL: the best). The result
    is trimmed to states on a successful path (start kept), numbered as in
    the input. Its total score equals the input's in `semiring`.

    Args:
      fsa: an Fsa (cyclic allowed, but its epsilon arcs must not form a
        cycle), single or batched; structure concrete, weights may be traced.
      semiring: LOG (default) or TROPICAL: how parallel epsilon paths add up.
    Returns:
      An epsilon-free Fsa of the same kind.
    Raises:
      ValueError: if the epsilon arcs form a cycle (naming a state on it).
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 0, 0.5), (1, 2, 7, 0.25)], final=[2])
      >>> out = sj.remove_epsilon(fsa)
      >>> print(out.label, out.weight)
      [7] [0.75]
    """
    check_operands([fsa], "remove_epsilon")
    if fsa.batch_shape:
        return stack([remove_epsilon(entry, semiring) for entry in unstack(fsa)])
    parts = parts_of(fsa, "remove_epsilon")
    tables, cycle = epsilon.epsilon_removal(parts)
    if cycle:
        path = " -> ".join(str(state) for state in cycle)
        raise ValueError(
            f"remove_epsilon: state {cycle[0]} lies on a cycle of epsilon arcs "
            f"({path}); its closure would be an infinite sum"
        )
    assert tables is not None  # no cycle
    dtype = fsa.dtype
    real = np.flatnonzero(np.asarray(fsa.arc_mask))
    weight = jnp.asarray(fsa.weight)[real]
    # Epsilon-closure weights d(p, q): forward scores of the pair graph.
    pair_weight = jnp.append(weight, jnp.asarray(semiring.one, dtype))[tables.pair_arc]
    zeros = np.zeros(len(tables.pair_src), np.int64)
    # Only the level scan reads this graph: no dense per-state arc tables.
    pair_graph = placeholder(
        tables.num_tree + tables.num_pairs,
        tables.pair_src,
        tables.pair_dst,
        zeros,
        zeros,
        dtype,
        True,
        dense_tables=False,
        known_levels=tables.pair_level,
    ).replace(weight=pair_weight)
    closure = forward_scores(pair_graph, semiring)[tables.num_tree :]  # [P]
    closure = jnp.append(closure, jnp.asarray(semiring.zero, dtype))  # pair P: none
    arc_weight = semiring.times(closure[tables.arc_pair], weight[tables.arc_input])
    final_weight = semiring.sum(
        semiring.times(
            closure[tables.final_pairs], jnp.asarray(fsa.final_weight)[tables.final_states]
        ),
        axis=1,
    )
    # Trim, as OpenFst's RmEpsilon does: states only reached through removed
    # epsilons, or that reach no final state, go.
    is_final = tables.final_pairs[:, 0] < tables.num_pairs
    return trimmed_fsa(
        parts.num_states,
        tables.src,
        tables.dst,
        tables.ilabel,
        tables.olabel,
        is_final,
        arc_weight,
        final_weight,
        fsa.is_acceptor,
    )
