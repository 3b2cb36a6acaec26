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

__all__ = ["KernelOp", "ScoreOp", "kernel", "score", "undefined_to_nan"]

# (diff, aux) -> (value [*batch], gradient: a pytree like diff)
ValueAndGrad = Callable[[Any, Any], tuple[jax.Array, Any]]


class ScoreOp(NamedTuple):
    """An op's value and its (value, gradient); hashable, so build each
    once (e.g. under `functools.cache`) and traces share it."""

    value: Callable[[Any, Any], jax.Array]
    value_and_grad: ValueAndGrad


class KernelOp(NamedTuple):
    """A kernel's (value, gradient) and a differentiable `reference` with
    the same results."""

    kernel: ValueAndGrad
    reference: ValueAndGrad


def _contract(value: jax.Array, grad: Any, tangent: Any) -> jax.Array:
    """Σ over each leaf's trailing axes of gradient * tangent: [*batch]."""
    batch = value.ndim

    def term(g: jax.Array, t: jax.Array) -> jax.Array:
        return jnp.sum(g * t.astype(g.dtype), axis=tuple(range(batch, g.ndim)))

    terms = jax.tree_util.tree_leaves(jax.tree_util.tree_map(term, grad, tangent))
    total: jax.Array = functools.reduce(jnp.add, terms, jnp.zeros_like(value))
    return total


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def score(op: ScoreOp, diff: Any, aux: Any) -> jax.Array:
    """`op.value(diff, aux)`, differentiable in `diff` by `op.value_and_grad`."""
    return op.value(diff, aux)


@score.defjvp
def _score_jvp(op: ScoreOp, primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> Any:
    diff, aux = primals
    value, grad = op.value_and_grad(diff, aux)
    return value, _contract(value, grad, tangents[0])


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
    return out, out_tangent


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
