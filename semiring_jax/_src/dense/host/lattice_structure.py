"""The structure of a dense intersection's lattice (numpy only).

Lattice state (t, s) is graph state s after t frames. Arc a of the graph at
frame t joins (t, src) to (t + 1, dst). Only states on some path of exactly
`length` frames from (0, 0) to a final state (length, f) are kept, so the
lattice is connected; it depends on the graph's structure, its final states
and the length, never on weight values.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["LatticeStructure", "lattice_structure"]


class LatticeStructure(NamedTuple):
    """A lattice, with maps back to the graph and the frames.

    Attributes:
      num_states: N, at least 1 (an empty lattice is one non-final state).
      src, dst: int32 [M], lattice arcs (src < dst: states are in frame order).
      arc: int32 [M], the graph arc each lattice arc copies.
      frame: int32 [M], the frame it consumes.
      final_state: int32 [N], the graph state of each lattice state that is
        final (at frame `length`), -1 for the others.
    """

    num_states: int
    src: np.ndarray
    dst: np.ndarray
    arc: np.ndarray
    frame: np.ndarray
    final_state: np.ndarray


def lattice_structure(
    num_states: int, src: np.ndarray, dst: np.ndarray, is_final: np.ndarray, length: int
) -> LatticeStructure:
    """The connected lattice of a graph's real arcs over `length` frames.

    Args:
      num_states: S of the graph.
      src, dst: int [A], the graph's real arcs.
      is_final: bool [S].
      length: the number of frames.
    Returns:
      The lattice structure; one frame of numpy work at a time.
    """
    reach = np.zeros((length + 1, num_states), bool)
    reach[0, 0] = True
    for t in range(length):
        reach[t + 1, dst[reach[t, src]]] = True
    alive = np.zeros_like(reach)
    alive[length] = reach[length] & is_final
    for t in range(length - 1, -1, -1):
        used = reach[t, src] & alive[t + 1, dst]
        alive[t, src[used]] = True
    # Number the kept states in frame order, (0, 0) first.
    ids = np.full(alive.shape, -1, np.int64)
    kept = np.flatnonzero(alive.reshape(-1))
    ids.reshape(-1)[kept] = np.arange(kept.size)
    frames, arcs = np.nonzero(alive[:-1][:, src] & alive[1:][:, dst])  # [M] each
    lattice_src = ids[frames, src[arcs]]
    lattice_dst = ids[frames + 1, dst[arcs]]
    order = np.lexsort((arcs, lattice_src))  # by source state, then graph arc
    final_state = np.full(max(kept.size, 1), -1, np.int64)
    last = ids[length][alive[length]]
    final_state[last] = np.flatnonzero(alive[length])
    as32 = lambda values: values.astype(np.int32)
    return LatticeStructure(
        max(kept.size, 1),
        as32(lattice_src[order]),
        as32(lattice_dst[order]),
        as32(arcs[order]),
        as32(frames[order]),
        as32(final_state),
    )
