"""A structural op's result builds its tables when first needed, once."""

import pickle

import jax
import numpy as np

import semiring_jax as sj
from tests.builds import count_builds

NONE = {"levels": 0, "dense": 0, "paths": 0}
ONE = {"levels": 1, "dense": 1, "paths": 1}


def _graph():
    arcs = [(0, 1, 0, 0.5), (0, 2, 3, -0.25), (1, 2, 4, 1.0), (1, 3, 0, 0.0), (2, 3, 5, 0.75)]
    return sj.Fsa.from_arcs(arcs, final=[3])


def _built_counts(counts, op):
    counts.update(dict.fromkeys(counts, 0))
    result = op()
    return result, dict(counts)


def test_a_chain_of_structural_ops_builds_no_intermediate(monkeypatch):
    fsa = _graph()
    counts = count_builds(monkeypatch)
    result, chain = _built_counts(
        counts, lambda: sj.determinize(sj.remove_epsilon(sj.connect(sj.invert(fsa))))
    )
    assert chain == NONE and not result.tables.is_built
    score, first = _built_counts(counts, lambda: sj.tot_score(result))
    assert first == ONE and result.tables.is_built
    np.testing.assert_allclose(score, sj.tot_score(fsa), rtol=1e-6)
    _, again = _built_counts(counts, lambda: sj.tot_score(result))
    assert again == NONE


def test_unbuilt_tables_equal_an_eager_build(monkeypatch):
    result = sj.remove_epsilon(_graph())
    arcs = [
        (int(s), int(d), int(i), float(w))
        for s, d, i, w in zip(result.src, result.dst, result.ilabel, result.weight)
    ]
    eager = sj.Fsa.from_arcs(
        arcs, {int(s): 0.0 for s in np.flatnonzero(result.final_mask)}, num_states=result.num_states
    ).replace(final_weight=result.final_weight)
    jax.tree_util.tree_map(np.testing.assert_array_equal, result.schedule, eager.schedule)
    assert (result.cycle, result.shapes) == (eager.cycle, eager.shapes)


def test_replace_pickle_and_jit_keep_or_build_as_they_should(monkeypatch):
    fsa = _graph()
    counts = count_builds(monkeypatch)
    result = sj.remove_epsilon(fsa)
    # New weights keep the structure: still unbuilt.
    doubled, replaced = _built_counts(counts, lambda: result.replace(weight=2 * result.weight))
    assert replaced == NONE and not doubled.tables.is_built
    restored = pickle.loads(pickle.dumps(doubled))
    assert not restored.tables.is_built
    # jit flattens the Fsa, which builds it (once) like any other read.
    score, traced = _built_counts(counts, lambda: jax.jit(sj.tot_score)(restored))
    assert traced == ONE
    np.testing.assert_allclose(score, sj.tot_score(doubled), rtol=1e-6)
    assert repr(restored) == "Fsa(acceptor, num_states=3, num_arcs=3)"


def test_gradients_reach_the_operand_through_an_unbuilt_result():
    fsa = _graph()
    grad = jax.grad(lambda w: sj.tot_score(sj.remove_epsilon(fsa.replace(weight=w))))(fsa.weight)
    np.testing.assert_allclose(
        grad, jax.grad(lambda w: sj.tot_score(fsa.replace(weight=w)))(fsa.weight), rtol=1e-6
    )
