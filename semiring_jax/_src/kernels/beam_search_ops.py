"""The beam search of `intersect_dense_pruned` through the compiled CPU kernel.

The kernel (`kernels/beam_search.cc`) makes the traced search's choices
(`decoding/beam_search.py`) by token passing: per frame it reads only the
active states' arcs and keeps each destination's best in a table whose
touched entries it lists, where the traced search pays for [S] segment
reductions and a top-K over every edge slot. An utterance whose candidates
hold a NaN or +inf is flagged, and the caller searches it with the traced
search, which keeps NaN candidates visible. Not differentiable (the search
only chooses states); batches split between XLA's CPU threads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from semiring_jax._src.kernels import loader

__all__ = ["beam_search", "usable"]


def usable(emissions: jax.Array) -> bool:
    """Whether the kernel serves these inputs."""
    return loader.serves(emissions.dtype)


@functools.partial(jax.jit, static_argnames=("search_beam", "slots", "expand", "min_active"))
def beam_search(
    out_start: jax.Array,
    dst: jax.Array,
    label: jax.Array,
    weight: jax.Array,
    emissions: jax.Array,
    lengths: jax.Array,
    *,
    search_beam: float,
    slots: int,
    expand: int,
    min_active: int,
) -> tuple[jax.Array, jax.Array]:
    """(active int32 [B, T + 1, K], flagged int32 [B]) for emissions
    [B, T, V] and a `SearchGraph`'s arrays (weight [A' + 1] in the
    emissions' dtype): as `decoding.beam_search.beam_search`, except where
    flagged (a NaN or +inf candidate), whose rows are to be searched again."""
    batch, frames, _ = emissions.shape
    call = jax.ffi.ffi_call(
        loader.target("beam_search", emissions.dtype),
        (
            jax.ShapeDtypeStruct((batch, frames + 1, slots), jnp.int32),
            jax.ShapeDtypeStruct((batch,), jnp.int32),
        ),
        vmap_method="sequential",
    )
    int32 = lambda x: jnp.asarray(x, jnp.int32)
    active, flagged = call(
        int32(out_start),
        int32(dst),
        int32(label),
        weight,
        emissions,
        int32(lengths),
        search_beam=float(search_beam),
        slots=slots,
        expand=expand,
        min_active=min_active,
    )
    return active, flagged
