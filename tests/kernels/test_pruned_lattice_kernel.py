"""The pruned lattice's compiled host function (`_src/kernels/pruned_lattice.cc`)
against the numpy one (`decoding/host/pruned_lattice.py`): the same lattice,
field for field, on random graphs and random active states per frame, with
ties, -inf, +inf and NaN weights and emissions, non-final and NaN final
weights, zero lengths, and finite and infinite output beams.
"""

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from semiring_jax._src.decoding import beam_search
from semiring_jax._src.decoding.host import pruned_lattice
from semiring_jax._src.decoding.host.active_rows import ActiveRows
from semiring_jax._src.dense.host.lattice_structure import LatticeStructure
from semiring_jax._src.kernels import beam_search_ops, loader, pruned_lattice_ops

pytestmark = pytest.mark.skipif(not loader.enabled(), reason="the CPU kernels are not built")

T, V, S, A, K = 5, 3, 6, 20, 4


def _case(seed: int, odd: bool):
    rng = np.random.default_rng(seed)
    src, dst, label = rng.integers(0, S, A), rng.integers(0, S, A), rng.integers(0, V, A)
    values = [-1.0, 0.0, 0.5, -np.inf] + ([np.inf, np.nan] if odd else [])
    weight = rng.choice(values, A)
    emissions = rng.choice(values[:3] + values[4:], (T, V))
    final = rng.choice([0.0, -1.0, -np.inf, -np.inf] + ([np.nan] if odd else []), S)
    length = int(rng.integers(0, T + 1))
    rows = np.full((T + 1, K), -1, np.int32)
    rows[0, 0] = 0
    for t in range(1, T + 1):
        count = int(rng.integers(0, K + 1))
        rows[t, :count] = rng.choice(S, count)  # repeats allowed, in any order
    return src, dst, label, weight, emissions, final, rows, length


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    odd=st.booleans(),
    output_beam=st.sampled_from([0.0, 0.7, 2.0, math.inf]),
)
# No path of a finite score (best -inf): every connected arc is within the
# beam, those of states that no open state reaches included.
@example(seed=8, odd=False, output_beam=0.0)
def test_kernel_builds_the_numpy_lattice(seed, odd, output_beam):
    src, dst, label, weight, emissions, final, rows, length = _case(seed, odd)
    active = [np.unique(row[row >= 0]) for row in rows[: length + 1]]
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as meant
        expected = pruned_lattice.pruned_lattice(
            src, dst, label, weight, final, emissions, active, output_beam
        )
    graph, _ = _graphs(src, dst, label, weight, final)
    found = pruned_lattice_ops.pruned_lattice(
        graph, emissions, ActiveRows.from_padded(rows, length), length, output_beam, searched=False
    )
    _assert_same(found, expected)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    odd=st.booleans(),
    output_beam=st.sampled_from([0.0, 0.7, 2.0, math.inf]),
)
def test_kernel_builds_the_numpy_lattice_of_a_searchs_rows(seed, odd, output_beam):
    # Rows kept by the compiled beam search (`searched`: every state is
    # reached), where the forward pass skips the states no kept state
    # reaches unless the best path is -inf or an arc scores +inf.
    src, dst, label, weight, emissions, final, _, length = _case(seed, odd)
    graph, tables = _graphs(src, dst, label, weight, final)
    with np.errstate(invalid="ignore"):
        rows = beam_search_ops.search(
            tables, emissions, length, search_beam=1.5, slots=K, min_active=1
        )
    if rows is None:  # a NaN or +inf candidate: the traced search's case
        return
    rows = ActiveRows(*rows)
    active = [np.unique(rows.state[rows.first[t] : rows.first[t + 1]]) for t in range(length + 1)]
    with np.errstate(invalid="ignore"):
        expected = pruned_lattice.pruned_lattice(
            src, dst, label, weight, final, emissions, active, output_beam
        )
    found = pruned_lattice_ops.pruned_lattice(
        graph, emissions, rows, length, output_beam, searched=True
    )
    _assert_same(found, expected)


def _graphs(src, dst, label, weight, final):
    """The lattice's and the search's tables of a random graph."""
    search = beam_search.search_graph(S, src, dst, label, np.arange(A), K)
    order = np.asarray(search.arc)
    graph = pruned_lattice_ops.LatticeGraph(
        search.out_start, search.dst[:-1], search.label[:-1], order, weight[order], final
    )
    tables = beam_search_ops.SearchTables(
        np.asarray(search.out_start),
        np.asarray(search.dst),
        np.asarray(search.label),
        np.append(weight[order], -np.inf),
        search.expand,
    )
    return graph, tables


def _assert_same(found, expected):
    found = LatticeStructure(*found)  # the kernel's plain tuple, in the fields' order
    assert found.num_states == expected.num_states
    for name in ("src", "dst", "arc", "frame", "final_state"):
        np.testing.assert_array_equal(getattr(found, name), getattr(expected, name), err_msg=name)
