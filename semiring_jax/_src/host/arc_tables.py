"""Each state's arcs, as a padded [S, K] table (numpy only).

Dense intersection steps through time, not levels, so it needs no level
schedule: one frame pulls every state's incoming arcs at once. The table
works for cyclic FSAs too (every arc consumes a frame, so a cycle is just a
path that takes several frames).
"""

from __future__ import annotations

import numpy as np

from semiring_jax._src.host.sorting import stable_argsort

__all__ = ["arcs_by_state"]


def arcs_by_state(
    num_states: int, key: np.ndarray, arc_mask: np.ndarray, width: int = 1
) -> np.ndarray:
    """int32 [S, K]: row s lists the real arcs with `key == s`, in arc order.

    Args:
      num_states: S.
      key: int [A], the state each arc belongs to (dst for incoming arcs,
        src for outgoing ones).
      arc_mask: bool [A]; padding arcs are left out.
      width: the least K (for stacking entries to one width).
    Returns:
      The table, padded with A (one past the last arc); K is the largest
      number of arcs of one state, at least `width` and at least 1.

    Examples:
      >>> arcs_by_state(3, np.array([1, 2, 1]), np.array([True, True, True]))
      array([[3, 3],
             [0, 2],
             [1, 3]], dtype=int32)
    """
    num_arcs = key.shape[0]
    real = np.flatnonzero(arc_mask)
    order = real[stable_argsort(key[real])]
    counts = np.bincount(key[order], minlength=num_states)
    starts = np.cumsum(counts) - counts
    rank = np.arange(order.size) - starts[key[order]]
    slots = max(int(counts.max(initial=0)), width, 1)
    table = np.full((num_states, slots), num_arcs, dtype=np.int32)
    table[key[order], rank] = order
    return table
