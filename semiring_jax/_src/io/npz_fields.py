"""Checking a saved Fsa's arrays, read from a `.npz` file, and building the
Fsa they describe: every name, dtype, shape and value checked, the tables
built once from the structure (`io/npz.py` describes the checks)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.core.host import dense_tables, levels, schedule_tables
from semiring_jax._src.core.host.fsa_tables import (
    UNKNOWN_SHAPES,
    Built,
    Entry,
    Shapes,
    build_tables,
)
from semiring_jax._src.core.schedule import Schedule
from semiring_jax._src.core.tables import Tables
from semiring_jax._src.io.npz_layout import (
    FORMAT,
    LAYOUTS,
    OLD_TABLES,
    READS,
    SIZES,
)

__all__ = ["fsa_from_arrays"]


class _Checker:
    """Located checks of the arrays of one file."""

    def __init__(self, arrays: dict[str, np.ndarray], where: str) -> None:
        self.arrays, self.where = arrays, where

    def fail(self, name: str, problem: str) -> ValueError:
        return ValueError(f"load: {self.where}: array {name!r} {problem}")

    def get(self, name: str, dtype: Any, shape: tuple[int, ...], described: str) -> np.ndarray:
        value = self.arrays[name]
        if value.dtype != np.dtype(dtype):
            raise self.fail(name, f"has dtype {value.dtype}, expected {np.dtype(dtype)}")
        if value.shape != shape:
            raise self.fail(name, f"has shape {value.shape}, expected {described} = {shape}")
        return value

    def rank(self, name: str, rank: int, described: str) -> tuple[int, ...]:
        shape = self.arrays[name].shape
        if len(shape) != rank:
            raise self.fail(name, f"has shape {shape}, expected {described}")
        return shape


def _header(
    check: _Checker, check_names: bool
) -> tuple[int, tuple[int, ...], bool, tuple[int, ...]]:
    """(version, batch shape, is_acceptor, cycle), after the format (and,
    with `check_names`, the version's names: every one, and no other)."""
    arrays = check.arrays
    fmt = arrays["format"]
    if fmt.shape != () or fmt.dtype.kind != "U" or str(fmt[()]) != FORMAT:
        raise check.fail("format", f"is not {FORMAT!r}; not a file written by sj.save")
    if "version" not in arrays:
        raise check.fail("version", "is missing")
    version = arrays["version"]
    if version.shape != () or version.dtype.kind not in "iu" or int(version) not in READS:
        raise check.fail(
            "version",
            f"is {version!r}; this semiring_jax reads versions {', '.join(map(str, READS))}",
        )
    names = LAYOUTS[int(version)]
    missing = sorted(names - set(arrays))
    if check_names and missing:
        raise check.fail(missing[0], "is missing")
    unexpected = sorted(set(arrays) - names)
    if check_names and unexpected:
        raise check.fail(unexpected[0], f"is not part of the version {int(version)} layout")
    (rank,) = check.rank("batch_shape", 1, "[N]")
    batch_shape = check.get("batch_shape", np.int64, (rank,), "[N]")
    if (batch_shape < 0).any():
        raise check.fail("batch_shape", f"holds a negative size: {batch_shape.tolist()}")
    is_acceptor = check.get("is_acceptor", bool, (), "[]")
    (length,) = check.rank("cycle", 1, "[C]")
    cycle = check.get("cycle", np.int64, (length,), "[C]")
    return int(version), tuple(batch_shape.tolist()), bool(is_acceptor), tuple(cycle.tolist())


def fsa_from_arrays(arrays: dict[str, Any], where: str, *, shapes_only: bool = False) -> Any:
    """The Fsa of a file's arrays, every check made. With `shapes_only`, the
    arrays other than `SMALL` may be `_Declared` headers: only names,
    dtypes and shapes are checked, and the bytes of the tables that the
    stored sizes would build are returned (`_table_bytes`)."""
    check = _Checker(arrays, where)
    # The names are checked with the headers: an old file's tables are
    # never read, so they are not among the arrays the second time.
    version, batch_shape, is_acceptor, cycle = _header(check, check_names=shapes_only)
    batch = len(batch_shape)
    num_arcs = check.rank("src", batch + 1, "[..., A]")[-1]
    num_states = check.rank("final_weight", batch + 1, "[..., S]")[-1]
    if num_states < 1:
        raise check.fail("final_weight", "has no state; an Fsa has at least one")
    if any(not 0 <= state < num_states for state in cycle):
        raise check.fail("cycle", f"holds a state out of range for S={num_states}: {cycle}")
    if math.prod(batch_shape) == 0:
        raise check.fail("batch_shape", f"is {list(batch_shape)}: a batch has at least one entry")
    dtype = arrays["weight"].dtype
    if dtype not in (np.float32, np.float64):
        raise check.fail("weight", f"has dtype {dtype}, expected float32 or float64")
    try:
        checks.check_float_dtype(dtype, "weight", "load")
    except ValueError as err:  # float64 with jax_enable_x64 off
        raise ValueError(
            f"load: {where}: array 'weight': {str(err).removeprefix('load: ')}"
        ) from None
    arc_shape, state_shape = (*batch_shape, num_arcs), (*batch_shape, num_states)
    fields = {
        name: check.get(name, np.int32, arc_shape, "[..., A]")
        for name in ("src", "dst", "ilabel", "olabel")
    }
    fields["weight"] = check.get("weight", dtype, arc_shape, "[..., A]")
    fields["final_weight"] = check.get("final_weight", dtype, state_shape, "[..., S]")
    fields["arc_mask"] = check.get("arc_mask", bool, arc_shape, "[..., A]")
    sizes_name = "real_sizes" if version >= 4 else "schedule.real_sizes"
    real_sizes = check.get(sizes_name, np.int32, (*batch_shape, 2), "[..., 2]")
    if shapes_only:
        if "final_mask" in arrays:
            check.get("final_mask", bool, state_shape, "[..., S]")
        if version < 4:
            _old_tables(check, batch_shape, num_states, num_arcs)
            return 0  # built at sizes the builders choose, bounded by the structure
        entries = math.prod(batch_shape)
        return entries * _table_bytes(_stored_shapes(check, cycle), num_states)
    fields["final_mask"] = (
        check.get("final_mask", bool, state_shape, "[..., S]")
        if "final_mask" in arrays
        else fields["final_weight"] > -np.inf
    )
    _check_values(check, fields, num_states)
    _check_real_sizes(check, sizes_name, real_sizes, num_states, num_arcs)
    shapes = _stored_shapes(check, cycle) if version >= 4 else UNKNOWN_SHAPES
    built = _build(check, fields, cycle, shapes)
    tables = {
        name: np.stack([entry[name] for entry in built.tables]).reshape(
            batch_shape + built.tables[0][name].shape
        )
        for name in built.tables[0]
    }
    return Fsa(
        **fields,
        tables=Tables(Schedule.from_arrays(tables, real_sizes), cycle, built.shapes),
        is_acceptor=is_acceptor,
    )


def _check_values(check: _Checker, fields: dict[str, np.ndarray], num_states: int) -> None:
    for name in ("src", "dst"):
        values = fields[name].reshape(-1)
        bad = np.flatnonzero((values < 0) | (values >= num_states))
        if bad.size:
            raise check.fail(
                name,
                f"holds state {values[bad[0]]} (flat index {bad[0]}), "
                f"out of range for S={num_states}",
            )
    for name in ("weight", "final_weight"):
        values = fields[name].reshape(-1)
        bad = np.flatnonzero(np.isnan(values) | (values == np.inf))
        if bad.size:
            raise check.fail(
                name,
                f"holds {values[bad[0]]} (flat index {bad[0]}); weights must be finite or -inf",
            )


def _old_tables(
    check: _Checker, batch_shape: tuple[int, ...], num_states: int, num_arcs: int
) -> None:
    """Checks the headers of a version 1 to 3 file's tables: int32, and
    shapes that agree with the Fsa's and with each other."""
    batch = len(batch_shape)
    sizes: dict[str, int] = {"S": num_states, "A": num_arcs, "2": 2}
    for field, axes in OLD_TABLES.items():
        name = f"schedule.{field}"
        if name not in check.arrays:
            continue  # a table the file's version lacks
        described = "[..., " + ", ".join(axes) + "]"
        shape = check.rank(name, batch + len(axes), described)[batch:]
        for axis, size in zip(axes, shape):
            sizes.setdefault(axis, size)
        expected = tuple(sizes[axis] for axis in axes)
        check.get(name, np.int32, batch_shape + expected, described)


def _stored_shapes(check: _Checker, cycle: tuple[int, ...]) -> Shapes:
    """The sizes a version 4 file stores, as this version's `ScheduleShape`
    and `DenseShape` (no level sizes for a cyclic Fsa)."""
    found = {}
    for kind, expected in (
        ("schedule", schedule_tables.ScheduleShape),
        ("dense", dense_tables.DenseShape),
    ):
        sizes_name, fields_name = SIZES[kind]
        (count,) = check.rank(sizes_name, 1, "[F]")
        sizes = check.get(sizes_name, np.int64, (count,), "[F]")
        names = check.arrays[fields_name]
        if names.shape != (count,) or (count and names.dtype.kind != "U"):
            raise check.fail(
                fields_name, f"has shape {names.shape}, expected [F] = ({count},) of str"
            )
        if kind == "schedule" and cycle:
            if count:
                raise check.fail(sizes_name, "holds sizes, but a cyclic Fsa has no level tables")
            continue
        if tuple(names.tolist()) != expected._fields:
            raise check.fail(
                fields_name,
                f"names the sizes {list(names.tolist())}, but this semiring_jax's "
                f"{expected.__name__} has {list(expected._fields)}; the file was written by "
                f"another version",
            )
        bad = np.flatnonzero((sizes < 0) | (sizes > np.iinfo(np.int32).max))
        if bad.size:
            raise check.fail(
                sizes_name, f"holds {names[bad[0]]} = {sizes[bad[0]]}, not a size in int32"
            )
        found[kind] = expected(*(int(size) for size in sizes))
    for side in ("in", "out"):
        fan, depth = (getattr(found["dense"], f"{side}_{name}") for name in ("fan", "levels"))
        # Trees of fan-in F >= 2 whose blocks of F ** L leaves some memory holds.
        if depth and (fan < 2 or depth * math.log2(fan) >= 62):
            raise check.fail(
                "dense_shape",
                f"holds {side}_levels = {depth} at {side}_fan = {fan}: trees that deep "
                f"need a fan-in of at least 2 and fewer than 2**62 leaves",
            )
    return Shapes(found.get("schedule"), found["dense"])


def _table_bytes(shapes: Shapes, num_states: int) -> int:
    """Bytes of one entry's tables at `shapes` (int32; the [A] ones aside,
    which the arrays' own sizes bound), so that sizes a file merely claims
    count against `load`'s budget before anything is built."""
    total = 0
    if shapes.schedule is not None:
        level = shapes.schedule
        positions = level.steps * level.width
        total += positions * (2 + 2 * level.in_slots + 2 * level.out_slots) + level.helpers
    dense = shapes.dense
    for slots, fan, extra_rows, leaves, depth in (dense[0:5], dense[6:11]):
        total += (num_states + extra_rows) * slots + num_states
        if depth:  # `_stored_shapes` saw to fan >= 2 and fan ** depth < 2 ** 62
            # Leaves rounded up to whole blocks, and as many nodes above them.
            total += 2 * (leaves + fan**depth)
    return 4 * total


def _check_real_sizes(
    check: _Checker, name: str, real_sizes: np.ndarray, num_states: int, num_arcs: int
) -> None:
    flat = real_sizes.reshape(-1, 2)
    bad = np.flatnonzero(
        (flat[:, 0] < 1) | (flat[:, 0] > num_states) | (flat[:, 1] < 0) | (flat[:, 1] > num_arcs)
    )
    if bad.size:
        raise check.fail(
            name,
            f"holds {flat[bad[0]].tolist()} (entry {bad[0]}), out of range for "
            f"S={num_states}, A={num_arcs}",
        )


def _build(
    check: _Checker, fields: dict[str, np.ndarray], cycle: tuple[int, ...], shapes: Shapes
) -> Built:
    """Every entry's tables, built once from its structure: at the stored
    sizes (version 4), or at the sizes the builders choose (older files)."""
    num_states = fields["final_weight"].shape[-1]
    num_arcs = fields["src"].shape[-1]
    count = math.prod(fields["src"].shape[:-1])
    flat = lambda name: fields[name].reshape(count, num_arcs)
    entries = [
        Entry(num_states, src, dst, mask)
        for src, dst, mask in zip(flat("src"), flat("dst"), flat("arc_mask"))
    ]
    lengths: list[levels.PathLengths | None] | None = None
    if not cycle:
        lengths = []
        for i, entry in enumerate(entries):
            real_src, real_dst = entry.src[entry.arc_mask], entry.dst[entry.arc_mask]
            lengths.append(levels.path_lengths(num_states, real_src, real_dst, height=False))
            if lengths[-1] is None:
                found = levels.find_cycle(num_states, real_src, real_dst)
                raise check.fail("cycle", f"is empty, but entry {i} has the cycle {list(found)}")
    if shapes.dense is None:  # an older file: sizes chosen as `sj.stack` does
        return build_tables(entries, lengths=lengths, cycle=cycle)
    tables = []
    for i, entry in enumerate(entries):
        try:
            if cycle:
                level = schedule_tables.empty_schedule_arrays(num_states, num_arcs)
            else:
                assert lengths is not None  # found for an acyclic file
                level = schedule_tables.build_schedule_arrays(
                    *entry, shape=shapes.schedule, lengths=lengths[i]
                )
        except ValueError as err:
            raise check.fail(
                "schedule_shape", f"holds sizes that do not fit entry {i}: {err}"
            ) from None
        try:
            dense = dense_tables.build_dense_tables(*entry, shape=shapes.dense)
        except ValueError as err:
            raise check.fail(
                "dense_shape", f"holds sizes that do not fit entry {i}: {err}"
            ) from None
        tables.append(dict(level, **dense))
    return Built(tables, cycle, shapes)
