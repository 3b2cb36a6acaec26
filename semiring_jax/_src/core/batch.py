"""Batches: padded stacks of Fsas, and mapping an op over the batch axes."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa, assemble
from semiring_jax._src.core.host import build, levels
from semiring_jax._src.core.host.fsa_tables import Entry, build_tables
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.sharding import per_device
from semiring_jax._src.core.tables import Tables

__all__ = [
    "batch_entries",
    "check_alike",
    "jit_over_batch",
    "map_batch",
    "stack",
    "stack_entries",
    "unstack",
]


def map_batch(fn: Callable[..., Any], fsa: Fsa, *args: Any) -> Any:
    """`fn(fsa, *args)` on each entry of a batched Fsa (vmap), or directly."""
    mapped = fn
    for _ in fsa.batch_shape:
        mapped = jax.vmap(mapped, in_axes=(0,) + (None,) * len(args))
    # `args` are shared by the batch (in_axes None).
    return per_device(lambda fsa, *args: [bool(fsa.batch_shape)] + [False] * len(args))(mapped)(
        fsa, *args
    )


@functools.cache
def jit_over_batch(one_fsa_op: Callable[..., Any]) -> Callable[..., Any]:
    """`one_fsa_op` mapped over the batch axes and jitted, so that eager calls
    compile once per shape (inside a user's jit it simply inlines)."""
    return jax.jit(lambda fsa, *args: map_batch(one_fsa_op, fsa, *args))


def _bucket(size: int) -> int:
    """The next size on the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ..."""
    if size <= 2:
        return max(size, 1)
    power = 2 ** math.floor(math.log2(size))
    return power if size == power else (power * 3 // 2 if size <= power * 3 // 2 else power * 2)


def _pad(values: Any, size: int, fill: Any) -> Any:
    """`values` [N] padded with `fill` to [size]; stays numpy unless JAX."""
    xp = jnp if isinstance(values, jax.Array) else np
    return xp.concatenate([values, xp.full((size - values.shape[0],), fill, values.dtype)])


def _stack_leaves(values: Sequence[Any]) -> Any:
    xp = jnp if any(isinstance(v, jax.Array) for v in values) else np
    return xp.stack(values)


def stack(fsas: Sequence[Fsa], *, bucket: bool = False) -> Fsa:
    """Pads Fsas to common sizes and stacks them into a batched Fsa.

    Padding (states, arcs, schedule slots) comes after the real entries and
    never changes a result or a gradient, in any semiring: padding arcs
    have `arc_mask` False and padding states `final_mask` False, so the
    score ops read the semiring's zero there whatever is stored (-inf).
    Structure must be concrete; weights may be traced (e.g.
    `fsa.replace(weight=w)` inside `jax.jit`).

    An acceptor is a transducer whose output labels are its input labels:
    among transducers it is stacked as one (and `unstack` gives it back as
    one), so the batch is a transducer unless every entry is an acceptor.

    Args:
      fsas: unbatched Fsas of one dtype, acceptors or transducers.
      bucket: round every padded size up the ladder 1, 2, 3, 4, 6, 8, 12,
        16, ... so that a training loop compiles few distinct programs.
    Returns:
      A batched Fsa, batch_shape (B,).
    Raises:
      TypeError: if an entry is not an Fsa.
      ValueError: for an empty list, a batched entry, or entries whose
        dtypes differ; naming the entry.
    Examples:
      >>> import semiring_jax as sj
      >>> batch = sj.stack([sj.linear_fsa([1, 2, 3]), sj.linear_fsa([4])])
      >>> batch.batch_shape, batch.num_states, batch.num_arcs
      ((2,), 4, 3)
      >>> print(sj.tot_score(batch))
      [0. 0.]
      >>> transducer = sj.Fsa.from_arcs([(0, 1, 2, 3, 0.0)], final=[1])
      >>> mixed = sj.stack([sj.linear_fsa([1]), transducer])
      >>> print(mixed.is_acceptor, mixed.olabel)
      False [[1]
       [3]]
    """
    return stack_entries(fsas, bucket=bucket)


def stack_entries(
    fsas: Sequence[Fsa],
    *,
    bucket: bool = False,
    lengths: Sequence[levels.PathLengths] | None = None,
) -> Fsa:
    """`stack`, whose entries may have deferred tables (`assemble(...,
    defer=True)`, not built yet): every entry's tables are built once, at
    the batch's sizes. `lengths`: each entry's `levels.path_lengths` (of its
    own states), where the caller knows them."""
    fsas = list(fsas)
    if not fsas:
        raise ValueError("stack: needs at least one Fsa, got an empty sequence")
    check_alike(fsas, "stack", lambda i: f"fsas[{i}]", same_kind=False)
    for i, fsa in enumerate(fsas):
        if fsa.batch_shape:
            raise ValueError(
                f"stack: fsas[{i}] is already batched "
                f"(batch_shape={fsa.batch_shape}); unstack it first"
            )
    is_acceptor = all(fsa.is_acceptor for fsa in fsas)
    num_states = max(fsa.num_states for fsa in fsas)
    num_arcs = max(fsa.num_arcs for fsa in fsas)
    if bucket:
        num_states, num_arcs = _bucket(num_states), _bucket(num_arcs)
    padded = [_padded(fsa, num_states, num_arcs, is_acceptor) for fsa in fsas]
    entries = [Entry(num_states, p.arrays.src, p.arrays.dst, p.arc_mask) for p in padded]
    if lengths is not None:
        lengths = [_pad_lengths(entry_lengths, num_states) for entry_lengths in lengths]
    built = build_tables(entries, round_up=_bucket if bucket else _identity, lengths=lengths)
    fields = {
        name: _stack_leaves([getattr(p.arrays, name) for p in padded])
        for name in ("src", "dst", "ilabel", "olabel", "weight", "final_weight")
    }
    tables = {name: np.stack([t[name] for t in built.tables]) for name in built.tables[0]}
    return Fsa(
        **fields,
        arc_mask=np.stack([p.arc_mask for p in padded]),
        final_mask=np.stack([p.final_mask for p in padded]),
        tables=Tables(
            Schedule.from_arrays(tables, np.stack([p.real_sizes for p in padded])),
            built.cycle,
            built.shapes,
        ),
        is_acceptor=is_acceptor,
    )


def check_alike(
    fsas: Sequence[Fsa], fn: str, name: Callable[[int], str], *, same_kind: bool = True
) -> None:
    """Raises unless every entry is an Fsa of the first one's dtype (and kind,
    acceptor or transducer, with `same_kind`); `name(i)` names entry i."""
    kinds = ["a transducer", "an acceptor"]
    for i, fsa in enumerate(fsas):
        if not isinstance(fsa, Fsa):
            raise TypeError(f"{fn}: {name(i)} is a {type(fsa).__name__}, not an Fsa")
        if same_kind and fsa.is_acceptor != fsas[0].is_acceptor:
            raise ValueError(
                f"{fn}: {name(i)} is {kinds[fsa.is_acceptor]} but {name(0)} is "
                f"{kinds[fsas[0].is_acceptor]}"
            )
        if fsa.dtype != fsas[0].dtype:
            raise ValueError(
                f"{fn}: {name(i)} has {fsa.dtype} weights but {name(0)} has {fsas[0].dtype}"
            )


def _identity(size: int) -> int:
    return size


class _Padded(NamedTuple):
    """One entry's host arrays padded to the batch's sizes."""

    arrays: build.ArcArrays
    arc_mask: np.ndarray  # bool [A]
    final_mask: np.ndarray  # bool [S]
    real_sizes: np.ndarray  # int32 [2]


def _padded(fsa: Fsa, num_states: int, num_arcs: int, is_acceptor: bool) -> _Padded:
    """`fsa`'s arrays padded to `num_states` and `num_arcs`; an acceptor in
    a transducer batch (`is_acceptor` False) gets olabel = ilabel."""
    src, dst, arc_mask = _host_structure(fsa, "stack")
    final_mask = checks.concrete(fsa.final_mask, "final_mask", "stack").astype(bool)
    olabel = fsa.olabel if is_acceptor or not fsa.is_acceptor else fsa.ilabel
    # Padding weights are -inf, the zero of LOG and TROPICAL; other
    # semirings never read them, as `arc_mask` and `final_mask` are False.
    arrays = build.ArcArrays(
        num_states,
        _pad(src, num_arcs, 0),
        _pad(dst, num_arcs, 0),
        _pad(np.asarray(fsa.ilabel), num_arcs, 0),
        _pad(np.asarray(olabel), num_arcs, 0),
        _pad(fsa.weight, num_arcs, -np.inf),
        _pad(fsa.final_weight, num_states, -np.inf),
        is_acceptor,
    )
    if fsa.tables.is_built:
        real_sizes = checks.concrete(fsa.schedule.real_sizes, "schedule", "stack")
    else:
        real_sizes = np.array([fsa.num_states, fsa.num_arcs])
    return _Padded(
        arrays,
        _pad(arc_mask, num_arcs, False),
        _pad(final_mask, num_states, False),
        np.asarray(real_sizes, np.int32),
    )


def _pad_lengths(lengths: levels.PathLengths, num_states: int) -> levels.PathLengths:
    """Path lengths of an entry padded with states of no arc (lengths 0)."""
    height = None if lengths.height is None else _pad(lengths.height, num_states, 0)
    return levels.PathLengths(_pad(lengths.earliest, num_states, 0), height)


def _host_structure(fsa: Fsa, fn: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        checks.concrete(fsa.src, "src", fn).astype(np.int32),
        checks.concrete(fsa.dst, "dst", fn).astype(np.int32),
        checks.concrete(fsa.arc_mask, "arc_mask", fn).astype(bool),
    )


def _entry_arrays(batch: Fsa, fn: str) -> list[tuple[build.ArcArrays, np.ndarray]]:
    """Each entry's arrays (and arc_mask) at its real sizes."""
    if len(batch.batch_shape) != 1:
        raise ValueError(f"{fn}: expects batch_shape (B,), got {batch.batch_shape}")
    src, dst, arc_mask = _host_structure(batch, fn)
    final_mask = checks.concrete(batch.final_mask, "final_mask", fn).astype(bool)
    ilabel = checks.concrete(batch.ilabel, "ilabel", fn)
    olabel = checks.concrete(batch.olabel, "olabel", fn)
    sizes = checks.concrete(batch.schedule.real_sizes, "schedule", fn)
    entries = []
    for b, (num_states, num_arcs) in enumerate(sizes.tolist()):
        arrays = build.ArcArrays(
            num_states,
            src[b, :num_arcs],
            dst[b, :num_arcs],
            ilabel[b, :num_arcs],
            olabel[b, :num_arcs],
            batch.weight[b, :num_arcs],
            batch.final_weight[b, :num_states],
            batch.is_acceptor,
            final_mask[b, :num_states],
        )
        entries.append((arrays, arc_mask[b, :num_arcs]))
    return entries


def batch_entries(batch: Fsa, fn: str) -> list[Fsa]:
    """The entries of a batched Fsa at their real sizes, deferred (no
    schedule built): for structural ops, which read structure and weights
    only, and stack what they make of them."""
    return [
        assemble(arrays, arc_mask=mask, defer=True) for arrays, mask in _entry_arrays(batch, fn)
    ]


def unstack(batch: Fsa) -> list[Fsa]:
    """Splits a batched Fsa into its entries, undoing `stack`'s padding.

    Every entry has the batch's kind: an acceptor stacked among transducers
    comes back as a transducer (with olabel == ilabel).

    Args:
      batch: an Fsa with batch_shape (B,).
    Returns:
      A list of B unbatched Fsas with their original sizes.
    Raises:
      ValueError: if `batch` is not batched along exactly one axis.
    Examples:
      >>> import semiring_jax as sj
      >>> entries = sj.unstack(sj.stack([sj.linear_fsa([1, 2, 3]), sj.linear_fsa([4])]))
      >>> [entry.num_arcs for entry in entries]
      [3, 1]
    """
    return [assemble(arrays, arc_mask=mask) for arrays, mask in _entry_arrays(batch, "unstack")]
