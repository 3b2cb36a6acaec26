"""The states a beam search keeps after each frame, packed row after row.

The traced search returns them padded, int32 [T + 1, K] with -1 in empty
slots; the compiled search (`kernels/beam_search.cc`) returns only the
kept states, which on a large graph are a small part of the K slots. The
lattice builder (`kernels/pruned_lattice.cc`) reads this packed form.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["ActiveRows"]


class ActiveRows(NamedTuple):
    """Rows t = 0 .. L of one utterance (L its length): row t, the states
    kept after t frames in slot order, is `state[first[t]:first[t + 1]]`.

    Attributes:
      first: int32 [L + 2], non-decreasing from 0.
      state: int32 [first[-1]].
    """

    first: np.ndarray
    state: np.ndarray

    @classmethod
    def from_padded(cls, rows: np.ndarray, length: int) -> ActiveRows:
        """Rows 0 .. length of int [>= length + 1, K] (-1: an empty slot).

        >>> rows = np.array([[0, -1], [2, 1], [1, -1]])
        >>> ActiveRows.from_padded(rows, 1)
        ActiveRows(first=array([0, 1, 3], dtype=int32), state=array([0, 2, 1], dtype=int32))
        """
        kept = np.asarray(rows[: length + 1])
        mask = kept >= 0
        first = np.concatenate([[0], np.cumsum(mask.sum(axis=1))]).astype(np.int32)
        return cls(first, kept[mask].astype(np.int32))

    def padded(self, frames: int, slots: int) -> np.ndarray:
        """int32 [frames + 1, slots], as the traced search pads its rows: -1
        in empty slots, and the rows past L repeating row L.

        >>> ActiveRows(np.array([0, 1, 3]), np.array([0, 2, 1])).padded(2, 2)
        array([[ 0, -1],
               [ 2,  1],
               [ 2,  1]], dtype=int32)
        """
        out = np.full((frames + 1, slots), -1, np.int32)
        length = self.first.size - 2
        for t in range(frames + 1):
            row = min(t, length)
            states = self.state[self.first[row] : self.first[row + 1]]
            out[t, : states.size] = states
        return out
