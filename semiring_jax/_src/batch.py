"""Batches: padded stacks of Fsas, and mapping an op over the batch axes."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from semiring_jax._src import checks
from semiring_jax._src.fsa import Fsa, assemble
from semiring_jax._src.host import build, schedule
from semiring_jax._src.schedule import Schedule

__all__ = ["check_alike", "jit_over_batch", "map_batch", "pad_entry", "stack", "unstack"]


def map_batch(fn: Callable[..., Any], fsa: Fsa, *args: Any) -> Any:
    """`fn(fsa, *args)` on each entry of a batched Fsa (vmap), or directly."""
    mapped = fn
    for _ in fsa.batch_shape:
        mapped = jax.vmap(mapped, in_axes=(0,) + (None,) * len(args))
    return mapped(fsa, *args)


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
    if not is_acceptor:  # promote the acceptors: olabel is the (only) label
        fsas = [
            dataclasses.replace(fsa, olabel=fsa.ilabel, is_acceptor=False)
            if fsa.is_acceptor
            else fsa
            for fsa in fsas
        ]
    num_states = max(fsa.num_states for fsa in fsas)
    num_arcs = max(fsa.num_arcs for fsa in fsas)
    shape = _common_shape(fsas, bucket)
    if bucket:
        num_states, num_arcs = _bucket(num_states), _bucket(num_arcs)
    padded = [pad_entry(fsa, num_states, num_arcs, shape) for fsa in fsas]
    cycle = next((entry.cycle for entry in padded if entry.cycle), ())
    if cycle:  # one cyclic entry: no schedule for anyone, score ops refuse it
        padded = [entry if entry.cycle else _without_schedule(entry) for entry in padded]
    in_width = max(entry.schedule.state_in_arcs.shape[1] for entry in padded)
    out_width = max(entry.schedule.state_out_arcs.shape[1] for entry in padded)
    padded = [_widen_arc_tables(entry, in_width, out_width) for entry in padded]
    leaves = jax.tree_util.tree_map(
        lambda *values: _stack_leaves(values), *[_array_fields(entry) for entry in padded]
    )
    return Fsa(**leaves, cycle=cycle, is_acceptor=is_acceptor)


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


def _common_shape(fsas: Sequence[Fsa], bucket: bool) -> schedule.ScheduleShape | None:
    """The smallest schedule shape that fits every entry; None if one is cyclic."""
    real_arcs = []
    for fsa in fsas:
        src, dst, arc_mask = _host_structure(fsa, "stack")
        real_arcs.append((fsa.num_states, src[arc_mask], dst[arc_mask]))
    return schedule.common_shape(real_arcs, _bucket if bucket else (lambda size: size))


def pad_entry(
    fsa: Fsa, num_states: int, num_arcs: int, shape: schedule.ScheduleShape | None
) -> Fsa:
    """One unbatched Fsa padded to `num_states`, `num_arcs` and `shape`."""
    src, dst, arc_mask = _host_structure(fsa, "stack")
    final_mask = checks.concrete(fsa.final_mask, "final_mask", "stack").astype(bool)
    # Padding weights are -inf, the zero of LOG and TROPICAL; other
    # semirings never read them, as `arc_mask` and `final_mask` are False.
    arrays = build.ArcArrays(
        num_states,
        _pad(src, num_arcs, 0),
        _pad(dst, num_arcs, 0),
        _pad(np.asarray(fsa.ilabel), num_arcs, 0),
        _pad(np.asarray(fsa.olabel), num_arcs, 0),
        _pad(fsa.weight, num_arcs, -np.inf),
        _pad(fsa.final_weight, num_states, -np.inf),
        fsa.is_acceptor,
        _pad(final_mask, num_states, False),
    )
    real_sizes = checks.concrete(fsa.schedule.real_sizes, "schedule", "stack")
    return assemble(
        arrays, arc_mask=_pad(arc_mask, num_arcs, False), shape=shape, real_sizes=tuple(real_sizes)
    )


def _array_fields(fsa: Fsa) -> dict[str, Any]:
    """The pytree children of `fsa` by name (everything but the metadata)."""
    return {
        field.name: getattr(fsa, field.name)
        for field in dataclasses.fields(fsa)
        if field.name not in ("cycle", "is_acceptor")
    }


def _without_schedule(fsa: Fsa) -> Fsa:
    tables = schedule.empty_schedule_arrays(fsa.num_states, fsa.num_arcs)
    old = fsa.schedule
    return Fsa(
        **{
            **_array_fields(fsa),
            "schedule": Schedule(
                **tables,
                real_sizes=old.real_sizes,
                state_in_arcs=old.state_in_arcs,
                state_out_arcs=old.state_out_arcs,
            ),
        },
        cycle=(),
        is_acceptor=fsa.is_acceptor,
    )


def _widen_arc_tables(fsa: Fsa, in_width: int, out_width: int) -> Fsa:
    """`fsa` with its per-state arc tables padded to the batch's widths."""
    old = fsa.schedule
    widen = lambda table, width: np.pad(
        table, ((0, 0), (0, width - table.shape[1])), constant_values=fsa.num_arcs
    )
    new = dataclasses.replace(
        old,
        state_in_arcs=widen(old.state_in_arcs, in_width),
        state_out_arcs=widen(old.state_out_arcs, out_width),
    )
    return dataclasses.replace(fsa, schedule=new)


def _host_structure(fsa: Fsa, fn: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        checks.concrete(fsa.src, "src", fn).astype(np.int32),
        checks.concrete(fsa.dst, "dst", fn).astype(np.int32),
        checks.concrete(fsa.arc_mask, "arc_mask", fn).astype(bool),
    )


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
    if len(batch.batch_shape) != 1:
        raise ValueError(f"unstack: expects batch_shape (B,), got {batch.batch_shape}")
    src, dst, arc_mask = _host_structure(batch, "unstack")
    final_mask = checks.concrete(batch.final_mask, "final_mask", "unstack").astype(bool)
    sizes = checks.concrete(batch.schedule.real_sizes, "schedule", "unstack")
    entries = []
    for b, (num_states, num_arcs) in enumerate(sizes.tolist()):
        arrays = build.ArcArrays(
            num_states,
            src[b, :num_arcs],
            dst[b, :num_arcs],
            np.asarray(batch.ilabel[b, :num_arcs]),
            np.asarray(batch.olabel[b, :num_arcs]),
            batch.weight[b, :num_arcs],
            batch.final_weight[b, :num_states],
            batch.is_acceptor,
            final_mask[b, :num_states],
        )
        entries.append(assemble(arrays, arc_mask=arc_mask[b, :num_arcs]))
    return entries
