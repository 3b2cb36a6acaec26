"""`ctc_loss` through the compiled CPU kernel (traced).

The kernel (`kernels/ctc.cc`) runs the forward and backward recursions over
each utterance's CTC band, normalised per frame, and writes the gradient
with respect to `log_probs` directly: no scan, no [T, B, S] gather and
scatter. Batches split between XLA's CPU threads.

The loss is a `jax.custom_vjp` whose backward pass is itself a custom_vjp
whose derivative is the portable scan's (`reference`), so second
derivatives agree with the scan's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src import kernels

__all__ = ["ctc_loss", "usable"]

# What the forward kernel keeps for the backward: α [B, T, 2U + 1] (each
# frame shifted by its maximum) and the per-frame shifts [B, T].
Kept = tuple[jax.Array, jax.Array]

# (log_probs, input_lengths, labels, label_lengths, cotangent [B]) -> ∂ loss·cotangent / ∂ log_probs
Reference = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def usable(log_probs: jax.Array) -> bool:
    """Whether the kernel serves these inputs (trace time)."""
    return (
        jnp.dtype(log_probs.dtype)
        in (
            jnp.dtype(jnp.float32),
            jnp.dtype(jnp.float64),
        )
        and kernels.enabled()
    )


def _forward(
    blank: int,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
) -> tuple[jax.Array, Kept]:
    """(loss [B], (α [B, T, 2U + 1], per-frame shifts [B, T])): each
    frame's scores shifted by its maximum."""
    batch, frames, _ = log_probs.shape
    states = 2 * labels.shape[1] + 1
    dtype = log_probs.dtype
    call = jax.ffi.ffi_call(
        "semiring_jax_ctc_forward",
        (
            jax.ShapeDtypeStruct((batch,), dtype),
            jax.ShapeDtypeStruct((batch, frames, states), dtype),
            jax.ShapeDtypeStruct((batch, frames), dtype),
        ),
        vmap_method="sequential",
    )
    loss, alpha, shift = call(
        log_probs,
        input_lengths.astype(jnp.int32),
        labels.astype(jnp.int32),
        label_lengths.astype(jnp.int32),
        blank=blank,
    )
    return loss, (alpha, shift)


def _backward(
    blank: int,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    kept: Kept,
    loss: jax.Array,
    cotangent: jax.Array,
) -> jax.Array:
    call = jax.ffi.ffi_call(
        "semiring_jax_ctc_backward",
        jax.ShapeDtypeStruct(log_probs.shape, log_probs.dtype),
        vmap_method="sequential",
    )
    return call(
        log_probs,
        input_lengths.astype(jnp.int32),
        labels.astype(jnp.int32),
        label_lengths.astype(jnp.int32),
        *kept,
        loss,
        cotangent.astype(log_probs.dtype),
        blank=blank,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _grad_core(
    blank: int,
    reference: Reference,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    residuals: tuple[Kept, jax.Array],
    cotangent: jax.Array,
) -> jax.Array:
    return _backward(blank, log_probs, input_lengths, labels, label_lengths, *residuals, cotangent)


def _grad_fwd(
    blank: int,
    reference: Reference,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
    residuals: tuple[Kept, jax.Array],
    cotangent: jax.Array,
) -> tuple[jax.Array, tuple[Any, ...]]:
    # Through the custom_vjp again, so an outer derivative sees the rules.
    out = _grad_core(
        blank, reference, log_probs, input_lengths, labels, label_lengths, residuals, cotangent
    )
    return out, (log_probs, input_lengths, labels, label_lengths, residuals, cotangent)


def _grad_bwd(
    blank: int, reference: Reference, saved: tuple[Any, ...], out_cotangent: jax.Array
) -> tuple[Any, ...]:
    log_probs, input_lengths, labels, label_lengths, residuals, cotangent = saved
    _, pullback = jax.vjp(
        lambda lp, c: reference(lp, input_lengths, labels, label_lengths, c), log_probs, cotangent
    )
    log_probs_ct, cotangent_ct = pullback(out_cotangent)
    # The residuals are functions of log_probs whose part the reference's
    # derivative already counts.
    zeros = jax.tree_util.tree_map(jnp.zeros_like, residuals)
    return log_probs_ct, None, None, None, zeros, cotangent_ct


_grad_core.defvjp(_grad_fwd, _grad_bwd)


# The forward pass as seen by an outer derivative (reverse-over-reverse):
# the loss's derivative is the kernel's gradient; α and the shifts flow only
# into `_grad_core`, which gives them zero cotangents.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _forward_differentiable(
    blank: int,
    reference: Reference,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
) -> tuple[jax.Array, Kept]:
    return _forward(blank, log_probs, input_lengths, labels, label_lengths)


def _forward_differentiable_fwd(
    blank: int,
    reference: Reference,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
) -> tuple[tuple[jax.Array, Kept], tuple[Any, ...]]:
    out = _forward_differentiable(blank, reference, log_probs, input_lengths, labels, label_lengths)
    return out, (log_probs, input_lengths, labels, label_lengths, out)


def _forward_differentiable_bwd(
    blank: int,
    reference: Reference,
    saved: tuple[Any, ...],
    cotangents: tuple[jax.Array, Any],
) -> tuple[Any, ...]:
    log_probs, input_lengths, labels, label_lengths, (loss, kept) = saved
    grad = _grad_core(
        blank,
        reference,
        log_probs,
        input_lengths,
        labels,
        label_lengths,
        (kept, loss),
        cotangents[0],
    )
    return grad, None, None, None


_forward_differentiable.defvjp(_forward_differentiable_fwd, _forward_differentiable_bwd)


def ctc_loss(
    blank: int,
    reference: Reference,
    log_probs: jax.Array,
    input_lengths: jax.Array,
    labels: jax.Array,
    label_lengths: jax.Array,
) -> jax.Array:
    """The CTC loss [B] by the kernel (+inf where infeasible, never < 0);
    its gradient is the kernel's, second derivatives `reference`'s."""
    return _forward_differentiable(
        blank, reference, log_probs, input_lengths, labels, label_lengths
    )[0]
