"""Derivatives of ops computed by compiled kernels (traced).

A kernel op (`KernelOp`) has a forward kernel, `(diff, aux) -> (value,
kept)`, and a backward kernel, `(diff, aux, value, kept, cotangent) ->` the
cotangent of `diff`; JAX cannot differentiate either (they are FFI calls).
`value` and `gradient` wire them into `jax.custom_vjp`s: the value's
derivative is the backward kernel, and the backward kernel's own derivative
is that of `reference`, a differentiable JAX function `(diff, aux,
cotangent) ->` the same gradient (the portable recursion's), so
reverse-over-reverse gives what the portable path gives.

`diff` holds the float inputs to differentiate, `aux` everything else
(index tables, lengths): it gets no cotangent. `kept` and `value` flow only
into the backward kernel, whose derivative, taken through `reference` with
respect to `diff` directly, already counts their part: they get zero
cotangents.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["KernelOp", "gradient", "value"]


class KernelOp(NamedTuple):
    """The three functions of an op (hashable: a static argument)."""

    forward: Callable[[Any, Any], tuple[jax.Array, Any]]
    backward: Callable[[Any, Any, jax.Array, Any, jax.Array], Any]
    reference: Callable[[Any, Any, jax.Array], Any]


def value(op: KernelOp, diff: Any, aux: Any) -> jax.Array:
    """The op's value, differentiable with respect to `diff`."""
    return _forward(op, diff, aux)[0]


def gradient(op: KernelOp, diff: Any, aux: Any, cotangent: jax.Array) -> Any:
    """The cotangent of `diff` for the value's `cotangent`, by the kernels;
    itself differentiable (through `op.reference`)."""
    out, kept = _forward(op, diff, aux)
    return _gradient(op, diff, aux, out, kept, cotangent)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _forward(op: KernelOp, diff: Any, aux: Any) -> tuple[jax.Array, Any]:
    return op.forward(diff, aux)


def _forward_fwd(op: KernelOp, diff: Any, aux: Any) -> tuple[tuple[jax.Array, Any], Any]:
    # The primal through the custom_vjp again, so that an outer derivative
    # of this rule sees the rules, not the FFI call.
    out = _forward(op, diff, aux)
    return out, (diff, aux, out)


def _forward_bwd(op: KernelOp, saved: Any, cotangents: tuple[jax.Array, Any]) -> tuple[Any, None]:
    diff, aux, (out, kept) = saved
    return _gradient(op, diff, aux, out, kept, cotangents[0]), None


_forward.defvjp(_forward_fwd, _forward_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gradient(
    op: KernelOp, diff: Any, aux: Any, out: jax.Array, kept: Any, cotangent: jax.Array
) -> Any:
    return op.backward(diff, aux, out, kept, cotangent)


def _gradient_fwd(
    op: KernelOp, diff: Any, aux: Any, out: jax.Array, kept: Any, cotangent: jax.Array
) -> tuple[Any, Any]:
    grads = _gradient(op, diff, aux, out, kept, cotangent)  # see _forward_fwd
    return grads, (diff, aux, out, kept, cotangent)


def _zeros(tree: Any) -> Any:
    """Zero cotangents for float leaves, None for integer ones."""
    return jax.tree_util.tree_map(
        lambda x: jnp.zeros_like(x) if jnp.issubdtype(x.dtype, jnp.floating) else None, tree
    )


def _gradient_bwd(op: KernelOp, saved: Any, grads_cotangent: Any) -> tuple[Any, ...]:
    diff, aux, out, kept, cotangent = saved
    _, pullback = jax.vjp(lambda d, c: op.reference(d, aux, c), diff, cotangent)
    diff_cotangent, cotangent_cotangent = pullback(grads_cotangent)
    return diff_cotangent, None, _zeros(out), _zeros(kept), cotangent_cotangent


_gradient.defvjp(_gradient_fwd, _gradient_bwd)
