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
from typing import Any, BinaryIO

import numpy as np

from semiring_jax._src.core import checks
from semiring_jax._src.core.fsa import Fsa
from semiring_jax._src.io import npz_archive
from semiring_jax._src.io.npz_fields import fsa_from_arrays
from semiring_jax._src.io.npz_layout import (
    FORMAT,
    FSA_FIELDS,
    MAX_BYTES,
    OLD_NAMES,
    SIZES,
    SMALL,
    VERSION,
    File,
)

__all__ = ["FORMAT", "MAX_BYTES", "VERSION", "load", "save"]


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
    for name in FSA_FIELDS:
        arrays[name] = checks.concrete(getattr(fsa, name), name, "save")
    arrays["real_sizes"] = checks.concrete(fsa.schedule.real_sizes, "schedule.real_sizes", "save")
    for kind, shape in _saved_shapes(fsa).items():
        sizes, fields = SIZES[kind]
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
    where = npz_archive.file_name(file)
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
        members = npz_archive.members(archive, where, size)
        declared = {
            name: npz_archive.declared(archive, info, name, where) for name, info in members.items()
        }
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
        for name in SMALL:
            if name in members:
                shapes[name] = npz_archive.read(archive, members[name], name, where)
        table_bytes = fsa_from_arrays(shapes, where, shapes_only=True)
        if total + table_bytes > max_bytes:
            raise ValueError(
                f"load: {where}: the arrays declare {total} bytes and the table sizes "
                f"they store {table_bytes} more, in all more than max_bytes = "
                f"{max_bytes}; pass a larger max_bytes= to load the file"
            )
        arrays = {
            name: shapes[name] if name in SMALL else npz_archive.read(archive, info, name, where)
            for name, info in members.items()
            if name not in OLD_NAMES or name == "schedule.real_sizes"
        }
    return fsa_from_arrays(arrays, where)
