"""An Fsa's tables built on the host: the level schedule's and the dense
scan's, for each entry of a batch at sizes common to all, and the sizes
they were built at (`Shapes`).

These are the build-once tables of `core/tables.py`'s `Tables`: pure numpy,
from the structure alone (`src`, `dst`, `arc_mask`), never from a weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from semiring_jax._src.core.host import dense_tables, levels, schedule_tables

__all__ = [
    "UNKNOWN_SHAPES",
    "Built",
    "Entry",
    "Shapes",
    "at_levels",
    "build_tables",
    "dense_tables_of",
]


class Shapes(NamedTuple):
    """The padded sizes an Fsa's tables were built at, as the builders chose
    them: static metadata, which `sj.save` stores so that `sj.load` builds
    the same tables again.

    Attributes:
      schedule: the level tables' `ScheduleShape`; None for a cyclic Fsa
        (it has none) or where the sizes are not known.
      dense: the dense-intersection tables' `DenseShape`; None where the
        sizes are not known.
    """

    schedule: Any = None
    dense: Any = None


# No sizes known (or chosen): the builders choose them.
UNKNOWN_SHAPES = Shapes()


class Entry(NamedTuple):
    """One FSA's structure as the table builders take it."""

    num_states: int  # S (padded)
    src: np.ndarray  # int32 [A] (padded)
    dst: np.ndarray  # int32 [A]
    arc_mask: np.ndarray  # bool [A]


class Built(NamedTuple):
    """The tables of a batch's entries, each built once, at common sizes."""

    tables: list[dict[str, np.ndarray]]  # per entry, every Schedule field but real_sizes
    cycle: tuple[int, ...]  # the first cyclic entry's cycle; () if none
    shapes: Shapes


def _identity(size: int) -> int:
    return size


def _path_lengths(entry: Entry) -> levels.PathLengths | None:
    return levels.path_lengths(
        entry.num_states, entry.src[entry.arc_mask], entry.dst[entry.arc_mask], height=False
    )


def build_tables(
    entries: Sequence[Entry],
    *,
    round_up: Callable[[int], int] = _identity,
    shapes: Shapes = UNKNOWN_SHAPES,
    lengths: Sequence[levels.PathLengths | None] | None = None,
    cycle: tuple[int, ...] = (),
) -> Built:
    """Every entry's tables, each built once, at sizes common to all.

    The longest paths of each entry are found once (unless given) and both
    prove it acyclic and seed its levels. One cyclic entry leaves every
    entry without level tables (zero-sized) and gives the batch its cycle;
    the dense tables are built for cyclic entries too.

    Args:
      entries: each entry's structure, all of one S and A (padded).
      round_up: applied to every size the builders choose (a bucketing
        ladder); not to given `shapes`.
      shapes: sizes to build at instead of choosing them (either may be
        None: chosen); `sj.load` gives a file's.
      lengths: `levels.path_lengths` of each entry's real arcs, if known.
      cycle: a cycle the caller knows the batch to have (a file's): no
        longest paths are sought and no level tables built.
    Returns:
      The tables of each entry, the batch's cycle, and the sizes used.
    Raises:
      ValueError: from the builders, if given level sizes are too small.
    """
    found = list(lengths) if lengths is not None else []
    if not cycle and lengths is None:
        for entry in entries:
            found.append(_path_lengths(entry))
            if found[-1] is None:  # the batch is cyclic: no level tables for any
                break
    cyclic = next((i for i, entry_lengths in enumerate(found) if entry_lengths is None), None)
    if not cycle and cyclic is not None:
        entry = entries[cyclic]
        cycle = levels.find_cycle(
            entry.num_states, entry.src[entry.arc_mask], entry.dst[entry.arc_mask]
        )
    level_shape = None
    if cycle:
        level_tables = [
            schedule_tables.empty_schedule_arrays(e.num_states, e.src.shape[0]) for e in entries
        ]
    elif shapes.schedule is not None:
        level_shape = shapes.schedule
        level_tables = [
            schedule_tables.build_schedule_arrays(*entry, shape=level_shape, lengths=entry_lengths)
            for entry, entry_lengths in zip(entries, found)
        ]
    else:
        common = schedule_tables.build_common(entries, round_up, found)
        assert common is not None  # every entry is acyclic
        level_shape, level_tables = common
    dense, dense_shape = dense_tables_of(entries, shapes.dense)
    tables = [dict(level, **by_state) for level, by_state in zip(level_tables, dense)]
    return Built(tables, cycle, Shapes(level_shape, dense_shape))


def dense_tables_of(
    entries: Sequence[Entry], shape: Any
) -> tuple[list[dict[str, np.ndarray]], Any]:
    """Each entry's dense-intersection tables at `shape` (the entries'
    common sizes if None), and the shape."""
    if shape is None:
        shape = dense_tables.common_dense_shape(
            [dense_tables.dense_shape(*entry) for entry in entries]
        )
    return [dense_tables.build_dense_tables(*entry, shape=shape) for entry in entries], shape


def at_levels(entry: Entry, known_levels: np.ndarray) -> Built:
    """The tables of an internal graph at levels its builder knows (every
    arc goes up them): no longest paths, no balancing; its level sizes are
    not recorded (the builder chooses them from the levels)."""
    level = schedule_tables.build_schedule_arrays(*entry, levels=known_levels)
    (by_state,), dense_shape = dense_tables_of([entry], None)
    return Built([dict(level, **by_state)], (), Shapes(None, dense_shape))
