"""`remove_epsilon`: an equivalent FSA without epsilon arcs (label 0 both sides).

The structure comes from `host/epsilon_closure.py`; the epsilon-closure weights
d(p, q) are the forward scores of its pair graph (`tot_score`'s level
scan), so the result's weights are JAX expressions of the input's, under
`jax.grad` and `jax.jit` alike.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import LOG, Semiring, check_float_semiring
from semiring_jax._src.scores.tot_score import forward_scores
from semiring_jax._src.structural.arc_map import (
    check_operands,
    map_entries,
    parts_of,
    placeholder,
    trimmed_fsa,
    weights_on_host,
)
from semiring_jax._src.structural.host import epsilon_closure, plus

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
    check_float_semiring(semiring, "remove_epsilon")
    if fsa.batch_shape:
        return map_entries(lambda entry: remove_epsilon(entry, semiring), fsa, fn="remove_epsilon")
    parts = parts_of(fsa, "remove_epsilon")
    tables, cycle = epsilon_closure.epsilon_removal(parts)
    if cycle:
        path = " -> ".join(str(state) for state in cycle)
        raise ValueError(
            f"remove_epsilon: state {cycle[0]} lies on a cycle of epsilon arcs "
            f"({path}); its closure would be an infinite sum"
        )
    assert tables is not None  # no cycle
    dtype = fsa.dtype
    real = np.flatnonzero(np.asarray(fsa.arc_mask))
    # Trim, as OpenFst's RmEpsilon does: states only reached through removed
    # epsilons, or that reach no final state, go.
    is_final = tables.final_pairs[:, 0] < tables.num_pairs
    result = lambda arc_weight, final_weight: trimmed_fsa(
        parts.num_states,
        tables.src,
        tables.dst,
        tables.ilabel,
        tables.olabel,
        is_final,
        arc_weight,
        final_weight,
        fsa.is_acceptor,
        tables.useful,
    )
    if weights_on_host(fsa, semiring):
        return result(*_host_weights(tables, np.asarray(fsa.weight)[real], fsa, semiring))
    weight = jnp.asarray(fsa.weight)[real]
    # Epsilon-closure weights d(p, q): forward scores of the pair graph.
    pair_weight = jnp.append(weight, jnp.asarray(semiring.one, dtype))[tables.pair_arc]
    zeros = np.zeros(len(tables.pair_src), np.int64)
    pair_graph = placeholder(
        tables.num_tree + tables.num_pairs,
        tables.pair_src,
        tables.pair_dst,
        zeros,
        zeros,
        dtype,
        True,
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
    return result(arc_weight, final_weight)


def _host_weights(
    tables: epsilon_closure.EpsilonRemoval, weight: np.ndarray, fsa: Fsa, semiring: Semiring
) -> tuple[np.ndarray, np.ndarray]:
    """The result's arc and final weights in numpy (float64 within): d(p, q)
    level by level of the pair graph, each pair once its level is reached,
    with the same tables as the level scan."""
    arithmetic = semiring.arithmetic
    assert arithmetic is not None  # see `weights_on_host`
    num_tree = tables.num_tree
    closure = np.full(tables.num_pairs + 1, -np.inf)  # pair P: none
    step = tables.pair_arc >= 0  # the tree's arcs (weight one) reach the pairs (p, p)
    leaf = ~step & (tables.pair_dst >= num_tree)
    closure[tables.pair_dst[leaf] - num_tree] = 0.0
    src, dst = tables.pair_src[step] - num_tree, tables.pair_dst[step] - num_tree
    level = tables.pair_level[num_tree + dst]
    order = np.lexsort((dst, level))
    src, dst, level = src[order], dst[order], level[order]
    arc_weight = weight.astype(np.float64)[tables.pair_arc[step][order]]
    bounds = np.flatnonzero(level[1:] != level[:-1]) + 1
    for begin, end in zip(np.concatenate([[0], bounds]), np.append(bounds, level.size)):
        if begin == end:
            continue
        targets = dst[begin:end]
        starts = np.flatnonzero(np.concatenate([[True], targets[1:] != targets[:-1]]))
        values = closure[src[begin:end]] + arc_weight[begin:end]
        closure[targets[starts]] = plus.run_plus(values, starts, arithmetic)
    closure = closure.astype(weight.dtype)
    arc = closure[tables.arc_pair] + weight[tables.arc_input]
    final_weight = np.asarray(fsa.final_weight)
    terms = (closure[tables.final_pairs] + final_weight[tables.final_states]).astype(np.float64)
    rows = terms.shape[1]
    starts = np.arange(terms.shape[0]) * rows
    final = (
        plus.run_plus(terms.reshape(-1), starts, arithmetic)
        if rows
        else np.full(terms.shape[0], -np.inf)
    )
    return arc, final.astype(weight.dtype)
