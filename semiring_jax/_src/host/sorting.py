"""A stable argsort of non-negative integer keys (numpy only).

numpy sorts 16-bit integers stably with a radix sort, several times faster
than the merge sort it uses for wider ones; keys that fit in 32 bits are
sorted by their low, then their high 16 bits (a two-pass LSD radix sort).
State and position keys of every table builder go through here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["stable_argsort"]


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """The stable argsort of non-negative integer `keys` [N], as int64 [N].

    Examples:
      >>> stable_argsort(np.array([70000, 3, 70000, 0, 3]))
      array([3, 1, 4, 0, 2])
    """
    keys = np.asarray(keys)
    top = int(keys.max(initial=0))
    if keys.size == 0 or top >= 2**32 or int(keys.min(initial=0)) < 0:
        return np.argsort(keys, kind="stable")
    if top < 2**16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    low = (keys & 0xFFFF).astype(np.uint16)
    high = (keys >> 16).astype(np.uint16)
    by_low = np.argsort(low, kind="stable")
    return by_low[np.argsort(high[by_low], kind="stable")]
