"""`ctc_loss` through the compiled CPU kernel (traced).

The kernel (`kernels/ctc.cc`) runs the forward and backward recursions over
each utterance's CTC band, normalised per frame, and writes the gradient
with respect to `log_probs` directly: no scan, no [T, B, S] gather and
scatter. Batches split between XLA's CPU threads.

Derivatives come from `kernel_vjp`: the gradient is the backward kernel,
and its own derivative the portable scan's gradient (`reference`), so
second derivatives agree with the scan's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from semiring_jax._src import kernel_vjp, kernels

__all__ = ["ctc_loss", "usable"]

# What the forward kernel keeps for the backward: α [B, T, 2U + 1] (each
# frame shifted by its maximum) and the per-frame shifts [B, T].
Kept = tuple[jax.Array, jax.Array]

# (input_lengths [B], labels [B, U], label_lengths [B]), int32.
Lengths = tuple[jax.Array, jax.Array, jax.Array]

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
    frame's scores shifted by its maximum. Lengths and labels are int32."""
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
    loss, alpha, shift = call(log_probs, input_lengths, labels, label_lengths, blank=blank)
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
        input_lengths,
        labels,
        label_lengths,
        *kept,
        loss,
        cotangent.astype(log_probs.dtype),
        blank=blank,
    )


@functools.cache
def _op(blank: int, reference: Reference) -> kernel_vjp.KernelOp:
    """The kernel as a `KernelOp` with diff = log_probs and aux = (input
    lengths, labels, label lengths); cached, so that traces share one
    static argument."""

    def forward(log_probs: jax.Array, aux: Lengths) -> tuple[jax.Array, Kept]:
        return _forward(blank, log_probs, *aux)

    def backward(
        log_probs: jax.Array,
        aux: Lengths,
        loss: jax.Array,
        kept: Kept,
        cotangent: jax.Array,
    ) -> jax.Array:
        return _backward(blank, log_probs, *aux, kept, loss, cotangent)

    def scan_gradient(log_probs: jax.Array, aux: Lengths, cotangent: jax.Array) -> jax.Array:
        return reference(log_probs, *aux, cotangent)

    return kernel_vjp.KernelOp(forward, backward, scan_gradient)


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
    aux: Lengths = (
        input_lengths.astype(jnp.int32),
        labels.astype(jnp.int32),
        label_lengths.astype(jnp.int32),
    )
    return kernel_vjp.value(_op(blank, reference), log_probs, aux)
