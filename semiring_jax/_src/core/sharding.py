"""Per-utterance ops on a batch sharded over explicit mesh axes.

`jax.make_mesh` gives explicit axes by default: under `jax.jit` every value
carries its sharding in its type, and an op whose output sharding is
ambiguous (a strided `.at[...].set`, a gather, a concatenation of a sharded
and a replicated operand, a `jax.vmap` over operands sharded differently)
raises `ShardingTypeError` instead of choosing. The ops here are
independent per utterance, so none of that needs a choice: `per_device`
runs the op's body under `jax.shard_map` over the axes that shard the batch,
where each device sees its own B / n utterances as plain local arrays, and
the compiled program has no collective. Elsewhere (one device, an auto-axis
mesh, inside a user's `jax.shard_map`) the body runs as it is.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["batch_axes", "per_device", "varying_like"]


def _explicit_leading_axes(leaf: Any) -> tuple[Any, Any] | None:
    """(mesh, the spec entry of axis 0) where `leaf`'s leading axis is split
    over explicit mesh axes only; None otherwise."""
    if getattr(leaf, "ndim", 0) == 0:
        return None
    sharding: Any = getattr(jax.typeof(leaf), "sharding", None)
    spec = getattr(sharding, "spec", None)
    if sharding is None or not spec or spec[0] is None:
        return None
    mesh = sharding.mesh
    names = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    if not all(types.get(name) == AxisType.Explicit for name in names):
        return None
    return mesh, spec[0]


def batch_axes(batched: Sequence[Any]) -> tuple[Any, Any] | None:
    """(mesh, spec entry) of the first array in `batched` (pytrees whose
    leaves all lead with the batch axis B) whose batch axis is split over
    explicit mesh axes, if that split is even; else None."""
    for leaf in jax.tree.leaves(batched):
        found = _explicit_leading_axes(leaf)
        if found is None:
            continue
        mesh, entry = found
        names = entry if isinstance(entry, tuple) else (entry,)
        devices = math.prod(mesh.shape[name] for name in names)
        return found if leaf.shape[0] % devices == 0 else None
    return None


def _placed(arg: Any, mesh: Any, batched: bool, entry: Any) -> Any:
    """`arg` split over `entry` like the batch (`batched`), or replicated:
    `jax.shard_map` takes explicitly typed inputs only as its specs say, and
    the lengths may come replicated with the scores split (a local slice
    either way, no collective)."""

    def place(leaf: Any) -> Any:
        spec = tuple(getattr(getattr(jax.typeof(leaf), "sharding", None), "spec", None) or ())
        if batched and getattr(leaf, "ndim", 0) > 0:
            wanted, rest = P(entry), spec[1:]
            fits = spec[:1] == (entry,)
        else:
            wanted, rest, fits = P(), spec, True
        if fits and all(name is None for name in rest):
            return leaf
        return jax.sharding.reshard(leaf, NamedSharding(mesh, wanted))

    return jax.tree.map(place, arg)


def per_device(
    is_batched: Callable[..., Sequence[bool]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a per-utterance body `fn(*args)` (traced; every output
    leads with the batch axis B) to run under `jax.shard_map` when its
    batch is split over explicit mesh axes (module doc).

    Args:
      is_batched: `is_batched(*args)` gives, per positional argument, True
        where every leaf of it leads with B (split like the batch), False
        where it is shared by the batch (replicated). Keyword arguments are
        static and passed through.
    Returns:
      The decorator.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **static: Any) -> Any:
            batched = tuple(is_batched(*args))
            found = batch_axes([arg for arg, b in zip(args, batched, strict=True) if b])
            if found is None:
                return fn(*args, **static)
            mesh, entry = found
            specs = tuple(P(entry) if b else P() for b in batched)
            args = tuple(_placed(arg, mesh, b, entry) for arg, b in zip(args, batched, strict=True))
            # check_vma=False: a constant (replicated) initial scan carry may
            # meet per-device data in the body; the program is the same.
            return jax.shard_map(
                functools.partial(fn, **static),
                mesh=mesh,
                in_specs=specs,
                out_specs=P(entry),
                check_vma=False,
            )(*args)

        return run

    return decorate


def _varying_axes(leaf: Any) -> set[str]:
    """The manual mesh axes `leaf` varies over (its type's vma)."""
    aval = jax.typeof(leaf)
    manual = getattr(aval, "mat", None)  # JAX 0.10; earlier releases: aval.vma
    return set(getattr(manual, "varying", None) or getattr(aval, "vma", None) or ())


def varying_like(values: Any, *references: Any) -> Any:
    """`values` (a pytree), typed as varying over every manual mesh axis
    that some leaf of `references` varies over; unchanged outside
    `jax.shard_map`. Inside it, a scan's carry must keep one type, so a
    constant initial carry that meets per-device data in the body must
    start as varying as that data."""
    axes: set[str] = set()
    for leaf in jax.tree.leaves(references):
        axes |= _varying_axes(leaf)

    def vary(value: Any) -> Any:
        missing = tuple(sorted(axes - _varying_axes(value)))
        return jax.lax.pcast(value, missing, to="varying") if missing else value

    return jax.tree.map(vary, values) if axes else values
