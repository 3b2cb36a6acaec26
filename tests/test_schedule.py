"""Host-side schedule tables, and the numpy-only boundary of host/."""

import ast
import pathlib

import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.algorithms import placeholder
from semiring_jax._src.host import levels as levels_lib
from semiring_jax._src.host import schedule


def test_number_of_steps_is_the_depth_not_the_states():
    # 1,000 states in a fan: depth 2, so 3 levels, or up to 1.5 times as
    # many where that makes the levels narrower, whatever the width.
    arcs = [(0, s, 1, 0.0) for s in range(1, 999)] + [(s, 999, 1, 0.0) for s in range(1, 999)]
    fsa = sj.Fsa.from_arcs(arcs, final=[999])
    levels, width = fsa.schedule.pos_state.shape
    assert 3 <= levels <= 5 and levels * width < 2 * 1000
    # State 999's 998 arcs are split into rows, so no level is padded to 998
    # slots per state.
    levels, rows, slots = fsa.schedule.in_arc.shape
    assert rows * slots < 998 * 998 // 20
    chain = sj.linear_fsa(np.ones(50, np.int32))
    assert chain.schedule.in_arc.shape == (51, 1, 1)
    assert float(sj.tot_score(fsa)) == pytest.approx(np.log(998))


def test_rows_split_high_degree_states():
    # State 5 has 7 incoming arcs; with K = 2 slots they fill 4 rows.
    src = np.array([0, 0, 0, 0, 1, 2, 3, 4, 0])
    dst = np.array([1, 2, 3, 4, 5, 5, 5, 5, 5])
    src, dst = np.concatenate([src, [1, 2]]), np.concatenate([dst, [5, 5]])
    natural = schedule.common_shape([(6, src, dst)])
    shape = natural._replace(in_rows=natural.width + 3, max_in=2, in_parts=4)
    tables = schedule.build_schedule_arrays(6, src, dst, np.ones(src.size, bool), shape)
    level, rank = divmod(int(tables["state_pos"][5]), shape.width)
    rows = tables["in_combine"][level, rank]
    entries = tables["in_arc"][level][rows].reshape(-1)
    np.testing.assert_array_equal(entries[:7], [4, 5, 6, 7, 8, 9, 10])  # arc order kept
    fsa = sj.Fsa.from_arcs([(s, d, 1, 0.0) for s, d in zip(src, dst)], final=[5])
    assert float(sj.tot_score(fsa)) == pytest.approx(np.log(7))


def test_tables_list_incoming_arcs_in_index_order():
    src, dst = np.array([0, 0, 1, 0]), np.array([1, 2, 2, 2])
    tables = schedule.build_schedule_arrays(3, src, dst, np.ones(4, bool))
    levels, width = tables["pos_state"].shape
    max_in = tables["in_arc"].shape[-1]
    row = tables["in_arc"].reshape(-1, max_in)[tables["state_pos"][2]]
    np.testing.assert_array_equal(row, [1, 2, 3])
    # The start's row begins with the pseudo-arc A + 1 from position P + 1.
    start_row = tables["in_arc"].reshape(-1, max_in)[tables["state_pos"][0]]
    np.testing.assert_array_equal(start_row, [5, 4, 4])
    assert tables["in_src_pos"].reshape(-1, max_in)[tables["state_pos"][0], 0] == levels * width + 1
    # A state without any arc (other than the start) needs no grid position.
    isolated = schedule.build_schedule_arrays(4, src, dst, np.ones(4, bool))
    assert isolated["state_pos"][3] == levels * width


def test_given_levels_are_used_as_they_are():
    # A 4-state diamond at levels the caller chose (state 2 one level late):
    # the tables follow them, and scores match the usual schedule.
    src, dst = np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3])
    mask = np.ones(4, dtype=bool)
    tables = schedule.build_schedule_arrays(4, src, dst, mask, levels=np.array([0, 1, 2, 3]))
    assert tables["pos_state"].shape == (4, 1)
    np.testing.assert_array_equal(tables["pos_state"][:, 0], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="does not go up the given levels"):
        schedule.build_schedule_arrays(4, src, dst, mask, levels=np.array([0, 2, 1, 1]))
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


def test_host_modules_do_not_import_jax():
    host = pathlib.Path(schedule.__file__).parent
    for module in host.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith("jax"), f"{module.name} imports {name}"


def _direct_row_counts(structure, degree, slots, width):
    # Every placed state, one by one: the reference for the histogram.
    rows = np.maximum(-(-degree[structure.placed] // slots), 1)
    extra = np.bincount(structure.levels[structure.placed], weights=rows - 1)
    return width + int(extra.max()), int(rows.max())


def test_row_counts_from_the_histogram_equal_the_direct_ones():
    rng = np.random.default_rng(3)
    for _ in range(20):
        num_states = int(rng.integers(2, 60))
        src = rng.integers(0, num_states - 1, int(rng.integers(1, 200)))
        dst = np.minimum(src + 1 + rng.integers(0, 5, src.size), num_states - 1)
        lengths = levels_lib.path_lengths(num_states, src, dst)
        structure = schedule._structure(num_states, src, dst, lengths, None)
        for degree in schedule._degrees(structure):
            histogram = schedule._histogram(structure, degree)
            width = int(np.bincount(structure.levels[structure.placed]).max())
            for slots in (1, 2, 3, 7, 64):
                assert schedule._row_counts(histogram, slots, width) == _direct_row_counts(
                    structure, degree, slots, width
                )
