"""The pruned lattice's compiled host function (`_src/kernels/pruned_lattice.cc`)
against the numpy one (`decoding/host/pruned_lattice.py`): the same lattice,
field for field, on random graphs and random active states per frame, with
ties, -inf, +inf and NaN weights and emissions, non-final and NaN final
weights, zero lengths, and finite and infinite output beams.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_jax._src.decoding import beam_search
from semiring_jax._src.decoding.host import pruned_lattice
from semiring_jax._src.decoding.host.active_rows import ActiveRows
from semiring_jax._src.kernels import loader, pruned_lattice_ops

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
def test_kernel_builds_the_numpy_lattice(seed, odd, output_beam):
    src, dst, label, weight, emissions, final, rows, length = _case(seed, odd)
    active = [np.unique(row[row >= 0]) for row in rows[: length + 1]]
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as meant
        expected = pruned_lattice.pruned_lattice(
            src, dst, label, weight, final, emissions, active, output_beam
        )
    search = beam_search.search_graph(S, src, dst, label, np.arange(A), K)
    order = np.asarray(search.arc)
    graph = pruned_lattice_ops.LatticeGraph(
        search.out_start, search.dst[:-1], search.label[:-1], order, weight[order], final
    )
    found = pruned_lattice_ops.pruned_lattice(
        graph, emissions, ActiveRows.from_padded(rows, length), length, output_beam, searched=False
    )
    assert found.num_states == expected.num_states
    for name in ("src", "dst", "arc", "frame", "final_state"):
        np.testing.assert_array_equal(getattr(found, name), getattr(expected, name), err_msg=name)
