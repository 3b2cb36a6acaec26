"""The beam search's compiled host function (`_src/kernels/beam_search.cc`)
against the traced search (`decoding/beam_search.py`): the same states in
the same slots after every frame (its packed rows padded as the traced
search pads them), on random cyclic graphs with ties, -inf weights,
zero lengths, small slot counts, `min_active`, finite and infinite beams
and capped expansions; and utterances with a NaN or +inf candidate
flagged for the traced search.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_jax._src.decoding import beam_search
from semiring_jax._src.decoding.host.active_rows import ActiveRows
from semiring_jax._src.kernels import beam_search_ops, loader

pytestmark = pytest.mark.skipif(not loader.enabled(), reason="the CPU kernels are not built")

B, T, V, S, A = 3, 6, 4, 7, 24


def _inputs(seed: int, dtype: str):
    rng = np.random.default_rng(seed)
    src, dst, label = rng.integers(0, S, A), rng.integers(0, S, A), rng.integers(0, V, A)
    # Few distinct values: ties between candidates, and some -inf arcs.
    weight = rng.choice([-1.0, 0.0, 0.5, -np.inf], A, p=[0.3, 0.3, 0.3, 0.1]).astype(dtype)
    emissions = rng.choice([-2.0, -1.0, 0.0, -0.5], (B, T, V)).astype(dtype)
    lengths = rng.integers(0, T + 1, B)
    return src, dst, label, weight, emissions, lengths


def _both(inputs, slots, min_active, search_beam, max_arcs):
    src, dst, label, weight, emissions, lengths = inputs
    graph = beam_search.search_graph(S, src, dst, label, np.arange(A), slots, max_arcs)
    weights = jnp.asarray(np.append(weight[graph.arc], -np.inf).astype(weight.dtype))
    tables = (jnp.asarray(graph.out_start), jnp.asarray(graph.dst), jnp.asarray(graph.label))
    sizes = dict(expand=graph.expand, slots=slots, min_active=min(min_active, slots))
    traced = beam_search.beam_search(
        *tables,
        weights,
        jnp.asarray(emissions),
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(search_beam, emissions.dtype),
        **sizes,
    )
    host = beam_search_ops.SearchTables(
        *(np.asarray(table) for table in tables), np.asarray(weights), graph.expand
    )
    kernel, flagged = np.full(traced.shape, -2, np.int32), np.zeros(B, np.int32)
    for b in range(B):
        found = beam_search_ops.search(
            host,
            emissions[b],
            int(lengths[b]),
            search_beam=search_beam,
            slots=slots,
            min_active=sizes["min_active"],
        )
        if found is None:
            flagged[b] = 1
        else:
            kernel[b] = ActiveRows(*found).padded(T, slots)
    return np.asarray(traced), kernel, flagged


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["float32", "float64"]),
    slots=st.sampled_from([1, 3, S]),
    min_active=st.integers(0, 3),
    search_beam=st.sampled_from([0.0, 1.0, math.inf]),
    max_arcs=st.sampled_from([None, 2, 5]),
)
def test_kernel_makes_the_traced_searchs_choices(
    seed, dtype, slots, min_active, search_beam, max_arcs
):
    traced, kernel, flagged = _both(_inputs(seed, dtype), slots, min_active, search_beam, max_arcs)
    assert not flagged.any()
    np.testing.assert_array_equal(kernel, traced)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_plus_inf_candidates_are_flagged(bad):
    src, dst, label, weight, emissions, lengths = _inputs(0, "float32")
    weight[:] = 0.0  # every arc live, so the bad column is read
    emissions[1, 0, :] = bad
    lengths[:] = T
    traced, kernel, flagged = _both(
        (src, dst, label, weight, emissions, lengths), S, 0, math.inf, None
    )
    assert flagged.tolist() == [0, 1, 0]
    np.testing.assert_array_equal(kernel[[0, 2]], traced[[0, 2]])


@pytest.mark.parametrize("vocab", [V, 65_536, 65_537])
def test_labels_past_16_bits(vocab):
    # The kernel narrows labels to 16 bits where the vocabulary allows
    # (V <= 65,536) and reads them as they are otherwise.
    src, dst, label, weight, _, lengths = _inputs(3, "float32")
    rng = np.random.default_rng(4)
    label = np.where(label % 2 == 0, label, vocab - 1 - label)
    emissions = rng.choice([-2.0, -1.0, 0.0, -0.5], (B, T, vocab)).astype("float32")
    traced, kernel, flagged = _both((src, dst, label, weight, emissions, lengths), 3, 1, 1.0, None)
    assert not flagged.any()
    np.testing.assert_array_equal(kernel, traced)
