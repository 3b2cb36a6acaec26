"""The band layout: where each node lies, and its moves' cells, against a
node-by-node numpy construction."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_jax._src.transducer import band as bands


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 4))
def test_every_node_and_move_lands_where_the_layout_says(seed, width):
    rng = np.random.default_rng(seed)
    batch, num_frames, num_labels = 2, 5, 4
    starts = np.cumsum(rng.integers(0, width + 1, (batch, num_frames + 1)), axis=1)
    starts = np.minimum(starts - starts[:, :1], num_labels).astype(np.int32)
    band = bands.from_starts(starts, num_labels + 1, width)
    frame, valid = np.asarray(band.frame), np.asarray(band.valid)
    blank_from, blank_to = np.asarray(band.blank_from), np.asarray(band.blank_to)
    num_diagonals = num_frames + num_labels + 1
    assert frame.shape == (num_diagonals, batch, width)
    cell_of = {}
    for b in range(batch):
        for t in range(num_frames + 1):
            for k in range(width):
                n = t + starts[b, t] + k
                if starts[b, t] + k <= num_labels:
                    cell_of[b, t, starts[b, t] + k] = (n, k)
                    assert valid[n, b, k] and frame[n, b, k] == t
    assert valid.sum() == len(cell_of)
    for (b, t, u), (n, k) in cell_of.items():
        # The blank move (t, u) -> (t + 1, u): position k - (s_{t+1} - s_t)
        # of the next diagonal, if that node is kept.
        after = cell_of.get((b, t + 1, u))
        assert blank_to[n, b, k] == (after[1] if after and t < num_frames else width)
        before = cell_of.get((b, t - 1, u))
        assert blank_from[n, b, k] == (before[1] if before and t > 0 else width)
    values = rng.normal(size=(batch, num_frames, width))
    skewed = np.asarray(bands.skew(band, values, -np.inf))
    back = np.asarray(bands.unskew(band, skewed, num_frames))
    for b in range(batch):
        for t in range(num_frames):
            for k in range(width):
                if (b, t, starts[b, t] + k) in cell_of:
                    assert back[b, t, k] == values[b, t, k]


def test_the_full_grid_is_the_band_of_zero_starts():
    batch, num_frames, num_positions = 2, 4, 3
    full = bands.full_grid(batch, num_frames, num_positions)
    zero = bands.from_starts(
        np.zeros((batch, num_frames + 1), np.int32), num_positions, num_positions
    )
    np.testing.assert_array_equal(full.valid, zero.valid)
    np.testing.assert_array_equal(
        np.where(full.valid, full.frame, -1), np.where(zero.valid, zero.frame, -1)
    )
    values = np.random.default_rng(0).normal(size=(batch, num_frames, num_positions))
    np.testing.assert_array_equal(
        bands.skew(full, values, -np.inf), bands.skew(zero, values, -np.inf)
    )
