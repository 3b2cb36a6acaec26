"""Total, forward and backward scores and arc posteriors (jit/vmap/grad).

Semirings that declare an `arithmetic` ("log": LOG's, "tropical":
TROPICAL's) run the compensated level scans of `scores/level_pairs.py` (or, on
the CPU, the compiled kernels of `score_ops.py`: `route_table.TOT_SCORE`);
any other semiring runs the float level scans of `level_scan.py`.
`tot_score` is
differentiated by `derivatives.score`: a custom JVP whose tangent is
⟨gradient, tangent⟩, with the gradient computed once by a backward
recursion — LOG's posteriors exp(α + w + β - Z), TROPICAL's trace-back of
one path, or for other semirings that give `sum_grad` / `argsum` the level
scan of local derivatives (`level_scan.path_gradients`) or a trace-back. So
forward and reverse mode both work, and second derivatives come from
autodiff through those level_scan. Other semirings are differentiated by
plain autodiff through the recursion.

| total | gradients (every path: kernels and scans alike)          |
| -inf  | exactly 0                                                 |
| +inf  | LOG: NaN; TROPICAL: the indicator of the best path (through |
|       | a +inf weight); the +inf total stays visible              |
| NaN   | NaN (a NaN weight on any real arc, or a NaN final weight) |
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import derivatives, records, route_table, routes
from semiring_jax._src.core.array_types import ArrayLeaf
from semiring_jax._src.core.batch import jit_over_batch
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.semiring import LOG, Semiring, check_float_semiring, lifted
from semiring_jax._src.kernels import score_ops
from semiring_jax._src.scores import level_pairs, level_scan

__all__ = [
    "arc_posteriors",
    "backward_scores",
    "check_scorable",
    "final_weights",
    "forward_scores",
    "scan_total",
    "tot_score",
]


def check_scorable(fsa: Fsa, fn: str) -> None:
    """Raises unless `fsa` is an acyclic Fsa whose schedule fits its sizes
    (checked on static metadata and shapes)."""
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{fn}: expected an Fsa, got {type(fsa).__name__}")
    if fsa.cycle:
        path = " -> ".join(str(state) for state in fsa.cycle)
        raise ValueError(
            f"{fn}: state {fsa.cycle[0]} lies on a cycle ({path}); score recursions "
            f"need an acyclic FSA"
        )
    _check_schedule_shapes(fsa, fn)


def _check_schedule_shapes(fsa: Fsa, fn: str) -> None:
    """A schedule built for another Fsa (`dataclasses.replace(fsa,
    schedule=...)`) would index past this one's arrays."""
    schedule = fsa.schedule
    levels, pull = schedule.levels, schedule.pull
    # Read by attribute, not through `schedule.arrays()`: this runs on every
    # eager call, and building that dict cost more than the checks.
    expected = (
        ("pull_arc", pull.arc, fsa.num_arcs, "arcs"),
        ("pull_src", pull.src, fsa.num_arcs, "arcs"),
        ("arc_src_pos", levels.arc_src_pos, fsa.num_arcs, "arcs"),
        ("arc_dst_pos", levels.arc_dst_pos, fsa.num_arcs, "arcs"),
        ("arc_grad_index", levels.arc_grad_index, fsa.num_arcs, "arcs"),
        ("state_pos", levels.state_pos, fsa.num_states, "states"),
    )
    for name, table, size, what in expected:
        shape = table.shape
        if shape[-1:] != (size,):
            raise ValueError(
                f"{fn}: the schedule's {name} has shape {tuple(shape)} but the Fsa has "
                f"{size} {what} (a schedule of another Fsa?)"
            )
    num_levels, width = levels.pos_state.shape[-2:]
    if num_levels and not width:
        raise ValueError(f"{fn}: the schedule has {num_levels} levels of width 0")
    if pull.end.shape != levels.pos_state.shape:
        raise ValueError(
            f"{fn}: the schedule's pull_end {tuple(pull.end.shape)} and pos_state "
            f"{tuple(levels.pos_state.shape)} differ in shape (a schedule of another Fsa?)"
        )


def final_weights(fsa: Fsa, semiring: Semiring) -> Any:
    """`final_weight` on final states, the semiring's zero elsewhere, [..., S].

    Which states are final is `final_mask`: the values stored at non-final
    and padding states (-inf, the zero of LOG and TROPICAL) would be NaN or
    a wrong term in another semiring (e.g. -inf * 0 in the real one). A
    semiring with a `lift` gets the lifted records.
    """
    return lifted(semiring, fsa.final_weight, fsa.final_mask)


def _is_builtin(semiring: Semiring) -> bool:
    """Semirings with LOG's or TROPICAL's arithmetic, whose recursions run
    on compensated pairs."""
    return semiring.arithmetic is not None


def _has_rules(semiring: Semiring) -> bool:
    """Semirings whose gradient is a backward recursion, not autodiff (an
    `arithmetic` implies one: it needs `sum_grad` or `argsum`)."""
    return semiring.sum_grad is not None or semiring.argsum is not None


def _inf_undefined(semiring: Semiring) -> bool:
    """LOG's posteriors of a +inf total are NaN (undefined, and visible)."""
    return semiring.arithmetic == "log"


def _total(
    semiring: Semiring, schedule: Schedule, alpha: jax.Array, final_weight: ArrayLeaf
) -> jax.Array:
    return semiring.sum(level_scan.endings(semiring, schedule, alpha, final_weight), axis=0)


def scan_total(semiring: Semiring, schedule: Schedule, weight: Any, final_weight: Any) -> Any:
    """The total score [] (a record for a structured semiring) by the
    portable level scans, from weights [A] and final weights [S] already
    in the semiring's domain."""
    if _is_builtin(semiring):
        tropical = semiring.arithmetic == "tropical"
        pair, _ = level_pairs.forward(schedule, weight, tropical=tropical)
        total, _ = level_pairs.total(schedule, pair, final_weight, tropical=tropical)
        return total[0] + total[1]
    alpha, _ = level_scan.forward_positions(semiring, schedule, weight)
    return _total(semiring, schedule, alpha, final_weight)


def _rule_gradients(
    semiring: Semiring, schedule: Schedule, weight: ArrayLeaf, final_weight: ArrayLeaf
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """(total, gradients) of a user semiring with `sum_grad` or `argsum`."""
    final_weight = jnp.asarray(final_weight)
    if semiring.argsum is None:
        alpha, local = level_scan.forward_positions(semiring, schedule, weight, with_local=True)
        grads = level_scan.path_gradients(semiring, schedule, final_weight, alpha, local)
        return _total(semiring, schedule, alpha, final_weight), grads
    alpha, choices = level_scan.forward_positions(semiring, schedule, weight, with_choice=True)
    arcs, final_state, found = level_scan.best_path_arcs(
        semiring, schedule, final_weight, alpha, choices
    )
    num_arcs = schedule.levels.arc_src_pos.shape[0]
    on_path = jnp.zeros(num_arcs + 1, final_weight.dtype).at[arcs].set(1)[:num_arcs]
    stop = jnp.zeros_like(final_weight).at[final_state].set(found.astype(final_weight.dtype))
    return _total(semiring, schedule, alpha, final_weight), (on_path, stop)


# tot_score's score op inputs: diff = (weight [A], final_weight [S]), aux =
# (schedule, src [A], final_mask [S]); see `_score_inputs`.
Diff = tuple[ArrayLeaf, ArrayLeaf]
Aux = tuple[Schedule, ArrayLeaf, ArrayLeaf]


def _score_inputs(fsa: Fsa, semiring: Semiring) -> tuple[Diff, Aux]:
    """(diff, aux) of tot_score's score op for an unbatched `fsa`.

    A float semiring's final weights go in as stored, with `final_mask` in
    `aux`: every route reads them only where it holds (the kernels in C++,
    the level scan by a select of its own), so that the kernel route's
    program is the custom call alone, with no select on [S] around it
    (XLA:CPU runs a program of under 1,000 estimated flops inline on the
    calling thread, any other on a worker thread at every call). A
    semiring with a `lift` gets them lifted (`final_weights`: already the
    zero where the mask is False; the routes' select keeps them so).
    """
    aux = (fsa.schedule, fsa.src, fsa.final_mask)
    if semiring.lift is not None or semiring.structured:
        return _diff(fsa, semiring), aux
    weight = jnp.asarray(fsa.weight)
    return (weight, jnp.asarray(fsa.final_weight).astype(weight.dtype)), aux


def _on_final(semiring: Semiring, final_weight: ArrayLeaf, final_mask: ArrayLeaf) -> Any:
    """`final_weight` where `final_mask` holds, the semiring's zero elsewhere."""
    return records.where(final_mask, final_weight, semiring.zero)


def _scan_value(semiring: Semiring, diff: Diff, aux: Aux) -> jax.Array:
    """The total [] by the portable scans (the level_scan route's value)."""
    (weight, final_weight), (schedule, _, final_mask) = diff, aux
    return scan_total(semiring, schedule, weight, _on_final(semiring, final_weight, final_mask))


def _scan_value_and_grads(
    semiring: Semiring, diff: Diff, aux: Aux
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """(total [], (∂/∂weight [A], ∂/∂final_weight [S])) by the portable
    scans; differentiable JAX (the kernels' reference). The final weights
    are read where `final_mask` holds; elsewhere their gradient is 0, NaN
    total or not (the kernels' too)."""
    (weight, final_weight), (schedule, _, final_mask) = diff, aux
    final_weight = _on_final(semiring, final_weight, final_mask)
    if semiring.arithmetic == "log":
        total, arc_grad, final_grad = level_pairs.log_gradients(schedule, weight, final_weight)
        grads = (arc_grad, final_grad)
    elif semiring.arithmetic == "tropical":
        total, arc_grad, final_grad = level_pairs.tropical_gradients(schedule, weight, final_weight)
        grads = (arc_grad, final_grad)
    else:
        total, grads = _rule_gradients(semiring, schedule, weight, final_weight)
    arc_grad, final_grad = derivatives.undefined_to_nan(
        total, grads, inf_undefined=_inf_undefined(semiring)
    )
    return total, (arc_grad, jnp.where(final_mask, final_grad, jnp.zeros_like(final_grad)))


def _kernel_value_and_grad(
    semiring: Semiring, reference: derivatives.ValueAndGrad, diff: Diff, aux: Aux
) -> tuple[jax.Array, Any]:
    # The kernels' gradients are already NaN where the total is NaN (and, in
    # LOG, +inf), in every entry but the final gradient of a non-final state
    # (0), and they read final weights only where final_mask holds: a select
    # here (undefined_to_nan, or the mask's) would add [A]- or [S]-sized
    # work to every program, and XLA:CPU runs a program of 1,000 or more
    # estimated flops asynchronously (a thread handoff on every call)
    # instead of inline.
    return score_ops.value_and_grads(semiring, reference, *aux, *diff)


@functools.cache
def _op(semiring: Semiring) -> derivatives.ScoreOp:
    """tot_score's value and gradient for one semiring, by its routes
    (`route_table.TOT_SCORE`): the CPU kernel or the level scan."""
    reference = functools.partial(_scan_value_and_grads, semiring)
    values: dict[str, Callable[..., Any]] = {
        "cpu_kernel": lambda diff, aux: score_ops.total(semiring, aux[0], diff[0], diff[1], aux[2]),
        "level_scan": functools.partial(_scan_value, semiring),
    }
    values_and_grads: dict[str, Callable[..., Any]] = {
        "cpu_kernel": functools.partial(_kernel_value_and_grad, semiring, reference),
        "level_scan": reference,
    }

    def facts(diff: Diff) -> dict[str, Any]:
        return {"dtype": records.leaves_of(diff[0])[0].dtype, "arithmetic": semiring.arithmetic}

    def value(diff: Diff, aux: Aux) -> jax.Array:
        return routes.dispatch(route_table.TOT_SCORE, values, diff, aux, **facts(diff))

    def value_and_grad(diff: Diff, aux: Aux) -> tuple[jax.Array, Any]:
        return routes.dispatch(route_table.TOT_SCORE, values_and_grads, diff, aux, **facts(diff))

    return derivatives.ScoreOp(value, value_and_grad)


def _diff(fsa: Fsa, semiring: Semiring) -> tuple[Any, Any]:
    if semiring.lift is not None or semiring.structured:
        return lifted(semiring, fsa.weight, fsa.arc_mask), final_weights(fsa, semiring)
    weight = jnp.asarray(fsa.weight)
    return weight, final_weights(fsa, semiring).astype(weight.dtype)


def _tot_score_one(fsa: Fsa, semiring: Semiring) -> jax.Array:
    if not _has_rules(semiring):  # plain autodiff through the recursion
        return scan_total(semiring, fsa.schedule, *_diff(fsa, semiring))
    return derivatives.score(_op(semiring), *_score_inputs(fsa, semiring))


def tot_score(fsa: Fsa, semiring: Semiring = LOG) -> jax.Array:
    """⊕ over all successful paths of the path score (arcs ⊗ final weight).

    Its gradient with respect to `weight` is `arc_posteriors` (times the
    incoming cotangent), and with respect to `final_weight` the posterior
    (LOG) or indicator (TROPICAL) of stopping in each state. Gradients are
    finite everywhere: a -inf total, a padding arc or an unreachable state
    gets gradient 0. Forward mode (`jax.jvp`, `jax.hessian`) works too. NaN
    in a real arc's weight or a final weight gives a NaN total and NaN
    gradients; a +inf weight that a path uses gives +inf (gradients: NaN in
    LOG, the best path in TROPICAL). For `jax.grad` with respect to a whole
    Fsa, pass `allow_int=True` (its index arrays get float0 gradients).

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


def _forward_one(fsa: Fsa, semiring: Semiring) -> Any:
    if _is_builtin(semiring):
        tropical = semiring.arithmetic == "tropical"
        pair, _ = level_pairs.forward(fsa.schedule, fsa.weight, tropical=tropical)
        return (pair[0] + pair[1])[fsa.schedule.levels.state_pos]
    weight, _ = _diff(fsa, semiring)
    alpha, _ = level_scan.forward_positions(semiring, fsa.schedule, weight)
    return records.take(alpha, fsa.schedule.levels.state_pos)


def forward_scores(fsa: Fsa, semiring: Semiring = LOG) -> jax.Array:
    """⊕ over paths from the start state to each state (no final weights).

    Args:
      fsa: an acyclic Fsa, single or batched [B].
      semiring: LOG (default), TROPICAL or any `Semiring`.
    Returns:
      float [S] or [B, S]; `one` (0.0) at the start, `zero` (-inf) where a
      state cannot be reached; +inf where a path from the start passes a
      +inf weight, as in `tot_score`.
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


def _backward_one(fsa: Fsa, semiring: Semiring) -> Any:
    schedule = fsa.schedule
    weight, final_weight = _diff(fsa, semiring)
    if _is_builtin(semiring):
        pair = level_pairs.backward(
            schedule, weight, final_weight, tropical=semiring.arithmetic == "tropical"
        )
        beta = pair[0] + pair[1]
    else:
        beta = level_scan.backward_positions(semiring, schedule, weight, final_weight)
    # States without a position have no arcs: their β is their final weight.
    unplaced = schedule.levels.state_pos == records.leaves_of(beta)[0].shape[0] - 1
    return records.where(unplaced, final_weight, records.take(beta, schedule.levels.state_pos))


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
    if not _has_rules(semiring):
        return jax.grad(lambda w: _tot_score_one(fsa.replace(weight=w), semiring))(fsa.weight)
    _, (arc_grad, _) = _op(semiring).value_and_grad(*_score_inputs(fsa, semiring))
    return arc_grad


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
    check_float_semiring(semiring, "arc_posteriors")
    return jit_over_batch(_posteriors_one)(fsa, semiring)
