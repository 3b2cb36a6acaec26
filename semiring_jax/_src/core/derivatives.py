"""Derivatives of the score ops: gradients as forward-mode rules (traced).

A score op has a value and a gradient that a backward recursion computes
far more cheaply than autodiff through the forward one (posteriors for
LOG, the best path for TROPICAL). `score` wires them into a
`jax.custom_jvp` whose tangent is ⟨gradient, input tangent⟩: forward mode
(`jax.jvp`, `jax.jacfwd`, `jax.hessian`) works, and reverse mode
(`jax.grad`) comes from JAX transposing that linear map, so the gradient
is computed once, as the value's, whichever way the op is differentiated.

Compiled kernels cannot be differentiated by JAX at all. `kernel` makes a
kernel's (value, gradient) a `jax.custom_jvp` too, whose derivative is
that of a `reference`: a differentiable JAX function giving the same
results (the portable scan's). So second derivatives (`jax.hessian`,
`jax.jacrev(jax.grad(...))`) agree on every path.

`diff` holds the float inputs to differentiate, `aux` everything else
(index tables, lengths): it gets no tangent. The value has shape
`batch`, and each gradient leaf the shape of its `diff` leaf, [*batch,
...]: the tangent of the value is the sum over the trailing axes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from semiring_jax._src.core.sharding import varying_like

__all__ = [
    "KernelOp",
    "ScoreOp",
    "contract",
    "every_grad",
    "keep_wanted",
    "kernel",
    "nan_spread",
    "score",
    "undefined_to_nan",
]

# (diff, aux) -> (value [*batch], gradient: a pytree like diff)
ValueAndGrad = Callable[[Any, Any], tuple[jax.Array, Any]]
# (diff, aux, wanted) -> (value, gradient leaves wanted, None for the others)
ValueAndSomeGrads = Callable[[Any, Any, tuple[bool, ...]], tuple[jax.Array, Any]]


class ScoreOp(NamedTuple):
    """An op's value and its (value, gradient); hashable, so build each
    once (e.g. under `functools.cache`) and traces share it.

    `value_and_some_grads(diff, aux, wanted)`, where given, computes only
    the gradient leaves that `wanted` (a tuple of bools, one per leaf of a
    tuple `diff`) marks, the others None: `score` calls it with the leaves
    the caller differentiates, so that an op skips work for the rest (e.g.
    the weights' gradient when only the emissions are trained)."""

    value: Callable[[Any, Any], jax.Array]
    value_and_grad: ValueAndGrad
    value_and_some_grads: ValueAndSomeGrads | None = None


def keep_wanted(grads: Any, wanted: tuple[bool, ...]) -> tuple[jax.Array | None, ...]:
    """The gradient leaves `wanted` marks, None for the others."""
    return tuple(g if w else None for g, w in zip(grads, wanted, strict=True))


def every_grad(value_and_some_grads: ValueAndSomeGrads) -> ValueAndGrad:
    """A `ScoreOp.value_and_grad` from its `value_and_some_grads`, every
    gradient leaf wanted."""
    return lambda diff, aux: value_and_some_grads(diff, aux, (True,) * len(diff))


class KernelOp(NamedTuple):
    """A kernel's (value, gradient) and a differentiable `reference` with
    the same results."""

    kernel: ValueAndGrad
    reference: ValueAndGrad


def _is_zero(tangent: Any) -> bool:
    return isinstance(tangent, SymbolicZero)


def contract(value: jax.Array, grad: Any, tangent: Any) -> jax.Array:
    """Σ over each leaf's trailing axes of gradient * tangent: [*batch];
    symbolic zero tangents (and their None gradients) add nothing."""
    batch = value.ndim

    def term(t: Any, g: jax.Array | None) -> jax.Array | None:
        if _is_zero(t) or g is None:
            return None
        return jnp.sum(g * t.astype(g.dtype), axis=tuple(range(batch, g.ndim)))

    terms = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(term, tangent, grad, is_leaf=lambda x: _is_zero(x) or x is None)
    )
    total: jax.Array = functools.reduce(jnp.add, terms, jnp.zeros_like(value))
    # A tangent must be as varying as its primal inside `jax.shard_map`,
    # though the terms (of replicated inputs, or none) may be less so.
    return varying_like(total, value)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def score(op: ScoreOp, diff: Any, aux: Any) -> jax.Array:
    """`op.value(diff, aux)`, differentiable in `diff` by `op.value_and_grad`."""
    return op.value(diff, aux)


def _score_jvp(op: ScoreOp, primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> Any:
    diff, aux = primals
    tangent = tangents[0]
    if op.value_and_some_grads is not None and isinstance(tangent, tuple):
        wanted = tuple(not _is_zero(t) for t in tangent)
        value, grad = op.value_and_some_grads(diff, aux, wanted)
    else:
        value, grad = op.value_and_grad(diff, aux)
    return value, contract(value, grad, tangent)


# Symbolic zeros: the tangents of the inputs nobody differentiates arrive
# as `SymbolicZero`, so their gradients need not be computed.
score.defjvp(_score_jvp, symbolic_zeros=True)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def kernel(op: KernelOp, diff: Any, aux: Any) -> tuple[jax.Array, Any]:
    """`op.kernel(diff, aux)`: (value, gradient), differentiable in `diff`
    through `op.reference`."""
    return op.kernel(diff, aux)


@kernel.defjvp
def _kernel_jvp(op: KernelOp, primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> Any:
    diff, aux = primals
    out = op.kernel(diff, aux)
    _, out_tangent = jax.jvp(lambda d: op.reference(d, aux), (diff,), (tangents[0],))
    # Inside `jax.shard_map` each tangent must vary as its output does (the
    # kernel's outputs vary per device; the reference's may be typed less).
    return out, jax.tree.map(varying_like, out_tangent, out)


def undefined_to_nan(value: jax.Array, grad: Any, *, inf_undefined: bool) -> Any:
    """The gradient, NaN wherever the value is NaN (NaN in, NaN out), and
    with `inf_undefined` (LOG: the posteriors of a +inf score) where it is
    +inf; every leaf entry of that batch entry, padding included, so that
    all paths agree entry for entry."""
    bad = jnp.isnan(value)
    if inf_undefined:
        bad = bad | (value == jnp.inf)

    def mask(g: jax.Array) -> jax.Array:
        where = jnp.reshape(bad, bad.shape + (1,) * (g.ndim - bad.ndim))
        return jnp.where(where, jnp.nan, g)

    return jax.tree_util.tree_map(mask, grad)


def nan_spread(value: jax.Array, *inputs: jax.Array) -> jax.Array:
    """`value` [...] unchanged, whose derivative where it is NaN is NaN in
    every entry of `inputs` (the weights it is computed from), as the score
    ops' is: where a derivative is a path's indicator (a gather, a
    trace-back, `top_k`'s), a NaN read on the path would otherwise have a
    finite derivative, or 0 where the NaN was set as a constant.

    The tangent of a NaN entry gains NaN · Σ (every input's tangent), as
    the KBEST kernel's rule; elsewhere nothing. So, as for the score ops, a
    reverse-mode gradient through any NaN entry is NaN in every input.
    """
    bad = jnp.isnan(jax.lax.stop_gradient(value))
    factor = jnp.where(bad, jnp.nan, 0).astype(value.dtype)
    spread = functools.reduce(jnp.add, [jnp.sum(x).astype(value.dtype) for x in inputs])
    # Where the value is defined, the factor is 0 as well as the first
    # branch's cotangent: no 0 · NaN reaches the inputs' gradients (the
    # spread's value may be NaN or inf; only a NaN entry shows it).
    return jnp.where(bad, value + factor * spread, value)
