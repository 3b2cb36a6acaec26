"""The arc-map machinery every structural op shares: an op works out the
result's structure on the host, with the *source* of every result weight
among its operands' arc and final weights, and these helpers gather the
weights in JAX (`from_sources`), so any score of the result
differentiates back to the operands. A new op computes a
`host/structure.Result` and calls `assemble_operands` (or `apply_map`
for one operand, batched entry by entry).

Structural algorithms whose weights stay differentiable.

Each op works out the result's structure on the host (`structural/host/structure.py`),
together with the source of every result weight among the operands' arc and
final weights, and then gathers the weights in JAX. So the structure must be
concrete, but the weights may be traced: `jax.grad` of any score of the
result flows back to the operands' `weight` and `final_weight`. A batched
operand is processed entry by entry and the results are stacked.

Weights are scores (log domain) in any semiring whose ⊗ is addition: new
epsilon arcs weigh 0 (one). Which states are final is structure too
(`final_mask`, concrete), never read from `final_weight`, so a traced final
weight keeps the final states and differentiates like an arc weight; a
result's non-final states store -inf (zero).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import checks
from semiring_jax._src.core.batch import batch_entries, check_alike, stack
from semiring_jax._src.core.fsa import Fsa, assemble
from semiring_jax._src.core.host import build
from semiring_jax._src.structural.host import structure

__all__ = [
    "apply_map",
    "assemble_operands",
    "check_operands",
    "from_sources",
    "map_entries",
    "parts_of",
    "placeholder",
    "trimmed_fsa",
    "weights_on_host",
]


def parts_of(fsa: Fsa, fn: str) -> structure.Parts:
    """An unbatched Fsa's concrete structure: real arcs, and which states are final."""
    real = checks.concrete(fsa.arc_mask, "arc_mask", fn).astype(bool)
    pick = lambda name: checks.concrete(getattr(fsa, name), name, fn)[real].astype(np.int64)
    # Final states are structure, recorded apart from the (maybe traced)
    # final weights, as arcs are apart from theirs.
    is_final = checks.concrete(fsa.final_mask, "final_mask", fn).astype(bool)
    return structure.Parts(
        fsa.num_states,
        pick("src"),
        pick("dst"),
        pick("ilabel"),
        pick("olabel"),
        is_final,
        fsa.is_acceptor,
    )


def placeholder(
    num_states: int,
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    ilabel: npt.ArrayLike,
    olabel: npt.ArrayLike,
    dtype: npt.DTypeLike,
    is_acceptor: bool,
    known_levels: np.ndarray | None = None,
    *,
    is_final: npt.ArrayLike | None = None,
    defer: bool = False,
) -> Fsa:
    """An Fsa of the given structure whose weights are still to be set
    (arcs 0, final -inf), for `replace(weight=..., final_weight=...)`;
    `is_final` (bool [S]) names its final states (none by default: replacing
    `final_weight` does not make a state final); `known_levels` and `defer`
    as in `fsa.assemble`."""
    as32 = lambda values: np.asarray(values, np.int32)
    src = as32(src)
    final_mask = (
        np.zeros(num_states, bool) if is_final is None else np.asarray(is_final, bool).copy()
    )
    return assemble(
        build.ArcArrays(
            num_states,
            src,
            as32(dst),
            as32(ilabel),
            as32(olabel),
            np.zeros(len(src), dtype),
            np.full(num_states, -np.inf, dtype),
            is_acceptor,
            final_mask,
        ),
        known_levels=known_levels,
        defer=defer,
    )


def map_entries(op: Callable[..., Fsa], *batches: Fsa, fn: str) -> Fsa:
    """`op` on the entries of batched operands (batch_shape (B,)), its
    results stacked. The operands' entries and `op`'s results are unbuilt
    (structure and weights only), so the only tables built are the batch's,
    in that one `stack`."""
    entries = zip(*(batch_entries(batch, fn) for batch in batches))
    return stack([op(*entry) for entry in entries])


def from_sources(result: structure.Result, sources: Any, zero: int) -> Fsa:
    """The result Fsa; each weight is the product (sum of scores) of its
    sources' entries (gathered in numpy if `sources` is, else in JAX); a
    state is final where no source is `zero` (the index of ZERO among the
    sources)."""
    xp: Any = np if isinstance(sources, np.ndarray) else jnp
    combine = lambda index: sources[index] if index.ndim == 1 else xp.sum(sources[index], axis=-1)
    is_final = result.final_source != zero
    if is_final.ndim == 2:  # a pair: final in both operands
        is_final = is_final.all(axis=1)
    return placeholder(
        result.num_states,
        result.src,
        result.dst,
        result.ilabel,
        result.olabel,
        sources.dtype,
        result.is_acceptor,
        is_final=is_final,
        defer=True,
    ).replace(weight=combine(result.arc_source), final_weight=combine(result.final_source))


def assemble_operands(operands: Sequence[Fsa], result: structure.Result) -> Fsa:
    """The result Fsa, its weights gathered from the operands' in JAX where
    one is traced (so that gradients flow), else in numpy (no gradient to
    carry, and no device round trip)."""
    weights = [leaf for fsa in operands for leaf in (fsa.weight, fsa.final_weight)]
    xp: Any = jnp if any(checks.is_traced(leaf) for leaf in weights) else np
    pieces = []
    for fsa in operands:
        real = np.flatnonzero(np.asarray(fsa.arc_mask))
        pieces += [xp.asarray(fsa.weight)[real], xp.asarray(fsa.final_weight)]
    dtype = operands[0].dtype
    sources = xp.concatenate([*pieces, xp.array([-np.inf, 0.0], dtype)])
    return from_sources(result, sources, zero=sources.shape[0] - 2)


def trimmed_fsa(
    num_states: int,
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    ilabel: npt.ArrayLike,
    olabel: npt.ArrayLike,
    is_final: np.ndarray,
    arc_weight: jax.Array | np.ndarray,
    final_weight: jax.Array | np.ndarray,
    is_acceptor: bool,
    useful: np.ndarray | None = None,
) -> Fsa:
    """An Fsa of computed weights ([A], [S]), trimmed to the states on a
    successful path (start kept); `is_final` [S] is the structure's;
    `useful` (bool [S]): those states, where the caller knows them."""
    src = np.asarray(src)
    num_arcs = len(src)
    sources = structure.Sources([0], [num_arcs], num_arcs + num_states, num_arcs + num_states + 1)
    final_source = np.where(is_final, num_arcs + np.arange(num_states), sources.zero)
    result = structure.Result(
        num_states,
        src,
        np.asarray(dst),
        np.asarray(ilabel),
        np.asarray(olabel),
        np.arange(num_arcs),
        final_source,
        is_acceptor,
    )
    # Concrete weights are gathered in numpy (see `assemble_operands`).
    xp: Any = jnp if any(checks.is_traced(w) for w in (arc_weight, final_weight)) else np
    values = xp.concatenate(
        [
            xp.asarray(arc_weight),
            xp.asarray(final_weight),
            xp.array([-np.inf, 0.0], arc_weight.dtype),
        ]
    )
    kept = structure.trimmed(result, sources, useful=useful)
    return from_sources(kept, values, sources.zero)


def weights_on_host(fsa: Fsa, semiring: Any) -> bool:
    """Whether an op computes `fsa`'s result weights in numpy: they are
    concrete (nothing to differentiate, no device round trip) and the
    semiring declares LOG's or TROPICAL's `arithmetic`."""
    weights = (fsa.weight, fsa.final_weight)
    return semiring.arithmetic is not None and not any(checks.is_traced(w) for w in weights)


def check_operands(operands: Sequence[Fsa], fn: str, same_kind: bool = True) -> None:
    check_alike(operands, fn, lambda i: f"operand {i}", same_kind=same_kind)
    for i, fsa in enumerate(operands):
        if fsa.batch_shape != operands[0].batch_shape:
            raise ValueError(
                f"{fn}: operand {i} has batch_shape {fsa.batch_shape} but "
                f"operand 0 has {operands[0].batch_shape}"
            )


def apply_map(
    fn: str,
    operands: Sequence[Fsa],
    make: Callable[[list[structure.Parts]], structure.Result],
    same_kind: bool = True,
) -> Fsa:
    """`make(parts)` on unbatched operands, entry by entry on batched ones."""
    check_operands(operands, fn, same_kind)
    if operands[0].batch_shape:
        return map_entries(
            lambda *entry: apply_map(fn, list(entry), make, same_kind), *operands, fn=fn
        )
    result = make([parts_of(fsa, fn) for fsa in operands])
    return assemble_operands(operands, result)
