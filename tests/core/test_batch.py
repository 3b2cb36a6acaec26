"""stack / unstack, and batched ops equal to one-by-one ops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles
from tests.builds import count_builds
from tests.strategies import acyclic_fsas, as_rows, dense_graphs

SEMIRINGS = [sj.LOG, sj.TROPICAL]
REAL = sj.Semiring(name="real", plus=jnp.add, times=jnp.multiply, sum=jnp.sum, zero=0.0, one=1.0)


def build(data, dtype="float64", transducer=False):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype=dtype)


def assert_fsas_equal(a, b):
    assert (a.cycle, a.is_acceptor) == (b.cycle, b.is_acceptor)
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


@settings(max_examples=4, deadline=None)
@given(datas=st.lists(acyclic_fsas(), min_size=1, max_size=3), bucket=st.booleans())
def test_batched_equals_one_by_one(datas, bucket):
    fsas = [build(data) for data in datas]
    batch = sj.stack(fsas, bucket=bucket)
    for semiring in SEMIRINGS:
        totals = sj.tot_score(batch, semiring)
        forward = sj.forward_scores(batch, semiring)
        backward = sj.backward_scores(batch, semiring)
        posteriors = sj.arc_posteriors(batch, semiring)
        grad = jax.grad(lambda f: sj.tot_score(f, semiring).sum(), allow_int=True)(batch)
        for b, fsa in enumerate(fsas):
            s, a = fsa.num_states, fsa.num_arcs
            np.testing.assert_allclose(totals[b], sj.tot_score(fsa, semiring), rtol=1e-12)
            np.testing.assert_allclose(forward[b, :s], sj.forward_scores(fsa, semiring), rtol=1e-12)
            np.testing.assert_allclose(
                backward[b, :s], sj.backward_scores(fsa, semiring), rtol=1e-12
            )
            np.testing.assert_allclose(
                posteriors[b, :a], sj.arc_posteriors(fsa, semiring), rtol=1e-12, atol=1e-15
            )
            np.testing.assert_allclose(grad.weight[b, :a], posteriors[b, :a], rtol=1e-12)
            assert not np.any(grad.weight[b, a:]) and not np.any(posteriors[b, a:])
            assert not np.any(grad.final_weight[b, s:])
    for original, entry in zip(fsas, sj.unstack(batch)):
        assert_fsas_equal(original, entry)


def test_vmap_and_jit_of_every_op():
    fsas = [
        sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 2, 0.25), (0, 2, 3, 1.0)], final=[2]),
        sj.Fsa.from_arcs([(0, 1, 1, -0.5)], final={1: 0.5, 0: 0.0}),
    ]
    batch = sj.stack(fsas)
    for op in [sj.tot_score, sj.forward_scores, sj.backward_scores, sj.arc_posteriors]:
        for semiring in SEMIRINGS:
            direct = op(batch, semiring)
            mapped = jax.jit(jax.vmap(lambda f: op(f, semiring)))(batch)
            np.testing.assert_allclose(direct, mapped, rtol=1e-6)
    paths = jax.vmap(sj.best_path)(batch)
    np.testing.assert_allclose(sj.tot_score(paths, sj.TROPICAL), [1.0, 0.0])


def test_traced_weights_can_be_stacked_inside_jit():
    fsas = [sj.linear_fsa([1, 2]), sj.linear_fsa([3])]

    @jax.jit
    def total(w1, w2):
        return sj.tot_score(sj.stack([fsas[0].replace(weight=w1), fsas[1].replace(weight=w2)]))

    np.testing.assert_allclose(
        total(jnp.ones(2, jnp.float32), jnp.ones(1, jnp.float32)), [2.0, 1.0]
    )


def test_bucket_sizes_follow_the_ladder():
    batch = sj.stack([sj.linear_fsa(list(range(1, 6)))], bucket=True)
    assert (batch.num_states, batch.num_arcs) == (6, 6)
    assert batch.schedule.levels.in_arc.shape[1:] == (6, 1, 1)


def test_stack_errors_name_the_entry():
    acceptor = sj.linear_fsa([1])
    with pytest.raises(
        ValueError, match=r"fsas\[1\] has float64 weights but fsas\[0\] has float32"
    ):
        sj.stack([acceptor, sj.linear_fsa([1], dtype="float64")])
    with pytest.raises(ValueError, match="needs at least one Fsa"):
        sj.stack([])
    with pytest.raises(TypeError, match=r"fsas\[0\] is a list"):
        sj.stack([[1]])
    with pytest.raises(ValueError, match=r"fsas\[0\] is already batched"):
        sj.stack([sj.stack([acceptor])])
    with pytest.raises(ValueError, match=r"unstack: expects batch_shape \(B,\)"):
        sj.unstack(acceptor)


def test_a_cyclic_entry_makes_the_batch_cyclic():
    cyclic = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 0, 1, 0.0)], final=[1])
    batch = sj.stack([sj.linear_fsa([1]), cyclic])
    with pytest.raises(ValueError, match="lies on a cycle"):
        sj.tot_score(batch)
    assert sj.unstack(batch)[1].cycle == cyclic.cycle


def test_padding_is_the_zero_of_a_user_semiring():
    # The case: real weights (zero 0.0) given through replace; the
    # 1-arc entry's padding (stored -inf) must not turn its 0.5 into NaN.
    two = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0)], final=[2], dtype="float64")
    one = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final=[1], dtype="float64")
    two = two.replace(weight=np.array([1.0, 1.0]), final_weight=np.array([0.0, 0.0, 1.0]))
    one = one.replace(weight=np.array([0.5]), final_weight=np.array([0.0, 1.0]))
    batch = sj.stack([two, one])
    np.testing.assert_allclose(sj.tot_score(batch, REAL), [1.0, 0.5])
    np.testing.assert_allclose(sj.backward_scores(batch, REAL)[1], [0.5, 1.0, 0.0])
    np.testing.assert_allclose(sj.forward_scores(batch, REAL)[1], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(sj.arc_posteriors(batch, REAL), [[1.0, 1.0], [1.0, 0.0]])


@settings(max_examples=5, deadline=None)
@given(datas=st.lists(acyclic_fsas(weights=st.floats(-2.0, 2.0)), min_size=2, max_size=3))
def test_user_semiring_batches_equal_unbatched_and_brute_force(datas):
    """Real weights exp(w) via replace; every score and gradient of the
    stacked batch equals the entry's own and the path enumeration's."""
    fsas, real_datas = [], []
    for num_states, arcs, final in datas:
        real_arcs = [(s, d, i, o, math.exp(w)) for s, d, i, o, w in arcs]
        real_final = {state: math.exp(w) for state, w in final.items()}
        final_weight = np.zeros(num_states)  # non-final entries are ignored
        final_weight[list(real_final)] = list(real_final.values())
        fsa = build((num_states, arcs, final)).replace(
            weight=np.array([w for *_, w in real_arcs], np.float64).reshape(-1),
            final_weight=final_weight,
        )
        fsas.append(fsa)
        real_datas.append((num_states, real_arcs, real_final))
    batch = sj.stack(fsas)
    totals = sj.tot_score(batch, REAL)
    forward, backward = sj.forward_scores(batch, REAL), sj.backward_scores(batch, REAL)
    posteriors = sj.arc_posteriors(batch, REAL)
    weight_grad, final_grad = jax.grad(
        lambda w, f: sj.tot_score(batch.replace(weight=w, final_weight=f), REAL).sum(),
        argnums=(0, 1),
    )(batch.weight, batch.final_weight)
    for b, (fsa, data) in enumerate(zip(fsas, real_datas)):
        s, a = fsa.num_states, fsa.num_arcs
        np.testing.assert_allclose(totals[b], sj.tot_score(fsa, REAL), rtol=1e-12)
        np.testing.assert_allclose(totals[b], oracles.brute_tot_score(*data, "real"), rtol=1e-10)
        np.testing.assert_allclose(
            forward[b, :s], oracles.brute_forward_scores(*data, "real"), rtol=1e-10
        )
        np.testing.assert_allclose(
            backward[b, :s], oracles.brute_backward_scores(*data, "real"), rtol=1e-10
        )
        np.testing.assert_allclose(
            posteriors[b, :a], sj.arc_posteriors(fsa, REAL), rtol=1e-12, atol=1e-15
        )
        np.testing.assert_allclose(weight_grad[b, :a], posteriors[b, :a], rtol=1e-12)
        # Padding is never read: exactly zero gradient, no NaN anywhere.
        assert not np.any(weight_grad[b, a:]) and not np.any(final_grad[b, s:])
    assert np.all(np.isfinite(totals)) and np.all(np.isfinite(final_grad))


def test_stack_promotes_an_acceptor_among_transducers():
    acceptor = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 2, 0.25)], final=[2])
    transducer = sj.Fsa.from_arcs([(0, 1, 1, 7, -0.5)], final={1: 0.5})
    batch = sj.stack([acceptor, transducer])
    assert not batch.is_acceptor
    np.testing.assert_array_equal(batch.ilabel, [[1, 2], [1, 0]])
    np.testing.assert_array_equal(batch.olabel, [[1, 2], [7, 0]])
    np.testing.assert_allclose(
        sj.tot_score(batch), [sj.tot_score(acceptor), sj.tot_score(transducer)], rtol=1e-6
    )
    promoted, same = sj.unstack(batch)
    assert not promoted.is_acceptor and not same.is_acceptor
    np.testing.assert_array_equal(promoted.olabel, acceptor.ilabel)
    # A transducer batch composes as one: the acceptor acts as its identity.
    composed = sj.compose(batch, sj.stack([transducer, transducer]))
    assert composed.batch_shape == (2,)
    # All acceptors stay an acceptor batch.
    assert sj.stack([acceptor, sj.linear_fsa([3])]).is_acceptor


def test_each_entry_is_built_once(monkeypatch, tmp_path):
    # 32 entries of low degree (no fan trees: their tables are all ours).
    fsas = [
        sj.Fsa.from_arcs(
            [(i, i + 1, 1 + (i + b) % 3, 0.1 * i) for i in range(2 + b % 5)]
            + [(0, 2, 4, -0.5), (1, 2 + b % 5, 5, 0.25)],
            final=[2 + b % 5],
        )
        for b in range(32)
    ]
    path = tmp_path / "batch.npz"
    sj.save(path, sj.stack(fsas))
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], final=[1])
    emissions = np.log(np.full((32, 5, 2), 0.5, np.float32))
    counts = count_builds(monkeypatch)

    def built(op):
        counts.update(dict.fromkeys(counts, 0))
        result = op()
        return result, dict(counts)

    batch, stack_counts = built(lambda: sj.stack(fsas))
    assert stack_counts == {"levels": 32, "dense": 32, "paths": 32}
    _, bucket_counts = built(lambda: sj.stack(fsas, bucket=True))
    assert bucket_counts == {"levels": 32, "dense": 32, "paths": 32}
    for op in (sj.connect, sj.invert, sj.determinize, lambda fsa: sj.prune(fsa, 1.0)):
        result, op_counts = built(lambda: op(batch))
        assert result.batch_shape == (32,)
        # The operands' entries are not built at all; each result once.
        assert op_counts == {"levels": 32, "dense": 32, "paths": 32}
    lattice, dense_counts = built(lambda: sj.intersect_dense(graph, emissions))
    # The lattices' longest paths come from their frames.
    assert dense_counts == {"levels": 32, "dense": 32, "paths": 0}
    labels = [[1 + b % 3, 2] * (1 + b % 4) for b in range(32)]
    graphs, graph_counts = built(lambda: sj.ctc_graph(labels))
    assert graphs.batch_shape == (32,)
    # CTC graphs loop (blanks): the first entry's longest paths find the
    # cycle, so no entry gets level tables; each gets its dense ones once.
    assert graph_counts == {"levels": 0, "dense": 32, "paths": 1}
    loaded, load_counts = built(lambda: sj.load(path))
    assert load_counts == {"levels": 32, "dense": 32, "paths": 32}
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, batch)
    np.testing.assert_allclose(sj.tot_score(lattice), sj.dense_tot_score(graph, emissions))


@settings(max_examples=30, deadline=None)
@given(data=dense_graphs(), length=st.integers(0, 4))
def test_lattice_path_lengths_from_frames_are_the_longest_paths(data, length):
    from semiring_jax._src.core.host import levels
    from semiring_jax._src.dense import lattice
    from semiring_jax._src.dense.host import lattice_structure as host_lattice

    num_states, arcs, final = data
    src = np.array([arc[0] for arc in arcs], np.int64)
    dst = np.array([arc[1] for arc in arcs], np.int64)
    is_final = np.isin(np.arange(num_states), list(final))
    found = host_lattice.lattice_structure(num_states, src, dst, is_final, length)
    expected = levels.path_lengths(found.num_states, found.src, found.dst)
    got = lattice._path_lengths(found, length)
    np.testing.assert_array_equal(got.earliest, expected.earliest)
    np.testing.assert_array_equal(got.height, expected.height)
