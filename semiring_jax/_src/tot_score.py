"""Total, forward and backward scores and arc posteriors (jit/vmap/grad).

`tot_score` is a `jax.custom_vjp` for semirings that give `sum_grad` (LOG)
or `argsum` (TROPICAL): the forward pass saves α and the local derivatives
or choices, and the backward pass is one more level scan
(`recursions.path_gradients`) or a trace-back of one path
(`recursions.best_path_arcs`). Other semirings are differentiated by plain
autodiff through the recursion.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src import cpu_scores, recursions
from semiring_jax._src.array_types import ArrayLeaf
from semiring_jax._src.batch import jit_over_batch
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.schedule import Schedule
from semiring_jax._src.semiring import LOG, Semiring

__all__ = [
    "arc_posteriors",
    "backward_scores",
    "check_scorable",
    "forward_scores",
    "tot_score",
]


def check_scorable(fsa: Fsa, fn: str) -> None:
    """Raises unless `fsa` is an acyclic Fsa (checked on static metadata)."""
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{fn}: expected an Fsa, got {type(fsa).__name__}")
    if fsa.cycle:
        path = " -> ".join(str(state) for state in fsa.cycle)
        raise ValueError(
            f"{fn}: state {fsa.cycle[0]} lies on a cycle ({path}); score recursions "
            f"need an acyclic FSA"
        )


def _total(
    semiring: Semiring, schedule: Schedule, alpha: jax.Array, final_weight: ArrayLeaf
) -> jax.Array:
    return semiring.sum(recursions.endings(semiring, schedule, alpha, final_weight), axis=0)


def _plain_tot_score(
    semiring: Semiring, schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> jax.Array:
    alpha, _ = recursions.forward_positions(semiring, schedule, weight)
    return _total(semiring, schedule, alpha, final_weight)


# Differentiated by `path_gradients`, not by autodiff through the scan.
_tot_score_core = jax.custom_vjp(_plain_tot_score, nondiff_argnums=(0,))


def _tot_score_fwd(
    semiring: Semiring, schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> tuple[jax.Array, tuple[Any, ...]]:
    selective = semiring.argsum is not None
    alpha, saved = recursions.forward_positions(
        semiring, schedule, weight, with_local=not selective, with_choice=selective
    )
    total = _total(semiring, schedule, alpha, final_weight)
    return total, (schedule, final_weight, alpha, saved)


def _tot_score_bwd(
    semiring: Semiring, residuals: tuple[Any, ...], cotangent: jax.Array
) -> tuple[None, jax.Array, jax.Array]:
    # | total | arc / final gradient                                  |
    # | -inf  | exactly 0 (sum_grad gives 0 on all -inf candidates,   |
    # |       | and no path is traced back)                           |
    # | +inf  | LOG: NaN; TROPICAL: the indicator of a path through   |
    # |       | the +inf weight. Either way the +inf total stays      |
    # |       | visible: a +inf weight is a bug, never clipped.       |
    arc_grad, final_grad = _path_gradients(semiring, *residuals)
    return None, arc_grad * cotangent, final_grad * cotangent


def _path_gradients(
    semiring: Semiring, schedule: Schedule, final_weight: jax.Array, alpha: jax.Array, saved: Any
) -> tuple[jax.Array, jax.Array]:
    """∂ total / ∂ (weight, final_weight) from the forward pass's residuals."""
    if semiring.argsum is None:
        return recursions.path_gradients(semiring, schedule, final_weight, alpha, saved)
    arcs, final_state, found = recursions.best_path_arcs(
        semiring, schedule, final_weight, alpha, saved
    )
    num_arcs = schedule.arc_src_pos.shape[0]
    on_path = jnp.zeros(num_arcs + 1, final_weight.dtype).at[arcs].set(1)[:num_arcs]
    stop = jnp.zeros_like(final_weight).at[final_state].set(found.astype(final_weight.dtype))
    return on_path, stop


_tot_score_core.defvjp(_tot_score_fwd, _tot_score_bwd)


def _scan_gradients(
    semiring: Semiring, schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> tuple[jax.Array, jax.Array]:
    """∂ total / ∂ (weight, final_weight) by the portable level scans."""
    _, residuals = _tot_score_fwd(semiring, schedule, weight, final_weight)
    return _path_gradients(semiring, *residuals)


def _tot_score_one(fsa: Fsa, semiring: Semiring) -> jax.Array:
    if cpu_scores.usable(semiring, fsa.schedule, fsa.weight):
        return cpu_scores.tot_score(
            semiring, _scan_gradients, fsa.schedule, fsa.src, fsa.weight, fsa.final_weight
        )
    custom = semiring.sum_grad is not None or semiring.argsum is not None
    score = _tot_score_core if custom else _plain_tot_score
    return score(semiring, fsa.schedule, fsa.weight, fsa.final_weight)


def tot_score(fsa: Fsa, semiring: Semiring = LOG) -> jax.Array:
    """⊕ over all successful paths of the path score (arcs ⊗ final weight).

    Its gradient with respect to `weight` is `arc_posteriors` (times the
    incoming cotangent), and with respect to `final_weight` the posterior
    (LOG) or indicator (TROPICAL) of stopping in each state. Gradients are
    finite everywhere: a -inf total, a padding arc or an unreachable state
    gets gradient 0. For `jax.grad` with respect to a whole Fsa, pass
    `allow_int=True` (its index arrays get float0 gradients).

    Args:
      fsa: an acyclic Fsa, single or batched [B].
      semiring: LOG (default), TROPICAL or any `Semiring`.
    Returns:
      float [] or [B]; the semiring's zero (-inf) where no path succeeds.
    Raises:
      ValueError: if `fsa` has a cycle; the message names a state on it.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 6, 1.0)], final=[1])
      >>> print(round(float(sj.tot_score(fsa)), 4))
      1.4741
      >>> print(float(sj.tot_score(fsa, sj.TROPICAL)))
      1.0
    """
    check_scorable(fsa, "tot_score")
    return jit_over_batch(_tot_score_one)(fsa, semiring)


def _forward_one(fsa: Fsa, semiring: Semiring) -> jax.Array:
    alpha, _ = recursions.forward_positions(semiring, fsa.schedule, fsa.weight)
    return alpha[fsa.schedule.state_pos]


def forward_scores(fsa: Fsa, semiring: Semiring = LOG) -> jax.Array:
    """⊕ over paths from the start state to each state (no final weights).

    Args:
      fsa: an acyclic Fsa, single or batched [B].
      semiring: LOG (default), TROPICAL or any `Semiring`.
    Returns:
      float [S] or [B, S]; `one` (0.0) at the start, `zero` (-inf) where a
      state cannot be reached.
    Raises:
      ValueError: if `fsa` has a cycle; the message names a state on it.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (1, 2, 6, 1.0)], final=[2])
      >>> print(sj.forward_scores(fsa))
      [0.  0.5 1.5]
    """
    check_scorable(fsa, "forward_scores")
    return jit_over_batch(_forward_one)(fsa, semiring)


def _backward_one(fsa: Fsa, semiring: Semiring) -> jax.Array:
    schedule = fsa.schedule
    beta = recursions.backward_positions(semiring, schedule, fsa.weight, fsa.final_weight)
    # States without a position have no arcs: their β is their final weight.
    unplaced = schedule.state_pos == beta.shape[0] - 1
    return jnp.where(unplaced, fsa.final_weight, beta[schedule.state_pos])


def backward_scores(fsa: Fsa, semiring: Semiring = LOG) -> jax.Array:
    """⊕ over paths from each state to the end, final weights included.

    Args:
      fsa: an acyclic Fsa, single or batched [B].
      semiring: LOG (default), TROPICAL or any `Semiring`.
    Returns:
      float [S] or [B, S]; at the start state it equals `tot_score`.
    Raises:
      ValueError: if `fsa` has a cycle; the message names a state on it.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (1, 2, 6, 1.0)], final=[2])
      >>> print(sj.backward_scores(fsa))
      [1.5 1.  0. ]
    """
    check_scorable(fsa, "backward_scores")
    return jit_over_batch(_backward_one)(fsa, semiring)


def _posteriors_one(fsa: Fsa, semiring: Semiring) -> jax.Array:
    if semiring.sum_grad is None and semiring.argsum is None:
        return jax.grad(lambda w: _tot_score_one(fsa.replace(weight=w), semiring))(fsa.weight)
    if cpu_scores.usable(semiring, fsa.schedule, fsa.weight):
        return cpu_scores.gradients(
            semiring, _scan_gradients, fsa.schedule, fsa.src, fsa.weight, fsa.final_weight
        )[0]
    return _scan_gradients(semiring, fsa.schedule, fsa.weight, fsa.final_weight)[0]


def arc_posteriors(fsa: Fsa, semiring: Semiring = LOG) -> jax.Array:
    """The gradient of `tot_score` with respect to each arc weight.

    LOG: the probability that the arc lies on a path, under the distribution
    p(path) ∝ exp(path score). TROPICAL: 1.0 on the arcs of the best path,
    0.0 elsewhere. Tie rule (TROPICAL): the best path is traced back from
    the lowest-numbered best final state; at each state, stopping at the
    start state (the empty prefix) wins a tie, then the entering arc with
    the lowest index. All zeros where no path succeeds. For other semirings,
    the autodiff gradient of `tot_score`.

    Args:
      fsa: an acyclic Fsa, single or batched [B].
      semiring: LOG (default), TROPICAL or any `Semiring`.
    Returns:
      float [A] or [B, A]; 0.0 on padding arcs.
    Raises:
      ValueError: if `fsa` has a cycle; the message names a state on it.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.0), (0, 1, 6, 0.0)], final=[1])
      >>> print(sj.arc_posteriors(fsa))
      [0.5 0.5]
      >>> print(sj.arc_posteriors(fsa, sj.TROPICAL))
      [1. 0.]
    """
    check_scorable(fsa, "arc_posteriors")
    return jit_over_batch(_posteriors_one)(fsa, semiring)
