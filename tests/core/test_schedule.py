"""Host-side schedule tables, and the numpy-only boundary of host/."""

import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.core.host import schedule_tables
from semiring_jax._src.structural.arc_map import placeholder
from tests.strategies import pad_entry


def test_number_of_steps_is_the_depth_not_the_states():
    # 1,000 states in a fan: depth 2, and state 999's 998 in-arcs go
    # through a fan tree (a few more steps), so no position is padded to
    # 998 slots; every table stays within a small multiple of the arcs.
    arcs = [(0, s, 1, 0.0) for s in range(1, 999)] + [(s, 999, 1, 0.0) for s in range(1, 999)]
    fsa = sj.Fsa.from_arcs(arcs, final=[999])
    steps, width, slots = fsa.schedule.levels.in_arc.shape
    assert steps <= 20 and steps * width <= 2 * 2000 + 64
    assert steps * width * slots <= 4 * (len(arcs) + 1000)
    assert fsa.schedule.levels.out_arc.size <= 4 * (len(arcs) + 1000)
    chain = sj.linear_fsa(np.ones(50, np.int32))
    assert chain.schedule.levels.in_arc.shape == (51, 1, 1)
    assert float(sj.tot_score(fsa)) == pytest.approx(np.log(998))


def _star(num_leaves):
    src = np.zeros(num_leaves, np.int64)
    dst = np.arange(1, num_leaves + 1)
    return num_leaves + 1, src, dst


def test_tables_grow_with_the_arcs_not_with_states_times_degree():
    # A star (one state, 100,000 out-arcs) and a fan-in of the same size
    # behind a chain: S x (largest degree) would be 10^10 slots.
    for num_states, src, dst in (
        _star(100_000),
        (
            100_002,
            np.r_[np.arange(100_000), np.arange(100_000)],
            np.r_[np.arange(1, 100_001), np.full(100_000, 100_001)],
        ),
    ):
        tables = schedule_tables.build_schedule_arrays(
            num_states, src, dst, np.ones(src.size, bool)
        )
        entries = src.size + num_states
        for name in ("in_arc", "out_arc"):  # the bound of core/host/schedule_tables.py
            assert tables[name].size <= max(4 * entries, 2**22), name
        steps, width = tables["pos_state"].shape
        assert steps * width <= 2 * (num_states + tables["helper_grad_index"].size) + 64
        # Every real arc is listed once in each direction.
        for name in ("in_arc", "out_arc"):
            listed = tables[name][tables[name] < src.size]
            np.testing.assert_array_equal(np.sort(listed), np.arange(src.size))


def test_fan_trees_keep_arc_order_for_ties():
    # State 5 has 7 incoming arcs, all of equal score; with K = 2 slots they
    # go through a fan tree of helpers, and the first arc in arc order (4,
    # from state 1) still wins the TROPICAL tie.
    src = np.array([0, 0, 0, 0, 1, 2, 3, 4, 0, 1, 2])
    dst = np.array([1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5])
    natural, _ = schedule_tables.build_common([(6, src, dst, np.ones(src.size, bool))])
    shape = natural._replace(in_slots=2, out_slots=2, steps=natural.steps + 8, helpers=20)
    tables = schedule_tables.build_schedule_arrays(6, src, dst, np.ones(src.size, bool), shape)
    assert tables["helper_grad_index"].size == 20 and (tables["in_arc"] >= 13).any()
    fsa = sj.Fsa.from_arcs([(s, d, 1, 0.0) for s, d in zip(src, dst)], final=[5])
    treed = pad_entry(fsa, 6, 11, shape)
    assert float(sj.tot_score(treed)) == pytest.approx(np.log(7))
    indicator = np.asarray(sj.arc_posteriors(treed, sj.TROPICAL))
    np.testing.assert_array_equal(np.flatnonzero(indicator), [0, 4])


def test_tables_list_incoming_arcs_in_index_order():
    src, dst = np.array([0, 0, 1, 0]), np.array([1, 2, 2, 2])
    tables = schedule_tables.build_schedule_arrays(3, src, dst, np.ones(4, bool))
    steps, width = tables["pos_state"].shape
    max_in = tables["in_arc"].shape[-1]
    row = tables["in_arc"].reshape(-1, max_in)[tables["state_pos"][2]]
    np.testing.assert_array_equal(row, [1, 2, 3])
    # The start's row begins with the pseudo-arc A + 1 from position P + 1.
    start_row = tables["in_arc"].reshape(-1, max_in)[tables["state_pos"][0]]
    np.testing.assert_array_equal(start_row, [5, 4, 4])
    assert tables["in_src_pos"].reshape(-1, max_in)[tables["state_pos"][0], 0] == steps * width + 1
    # A state without any arc (other than the start) needs no grid position.
    isolated = schedule_tables.build_schedule_arrays(4, src, dst, np.ones(4, bool))
    assert isolated["state_pos"][3] == steps * width


def test_given_levels_are_used_as_they_are():
    # A 4-state diamond at levels the caller chose (state 2 one level late):
    # the tables follow them, and scores match the usual schedule.
    src, dst = np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3])
    mask = np.ones(4, dtype=bool)
    tables = schedule_tables.build_schedule_arrays(4, src, dst, mask, levels=np.array([0, 1, 2, 3]))
    assert tables["pos_state"].shape == (4, 1)
    np.testing.assert_array_equal(tables["pos_state"][:, 0], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="does not go up the given levels"):
        schedule_tables.build_schedule_arrays(4, src, dst, mask, levels=np.array([0, 2, 1, 1]))
    given = placeholder(
        4,
        src,
        dst,
        [1, 2, 3, 4],
        [1, 2, 3, 4],
        np.float64,
        True,
        known_levels=np.array([0, 1, 2, 3]),
        is_final=[False, False, False, True],
    )
    usual = placeholder(
        4, src, dst, [1, 2, 3, 4], [1, 2, 3, 4], np.float64, True, is_final=[0, 0, 0, 1]
    )
    weight = np.array([0.5, -1.0, 0.25, 2.0])
    final = np.array([-np.inf, -np.inf, -np.inf, 0.0])
    for semiring in (sj.LOG, sj.TROPICAL):
        total = sj.tot_score(given.replace(weight=weight, final_weight=final), semiring)
        assert np.isfinite(total)
        np.testing.assert_allclose(
            total, sj.tot_score(usual.replace(weight=weight, final_weight=final), semiring)
        )
