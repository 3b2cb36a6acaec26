"""`Schedule`: the index tables of an Fsa's level schedule, as a pytree.

Built on the host by `core/host/schedule_tables.py`; read by the traced recursions in
`scores/level_scan.py`. Every field is an array leaf, so the tables travel with an
Fsa through `jax.jit` and `jax.vmap`.
"""

from __future__ import annotations

import dataclasses

import jax

from semiring_jax._src.core.array_types import ArrayLeaf

__all__ = ["Schedule"]


# eq=False: comparing or hashing arrays field by field is ill-defined;
# compare pytrees with chex.assert_trees_all_equal instead.
@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Index tables of the level schedule (see `core/host/schedule_tables.py`).

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
      real_sizes: int32 [2], the states and arcs before batch padding.
      pull_arc, pull_src: int32 [A], the real arcs grouped by destination
        position (then arc index), then the padding arcs; and their source
        states. pull_end: int32 [N, C], where each position's arcs end in
        that order. Read by the compiled CPU kernels (`kernels/scores.cc`).
      dense_in_arc: int32 [S + E, K], the real arcs grouped by destination
        in rows of K slots, in arc order (A for padding): row s < S is state
        s's first row, rows S.. the further rows of states with more than K.
      dense_in_leaf: int32 [G, F^L], the rows at the leaves of the trees
        (fan-in F = max(K, 2)) that combine such states' rows (S + E for
        padding); dense_in_top: int32 [S], each such state's node in the
        tree levels laid end to end (their total size for other states).
      dense_out_slot, dense_out_leaf, dense_out_top: the same for the arcs
        grouped by source, each slot naming the arc's slot in the flattened
        `dense_in_arc` ((S + E) * K for padding). Built for cyclic FSAs too,
        for dense intersection (`core/host/dense_tables.py`).
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
    real_sizes: ArrayLeaf
    pull_arc: ArrayLeaf
    pull_src: ArrayLeaf
    pull_end: ArrayLeaf
    dense_in_arc: ArrayLeaf
    dense_in_leaf: ArrayLeaf
    dense_in_top: ArrayLeaf
    dense_out_slot: ArrayLeaf
    dense_out_leaf: ArrayLeaf
    dense_out_top: ArrayLeaf


jax.tree_util.register_dataclass(
    Schedule, data_fields=[f.name for f in dataclasses.fields(Schedule)], meta_fields=[]
)
