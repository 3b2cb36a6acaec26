"""`Schedule`: the index tables an Fsa's score recursions gather through, as
a pytree, nested by purpose.

Built on the host by `core/host/schedule_tables.py` (the level and pull
tables) and `core/host/dense_tables.py` (the dense tables), as flat dicts
of arrays that `Schedule.from_arrays` nests; read by the traced recursions
in `scores/level_scan.py` and `scores/level_pairs.py` (`levels`), the
compiled CPU kernels (`pull`) and dense intersection (`dense`). Every table
is an array leaf, so the tables travel with an Fsa through `jax.jit` and
`jax.vmap`, and `sj.stack` stacks them leaf by leaf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import jax

from semiring_jax._src.core.array_types import ArrayLeaf

__all__ = ["DenseTables", "LevelTables", "PullTables", "Schedule"]


class LevelTables(NamedTuple):
    """The level schedule (see `core/host/schedule_tables.py`).

    Positions live in N steps of C, flattened to P = N * C, followed by the
    dummy positions P (zero) and P + 1 (one). Each position pulls through K
    slots (K_in incoming, K_out outgoing). Arc ids in the slot tables are
    *augmented*: a real arc's own index, A (the dummy, weight zero), A + 1
    (the start's pseudo-arc, weight one) and A + 2 + h (helper arc h of a
    fan tree, weight one).

    Attributes:
      state_pos: int32 [S], the position of each state (P if none).
      pos_state: int32 [N, C], the state at each position (S for a helper
        or padding).
      in_arc, in_src_pos: int32 [N, C, K_in], incoming arcs in slot order
        and their source positions (padding: arc A and position P; the
        start's pseudo-arc: arc A + 1 from position P + 1).
      out_arc, out_dst_pos: int32 [N, C, K_out], the same for outgoing arcs.
      arc_src_pos, arc_dst_pos: int32 [A], the positions at each real arc's
        ends (a helper's, where a fan tree stands between the arc and its
        state; P for padding arcs).
      arc_grad_index: int32 [A], each arc's index in the flattened in-table
        (N * C * K_in for padding arcs); helper_grad_index: int32 [H], the
        same for the helper arcs.
    """

    state_pos: ArrayLeaf
    pos_state: ArrayLeaf
    in_arc: ArrayLeaf
    in_src_pos: ArrayLeaf
    out_arc: ArrayLeaf
    out_dst_pos: ArrayLeaf
    arc_src_pos: ArrayLeaf
    arc_dst_pos: ArrayLeaf
    arc_grad_index: ArrayLeaf
    helper_grad_index: ArrayLeaf


class PullTables(NamedTuple):
    """The arcs in the order the compiled CPU kernels (`kernels/scores.cc`)
    pull them, position by position of the level schedule.

    Attributes:
      arc, src: int32 [A], the real arcs grouped by destination position
        (then arc index), then the padding arcs; and their source states.
      end: int32 [N, C], where each position's arcs end in that order.
    """

    arc: ArrayLeaf
    src: ArrayLeaf
    end: ArrayLeaf


class DenseTables(NamedTuple):
    """The arcs of each state in rows of K slots, for dense intersection
    (`core/host/dense_tables.py`); built for cyclic FSAs too.

    Attributes:
      in_arc: int32 [S + E, K], the real arcs grouped by destination in rows
        of K slots, in arc order (A for padding): row s < S is state s's
        first row, rows S.. the further rows of states with more than K.
      in_leaf: int32 [G, F^L], the rows at the leaves of the trees (fan-in
        F = max(K, 2)) that combine such states' rows (S + E for padding);
        in_top: int32 [S], each such state's node in the tree levels laid
        end to end (their total size for other states).
      out_slot, out_leaf, out_top: the same for the arcs grouped by source,
        each slot naming the arc's slot in the flattened `in_arc`
        ((S + E) * K for padding).
    """

    in_arc: ArrayLeaf
    in_leaf: ArrayLeaf
    in_top: ArrayLeaf
    out_slot: ArrayLeaf
    out_leaf: ArrayLeaf
    out_top: ArrayLeaf


# eq=False: comparing or hashing arrays field by field is ill-defined;
# compare pytrees with chex.assert_trees_all_equal instead.
@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """An Fsa's index tables, by purpose.

    Attributes:
      levels: the level schedule (`LevelTables`), zero-sized for a cyclic
        Fsa, which has none.
      pull: the arcs in the compiled kernels' order (`PullTables`).
      dense: the dense-intersection tables (`DenseTables`).
      real_sizes: int32 [2], the states and arcs before batch padding.
    """

    levels: LevelTables
    pull: PullTables
    dense: DenseTables
    real_sizes: ArrayLeaf

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, ArrayLeaf], real_sizes: ArrayLeaf) -> Schedule:
        """The schedule of the host builders' flat dict: the level tables by
        their names, the others by `pull_<field>` and `dense_<field>`."""
        pick = lambda tables, prefix: tables(*(arrays[prefix + f] for f in tables._fields))
        return cls(
            pick(LevelTables, ""),
            pick(PullTables, "pull_"),
            pick(DenseTables, "dense_"),
            real_sizes,
        )

    def arrays(self) -> dict[str, ArrayLeaf]:
        """The tables as the host builders name them (`from_arrays`'s input)."""
        flat = dict(self.levels._asdict())
        flat.update({f"pull_{field}": value for field, value in self.pull._asdict().items()})
        flat.update({f"dense_{field}": value for field, value in self.dense._asdict().items()})
        return flat


jax.tree_util.register_dataclass(
    Schedule, data_fields=[f.name for f in dataclasses.fields(Schedule)], meta_fields=[]
)
