"""Stable sorting and grouping of non-negative integer keys (numpy only).

numpy sorts 16-bit integers stably with a radix sort, several times faster
than the merge sort it uses for wider ones; keys that fit in 32 bits are
sorted by their low, then their high 16 bits (a two-pass LSD radix sort);
keys already in order (the arcs of most FSAs, by source) cost one pass.
State and position keys of every table builder go through here, and so do
the CSR groupings (entries grouped by state) of the graph traversals.
"""

from __future__ import annotations

import numpy as np

__all__ = ["group_by", "group_rows", "ranges", "stable_argsort"]


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """The stable argsort of non-negative integer `keys` [N], as int64 [N].

    Examples:
      >>> stable_argsort(np.array([70000, 3, 70000, 0, 3]))
      array([3, 1, 4, 0, 2])
    """
    keys = np.asarray(keys)
    if not (keys[1:] < keys[:-1]).any():  # already sorted (arcs by source, often)
        return np.arange(keys.size)
    top = int(keys.max(initial=0))
    if keys.size == 0 or top >= 2**32 or int(keys.min(initial=0)) < 0:
        return np.argsort(keys, kind="stable")
    if top < 2**16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    low = (keys & 0xFFFF).astype(np.uint16)
    high = (keys >> 16).astype(np.uint16)
    by_low = np.argsort(low, kind="stable")
    return by_low[np.argsort(high[by_low], kind="stable")]


def group_by(num_groups: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries grouped by `keys` in [0, G): (order [N], offsets [G + 1]).

    `order[offsets[g]:offsets[g + 1]]` are the entries of group g, in index
    order (a CSR layout).

    Examples:
      >>> group_by(3, np.array([2, 0, 2]))
      (array([1, 0, 2]), array([0, 1, 1, 3]))
    """
    order = stable_argsort(keys)
    offsets = np.zeros(num_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=num_groups), out=offsets[1:])
    return order, offsets


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The index ranges [start, start + count), concatenated in order.

    Examples:
      >>> ranges(np.array([5, 0]), np.array([2, 3]))
      array([5, 6, 0, 1, 2])
    """
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())


def group_rows(groups: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Positions, in a `group_by` order, of every entry of `groups`."""
    return ranges(offsets[groups], offsets[groups + 1] - offsets[groups])
