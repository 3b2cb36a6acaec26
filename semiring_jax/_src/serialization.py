"""`save` and `load`: an Fsa (single or batched) in a documented `.npz` file.

Layout, version 2 (numpy's `.npz`: a zip of `.npy` arrays, read with
`allow_pickle=False`). `...` is the batch shape: () for a single Fsa, (B,)
for one from `sj.stack`; A and S are the padded arc and state counts.

| array | dtype | shape | meaning |
|---|---|---|---|
| `format` | str | [] | always `"semiring_jax.Fsa"` |
| `version` | int64 | [] | 2 (version 1 lacked the `pull_*` tables) |
| `batch_shape` | int64 | [N] | the batch shape `...` (N = 0: a single Fsa) |
| `is_acceptor` | bool | [] | the static `is_acceptor` |
| `cycle` | int64 | [C] | the static `cycle` (C = 0 when acyclic) |
| `src`, `dst` | int32 | [..., A] | arc source and destination states |
| `ilabel`, `olabel` | int32 | [..., A] | arc labels |
| `weight` | float32 or float64 | [..., A] | arc scores (-inf allowed) |
| `final_weight` | as `weight` | [..., S] | stopping scores, -inf if not final |
| `arc_mask` | bool | [..., A] | False on padding arcs |
| `schedule.state_pos` | int32 | [..., S] | `Schedule` tables, one array each |
| `schedule.pos_state` | int32 | [..., L, W] | |
| `schedule.in_arc`, `schedule.in_src_pos` | int32 | [..., L, R, K] | |
| `schedule.in_combine` | int32 | [..., L, W, C] | |
| `schedule.in_row_part` | int32 | [..., L, R] | |
| `schedule.out_arc`, `schedule.out_dst_pos` | int32 | [..., L, R', K'] | |
| `schedule.out_combine` | int32 | [..., L, W, C'] | |
| `schedule.arc_src_pos`, `schedule.arc_dst_pos` | int32 | [..., A] | |
| `schedule.arc_grad_index` | int32 | [..., A] | |
| `schedule.real_sizes` | int32 | [..., 2] | states and arcs before padding |
| `schedule.pull_arc`, `schedule.pull_src` | int32 | [..., A] | arcs by destination position |
| `schedule.pull_end` | int32 | [..., L, W] | |
| `schedule.state_in_arcs` | int32 | [..., S, K1] | each state's incoming arcs |
| `schedule.state_out_arcs` | int32 | [..., S, K2] | each state's outgoing arcs |

The schedule tables are stored, not rebuilt, so that a batch's padded
sizes come back exactly; for a cyclic Fsa they are zero-sized (L = 0).

`load` trusts none of it: besides names, dtypes and shapes it checks the
values (states in range, no NaN or +inf weight) and rebuilds every entry's
schedule from its structure at the stored sizes, refusing a file whose
tables differ, so a tampered file cannot mislead the score recursions.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO, Union

import numpy as np

from semiring_jax._src import checks
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.host import arc_tables, levels, schedule
from semiring_jax._src.schedule import Schedule

__all__ = ["FORMAT", "VERSION", "load", "save"]

FORMAT = "semiring_jax.Fsa"
VERSION = 2

_HEADER = ("format", "version", "batch_shape", "is_acceptor", "cycle")
_ARC_FIELDS = ("src", "dst", "ilabel", "olabel", "weight", "arc_mask")
_FSA_FIELDS = (*_ARC_FIELDS, "final_weight")
_SCHEDULE_FIELDS = tuple(field.name for field in dataclasses.fields(Schedule))
_NAMES = frozenset(_HEADER + _FSA_FIELDS + tuple(f"schedule.{f}" for f in _SCHEDULE_FIELDS))

File = Union[str, "os.PathLike[str]", BinaryIO]


def save(file: File, fsa: Fsa, *, compress: bool = False) -> None:
    """Writes an Fsa, single or batched, to a `.npz` file that `load` reads.

    The layout (version 2) holds every pytree leaf as it is, padding and
    -inf weights included, so `load(file)` gives back an equal Fsa:

    - `format`: str [], `"semiring_jax.Fsa"`; `version`: int64 [], 2.
    - `batch_shape`: int64 [N]; `is_acceptor`: bool []; `cycle`: int64 [C].
    - `src`, `dst`, `ilabel`, `olabel`: int32 [..., A]; `arc_mask`: bool
      [..., A]; `weight`: float32 or float64 [..., A]; `final_weight`: the
      same dtype [..., S].
    - `schedule.<field>`: int32, each `Schedule` table (e.g.
      `schedule.state_pos` [..., S], `schedule.in_arc` [..., L, R, K]).

    The module docstring of `semiring_jax._src.serialization` has the full
    table. The name is used as given (no `.npz` is appended).

    Args:
      file: a path (str or os.PathLike) or a binary file object.
      fsa: an Fsa with concrete (not traced) arrays.
      compress: zip-compress the arrays (smaller, slower).
    Raises:
      TypeError: if `fsa` is not an Fsa.
      ValueError: for traced arrays (call `save` outside `jax.jit`).
    Examples:
      >>> import os, tempfile
      >>> import semiring_jax as sj
      >>> path = os.path.join(tempfile.mkdtemp(), "batch.npz")
      >>> batch = sj.stack([sj.linear_fsa([1, 2]), sj.linear_fsa([3])])
      >>> sj.save(path, batch)
      >>> sj.load(path)
      Fsa(acceptor, num_states=3, num_arcs=2, batch_shape=(2,))
    """
    if not isinstance(fsa, Fsa):
        raise TypeError(f"save: fsa must be an Fsa, got {type(fsa).__name__}")
    arrays: dict[str, np.ndarray] = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION, np.int64),
        "batch_shape": np.array(fsa.batch_shape, np.int64).reshape(-1),
        "is_acceptor": np.array(bool(fsa.is_acceptor)),
        "cycle": np.array(fsa.cycle, np.int64).reshape(-1),
    }
    for name in _FSA_FIELDS:
        arrays[name] = checks.concrete(getattr(fsa, name), name, "save")
    for name in _SCHEDULE_FIELDS:
        arrays[f"schedule.{name}"] = checks.concrete(
            getattr(fsa.schedule, name), f"schedule.{name}", "save"
        )
    writer: Callable[..., None] = np.savez_compressed if compress else np.savez
    if isinstance(file, (str, os.PathLike)):
        # np.savez would append ".npz" to a path without it.
        with open(os.fspath(file), "wb") as stream:
            writer(stream, **arrays)
    else:
        writer(file, **arrays)


def load(file: File) -> Fsa:
    """Reads an Fsa written by `save`, checking everything it reads.

    Args:
      file: a path (str or os.PathLike) or a binary file object.
    Returns:
      The Fsa (numpy leaves), equal leaf by leaf to the one saved, with the
      same `cycle` and `is_acceptor`.
    Raises:
      ValueError: naming the file and the array at fault: not a `save`
        file, another format version, a missing or unexpected array, a
        wrong dtype or shape, an out-of-range state, a NaN or +inf weight,
        or schedule tables that do not match the structure; also for
        float64 weights while jax_enable_x64 is off.
    Examples:
      >>> import io
      >>> import semiring_jax as sj
      >>> buffer = io.BytesIO()
      >>> sj.save(buffer, sj.Fsa.from_arcs([(0, 1, 5, 0.5)], final={1: -1.0}))
      >>> _ = buffer.seek(0)
      >>> fsa = sj.load(buffer)
      >>> print(fsa.weight, fsa.final_weight)
      [0.5] [-inf  -1.]
    """
    where = _file_name(file)
    try:
        data = np.load(file, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"load: {where}: cannot read it as .npz: {err}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"load: {where}: a single .npy array, not a saved Fsa")
    with data:
        names = set(data.files)
        if "format" not in names:
            raise ValueError(f"load: {where}: no array 'format'; not a file written by sj.save")
        arrays = {name: _read(data, name, where) for name in sorted(names)}
    return _fsa_from_arrays(arrays, where)


def _file_name(file: File) -> str:
    if isinstance(file, (str, os.PathLike)):
        return repr(os.fspath(file))
    name = getattr(file, "name", None)
    return repr(name) if isinstance(name, str) else "<file object>"


def _read(data: Any, name: str, where: str) -> np.ndarray:
    try:
        return np.asarray(data[name])
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        # e.g. an object array (refused without pickle), or a damaged member
        raise ValueError(f"load: {where}: array {name!r} cannot be read: {err}") from None


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


def _header(check: _Checker) -> tuple[tuple[int, ...], bool, tuple[int, ...]]:
    """(batch shape, is_acceptor, cycle), after the format and version."""
    arrays = check.arrays
    fmt = arrays["format"]
    if fmt.shape != () or fmt.dtype.kind != "U" or str(fmt[()]) != FORMAT:
        raise check.fail("format", f"is not {FORMAT!r}; not a file written by sj.save")
    missing = sorted(_NAMES - set(arrays))
    if "version" in missing:
        raise check.fail("version", "is missing")
    version = arrays["version"]
    if version.shape != () or version.dtype.kind not in "iu" or int(version) != VERSION:
        raise check.fail("version", f"is {version!r}; this semiring_jax reads version {VERSION}")
    if missing:
        raise check.fail(missing[0], "is missing")
    unexpected = sorted(set(arrays) - _NAMES)
    if unexpected:
        raise check.fail(unexpected[0], f"is not part of the version {VERSION} layout")
    (rank,) = check.rank("batch_shape", 1, "[N]")
    batch_shape = check.get("batch_shape", np.int64, (rank,), "[N]")
    if (batch_shape < 0).any():
        raise check.fail("batch_shape", f"holds a negative size: {batch_shape.tolist()}")
    is_acceptor = check.get("is_acceptor", bool, (), "[]")
    (length,) = check.rank("cycle", 1, "[C]")
    cycle = check.get("cycle", np.int64, (length,), "[C]")
    return tuple(batch_shape.tolist()), bool(is_acceptor), tuple(cycle.tolist())


def _fsa_from_arrays(arrays: dict[str, np.ndarray], where: str) -> Fsa:
    check = _Checker(arrays, where)
    batch_shape, is_acceptor, cycle = _header(check)
    batch = len(batch_shape)
    num_arcs = check.rank("src", batch + 1, "[..., A]")[-1]
    num_states = check.rank("final_weight", batch + 1, "[..., S]")[-1]
    if num_states < 1:
        raise check.fail("final_weight", "has no state; an Fsa has at least one")
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
    _check_values(check, fields, num_states, cycle)
    tables = _schedule_tables(check, batch_shape, num_states, num_arcs)
    _check_schedule(check, fields, tables, num_states, cycle)
    return Fsa(**fields, schedule=Schedule(**tables), cycle=cycle, is_acceptor=is_acceptor)


def _check_values(
    check: _Checker, fields: dict[str, np.ndarray], num_states: int, cycle: tuple[int, ...]
) -> None:
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
    if any(not 0 <= state < num_states for state in cycle):
        raise check.fail("cycle", f"holds a state out of range for S={num_states}: {cycle}")


def _schedule_tables(
    check: _Checker, batch_shape: tuple[int, ...], num_states: int, num_arcs: int
) -> dict[str, np.ndarray]:
    """The schedule arrays, their dtypes and mutually consistent shapes checked."""
    batch = len(batch_shape)
    name = lambda field: f"schedule.{field}"
    levels_, width = check.rank(name("pos_state"), batch + 2, "[..., L, W]")[-2:]
    in_rows, max_in = check.rank(name("in_arc"), batch + 3, "[..., L, R, K]")[-2:]
    out_rows, max_out = check.rank(name("out_arc"), batch + 3, "[..., L, R, K]")[-2:]
    in_parts = check.rank(name("in_combine"), batch + 3, "[..., L, W, C]")[-1]
    out_parts = check.rank(name("out_combine"), batch + 3, "[..., L, W, C]")[-1]
    in_width = check.rank(name("state_in_arcs"), batch + 2, "[..., S, K]")[-1]
    out_width = check.rank(name("state_out_arcs"), batch + 2, "[..., S, K]")[-1]
    expected = {
        "state_pos": ((num_states,), "[..., S]"),
        "pos_state": ((levels_, width), "[..., L, W]"),
        "in_arc": ((levels_, in_rows, max_in), "[..., L, R, K]"),
        "in_src_pos": ((levels_, in_rows, max_in), "[..., L, R, K]"),
        "in_combine": ((levels_, width, in_parts), "[..., L, W, C]"),
        "in_row_part": ((levels_, in_rows), "[..., L, R]"),
        "out_arc": ((levels_, out_rows, max_out), "[..., L, R, K]"),
        "out_dst_pos": ((levels_, out_rows, max_out), "[..., L, R, K]"),
        "out_combine": ((levels_, width, out_parts), "[..., L, W, C]"),
        "arc_src_pos": ((num_arcs,), "[..., A]"),
        "arc_dst_pos": ((num_arcs,), "[..., A]"),
        "arc_grad_index": ((num_arcs,), "[..., A]"),
        "real_sizes": ((2,), "[..., 2]"),
        "pull_arc": ((num_arcs,), "[..., A]"),
        "pull_src": ((num_arcs,), "[..., A]"),
        "pull_end": ((levels_, width), "[..., L, W]"),
        "state_in_arcs": ((num_states, in_width), "[..., S, K]"),
        "state_out_arcs": ((num_states, out_width), "[..., S, K]"),
    }
    return {
        field: check.get(name(field), np.int32, batch_shape + shape, described)
        for field, (shape, described) in expected.items()
    }


def _check_schedule(
    check: _Checker,
    fields: dict[str, np.ndarray],
    tables: dict[str, np.ndarray],
    num_states: int,
    cycle: tuple[int, ...],
) -> None:
    """Rebuilds each entry's tables from its structure and compares."""
    num_arcs = fields["src"].shape[-1]
    batch = fields["src"].ndim - 1
    entries = int(np.prod(fields["src"].shape[:-1]))
    flat = lambda value: value.reshape((entries, *value.shape[batch:]))
    src, dst, arc_mask = flat(fields["src"]), flat(fields["dst"]), flat(fields["arc_mask"])
    flat_tables = {field: flat(value) for field, value in tables.items()}
    real_sizes = flat_tables["real_sizes"]
    bad = np.flatnonzero(
        (real_sizes[:, 0] < 1)
        | (real_sizes[:, 0] > num_states)
        | (real_sizes[:, 1] < 0)
        | (real_sizes[:, 1] > num_arcs)
    )
    if bad.size:
        raise check.fail(
            "schedule.real_sizes",
            f"holds {real_sizes[bad[0]].tolist()} "
            f"(entry {bad[0]}), out of range for "
            f"S={num_states}, A={num_arcs}",
        )
    levels_, width = tables["pos_state"].shape[-2:]
    in_rows, max_in = tables["in_arc"].shape[-2:]
    out_rows, max_out = tables["out_arc"].shape[-2:]
    shape = schedule.ScheduleShape(
        levels_,
        width,
        in_rows,
        max_in,
        tables["in_combine"].shape[-1],
        out_rows,
        max_out,
        tables["out_combine"].shape[-1],
    )
    for entry in range(entries):
        mask = arc_mask[entry]
        entry_src, entry_dst = src[entry], dst[entry]
        expected = {
            "state_in_arcs": arc_tables.arcs_by_state(
                num_states, entry_dst, mask, flat_tables["state_in_arcs"].shape[-1]
            ),
            "state_out_arcs": arc_tables.arcs_by_state(
                num_states, entry_src, mask, flat_tables["state_out_arcs"].shape[-1]
            ),
        }
        if cycle:
            expected.update(schedule.empty_schedule_arrays(num_states, num_arcs))
        else:
            found = levels.find_cycle(num_states, entry_src[mask], entry_dst[mask])
            if found:
                raise check.fail(
                    "cycle", f"is empty, but entry {entry} has the cycle {list(found)}"
                )
            try:
                expected.update(
                    schedule.build_schedule_arrays(num_states, entry_src, entry_dst, mask, shape)
                )
            except ValueError as err:
                raise check.fail(
                    "schedule.pos_state", f"gives sizes that do not fit entry {entry}: {err}"
                ) from None
        for field, value in expected.items():
            stored = flat_tables[field][entry]
            if stored.shape != value.shape or not np.array_equal(stored, value):
                raise check.fail(
                    f"schedule.{field}",
                    f"does not match the structure of entry {entry} (src, dst, arc_mask)",
                )
