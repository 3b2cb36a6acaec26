"""prune: keep the arcs and states on paths within a beam of the best."""

from __future__ import annotations

import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.batch import batch_entries, stack
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import TROPICAL
from semiring_jax._src.scores.tot_score import backward_scores, check_scorable, forward_scores
from semiring_jax._src.structural.arc_map import apply_map
from semiring_jax._src.structural.host import structure

__all__ = ["prune"]

_SLACK = 1e-9


def prune(fsa: Fsa, beam: float) -> Fsa:
    """Drops the arcs (and final states) whose best path through them scores
    more than `beam` below the best path, then trims the rest (`connect`).

    Unlike the other structural ops, the result's structure depends on
    weight values, so the weights must be concrete (not traced); the kept
    weights are still gathered in JAX. An arc survives when α[src] + weight
    + β[dst] >= best - beam (TROPICAL forward and backward scores, with a
    slack of 1e-9 · max(1, |best|) for rounding, as OpenFst's delta), so
    `beam=0` keeps the best paths (all of them, on ties) and `beam=inf`
    keeps every arc on a successful path.

    Args:
      fsa: an acyclic Fsa, single or batched, with concrete weights.
      beam: float >= 0, in score units.
    Returns:
      The pruned Fsa; the start alone if no path succeeds.
    Raises:
      ValueError: for traced weights, a negative or NaN beam, or a cycle
        (naming a state on it).
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, -3.0), (1, 2, 3, 0.0)],
      ...                        final=[2])
      >>> print(sj.prune(fsa, 1.0).label, sj.prune(fsa, 5.0).label)
      [1 3] [1 2 3]
    """
    if not beam >= 0:
        raise ValueError(f"prune: beam must be >= 0, got {beam}")
    check_scorable(fsa, "prune")
    for name in ("weight", "final_weight"):
        checks.check_not_traced(getattr(fsa, name), name, "prune")

    # The scores of a batch are computed on the batch: its entries are
    # pruned unbuilt (see `map_entries`), each built once when stacked.
    alpha = np.asarray(forward_scores(fsa, TROPICAL), np.float64)
    beta = np.asarray(backward_scores(fsa, TROPICAL), np.float64)
    if not fsa.batch_shape:
        return _pruned(fsa, alpha, beta, beam)
    entries = batch_entries(fsa, "prune")
    return stack(
        [
            _pruned(entry, alpha[b, : entry.num_states], beta[b, : entry.num_states], beam)
            for b, entry in enumerate(entries)
        ]
    )


def _pruned(fsa: Fsa, alpha: np.ndarray, beta: np.ndarray, beam: float) -> Fsa:
    """`prune` of an unbatched Fsa, given its TROPICAL forward and backward
    scores [S]."""
    real = np.flatnonzero(np.asarray(fsa.arc_mask))
    src, dst = np.asarray(fsa.src)[real], np.asarray(fsa.dst)[real]
    best = beta[0]
    # A slack of 1e-9 (relative, at least absolute) absorbs the rounding of
    # the sums, as OpenFst's delta does: a tie of the best path stays.
    slack = _SLACK * max(1.0, abs(best)) if np.isfinite(best) else 0.0
    threshold = best - beam - slack if best > -np.inf else np.inf  # no path: keep nothing
    keep_arc = alpha[src] + np.asarray(fsa.weight, np.float64)[real] + beta[dst] >= threshold
    keep_final = alpha + np.asarray(fsa.final_weight, np.float64) >= threshold
    return apply_map("prune", [fsa], lambda parts: structure.prune(parts[0], keep_arc, keep_final))
