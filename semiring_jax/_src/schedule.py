"""`Schedule`: the index tables of an Fsa's level schedule, as a pytree.

Built on the host by `host/schedule.py`; read by the traced recursions in
`recursions.py`. Every field is an array leaf, so the tables travel with an
Fsa through `jax.jit` and `jax.vmap`.
"""

from __future__ import annotations

import dataclasses

import jax

from semiring_jax._src.array_types import ArrayLeaf

__all__ = ["Schedule"]


# eq=False: comparing or hashing arrays field by field is ill-defined;
# compare pytrees with chex.assert_trees_all_equal instead.
@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Index tables of the level schedule (see `host/schedule.py`).

    Positions live in an [L, W] grid flattened to P = L * W, followed by the
    dummy positions P (zero) and P + 1 (one). A state's arcs sit in rows of
    K slots; R rows per level, at most C rows per state.

    Attributes:
      state_pos: int32 [S], the grid position of each state (P if none).
      pos_state: int32 [L, W], the state at each position (S if padding).
      in_arc, in_src_pos: int32 [L, R, K], incoming arcs in arc-index order
        and their source positions (padding: arc A and position P; the
        start's pseudo-arc: arc A + 1 from position P + 1).
      in_combine: int32 [L, W, C], each state's rows (R for none).
      in_row_part: int32 [L, R], each row's index in a flattened [W, C].
      out_arc, out_dst_pos, out_combine: the same for outgoing arcs.
      arc_src_pos, arc_dst_pos: int32 [A], positions of each arc's ends.
      arc_grad_index: int32 [A], each arc's index in the flattened in-table
        (L * R * K for padding arcs).
      real_sizes: int32 [2], the states and arcs before batch padding.
      pull_arc, pull_src: int32 [A], the real arcs grouped by destination
        position (then arc index), then the padding arcs; and their source
        states. pull_end: int32 [L, W], where each position's arcs end in
        that order. Read by the compiled CPU kernels (`kernels/scores.cc`).
      state_in_arcs, state_out_arcs: int32 [S, K], each state's incoming
        and outgoing real arcs in arc order, padded with A; built for cyclic
        FSAs too, for dense intersection (`host/arc_tables.py`).
    """

    state_pos: ArrayLeaf
    pos_state: ArrayLeaf
    in_arc: ArrayLeaf
    in_src_pos: ArrayLeaf
    in_combine: ArrayLeaf
    in_row_part: ArrayLeaf
    out_arc: ArrayLeaf
    out_dst_pos: ArrayLeaf
    out_combine: ArrayLeaf
    arc_src_pos: ArrayLeaf
    arc_dst_pos: ArrayLeaf
    arc_grad_index: ArrayLeaf
    real_sizes: ArrayLeaf
    pull_arc: ArrayLeaf
    pull_src: ArrayLeaf
    pull_end: ArrayLeaf
    state_in_arcs: ArrayLeaf
    state_out_arcs: ArrayLeaf


jax.tree_util.register_dataclass(
    Schedule, data_fields=[f.name for f in dataclasses.fields(Schedule)], meta_fields=[]
)
