"""Entropy and KL divergence of path distributions, by structured semirings.

An Fsa's LOG scores define p(path) = exp(score - log Z). Its entropy and
its KL divergence from a second weighting of the same arcs are computed by
the ordinary level recursion in semirings whose weights are records of
log-masses and the quantity itself, so that no path is listed and nothing
large is subtracted from anything large:

* the entropy semiring weighs a set of paths with (z, h): z = log of its
  mass, h = the entropy of the paths' distribution renormalised to it.
  ⊗ (concatenation) adds both: entropies of independent parts add. ⊕ of
  disjoint sets with masses π_i = exp(z_i - z) is the mixture rule
  h = Σ π_i (h_i - log π_i). A one-arc path is (w, 0).
* the KL semiring weighs a set with (z_p, z_q, d): both log-masses and
  d = KL between the two renormalised distributions; ⊗ adds all three,
  ⊕ gives d = Σ π_i (d_i + log π_i - log s_i) with s_i the q-shares.

Both are isomorphic to the first-order expectation semiring (OpenFst's
`ExpectationWeight` in the log domain), with h = z - E[score] and
d = E_p[score_p - score_q] - z_p + z_q; the forms here stay accurate
where path scores are large and the entropy small. Gradients come from
autodiff through the recursion; the operations are written so that
zero-mass terms give 0, never NaN, in values and gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks, compensated, derivatives, route_table, routes
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.semiring import LOG, Semiring, lifted
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.kernels import score_ops
from semiring_jax._src.scores import tot_score as scores

__all__ = ["ENTROPY", "KL", "entropy", "kl_divergence"]

_NAN = float("nan")


def _shares(z: jax.Array, axis: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The log-mass `total` of entries z along `axis`, each entry's log
    share (0 where the entry or the total has no mass) and whether it has
    a share (mass > 0 in a set of finite mass). Shares are formed relative
    to the largest entry, not to the total, so that they stay exact when
    the masses are huge (the total's rounding would shift them all)."""
    top = jax.lax.stop_gradient(jnp.max(z, axis=axis, keepdims=True, initial=-jnp.inf))
    top = jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
    relative = z - top
    spread = LOG.sum(relative, axis=axis)  # log Σ exp(z - top)
    total = jnp.squeeze(top, axis) + spread
    live = (z > -jnp.inf) & jnp.expand_dims(jnp.isfinite(total), axis)
    safe_spread = jnp.expand_dims(jnp.where(jnp.isfinite(spread), spread, 0), axis)
    return total, jnp.where(live, relative - safe_spread, 0), live


def _nan_where(condition: jax.Array, values: jax.Array) -> jax.Array:
    return jnp.where(condition, jnp.asarray(_NAN, values.dtype), values)


def _stacked(a: Any, b: Any) -> Any:
    """Two records stacked along a new leading axis 0, for ⊕ as a sum."""
    return jax.tree_util.tree_map(lambda *v: jnp.stack(jnp.broadcast_arrays(*v)), a, b)


def _entropy_sum(x: tuple[jax.Array, jax.Array], axis: int) -> tuple[jax.Array, jax.Array]:
    z, h = x
    # A +inf z is a mass that overflowed the dtype (a +inf weight's record
    # carries a NaN entropy, `_entropy_lift`): one such entry has the whole
    # share, so the set's entropy is its own; two or more have unknown
    # shares. The finite entries' shares are formed without them, so that
    # no inf - inf reaches a gradient.
    overflowed = z == jnp.inf
    count = jnp.sum(overflowed, axis=axis)
    total, log_share, live = _shares(jnp.where(overflowed, -jnp.inf, z), axis)
    share = jnp.where(live, jnp.exp(log_share), 0)
    mixed = jnp.sum(jnp.where(live, share * (h - log_share), 0), axis=axis)
    own = jnp.sum(jnp.where(overflowed, h, 0), axis=axis)
    total = jnp.where(count > 0, jnp.asarray(jnp.inf, total.dtype), total)
    mixed = jnp.where(count > 0, own, mixed)
    bad = jnp.isnan(total) | jnp.any(jnp.isnan(h), axis=axis) | (count > 1)
    return total, _nan_where(bad, mixed)


def _entropy_plus(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> Any:
    return _entropy_sum(_stacked(a, b), 0)


def _entropy_times(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> Any:
    z = compensated.times(a[0], b[0])
    h = jnp.where(z > -jnp.inf, a[1] + b[1], 0)
    return z, _nan_where(jnp.isnan(z), h)


def _entropy_lift(scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A weight's record (w, 0); a +inf weight's entropy is NaN from the
    start, so that an infinite mass stays apart from one that overflowed
    (the sum of finite weights past the dtype's largest), whose entropy is
    still known."""
    return scores, _nan_where(scores == jnp.inf, jnp.zeros_like(scores))


ENTROPY = Semiring(
    name="entropy",
    plus=_entropy_plus,
    times=_entropy_times,
    sum=_entropy_sum,
    zero=(-np.inf, 0.0),
    one=(0.0, 0.0),
    lift=_entropy_lift,
)
"""The entropy semiring: records (log-mass z, entropy h); see the module doc."""


def _kl_sum(x: tuple[jax.Array, jax.Array, jax.Array], axis: int) -> Any:
    zp, zq, d = x
    total_p, log_p, live_p = _shares(zp, axis)
    total_q, log_q, live_q = _shares(zq, axis)
    # A share of p where q has none makes the divergence +inf.
    safe_q = jnp.where(live_p, jnp.where(live_q, log_q, -jnp.inf), 0)
    share = jnp.where(live_p, jnp.exp(log_p), 0)
    mixed = jnp.sum(jnp.where(live_p, share * (d + log_p - safe_q), 0), axis=axis)
    # q's shares are undefined where its mass is infinite (a +inf weight).
    bad = jnp.isnan(total_p) | jnp.isnan(total_q) | (total_q == jnp.inf)
    bad = bad | jnp.any(jnp.isnan(d), axis=axis)
    return total_p, total_q, _nan_where(bad, mixed)


def _kl_plus(a: Any, b: Any) -> Any:
    return _kl_sum(_stacked(a, b), 0)


def _kl_times(a: Any, b: Any) -> Any:
    zp, zq = compensated.times(a[0], b[0]), compensated.times(a[1], b[1])
    d = jnp.where(zp > -jnp.inf, a[2] + b[2], 0)
    return zp, zq, _nan_where(jnp.isnan(zp) | jnp.isnan(zq), d)


KL = Semiring(
    name="kl",
    plus=_kl_plus,
    times=_kl_times,
    sum=_kl_sum,
    zero=(-np.inf, -np.inf, 0.0),
    one=(0.0, 0.0, 0.0),
)
"""The KL semiring: records (z_p, z_q, KL); see the module doc. It has no
lift: its weights pair two Fsas' scores (`kl_divergence`)."""


def _settled(total: jax.Array, value: jax.Array) -> jax.Array:
    """0 for a set of no paths, NaN for an infinite or NaN mass, else value."""
    value = jnp.where(total == -jnp.inf, jnp.zeros_like(value), value)
    return _nan_where(jnp.isnan(total) | (total == jnp.inf), value)


def _scan_entropy(diff: tuple[jax.Array, jax.Array], aux: tuple[Any, Any]) -> jax.Array:
    """The entropy [] by the level scan over the entropy semiring, from
    LOG weights [A] and final weights [S] (-inf where not final). A +inf
    total with a known entropy is a mass that overflowed, not a +inf
    weight (whose entropy is NaN): the entropy stands."""
    (weight, final), (schedule, arc_mask) = diff, aux
    records = lifted(ENTROPY, weight, arc_mask), lifted(ENTROPY, final, final > -jnp.inf)
    total, h = scores.scan_total(ENTROPY, schedule, *records)
    return _settled(jnp.where(total == jnp.inf, jnp.zeros_like(total), total), h)


def _kernel_value_and_grad(diff: Any, aux: Any) -> tuple[jax.Array, Any]:
    return score_ops.entropy(aux[0], *diff)


_KERNEL = derivatives.KernelOp(_kernel_value_and_grad, jax.value_and_grad(_scan_entropy))
_COMPILED = derivatives.ScoreOp(
    value=lambda diff, aux: _kernel_value_and_grad(diff, aux)[0],
    value_and_grad=lambda diff, aux: derivatives.kernel(_KERNEL, diff, aux),
)


def _entropy_one(fsa: Fsa) -> jax.Array:
    diff = (jnp.asarray(fsa.weight), scores.final_weights(fsa, LOG).astype(fsa.dtype))
    aux = (fsa.schedule, fsa.arc_mask)
    impls: dict[str, Callable[..., Any]] = {
        # The compiled kernel, differentiated as the scan.
        "cpu_kernel": lambda: derivatives.score(_COMPILED, diff, aux),
        "level_scan": lambda: _scan_entropy(diff, aux),
    }
    return routes.dispatch(route_table.ENTROPY, impls, dtype=fsa.dtype, arithmetic=None)


def entropy(fsa: Fsa) -> jax.Array:
    """The Shannon entropy, in nats, of the path distribution
    p(path) = exp(score - log Z) of an Fsa's LOG scores.

    Computed by the level recursion over the entropy semiring (records
    (log-mass, entropy); see `semiring_jax._src.scores.entropy`), whose
    gradient is autodiff's; on the CPU by a compiled kernel that runs
    the same recursion and a backward pass for the gradient (the
    covariance of each arc's use with the path score).
    An Fsa with one path, or with none, has entropy 0.0 (never NaN), and
    so does a single path's set of parallel arcs with -inf weights but
    one. NaN where a weight or final weight that a path reads is NaN, or
    where a +inf weight makes the mass infinite. A path score past the
    dtype's largest value is no +inf weight: the kernel sums in double,
    and the scan still gives the entropy where at most one overflowed
    mass meets others at each ⊕ (one such path: 0.0); where two meet,
    their shares are lost to the dtype and the scan gives NaN.

    Args:
      fsa: an acyclic Fsa, single or batched [B].
    Returns:
      float [] or [B], >= 0.
    Raises:
      ValueError: if `fsa` has a cycle; the message names a state on it.
    Examples:
      >>> import semiring_jax as sj
      >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 0.0)], final=[1])
      >>> print(round(float(sj.entropy(fsa)), 6))  # log 2
      0.693147
      >>> print(float(sj.entropy(sj.linear_fsa([1, 2, 3]))))
      0.0
    """
    scores.check_scorable(fsa, "entropy")
    return _over_batch(_entropy_one)(fsa)


@functools.cache
def _over_batch(fn: Any) -> Any:
    """`fn` mapped over the batch axes of all its Fsa arguments, jitted."""

    @per_device(lambda *fsas: [bool(fsas[0].batch_shape)] * len(fsas))
    def mapped(*fsas: Fsa) -> Any:
        op = fn
        for _ in fsas[0].batch_shape:
            op = jax.vmap(op)
        return op(*fsas)

    return jax.jit(mapped)


def _kl_one(p: Fsa, q: Fsa) -> jax.Array:
    p_arcs, p_finals = lifted(LOG, p.weight, p.arc_mask), lifted(LOG, p.final_weight, p.final_mask)
    q_arcs, q_finals = lifted(LOG, q.weight, p.arc_mask), lifted(LOG, q.final_weight, p.final_mask)
    weight = (p_arcs, q_arcs, jnp.zeros_like(p_arcs))
    final = (p_finals, q_finals, jnp.zeros_like(p_finals))
    total_p, _, divergence = scores.scan_total(KL, p.schedule, weight, final)
    return _settled(total_p, divergence)


def _check_same_arcs(p: Fsa, q: Fsa) -> None:
    for fsa, name in ((p, "p"), (q, "q")):
        if not isinstance(fsa, Fsa):
            raise TypeError(f"kl_divergence: {name} is not an Fsa")
        scores.check_scorable(fsa, "kl_divergence")
    for field in ("src", "dst", "arc_mask", "final_mask"):
        a, b = getattr(p, field), getattr(q, field)
        if np.shape(a) != np.shape(b):
            raise ValueError(
                f"kl_divergence: p and q differ in {field} shape ({np.shape(a)} vs "
                f"{np.shape(b)}); they must share one structure"
            )
        if checks.is_traced(a) or checks.is_traced(b):
            continue
        differ = np.flatnonzero(np.asarray(a).reshape(-1) != np.asarray(b).reshape(-1))
        if differ.size:
            what = "state" if field == "final_mask" else "arc"
            index = np.unravel_index(int(differ[0]), np.shape(a))
            raise ValueError(
                f"kl_divergence: p and q differ in {field} at {what} {index[-1]}"
                f"{f' of entry {index[0]}' if len(index) > 1 else ''}; they must "
                f"share one structure (same arcs, different weights)"
            )


def kl_divergence(p: Fsa, q: Fsa) -> jax.Array:
    """KL(p ‖ q) of the path distributions of two weightings of one Fsa.

    p and q must have the same arcs and final states (`src`, `dst`,
    `arc_mask`, `final_mask`); their `weight` and `final_weight` give two
    LOG distributions over the same paths. Computed by the level
    recursion over the KL semiring (records (z_p, z_q, KL)); gradients
    with respect to both weightings by autodiff through it.

    Args:
      p, q: acyclic Fsas of one structure, single or batched [B].
    Returns:
      float [] or [B], >= 0: 0.0 where p has no path; +inf where q gives
      zero probability to a path that p does not (its gradient is then
      undefined); NaN where a weight either reads is NaN, or where a +inf
      weight makes a mass infinite.
    Raises:
      ValueError: if either has a cycle, or p and q differ in structure
        (naming the field and the arc or state).
    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> p = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 1, 2, 0.0)], final=[1])
      >>> q = p.replace(weight=jnp.log(jnp.array([0.75, 0.25], jnp.float32)))
      >>> print(round(float(sj.kl_divergence(p, q)), 6))  # 0.5 log(2/3) + 0.5 log 2
      0.143841
      >>> print(float(sj.kl_divergence(p, p)))
      0.0
    """
    _check_same_arcs(p, q)
    return _over_batch(_kl_one)(p, q)
