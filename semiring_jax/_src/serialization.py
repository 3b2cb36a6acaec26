"""`save` and `load`: an Fsa (single or batched) in a documented `.npz` file.

Layout, version 3 (numpy's `.npz`: a zip of `.npy` arrays, read with
`allow_pickle=False`). `...` is the batch shape: () for a single Fsa, (B,)
for one from `sj.stack`; A and S are the padded arc and state counts.

| array | dtype | shape | meaning |
|---|---|---|---|
| `format` | str | [] | always `"semiring_jax.Fsa"` |
| `version` | int64 | [] | 3 (version 2 lacked `final_mask`, version 1 the `pull_*` tables) |
| `batch_shape` | int64 | [N] | the batch shape `...` (N = 0: a single Fsa) |
| `is_acceptor` | bool | [] | the static `is_acceptor` |
| `cycle` | int64 | [C] | the static `cycle` (C = 0 when acyclic) |
| `src`, `dst` | int32 | [..., A] | arc source and destination states |
| `ilabel`, `olabel` | int32 | [..., A] | arc labels |
| `weight` | float32 or float64 | [..., A] | arc scores (-inf allowed) |
| `final_weight` | as `weight` | [..., S] | stopping scores, -inf if not final |
| `arc_mask` | bool | [..., A] | False on padding arcs |
| `final_mask` | bool | [..., S] | True on final states (not in version 2, see below) |
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
`load` reads versions 2 and 3. Version 2 files lack `final_mask`: their
final states are those with `final_weight` > -inf, as they were then.

`load` trusts none of it: besides names, dtypes and shapes it checks the
values (states in range, no NaN or +inf weight) and rebuilds every entry's
schedule from its structure at the stored sizes, refusing a file whose
tables differ, so a tampered file cannot mislead the score recursions.

Nor does it allocate what a file merely claims. Before any array is read it
checks the member names (the layout's, each once), every member's `.npy`
header (dtype, shape; no Python objects) against its zip directory entry
(the uncompressed size must be exactly the header plus the declared data;
a stored member's compressed size equals it, a deflated one's may not
promise more than deflate's 1032:1 ratio, and no other compression is
read), the declared shapes against each other (the checks above), and
their total against `max_bytes` (4 GiB by default). So a small file can
never make `load` take more memory than that budget, nor more than 1032
times its own size.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple, Union

import numpy as np

from semiring_jax._src import checks
from semiring_jax._src.fsa import Fsa
from semiring_jax._src.host import arc_tables, levels, messages, schedule
from semiring_jax._src.host.messages import quote
from semiring_jax._src.schedule import Schedule

__all__ = ["FORMAT", "MAX_BYTES", "VERSION", "load", "save"]

FORMAT = "semiring_jax.Fsa"
VERSION = 3
# Versions `load` reads.
_READS = (2, 3)

_HEADER = ("format", "version", "batch_shape", "is_acceptor", "cycle")
_ARC_FIELDS = ("src", "dst", "ilabel", "olabel", "weight", "arc_mask")
_FSA_FIELDS = (*_ARC_FIELDS, "final_weight", "final_mask")
_SCHEDULE_FIELDS = tuple(field.name for field in dataclasses.fields(Schedule))
_NAMES = frozenset(_HEADER + _FSA_FIELDS + tuple(f"schedule.{f}" for f in _SCHEDULE_FIELDS))
# Version 2 files, written before `Fsa.final_mask` existed, lack it; their
# final states are those with final_weight > -inf, as they were then.
_NOT_IN_VERSION_2 = frozenset({"final_mask"})

File = Union[str, "os.PathLike[str]", BinaryIO]

# load's default budget: the total size the arrays of a file may declare.
MAX_BYTES = 1 << 32
# The most a deflate stream expands (258 bytes from about 2 bits).
_DEFLATE_RATIO = 1032
# Arrays read before the shapes of the others are checked against them.
_SMALL = ("format", "version", "batch_shape", "is_acceptor", "cycle")


class _Declared(NamedTuple):
    """What a member's `.npy` header declares, before its data is read."""

    shape: tuple[int, ...]
    dtype: np.dtype


def save(file: File, fsa: Fsa, *, compress: bool = False) -> None:
    """Writes an Fsa, single or batched, to a `.npz` file that `load` reads.

    The layout (version 3) holds every pytree leaf as it is, padding and
    -inf weights included, so `load(file)` gives back an equal Fsa:

    - `format`: str [], `"semiring_jax.Fsa"`; `version`: int64 [], 3.
    - `batch_shape`: int64 [N]; `is_acceptor`: bool []; `cycle`: int64 [C].
    - `src`, `dst`, `ilabel`, `olabel`: int32 [..., A]; `arc_mask`: bool
      [..., A]; `weight`: float32 or float64 [..., A]; `final_weight`: the
      same dtype [..., S]; `final_mask`: bool [..., S].
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


def load(file: File, *, max_bytes: int = MAX_BYTES) -> Fsa:
    """Reads an Fsa written by `save`, checking everything it reads.

    Names, `.npy` headers, shapes and sizes are checked before any array is
    read (see the module docstring of `semiring_jax._src.serialization`),
    so a file cannot make `load` allocate more than `max_bytes`.

    Args:
      file: a path (str or os.PathLike) or a binary file object.
      max_bytes: the budget: the most bytes the file's arrays may declare
        in total (4 GiB by default); raise it to load larger files.
    Returns:
      The Fsa (numpy leaves), equal leaf by leaf to the one saved, with the
      same `cycle` and `is_acceptor`.
    Raises:
      ValueError: naming the file and the array at fault: not a `save`
        file, another format version, a missing, repeated or unexpected
        array, a wrong dtype or shape, a size that disagrees with the zip
        directory, more than `max_bytes` in all, an out-of-range state, a
        NaN or +inf weight, or schedule tables that do not match the
        structure; also for float64 weights while jax_enable_x64 is off.
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
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)):
        raise ValueError(f"load: max_bytes must be an int, got {max_bytes!r}")
    try:
        if isinstance(file, (str, os.PathLike)):
            with open(os.fspath(file), "rb") as stream:
                return _load(stream, where, int(max_bytes))
        return _load(file, where, int(max_bytes))
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile) as err:
        raise ValueError(f"load: {where}: cannot read it as .npz: {err}") from None


def _load(stream: BinaryIO, where: str, max_bytes: int) -> Fsa:
    start = stream.tell()
    if stream.read(6) == b"\x93NUMPY":
        raise ValueError(f"load: {where}: a single .npy array, not a saved Fsa")
    size = stream.seek(0, os.SEEK_END) - start
    stream.seek(start)
    with zipfile.ZipFile(stream) as archive:
        members = _members(archive, where, size)
        declared = {name: _declared(archive, info, name, where) for name, info in members.items()}
        total = sum(math.prod(d.shape) * d.dtype.itemsize for d in declared.values())
        if total > max_bytes:
            raise ValueError(
                f"load: {where}: the arrays declare {total} bytes in all, more than "
                f"max_bytes = {max_bytes}; pass a larger max_bytes= to load the file"
            )
        # Shapes first, from the headers (with the few small arrays they
        # are checked against), then the data.
        shapes: dict[str, Any] = dict(declared)
        for name in _SMALL:
            if name in members:
                shapes[name] = _read(archive, members[name], name, where)
        _fsa_from_arrays(shapes, where, shapes_only=True)
        arrays = {
            name: shapes[name] if name in _SMALL else _read(archive, info, name, where)
            for name, info in members.items()
        }
    return _fsa_from_arrays(arrays, where)


def _members(archive: zipfile.ZipFile, where: str, size: int) -> dict[str, zipfile.ZipInfo]:
    """The zip members by array name, checked before anything is read."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name not in _NAMES or not info.filename.endswith(".npy"):
            if "format.npy" not in archive.namelist():
                break  # reported below as no 'format'
            raise ValueError(f"load: {where}: array {quote(name)} is not part of the saved layout")
        if name in members:
            raise ValueError(f"load: {where}: array {name!r} appears twice in the file")
        if info.header_offset + info.compress_size > size:
            raise ValueError(
                f"load: {where}: array {name!r} claims {info.compress_size} compressed "
                f"bytes, more than the file holds ({size} bytes)"
            )
        members[name] = info
    if "format" not in members:
        raise ValueError(f"load: {where}: no array 'format'; not a file written by sj.save")
    return members


def _declared(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, where: str) -> _Declared:
    """A member's `.npy` header, checked against its zip directory entry."""
    fail = lambda problem: ValueError(f"load: {where}: array {name!r} {problem}")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise fail(
            f"is compressed with zip method {info.compress_type}; save writes stored or "
            f"deflated members only"
        )
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise fail(
            f"is stored uncompressed in {info.compress_size} bytes but claims {info.file_size}"
        )
    if info.file_size > _DEFLATE_RATIO * info.compress_size + 64:
        raise fail(
            f"claims {info.file_size} bytes from {info.compress_size} compressed ones, more "
            f"than deflate can expand ({_DEFLATE_RATIO}:1)"
        )
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise fail(f"is in .npy format version {version}, which load does not read")
            header_size = member.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        if str(err).startswith(f"load: {where}:"):
            raise
        raise fail(f"cannot be read: {messages.cut(str(err), 200)}") from None
    if dtype.hasobject:
        raise fail("cannot be read: it holds Python objects, which load does not unpickle")
    data_size = math.prod(shape) * dtype.itemsize  # exact: no int64 wrap-around
    if header_size + data_size != info.file_size:
        raise fail(
            f"declares shape {shape} of {dtype} ({data_size} bytes), but its zip member "
            f"holds {info.file_size - header_size} bytes of data"
        )
    return _Declared(tuple(shape), dtype)


def _file_name(file: File) -> str:
    if isinstance(file, (str, os.PathLike)):
        return repr(os.fspath(file))
    name = getattr(file, "name", None)
    return repr(name) if isinstance(name, str) else "<file object>"


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, where: str) -> np.ndarray:
    """One member's array (its header already checked by `_declared`)."""
    try:
        with archive.open(info) as member:
            return np.asarray(np.lib.format.read_array(member, allow_pickle=False))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        # e.g. a damaged member (a bad CRC, or data cut short)
        raise ValueError(
            f"load: {where}: array {name!r} cannot be read: {messages.cut(str(err), 200)}"
        ) from None


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
    if "version" not in arrays:
        raise check.fail("version", "is missing")
    version = arrays["version"]
    if version.shape != () or version.dtype.kind not in "iu" or int(version) not in _READS:
        raise check.fail(
            "version",
            f"is {version!r}; this semiring_jax reads versions {', '.join(map(str, _READS))}",
        )
    names = _NAMES - _NOT_IN_VERSION_2 if int(version) == 2 else _NAMES
    missing = sorted(names - set(arrays))
    if missing:
        raise check.fail(missing[0], "is missing")
    unexpected = sorted(set(arrays) - names)
    if unexpected:
        raise check.fail(unexpected[0], f"is not part of the version {int(version)} layout")
    (rank,) = check.rank("batch_shape", 1, "[N]")
    batch_shape = check.get("batch_shape", np.int64, (rank,), "[N]")
    if (batch_shape < 0).any():
        raise check.fail("batch_shape", f"holds a negative size: {batch_shape.tolist()}")
    is_acceptor = check.get("is_acceptor", bool, (), "[]")
    (length,) = check.rank("cycle", 1, "[C]")
    cycle = check.get("cycle", np.int64, (length,), "[C]")
    return tuple(batch_shape.tolist()), bool(is_acceptor), tuple(cycle.tolist())


def _fsa_from_arrays(arrays: dict[str, Any], where: str, *, shapes_only: bool = False) -> Fsa:
    """The Fsa of a file's arrays, every check made. With `shapes_only`, the
    arrays other than `_SMALL` may be `_Declared` headers: only names,
    dtypes and shapes are checked, and nothing is returned."""
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
    if shapes_only:
        if "final_mask" in arrays:
            check.get("final_mask", bool, state_shape, "[..., S]")
        _schedule_tables(check, batch_shape, num_states, num_arcs)
        return None  # type: ignore[return-value]  # the value is not used
    fields["final_mask"] = (
        check.get("final_mask", bool, state_shape, "[..., S]")
        if "final_mask" in arrays
        else fields["final_weight"] > -np.inf
    )
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
