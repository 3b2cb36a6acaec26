"""A band of the transducer grid, and its skewed layout for the scans.

The grid [T, U+1] has a node (t, u) per frame t and number u of labels
emitted. A *band* keeps, at each frame t, the W consecutive positions
u = s_t + k, k in [0, W), from non-decreasing starts s_t: the full grid is
the band s = 0, W = U + 1, and the pruned loss's ranges are a band of
width s_range. Arrays over a band are [B, T, W], cell (t, k) holding node
(t, s_t + k).

The scans run over anti-diagonals n = t + u: every node of one depends on
the diagonal before only. A band has at most one node per diagonal and
offset k (t + s_t rises by at least 1 a frame), so the *skewed* layout
[N, B, W], N = T + U + 1, holds node (t, s_t + k) at diagonal
t + s_t + k, position k. A label move (t, u) → (t, u+1) goes to position
k + 1 of the next diagonal, as in the full grid; a blank move
(t, u) → (t+1, u) keeps u, so it goes to position k - (s_{t+1} - s_t):
`Band.blank_from` and `Band.blank_to` index those positions (None for the
full grid, where they are k itself). Row t = T of the layout is the end:
node (T, u) holds the paths that have left the grid from (T - 1, u), with
s_T = s_{T-1}.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["Band", "from_starts", "full_grid", "positions", "skew", "unskew"]


class Band(NamedTuple):
    """Where each node of a band lies on the skewed layout.

    Attributes:
      starts: int32 [B, T + 1], s_t (row T: the end row's), or None for
        the full grid.
      frame: int32 [N, B, W], the frame t of each skewed cell (clipped to
        [0, T] where the cell holds no node).
      valid: bool [N, B, W], whether the cell holds a node.
      blank_from: int32 [N, B, W], the position on diagonal n - 1 of the
        cell's blank predecessor (W where it has none in the band), or
        None (the same position: the full grid).
      blank_to: int32 [N, B, W], the position on diagonal n + 1 of the
        cell's blank successor (W where none), or None.
    """

    starts: jax.Array | None
    frame: jax.Array
    valid: jax.Array
    blank_from: jax.Array | None
    blank_to: jax.Array | None

    @property
    def width(self) -> int:
        """W, the positions kept per frame."""
        return self.frame.shape[2]

    @property
    def num_frames(self) -> int:
        """T (the layout has T + U + 1 diagonals; the full grid's W is U + 1)."""
        if self.starts is not None:
            return self.starts.shape[1] - 1
        return self.frame.shape[0] - self.width


def full_grid(batch: int, num_frames: int, num_positions: int) -> Band:
    """The band of every node: s = 0, W = U + 1, layout [T + U + 1, B, U+1]."""
    diagonal = jnp.arange(num_frames + num_positions, dtype=jnp.int32)[:, None, None]
    frame = diagonal - jnp.arange(num_positions, dtype=jnp.int32)[None, None, :]
    frame = jnp.broadcast_to(frame, (frame.shape[0], batch, num_positions))
    valid = (frame >= 0) & (frame <= num_frames)
    return Band(None, jnp.clip(frame, 0, num_frames), valid, None, None)


def _at_frames(rows: jax.Array, frame: jax.Array) -> jax.Array:
    """rows [B, R] read at frame [N, B, W]: [N, B, W]. A gather per
    utterance (batching dims), not through an index of entries: with the
    batch sharded, the latter gathers the whole batch onto each device."""
    return jax.vmap(lambda row, index: row[index], in_axes=(0, 1), out_axes=1)(rows, frame)


def from_starts(starts: jax.Array, num_positions: int, width: int) -> Band:
    """The band of width W from starts [B, T + 1] that rise by >= 0 a frame
    (the caller's to ensure: t + s_t must increase strictly), the layout
    [T + U + 1, B, W] for U + 1 = `num_positions` (positions past U are
    no nodes: their cells are not valid)."""
    _, num_rows = starts.shape
    num_frames = num_rows - 1
    num_diagonals = num_frames + num_positions
    # Cell (n, k) holds the frame t with t + s_t = n - k, if there is one.
    offsets = jnp.arange(num_rows, dtype=jnp.int32)[None, :] + starts  # [B, T + 1]
    target = (
        jnp.arange(num_diagonals, dtype=jnp.int32)[:, None]
        - jnp.arange(width, dtype=jnp.int32)[None, :]
    )  # [N, W]
    frame = jax.vmap(lambda row: jnp.searchsorted(row, target).astype(jnp.int32))(offsets)
    frame = jnp.clip(jnp.moveaxis(frame, 0, 1), 0, num_frames)  # [N, B, W]
    position = jnp.arange(width, dtype=jnp.int32)[None, None, :]
    # A node past u = U is no node of the grid (a window may overhang it).
    in_grid = _at_frames(starts, frame) + position < num_positions
    valid = (_at_frames(offsets, frame) == target[:, None, :]) & in_grid
    rise = jnp.diff(starts, axis=1)  # [B, T]: s_{t+1} - s_t
    rise_into = _at_frames(jnp.pad(rise, ((0, 0), (1, 0))), frame)  # s_t - s_{t-1} (0 at t = 0)
    rise_out = _at_frames(jnp.pad(rise, ((0, 0), (0, 1))), frame)  # s_{t+1} - s_t (0 at t = T)
    come_from = position + rise_into
    blank_from = jnp.where(valid & (frame > 0) & (come_from < width), come_from, width)
    go_to = position - rise_out
    blank_to = jnp.where(valid & (frame < num_frames) & (go_to >= 0), go_to, width)
    return Band(starts, frame, valid, blank_from, blank_to)


def positions(band: Band, num_frames: int) -> jax.Array:
    """The label position u = s_t + k of each cell of a [B, T, W] band
    array, int32 (broadcastable: [1, 1, W] for the full grid)."""
    offset = jnp.arange(band.width, dtype=jnp.int32)[None, None, :]
    if band.starts is None:
        return offset
    return band.starts[:, :num_frames, None] + offset


def skew(band: Band, values: jax.Array, fill: float) -> jax.Array:
    """[B, T, W] → [N, B, W]: each node at its cell, `fill` where a cell
    holds no node of the first T rows."""
    _, num_frames, width = values.shape
    frame = jnp.clip(band.frame, 0, num_frames - 1)
    if band.starts is None:
        # The same frames for every utterance: one gather, not B.
        position = jnp.broadcast_to(jnp.arange(width), frame.shape[::2])
        gathered = jnp.moveaxis(values[:, frame[:, 0], position], 1, 0)  # [N, B, W]
    else:
        by_frame = jnp.moveaxis(values, 1, 0)  # [T, B, W]
        gathered = jnp.take_along_axis(by_frame, frame, axis=0)
    keep = band.valid & (band.frame < num_frames)
    return jnp.where(keep, gathered, fill)


def unskew(band: Band, diagonals: jax.Array, num_frames: int) -> jax.Array:
    """[N, B, W] → [B, num_frames, W]: node (t, s_t + k) from its cell
    (num_frames may be T + 1, to read the end row)."""
    num_diagonals, _, width = diagonals.shape
    frame = jnp.arange(num_frames, dtype=jnp.int32)[:, None]
    position = jnp.arange(width, dtype=jnp.int32)[None, :]
    if band.starts is None:
        index = jnp.clip(frame + position, 0, num_diagonals - 1)
        return jnp.moveaxis(diagonals[index, :, position], 2, 0)  # [B, t, W]
    cell = frame[None] + band.starts[:, :num_frames, None] + position[None]  # [B, t, W]
    by_batch = jnp.moveaxis(diagonals, 1, 0)  # [B, N, W]
    return jnp.take_along_axis(by_batch, jnp.clip(cell, 0, num_diagonals - 1), axis=1)
