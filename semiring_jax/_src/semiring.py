"""Semirings: the (⊕, ⊗, 0̄, 1̄) structures that score recursions run in.

A `Semiring` is a frozen record of pure functions. It is registered as a
static pytree, so it can be passed to `jax.jit`-ed functions as an ordinary
argument. Functions hash by identity: build each semiring once, at module
level, or every fresh instance costs a recompile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from semiring_jax._src import compensated

__all__ = ["LOG", "TROPICAL", "Semiring", "semiring"]


@dataclasses.dataclass(frozen=True)
class Semiring:
    """A semiring, given by its operations.

    Build one rather than subclass it (pytree registration ignores subclasses).

    Fsas are built with scores (LOG/TROPICAL weights). For a semiring whose
    weights mean something else (e.g. the real one, zero 0.0), build the
    structure with the right final states and give the weights in its
    domain with `fsa.replace(weight=w, final_weight=f)`; the score ops read
    the semiring's `zero` on padding and at non-final states (`final_mask`
    False), whatever is stored there.

    Attributes:
        name: a short name, used in messages and by `sj.semiring`.
        plus: ⊕, elementwise on two arrays.
        times: ⊗, elementwise on two arrays.
        sum: ⊕-reduction, `sum(x, axis)`; the reduction of an empty axis is `zero`.
        zero: the identity of ⊕ and annihilator of ⊗ (a Python float).
        one: the identity of ⊗ (a Python float).
        sum_grad: optional; `sum_grad(x, total, axis)`, given `total =
            sum(x, axis)`, is the derivative of `sum(x, axis)` with respect
            to each entry of `x` (same shape as `x`); it must be all zeros
            along a slice whose entries are all `zero`. Only for semirings
            whose ⊗ is addition (log-domain semirings): when it is given,
            `tot_score` gets a fast custom backward pass built on it and
            `arc_posteriors` is defined by it; otherwise gradients come from
            autodiff through the recursion.
        argsum: optional, for selective semirings (⊕ returns one of its
            arguments, as max does): `argsum(x, total, axis)`, given `total =
            sum(x, axis)`, is the int32 index along `axis` of the entry that
            `sum` returns (the tie rule). With it (and ⊗ addition), the
            gradient of `tot_score` is the indicator of one path, found by
            tracing back the saved choices instead of a backward recursion.

    Examples:
        >>> import jax.numpy as jnp
        >>> import semiring_jax as sj
        >>> real = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply,
        ...                    sum=jnp.sum, zero=0.0, one=1.0)
        >>> print(float(real.sum(jnp.array([0.5, 0.25]), axis=0)))
        0.75
        >>> fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (0, 2, 2, 0.0)], final=[1, 2])
        >>> fsa = fsa.replace(weight=jnp.array([0.5, 0.25]),
        ...                   final_weight=jnp.array([0.0, 1.0, 2.0]))  # real values
        >>> print(float(sj.tot_score(fsa, real)))  # 0.5 * 1 + 0.25 * 2
        1.0
    """

    name: str
    plus: Callable[[jax.typing.ArrayLike, jax.typing.ArrayLike], jax.Array]
    times: Callable[[jax.typing.ArrayLike, jax.typing.ArrayLike], jax.Array]
    sum: Callable[..., jax.Array]
    zero: float
    one: float
    sum_grad: Callable[..., jax.Array] | None = None
    argsum: Callable[..., jax.Array] | None = None

    def __repr__(self) -> str:
        return f"Semiring({self.name!r})"


jax.tree_util.register_static(Semiring)


def _shifted_exp(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """exp(x - shift) and the shift, the max along `axis` (0 where that is
    not finite, so an all -inf slice gives zeros, not NaN). The shift
    carries no gradient: results do not depend on it."""
    shift = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))
    return jnp.exp(x - shift), shift


def _log_sum(x: jax.typing.ArrayLike, axis: int) -> jax.Array:
    exps, shift = _shifted_exp(jnp.asarray(x), axis)
    total = jnp.sum(exps, axis=axis, keepdims=True)
    return jnp.squeeze(compensated.log_total(total) + shift, axis=axis)


def _log_plus(a: jax.typing.ArrayLike, b: jax.typing.ArrayLike) -> jax.Array:
    # jnp.logaddexp computes (-inf) - (-inf) = NaN internally and selects it
    # away; this form never makes a NaN, so jax_debug_nans stays quiet.
    a, b = jnp.asarray(a), jnp.asarray(b)
    shift = jax.lax.stop_gradient(jnp.maximum(a, b))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros_like(shift))
    return compensated.log_total(jnp.exp(a - shift) + jnp.exp(b - shift)) + shift


def _log_sum_grad(x: jax.typing.ArrayLike, total: jax.typing.ArrayLike, axis: int) -> jax.Array:
    # softmax exp(x - total), as exp(x - shift) * exp(shift - total): the
    # first factor is the one `_log_sum` made, so XLA computes it once. A
    # slice whose total is -inf gets weight 0, not NaN.
    exps, shift = _shifted_exp(jnp.asarray(x), axis)
    total = jnp.expand_dims(total, axis)
    found = jnp.isfinite(total)
    scale = jnp.where(found, jnp.exp(shift - jnp.where(found, total, 0)), 0)
    return (exps * scale).astype(exps.dtype)


def _max_sum(x: jax.typing.ArrayLike, axis: int) -> jax.Array:
    return jnp.max(x, axis=axis, initial=-jnp.inf)


def _max_argsum(x: jax.typing.ArrayLike, total: jax.typing.ArrayLike, axis: int) -> jax.Array:
    # Tie rule: the first maximal entry along `axis` wins. A min over
    # positions is cheaper than argmax on CPU.
    x = jnp.asarray(x)
    positions = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis % x.ndim)
    return jnp.min(
        jnp.where(x == jnp.expand_dims(total, axis), positions, x.shape[axis]), axis=axis
    )


def _max_sum_grad(x: jax.typing.ArrayLike, total: jax.typing.ArrayLike, axis: int) -> jax.Array:
    # The one-hot of `_max_argsum`; zero where every entry is -inf.
    x = jnp.asarray(x)
    total = jnp.expand_dims(total, axis)
    positions = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis % x.ndim)
    first = jnp.expand_dims(_max_argsum(x, jnp.squeeze(total, axis), axis), axis)
    return ((positions == first) & (total > -jnp.inf)).astype(x.dtype)


LOG = Semiring(
    name="log",
    plus=_log_plus,
    times=compensated.times,
    sum=_log_sum,
    zero=-float("inf"),
    one=0.0,
    sum_grad=_log_sum_grad,
)
"""The log semiring: ⊕ = logaddexp, ⊗ = +, 0̄ = -inf, 1̄ = 0.

⊗ keeps the zero absorbing: -inf ⊗ +inf = -inf (not NaN), so a +inf weight
shows as +inf wherever a path uses it. NaN in any operand gives NaN."""

TROPICAL = Semiring(
    name="tropical",
    plus=jnp.maximum,
    times=compensated.times,
    sum=_max_sum,
    zero=-float("inf"),
    one=0.0,
    sum_grad=_max_sum_grad,
    argsum=_max_argsum,
)
"""The tropical (max, +) semiring: 0̄ = -inf, 1̄ = 0; first maximum wins ties.

⊗ is LOG's (-inf ⊗ +inf = -inf); ⊕ = max propagates NaN."""

_BY_NAME = {"log": LOG, "tropical": TROPICAL}


def semiring(name: str) -> Semiring:
    """Looks up a built-in semiring by name.

    Args:
        name: "log" or "tropical" (case-insensitive).
    Returns:
        The module-level `Semiring` instance (`sj.LOG` or `sj.TROPICAL`).
    Raises:
        ValueError: if `name` is not a known semiring.
    Examples:
        >>> import semiring_jax as sj
        >>> sj.semiring("tropical") is sj.TROPICAL
        True
    """
    if not isinstance(name, str) or name.lower() not in _BY_NAME:
        raise ValueError(f"semiring: unknown semiring {name!r}; expected one of {sorted(_BY_NAME)}")
    return _BY_NAME[name.lower()]
