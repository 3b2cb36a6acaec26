"""The k-best semiring and `kbest_scores`: the k best path scores by the
ordinary level recursion, never by listing paths.

A weight is a [k] vector of scores sorted best first (-inf where fewer
exist): ⊕ keeps the k best of the union, ⊗ the k best of the pairwise
sums. Every operation returns a sorted vector, so ⊗ need not look at all
k² sums: in sorted a and b, the sum a[i] + b[j] is at most each of the
(i + 1)(j + 1) sums a[i'] + b[j'] with i' <= i, j' <= j, so only pairs
with (i + 1)(j + 1) <= k can be among the k best (at most k·H(k) of them, 50 for
k = 16, instead of 256).

On the CPU, `kbest_scores` runs a compiled search instead
(`kernels/scores.cc`, KBEST): one Viterbi pass, then each state's further
prefixes only when a longer list downstream asks for them (Huang and
Chiang's lazy k-best), so it costs one pass over the arcs plus about k
times the paths' length in heap steps. It traces the k paths back, so its
derivative is the sum of the weight tangents along each path; elsewhere
(and for `tot_score` in `kbest_semiring(k)`) the level scan runs and
autodiff differentiates it.
Either way the derivative of the i-th score is the indicator of the arcs
of the i-th path (where scores tie, of the one the recursion ranked i-th).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import compensated, derivatives, route_table, routes
from semiring_jax._src.core.batch import jit_over_batch
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.semiring import LOG, Semiring
from semiring_jax._src.kernels import score_ops
from semiring_jax._src.scores.tot_score import check_scorable, final_weights, tot_score

__all__ = ["kbest_scores", "kbest_semiring"]


def _top(values: jax.Array, k: int) -> jax.Array:
    """The k largest entries along the last axis, best first. NaN counts
    as the largest, so a NaN in reaches the front (and the result)."""
    if values.shape[-1] < k:
        pad = jnp.full((*values.shape[:-1], k - values.shape[-1]), -jnp.inf, values.dtype)
        values = jnp.concatenate([values, pad], axis=-1)
    # jax.lax.top_k, not a sort: a sort of each row was 10-17x slower on
    # the scan (CPU, k = 16). XLA does not split top_k along a batch that
    # an auto-axis mesh shards (it gathers the batch onto each device); on
    # an explicit-axis mesh each device runs its own part (`per_device`).
    return jax.lax.top_k(values, k)[0]


def _pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
    """The index pairs (i, j) with (i + 1)(j + 1) <= k (see the module doc)."""
    # For each i, j runs up to k // (i + 1) - 1: k·H(k) pairs, not k² tries.
    counts = k // np.arange(1, k + 1)
    first = np.repeat(np.arange(k, dtype=np.int32), counts)
    second = np.arange(first.size, dtype=np.int32) - np.repeat(np.cumsum(counts) - counts, counts)
    return first, second.astype(np.int32)


@functools.cache
def kbest_semiring(k: int) -> Semiring:
    """The k-best semiring over scores: weights are [k] vectors, best first.

    ⊕ is the k best of the union of two vectors, ⊗ the k best of their
    pairwise sums (with -inf ⊗ +inf = -inf, as in LOG), zero is all -inf
    and one is (0, -inf, ..., -inf). Its lift maps a score w to (w, -inf,
    ..., -inf), so `sj.tot_score(fsa, sj.kbest_semiring(k))` is
    `sj.kbest_scores(fsa, k)`. Cached: one instance per k.

    Args:
      k: the number of scores kept, >= 1.
    Returns:
      A `Semiring` with structured weights.
    Raises:
      ValueError: if k is not a positive int.
    Examples:
      >>> import semiring_jax as sj
      >>> kbest = sj.kbest_semiring(3)
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 1.0), (0, 1, 2, 2.0)], final=[1])
      >>> print(sj.tot_score(fsa, kbest))
      [  2.   1. -inf]
    """
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"kbest_semiring: k must be a positive int, got {k!r}")
    k = int(k)
    first, second = _pairs(k)

    def plus(a: jax.Array, b: jax.Array) -> jax.Array:
        return _top(jnp.concatenate([a, b], axis=-1), k)

    def times(a: jax.Array, b: jax.Array) -> jax.Array:
        a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
        return _top(compensated.times(a[..., first], b[..., second]), k)

    def total(x: jax.Array, axis: int) -> jax.Array:
        x = jnp.moveaxis(jnp.asarray(x), axis, -2)
        return _top(x.reshape(*x.shape[:-2], x.shape[-2] * k), k)

    def lift(scores: jax.Array) -> jax.Array:
        scores = jnp.asarray(scores)
        rest = jnp.full((*scores.shape, k - 1), -jnp.inf, scores.dtype)
        return jnp.concatenate([scores[..., None], rest], axis=-1)

    one = np.full(k, -np.inf)
    one[0] = 0.0
    return Semiring(
        name=f"kbest{k}",
        plus=plus,
        times=times,
        sum=total,
        zero=np.full(k, -np.inf),
        one=one,
        lift=lift,
    )


def kbest_scores(fsa: Fsa, k: int) -> jax.Array:
    """The k best path scores (arc weights plus final weight), best first.

    The result of `tot_score` in `kbest_semiring(k)`: on the CPU by a
    compiled lazy search (one Viterbi pass, then further prefixes of only
    the states the k best paths reach, and the k paths traced back), the
    level scan elsewhere. Equal paths count separately (two parallel arcs
    of one weight give that score twice), as in OpenFst's
    `shortestpath(nshortest=k)` without `unique`.
    `kbest_scores(fsa, 1)[0]` is `tot_score(fsa, sj.TROPICAL)`.
    Differentiable: the gradient of the i-th score with respect to
    `weight` is 1 on the arcs of the i-th path and 0 elsewhere (and with
    respect to `final_weight`, 1 at its final state). Where scores tie,
    which tied path is ranked first is fixed but unspecified, and may
    differ between the compiled and the portable recursion.

    Args:
      fsa: an acyclic Fsa, single or batched [B].
      k: the number of scores, >= 1.
    Returns:
      float [k] or [B, k]; -inf where fewer than k paths succeed. NaN where
      a path reads a NaN weight (the compiled recursion makes every score
      NaN when any real arc or final weight is NaN), with NaN gradients.
    Raises:
      ValueError: if `fsa` has a cycle (naming a state on it) or k is not a
        positive int.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs(
      ...     [(0, 1, 1, 1.0), (0, 1, 2, 3.0), (1, 2, 3, 0.5), (1, 2, 4, 0.0)], final=[2])
      >>> print(sj.kbest_scores(fsa, 5))
      [ 3.5  3.   1.5  1.  -inf]
    """
    semiring = kbest_semiring(k)  # checks k
    check_scorable(fsa, "kbest_scores")
    return jit_over_batch(_kbest_one)(fsa, semiring)


def _kbest_one(fsa: Fsa, semiring: Semiring) -> jax.Array:
    diff = (jnp.asarray(fsa.weight), final_weights(fsa, LOG).astype(fsa.dtype))
    k = int(np.size(semiring.zero))
    impls: dict[str, Callable[..., Any]] = {
        "cpu_kernel": lambda: _compiled(k, diff, fsa.schedule),
        # Autodiff of the scan gives a NaN score the derivative of the path
        # `top_k` ranked there (NaN first): the NaN arc's indicator. NaN in
        # every weight instead, as the kernel's rule gives.
        "level_scan": lambda: derivatives.nan_spread(tot_score(fsa, semiring), *diff),
    }
    return routes.dispatch(route_table.KBEST_SCORES, impls, dtype=fsa.dtype, arithmetic=None)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _compiled(k: int, diff: tuple[jax.Array, jax.Array], schedule: Schedule) -> jax.Array:
    """The KBEST kernel's scores [k], differentiable in diff = (weight
    [A], final_weight [S])."""
    weight, final = diff
    return score_ops.kbest(schedule, weight, final, k)[0]


@_compiled.defjvp
def _compiled_jvp(k: int, primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
    (weight, final), schedule = primals
    scores, paths, ends = score_ops.kbest(schedule, weight, final, k)
    weight_tangent, final_tangent = tangents[0]
    along = jnp.append(weight_tangent, 0)[paths].sum(axis=-1) + jnp.append(final_tangent, 0)[ends]
    # NaN in, NaN out: a NaN score's derivative is NaN in every input
    # (0 times the tangents' sum elsewhere).
    undefined = jnp.where(jnp.isnan(scores), jnp.nan, 0).astype(scores.dtype)
    return scores, along + undefined * (jnp.sum(weight_tangent) + jnp.sum(final_tangent))
