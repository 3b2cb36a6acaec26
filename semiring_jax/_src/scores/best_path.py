"""The best (TROPICAL) path of an FSA, as a linear Fsa (traced)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core.batch import jit_over_batch
from semiring_jax._src.core.fsa import Fsa, assemble
from semiring_jax._src.core.host import build
from semiring_jax._src.core.semiring import TROPICAL
from semiring_jax._src.scores import level_scan
from semiring_jax._src.scores.tot_score import check_scorable, final_weights

__all__ = ["best_path"]


@functools.lru_cache(maxsize=64)
def _chain(num_states: int, is_acceptor: bool) -> Fsa:
    """A chain 0 -> 1 -> ... of `num_states` states: the result's structure."""
    steps = np.arange(num_states - 1, dtype=np.int32)
    zeros = np.zeros(num_states - 1, np.float32)
    return assemble(
        build.ArcArrays(
            num_states,
            steps,
            steps + 1,
            steps,
            steps,
            zeros,
            np.zeros(num_states, np.float32),
            is_acceptor,
        )
    )


def _best_path_one(fsa: Fsa) -> Fsa:
    steps, _ = fsa.schedule.levels.pos_state.shape  # N: a path has at most N - 1 arcs
    alpha, choices = level_scan.forward_positions(
        TROPICAL, fsa.schedule, fsa.weight, with_choice=True
    )
    final_weight = final_weights(fsa, TROPICAL)
    arcs, final_state, found = level_scan.best_path_arcs(
        TROPICAL, fsa.schedule, final_weight, alpha, choices
    )
    # The trace-back lists the last arc first, then A (none): reverse the
    # real arcs into the first slots.
    length = jnp.sum(arcs < fsa.num_arcs)
    order = (length - 1 - jnp.arange(steps - 1)) % max(steps, 1)
    return path_as_chain(fsa, arcs[order], length, final_state, found, final_weight)


def path_as_chain(
    fsa: Fsa,
    arcs: jax.Array,
    length: jax.Array,
    final_state: jax.Array,
    found: jax.Array,
    final_weight: jax.Array,
) -> Fsa:
    """One path of an unbatched `fsa` as a linear Fsa of N states (traced).

    Args:
      fsa: the Fsa the path runs through; N = its schedule's steps.
      arcs: int [N - 1], the path's arc indices in order in the first
        `length` slots (the rest are ignored).
      length: int [], the number of arcs.
      final_state: int [], the state the path stops in.
      found: bool [], False for no path (then nothing is real or final).
      final_weight: float [S], `fsa`'s final weights (-inf where not final).
    Returns:
      The chain: arc slots past `length` are padding (weight -inf), only
      state `length` is final (none when not `found`), and every weight is a
      differentiable gather of `fsa`'s.
    """
    steps, _ = fsa.schedule.levels.pos_state.shape
    arc_mask = jnp.arange(steps - 1) < length
    arcs = jnp.where(arc_mask, arcs, 0)
    chain = _chain(steps, fsa.is_acceptor)
    neg_inf = jnp.asarray(-jnp.inf, fsa.weight.dtype)
    # The chain's schedule lists every slot; off-path slots have weight -inf,
    # so masking them needs no new schedule (and `arc_mask` may be traced).
    # Only the path's last state is final (none when no path succeeds), so
    # structural ops on the result see the path's one final state.
    final_mask = (jnp.arange(steps) == length) & found
    chain = dataclasses.replace(chain, arc_mask=arc_mask, final_mask=final_mask)
    return chain.replace(
        ilabel=jnp.where(arc_mask, fsa.ilabel[arcs], 0),
        olabel=jnp.where(arc_mask, fsa.olabel[arcs], 0),
        weight=jnp.where(arc_mask, fsa.weight[arcs], neg_inf),
        final_weight=jnp.where(final_mask, final_weight[final_state], neg_inf),
    )


def best_path(fsa: Fsa) -> Fsa:
    """The best path, as a linear Fsa with its arc and final weights.

    The result has N states and N - 1 arc slots, where N is the number of
    steps of `fsa`'s schedule (at least its depth plus one; batched results
    share one shape); the path's arcs
    come first, the rest are padding (`arc_mask` False, weight -inf). Its
    `tot_score` in TROPICAL equals that of `fsa`, and its weights are
    differentiable gathers of the input's. Ties are broken as in
    `arc_posteriors` (TROPICAL). Where no path succeeds, no arc is real and
    no state is final.

    Args:
      fsa: an acyclic Fsa, single or batched [B].
    Returns:
      A linear Fsa, batched like `fsa`.
    Raises:
      ValueError: if `fsa` has a cycle; the message names a state on it.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 6, 1.0), (1, 2, 7, 0.0)],
      ...                        final=[2])
      >>> path = sj.best_path(fsa)
      >>> print(path.label, path.weight, float(sj.tot_score(path, sj.TROPICAL)))
      [6 7] [1. 0.] 1.0
    """
    check_scorable(fsa, "best_path")
    return jit_over_batch(_best_path_one)(fsa)
