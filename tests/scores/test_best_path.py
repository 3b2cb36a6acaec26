"""best_path against the brute-force tie-broken best path."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings

import semiring_jax as sj
from tests import oracles
from tests.strategies import acyclic_fsas, as_rows, padded


def build(data, transducer=False):
    num_states, arcs, final = data
    fsa = sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype="float64")
    return padded(fsa)


@settings(max_examples=60, deadline=None)
@given(data=acyclic_fsas(transducer=True))
def test_best_path_matches_brute_force(data):
    _, arcs, _final = data
    fsa = build(data, transducer=True)
    path = sj.best_path(fsa)
    expected_arcs, expected_score = oracles.brute_best_path(*data)
    length = len(expected_arcs)
    mask = np.asarray(path.arc_mask)
    assert mask.sum() == length and mask[:length].all()
    np.testing.assert_array_equal(path.ilabel[:length], [arcs[a][2] for a in expected_arcs])
    np.testing.assert_array_equal(path.olabel[:length], [arcs[a][3] for a in expected_arcs])
    np.testing.assert_array_equal(path.weight[:length], [arcs[a][4] for a in expected_arcs])
    np.testing.assert_allclose(sj.tot_score(path, sj.TROPICAL), expected_score)
    np.testing.assert_allclose(sj.tot_score(path, sj.TROPICAL), sj.tot_score(fsa, sj.TROPICAL))
    if expected_score == -math.inf:
        assert not np.isfinite(np.asarray(path.final_weight)).any()
    assert path.is_acceptor == fsa.is_acceptor


def test_best_path_is_batched_and_differentiable():
    first = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 6, 1.0), (1, 2, 7, 0.0)], final={2: 0.25})
    second = sj.Fsa.from_arcs([(0, 1, 3, -1.0)], final=[1])
    batch = sj.stack([first, second], bucket=True)
    paths = sj.best_path(batch)
    assert paths.batch_shape == (2,)
    np.testing.assert_allclose(sj.tot_score(paths, sj.TROPICAL), [1.25, -1.0])
    singles = [sj.best_path(first), sj.best_path(second)]
    for b, single in enumerate(singles):
        length = int(single.arc_mask.sum())
        np.testing.assert_array_equal(paths.label[b, :length], single.label[:length])
    grad = jax.grad(lambda w: sj.tot_score(sj.best_path(first.replace(weight=w)), sj.TROPICAL))(
        jnp.asarray(first.weight)
    )
    np.testing.assert_allclose(grad, [0.0, 1.0, 1.0])


def test_best_path_under_jit():
    fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 6, 1.0), (1, 2, 7, 0.0)], final=[2])
    path = jax.jit(sj.best_path)(fsa)
    np.testing.assert_array_equal(path.label, [6, 7])
