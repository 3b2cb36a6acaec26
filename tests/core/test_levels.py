"""Level assignment and cycle finding on the host."""

import numpy as np
from hypothesis import given, settings

from semiring_jax._src.core.host import levels
from tests.strategies import acyclic_fsas


def test_longest_path_levels():
    src = np.array([0, 1, 0, 2, 3])
    dst = np.array([1, 2, 2, 3, 4])
    np.testing.assert_array_equal(levels.longest_path_levels(5, src, dst), [0, 1, 2, 3, 4])
    assert levels.longest_path_levels(3, np.array([0, 1, 2]), np.array([1, 2, 1])) is None


@settings(max_examples=200, deadline=None)
@given(data=acyclic_fsas(max_states=12, max_arcs=30))
def test_balanced_levels_keep_depth_and_order(data):
    num_states, arcs, _ = data
    src = np.array([a[0] for a in arcs], dtype=np.int64)
    dst = np.array([a[1] for a in arcs], dtype=np.int64)
    placed = np.ones(num_states, bool)
    balanced = levels.balanced_levels(
        num_states, src, dst, placed, levels.path_lengths(num_states, src, dst)
    )
    longest = levels.longest_path_levels(num_states, src, dst)
    assert balanced.max() == longest.max()  # same number of sequential steps
    assert (balanced[src] < balanced[dst]).all()  # every arc goes up a level
    assert (balanced >= longest).all()


def test_balanced_levels_even_out_widths():
    # A chain 0 -> 1 -> ... -> 9, and 10 states hanging off state 0 that
    # lead straight to state 9: by longest path they all crowd level 1.
    chain = [(i, i + 1) for i in range(9)]
    side = [(0, s) for s in range(10, 20)] + [(s, 9) for s in range(10, 20)]
    src, dst = (np.array(column) for column in zip(*(chain + side)))
    placed = np.ones(20, bool)
    longest = levels.longest_path_levels(20, src, dst)
    balanced = levels.balanced_levels(20, src, dst, placed, levels.path_lengths(20, src, dst))
    assert np.bincount(longest).max() == 11
    assert np.bincount(balanced).max() <= 3


def test_find_cycle_returns_a_closed_walk():
    src = np.array([0, 1, 2, 3, 4])
    dst = np.array([1, 2, 3, 1, 0])
    cycle = levels.find_cycle(5, src, dst)
    assert cycle[0] == cycle[-1] and set(cycle) == {1, 2, 3}
    assert levels.find_cycle(3, np.array([0, 1]), np.array([1, 2])) == ()
    assert levels.find_cycle(2, np.array([1]), np.array([1])) == (1, 1)
