"""The transducer grid's log-likelihood and move posteriors through the
compiled CPU kernel (traced).

The kernel (`kernels/rnnt.cc`) runs the forward (and, for the posteriors,
the backward) recursion over each utterance's band, a diagonal at a time
and eight positions per vector, in one call: no scan steps, no skewed
[T + U + 1, B, W] arrays in XLA. Batches split between XLA's CPU threads.

The posteriors call is a `derivatives.kernel`: its own derivative is the
portable scan's (`reference`), so second derivatives agree with the scan's.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from semiring_jax._src.core import derivatives
from semiring_jax._src.kernels import loader

__all__ = ["log_likelihood", "log_likelihood_and_posteriors"]

# (starts [B, T + 1], frame_lengths [B], label_lengths [B]) int32, then
# anything else the reference reads (the kernel reads these three).
Aux = tuple[Any, ...]
# (blank, emit) move log-probs [B, T, W].
Moves = tuple[jax.Array, jax.Array]


def _int32(aux: Aux) -> tuple[jax.Array, jax.Array, jax.Array]:
    starts, frame_lengths, label_lengths = (jnp.asarray(x, jnp.int32) for x in aux[:3])
    return starts, frame_lengths, label_lengths


def log_likelihood(moves: Moves, aux: Aux, num_positions: int) -> jax.Array:
    """log P [B] by the forward kernel (-inf without a path), for a grid of
    U + 1 = `num_positions` label positions; not differentiable by JAX
    (callers differentiate through the posteriors)."""
    blank_lp, emit_lp = moves
    call = loader.ffi(
        "rnnt_loss",
        blank_lp.dtype,
        jax.ShapeDtypeStruct(blank_lp.shape[:1], blank_lp.dtype),
        vmap_method="sequential",
    )
    return call(blank_lp, emit_lp.astype(blank_lp.dtype), *_int32(aux), num_positions=num_positions)


@functools.cache
def _op(reference: derivatives.ValueAndGrad, num_positions: int) -> derivatives.KernelOp:
    """The posteriors kernel and its reference; cached, so that traces share
    one static argument."""

    def kernel(moves: Moves, aux: Aux) -> tuple[jax.Array, Moves]:
        blank_lp, emit_lp = moves
        shape = jax.ShapeDtypeStruct(blank_lp.shape, blank_lp.dtype)
        call = loader.ffi(
            "rnnt_grad",
            blank_lp.dtype,
            (jax.ShapeDtypeStruct(blank_lp.shape[:1], blank_lp.dtype), shape, shape),
            vmap_method="sequential",
        )
        log_p, blank_post, emit_post = call(
            blank_lp, emit_lp.astype(blank_lp.dtype), *_int32(aux), num_positions=num_positions
        )
        return log_p, (blank_post, emit_post)

    return derivatives.KernelOp(kernel, reference)


def log_likelihood_and_posteriors(
    reference: derivatives.ValueAndGrad, moves: Moves, aux: Aux, num_positions: int
) -> tuple[jax.Array, Moves]:
    """(log P [B], the posteriors of the blank and the label moves
    [B, T, W]: ∂ log P / ∂ moves) by the kernel; differentiable through
    `reference`, the scan's (log P, posteriors)."""
    op = _op(reference, num_positions)
    result: tuple[jax.Array, Moves] = derivatives.kernel(op, moves, aux)
    return result
