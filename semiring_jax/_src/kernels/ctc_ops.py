"""The CTC log-likelihood and its gradient through the compiled CPU kernel (traced).

The kernel (`kernels/ctc.cc`) runs the forward (and, for the gradient, the
backward) recursion over each utterance's CTC band, normalised per frame,
and writes the gradient with respect to `log_probs` directly: no scan, no
[T, B, S] gather and scatter. Batches split between XLA's CPU threads.

The gradient call is a `derivatives.kernel`: its own derivative is the
portable scan's (`reference`), so second derivatives agree with the scan's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from semiring_jax._src.core import derivatives
from semiring_jax._src.kernels import loader

__all__ = ["log_likelihood", "log_likelihood_and_grad"]

# (input_lengths [B], labels [B, U], label_lengths [B]), int32.
Lengths = tuple[jax.Array, jax.Array, jax.Array]


def _int32(aux: Lengths) -> Lengths:
    input_lengths, labels, label_lengths = (jnp.asarray(x, jnp.int32) for x in aux)
    return input_lengths, labels, label_lengths


def log_likelihood(blank: int, log_probs: jax.Array, aux: Lengths) -> jax.Array:
    """log Z [B] by the forward kernel (-inf where infeasible); not
    differentiable by JAX (callers wrap it in `derivatives.score`)."""
    call = loader.ffi(
        "ctc_loss",
        log_probs.dtype,
        jax.ShapeDtypeStruct(log_probs.shape[:1], log_probs.dtype),
        vmap_method="sequential",
    )
    return call(log_probs, *_int32(aux), blank=blank)


@functools.cache
def _op(blank: int, reference: derivatives.ValueAndGrad) -> derivatives.KernelOp:
    """The gradient kernel and its reference; cached, so that traces share
    one static argument."""

    def kernel(log_probs: jax.Array, aux: Lengths) -> tuple[jax.Array, jax.Array]:
        call = loader.ffi(
            "ctc_grad",
            log_probs.dtype,
            (
                jax.ShapeDtypeStruct(log_probs.shape[:1], log_probs.dtype),
                jax.ShapeDtypeStruct(log_probs.shape, log_probs.dtype),
            ),
            vmap_method="sequential",
        )
        log_z, grad = call(log_probs, *_int32(aux), blank=blank)
        return log_z, grad

    return derivatives.KernelOp(kernel, reference)


def log_likelihood_and_grad(
    blank: int, reference: derivatives.ValueAndGrad, log_probs: jax.Array, aux: Lengths
) -> tuple[jax.Array, jax.Array]:
    """(log Z [B], ∂ log Z / ∂ log_probs [B, T, V]: the per-frame token
    posteriors) by the kernel; differentiable through `reference`, the
    scan's (log Z, gradient)."""
    result: tuple[jax.Array, jax.Array] = derivatives.kernel(_op(blank, reference), log_probs, aux)
    return result
