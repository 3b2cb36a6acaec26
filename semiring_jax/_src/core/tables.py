"""`Tables`: an Fsa's build-once tables (its `Schedule`, `cycle` and `Shapes`)
as one explicit pytree node, built when the Fsa is made or when first read.

Why not always when the Fsa is made: the tables cost more than most
structural ops (on `benchmarks/bench_algorithms.py`'s inputs, building
those of `remove_epsilon`'s result takes three times as long as the op),
and many Fsas never need theirs: the intermediate results of a chain of
structural ops, and the entries of a batch, whose tables `sj.stack` builds
once, at the batch's sizes. So the constructors that make such Fsas
(`assemble(..., defer=True)`) give them *deferred* tables, which keep the
structure (`fsa_tables.Entry`) and build from it, once, when something
reads them: a score op (`fsa.schedule`), `jax.jit` or any other flattening,
`sj.save`. Every other Fsa is made with its tables built.

The tables are derived data: building them changes no value, only when
their cost is paid. An Fsa's copies that keep its structure (`replace` of
a weight) share its `Tables`, so they build once between them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from semiring_jax._src.core.host import fsa_tables
from semiring_jax._src.core.host.fsa_tables import Shapes
from semiring_jax._src.core.schedule import Schedule

__all__ = ["Tables"]


class _Value(NamedTuple):
    schedule: Schedule
    cycle: tuple[int, ...]
    shapes: Shapes


class _Deferred(NamedTuple):
    entry: fsa_tables.Entry
    real_sizes: np.ndarray  # int32 [2]


class Tables:
    """An Fsa's tables: built (`Tables(schedule, cycle, shapes)`) or
    deferred (`Tables.deferred(entry, real_sizes)`: built from the
    structure at the first read of any attribute, once).

    A pytree node: its leaves are the schedule's arrays, its static
    metadata the cycle and shapes, so flattening a deferred one builds it.

    Attributes:
      schedule: the index tables the score recursions gather through.
      cycle: () if acyclic, else the states of one cycle.
      shapes: the padded sizes the tables were built at, which `sj.save`
        stores.
      is_built: False while deferred tables have not been read.
    """

    def __init__(self, schedule: Schedule, cycle: tuple[int, ...], shapes: Shapes) -> None:
        self._value: _Value | None = _Value(schedule, cycle, shapes)
        self._deferred: _Deferred | None = None

    @classmethod
    def deferred(cls, entry: fsa_tables.Entry, real_sizes: np.ndarray) -> Tables:
        """Tables of `entry`'s structure, built when first read."""
        tables = cls.__new__(cls)
        tables._value, tables._deferred = None, _Deferred(entry, real_sizes)
        return tables

    @classmethod
    def of(cls, built: fsa_tables.Built, real_sizes: np.ndarray) -> Tables:
        """The tables of `built`'s entry 0."""
        return cls(Schedule.from_arrays(built.tables[0], real_sizes), built.cycle, built.shapes)

    @property
    def is_built(self) -> bool:
        return self._value is not None

    def _built(self) -> _Value:
        if self._value is None:
            assert self._deferred is not None  # one of the two is always set
            entry, real_sizes = self._deferred
            built = self.of(fsa_tables.build_tables([entry]), real_sizes)._value
            # The structure is not needed once the tables are built.
            self._value, self._deferred = built, None
        assert self._value is not None
        return self._value

    @property
    def schedule(self) -> Schedule:
        return self._built().schedule

    @property
    def cycle(self) -> tuple[int, ...]:
        return self._built().cycle

    @property
    def shapes(self) -> Shapes:
        return self._built().shapes


_Meta = tuple[tuple[int, ...], Shapes]


def _flatten(tables: Tables) -> tuple[tuple[Schedule], _Meta]:
    return (tables.schedule,), (tables.cycle, tables.shapes)


def _flatten_with_keys(tables: Tables) -> tuple[tuple[tuple[Any, Schedule]], _Meta]:
    # Key paths read `.tables.schedule.levels.pos_state`, as attributes do.
    (schedule,), meta = _flatten(tables)
    return ((jax.tree_util.GetAttrKey("schedule"), schedule),), meta


def _unflatten(meta: _Meta, children: Any) -> Tables:
    (schedule,) = children
    return Tables(schedule, *meta)


jax.tree_util.register_pytree_with_keys(Tables, _flatten_with_keys, _unflatten, _flatten)
