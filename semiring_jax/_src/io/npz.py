"""`save` and `load`: an Fsa (single or batched) in a documented `.npz` file.

Layout, version 4 (numpy's `.npz`: a zip of `.npy` arrays, read with
`allow_pickle=False`). `...` is the batch shape: () for a single Fsa, (B,)
for one from `sj.stack`; A and S are the padded arc and state counts.

| array | dtype | shape | meaning |
|---|---|---|---|
| `format` | str | [] | always `"semiring_jax.Fsa"` |
| `version` | int64 | [] | 4 |
| `batch_shape` | int64 | [N] | the batch shape `...` (N = 0: a single Fsa) |
| `is_acceptor` | bool | [] | the static `is_acceptor` |
| `cycle` | int64 | [C] | the static `cycle` (C = 0 when acyclic) |
| `src`, `dst` | int32 | [..., A] | arc source and destination states |
| `ilabel`, `olabel` | int32 | [..., A] | arc labels |
| `weight` | float32 or float64 | [..., A] | arc scores (-inf allowed) |
| `final_weight` | as `weight` | [..., S] | stopping scores, -inf if not final |
| `arc_mask` | bool | [..., A] | False on padding arcs |
| `final_mask` | bool | [..., S] | True on final states |
| `real_sizes` | int32 | [..., 2] | states and arcs of each entry before padding |
| `schedule_shape` | int64 | [F] | the padded sizes of the level tables (F = 0 when cyclic) |
| `schedule_shape_fields` | str | [F] | their names, the fields of `ScheduleShape` |
| `dense_shape` | int64 | [G] | the padded sizes of the dense-intersection tables |
| `dense_shape_fields` | str | [G] | their names, the fields of `DenseShape` |

The file holds structure, weights and the sizes the tables were built at,
and no table: `load` builds every entry's tables once, from its structure,
at the stored sizes, so that a batch's padding comes back exactly (sizes a
file names that are not this version's fields, or that an entry does not
fit in, are refused, naming the array). For a cyclic Fsa there are no level
tables (F = 0).

Versions 1 to 3 stored the tables themselves, as `schedule.<field>` arrays
of the schedule of their time (`schedule.state_pos` [..., S],
`schedule.pos_state` [..., L, W], `schedule.in_arc` [..., L, R, K], ...,
`schedule.real_sizes` [..., 2]; version 1 lacked `schedule.pull_arc`,
`schedule.pull_src` and `schedule.pull_end`, versions 1 and 2 lacked
`final_mask`: their final states are those with `final_weight` > -inf, as
they were then). `load` still reads them: their tables' headers are checked
(presence, dtype, shapes that agree with each other) and their data is not
read; the tables are built from the structure at the sizes this version
chooses (as `sj.stack` would, without `bucket`).

`load` trusts none of it: besides names, dtypes and shapes it checks the
values (states in range, no NaN or +inf weight, real sizes within the
padded ones, no cycle in a file that claims none), so a tampered file
cannot mislead the score recursions.

Nor does it allocate what a file merely claims. Before any array is read it
checks the member names (the layout's, each once), every member's `.npy`
header (dtype, shape; no Python objects) against its zip directory entry
(the uncompressed size must be exactly the header plus the declared data;
a stored member's compressed size equals it, a deflated one's may not
promise more than deflate's 1032:1 ratio, and no other compression is
read), the declared shapes against each other (the checks above), and
their total against `max_bytes` (4 GiB by default). So a small file can
never make `load` read more than that budget, nor more than 1032 times its
own size; the tables it builds are those of the stored structure, at sizes
the table builders accept for it, and the bytes of the tables those stored
sizes would build count against the same budget, before any is built.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple, Union

import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import UNKNOWN_SHAPES, Built, Entry, Fsa, Shapes, build_tables
from semiring_jax._src.core.host import dense_tables, levels, messages, schedule_tables
from semiring_jax._src.core.host.messages import quote
from semiring_jax._src.core.schedule import Schedule

__all__ = ["FORMAT", "MAX_BYTES", "VERSION", "load", "save"]

FORMAT = "semiring_jax.Fsa"
VERSION = 4
# Versions `load` reads.
_READS = (1, 2, 3, 4)

_HEADER = ("format", "version", "batch_shape", "is_acceptor", "cycle")
_ARC_FIELDS = ("src", "dst", "ilabel", "olabel", "weight", "arc_mask")
_FSA_FIELDS = (*_ARC_FIELDS, "final_weight", "final_mask")
# The stored sizes, by kind: (sizes array, field names array).
_SIZES = {
    "schedule": ("schedule_shape", "schedule_shape_fields"),
    "dense": ("dense_shape", "dense_shape_fields"),
}
_SIZE_NAMES = tuple(name for pair in _SIZES.values() for name in pair)
# The tables versions 1 to 3 stored, each with its axes after the batch
# axes: S and A are the Fsa's, "2" is 2, and every other letter a size that
# each table naming it must agree on (L levels, W width, R and K rows and
# slots of the incoming arcs, P and Q of the outgoing ones, C and D rows per
# state, I and J the per-state arc tables' widths).
_OLD_TABLES = {
    "state_pos": "S",
    "pos_state": "LW",
    "in_arc": "LRK",
    "in_src_pos": "LRK",
    "in_combine": "LWC",
    "in_row_part": "LR",
    "out_arc": "LPQ",
    "out_dst_pos": "LPQ",
    "out_combine": "LWD",
    "arc_src_pos": "A",
    "arc_dst_pos": "A",
    "arc_grad_index": "A",
    "real_sizes": "2",
    "pull_arc": "A",
    "pull_src": "A",
    "pull_end": "LW",
    "state_in_arcs": "SI",
    "state_out_arcs": "SJ",
}
_OLD_NAMES = frozenset(f"schedule.{name}" for name in _OLD_TABLES)
# The arrays of each version: version 1 lacked the pull tables, versions 1
# and 2 `final_mask` (Fsa.final_mask did not exist yet).
_LAYOUTS = {
    4: frozenset((*_HEADER, *_FSA_FIELDS, "real_sizes", *_SIZE_NAMES)),
    3: frozenset((*_HEADER, *_FSA_FIELDS)) | _OLD_NAMES,
}
_LAYOUTS[2] = _LAYOUTS[3] - {"final_mask"}
_LAYOUTS[1] = _LAYOUTS[2] - {
    "schedule.pull_arc",
    "schedule.pull_src",
    "schedule.pull_end",
}
_NAMES = frozenset().union(*_LAYOUTS.values())

File = Union[str, "os.PathLike[str]", BinaryIO]

# load's default budget: the total size the arrays of a file may declare.
MAX_BYTES = 1 << 32
# The most a deflate stream expands (258 bytes from about 2 bits).
_DEFLATE_RATIO = 1032
# Arrays read before the shapes of the others are checked against them.
_SMALL = (*_HEADER, *_SIZE_NAMES)


class _Declared(NamedTuple):
    """What a member's `.npy` header declares, before its data is read."""

    shape: tuple[int, ...]
    dtype: np.dtype


def save(file: File, fsa: Fsa, *, compress: bool = False) -> None:
    """Writes an Fsa, single or batched, to a `.npz` file that `load` reads.

    The layout (version 4) holds the structure and weights as they are,
    padding and -inf weights included, and the sizes its tables were built
    at (not the tables: `load` builds them again, at those sizes), so
    `load(file)` gives back an equal Fsa, leaf by leaf:

    - `format`: str [], `"semiring_jax.Fsa"`; `version`: int64 [], 4.
    - `batch_shape`: int64 [N]; `is_acceptor`: bool []; `cycle`: int64 [C].
    - `src`, `dst`, `ilabel`, `olabel`: int32 [..., A]; `arc_mask`: bool
      [..., A]; `weight`: float32 or float64 [..., A]; `final_weight`: the
      same dtype [..., S]; `final_mask`: bool [..., S].
    - `real_sizes`: int32 [..., 2], each entry's sizes before padding.
    - `schedule_shape`, `dense_shape`: int64, the tables' padded sizes;
      `schedule_shape_fields`, `dense_shape_fields`: str, their names.

    The module docstring of `semiring_jax._src.io.npz` has the full
    table. The name is used as given (no `.npz` is appended).

    Args:
      file: a path (str or os.PathLike) or a binary file object.
      fsa: an Fsa with concrete (not traced) arrays.
      compress: zip-compress the arrays (smaller, slower).
    Raises:
      TypeError: if `fsa` is not an Fsa.
      ValueError: for traced arrays (call `save` outside `jax.jit`), or an
        Fsa whose `shapes` do not record the sizes of its tables (one not
        made by this library's constructors, `sj.stack` or `sj.load`).
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
    arrays["real_sizes"] = checks.concrete(fsa.schedule.real_sizes, "schedule.real_sizes", "save")
    for kind, shape in _saved_shapes(fsa).items():
        sizes, fields = _SIZES[kind]
        arrays[sizes] = np.array(tuple(shape), np.int64).reshape(-1)
        arrays[fields] = np.array(shape._fields if shape else (), str).reshape(-1)
    writer: Callable[..., None] = np.savez_compressed if compress else np.savez
    if isinstance(file, (str, os.PathLike)):
        # np.savez would append ".npz" to a path without it.
        with open(os.fspath(file), "wb") as stream:
            writer(stream, **arrays)
    else:
        writer(file, **arrays)


def _saved_shapes(fsa: Fsa) -> dict[str, Any]:
    """The sizes to store, by kind (an empty tuple: a cyclic Fsa's level
    tables, which have none)."""
    shapes = fsa.shapes
    missing = [
        name
        for name, shape in (("schedule", shapes.schedule), ("dense", shapes.dense))
        if shape is None and not (name == "schedule" and fsa.cycle)
    ]
    if missing:
        raise ValueError(
            f"save: fsa.shapes does not record the sizes of its {missing[0]} tables, so load "
            f"could not build them again; an Fsa from this library's constructors, "
            f"sj.stack or sj.load records them"
        )
    return {"schedule": () if fsa.cycle else shapes.schedule, "dense": shapes.dense}


def load(file: File, *, max_bytes: int = MAX_BYTES) -> Fsa:
    """Reads an Fsa written by `save`, checking everything it reads.

    Names, `.npy` headers, shapes and sizes are checked before any array is
    read (see the module docstring of `semiring_jax._src.io.npz`),
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
    # A byte count: no int32 bound.
    max_bytes = checks.check_int(max_bytes, "max_bytes", "load")
    try:
        if isinstance(file, (str, os.PathLike)):
            with open(os.fspath(file), "rb") as stream:
                return _load(stream, where, max_bytes)
        return _load(file, where, max_bytes)
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
        # are checked against), then the data; an old file's tables are
        # checked by their headers and never read.
        shapes: dict[str, Any] = dict(declared)
        for name in _SMALL:
            if name in members:
                shapes[name] = _read(archive, members[name], name, where)
        table_bytes = _fsa_from_arrays(shapes, where, shapes_only=True)
        if total + table_bytes > max_bytes:
            raise ValueError(
                f"load: {where}: the arrays declare {total} bytes and the table sizes "
                f"they store {table_bytes} more, in all more than max_bytes = "
                f"{max_bytes}; pass a larger max_bytes= to load the file"
            )
        arrays = {
            name: shapes[name] if name in _SMALL else _read(archive, info, name, where)
            for name, info in members.items()
            if name not in _OLD_NAMES or name == "schedule.real_sizes"
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
    if version.shape != () or version.dtype.kind not in "iu" or int(version) not in _READS:
        raise check.fail(
            "version",
            f"is {version!r}; this semiring_jax reads versions {', '.join(map(str, _READS))}",
        )
    names = _LAYOUTS[int(version)]
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


def _fsa_from_arrays(arrays: dict[str, Any], where: str, *, shapes_only: bool = False) -> Any:
    """The Fsa of a file's arrays, every check made. With `shapes_only`, the
    arrays other than `_SMALL` may be `_Declared` headers: only names,
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
        schedule=Schedule(**tables, real_sizes=real_sizes),
        cycle=cycle,
        is_acceptor=is_acceptor,
        shapes=built.shapes,
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
    for field, axes in _OLD_TABLES.items():
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
        sizes_name, fields_name = _SIZES[kind]
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
