"""nbest against brute-force enumeration and OpenFst's shortestpath."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles
from tests.strategies import acyclic_fsas, as_rows, padded

# Integer weights: every tie is exact in float32 and float64 alike, so the
# tie rule is checked path by path.
INTEGER_WEIGHTS = st.one_of(st.integers(-2, 2).map(float), st.just(-math.inf))
# Two values of n (each is a compile): one path, and more than most draws have.
NUM_PATHS = st.sampled_from([1, 6])


def build(data, dtype="float64"):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs, True), final, num_states=num_states, dtype=dtype)


def build_padded(data, dtype="float64"):
    """`build` padded to one shape, so that one compile serves every draw."""
    return padded(build(data, dtype))


def text(labels):
    return tuple(int(label) for label in labels if label != 0)


def found_paths(paths):
    """[(score, ilabels, olabels, weights, final weight)] of an unbatched
    result's found paths, in order; the missing ones are checked here."""
    scores = np.asarray(sj.tot_score(paths), np.float64)
    arc_mask, final_mask = np.asarray(paths.arc_mask), np.asarray(paths.final_mask)
    ilabel, olabel = np.asarray(paths.ilabel), np.asarray(paths.olabel)
    weight = np.asarray(paths.weight, np.float64)
    final_weight = np.asarray(paths.final_weight, np.float64)
    found = []
    for j in range(paths.batch_shape[0]):
        length = int(np.sum(arc_mask[j]))
        assert arc_mask[j, :length].all()
        if not final_mask[j].any():  # missing: nothing real, nothing final
            assert length == 0 and scores[j] == -math.inf
            found.append(None)
            continue
        assert final_mask[j].sum() == 1 and final_mask[j, length]
        found.append(
            (
                scores[j],
                tuple(ilabel[j, :length].tolist()),
                tuple(olabel[j, :length].tolist()),
                tuple(weight[j, :length].tolist()),
                float(final_weight[j, length]),
            )
        )
    real = [path for path in found if path is not None]
    assert found[: len(real)] == real, "missing paths come last"
    return real


def brute_nbest(data, n, unique):
    """The expected paths: every successful path, sorted by (score
    descending, arc indices ascending); with `unique`, each output string's
    first path."""
    num_states, arcs, final = data
    paths = [(s, p) for p, s in oracles.enumerate_paths(num_states, arcs, final) if s > -math.inf]
    paths.sort(key=lambda path: (-path[0], path[1]))
    if unique:
        firsts = {}
        for score, path in paths:
            firsts.setdefault(text(arcs[k][3] for k in path), (score, path))
        paths = sorted(firsts.values(), key=lambda path: (-path[0], path[1]))
    return paths[:n]


def as_fields(data, path):
    """A brute-force path as `found_paths` lists it (score aside)."""
    _, arcs, final = data
    end = arcs[path[-1]][1] if path else 0
    return (
        tuple(arcs[k][2] for k in path),
        tuple(arcs[k][3] for k in path),
        tuple(arcs[k][4] for k in path),
        final[end],
    )


def untied(scores, j, tol):
    return all(abs(scores[j] - other) > tol for i, other in enumerate(scores) if i != j)


@settings(max_examples=15, deadline=None)
@given(
    data=acyclic_fsas(transducer=True, weights=INTEGER_WEIGHTS),
    n=NUM_PATHS,
    unique=st.booleans(),
)
def test_nbest_follows_the_tie_rule_exactly(data, n, unique):
    # Each arc's input label is its index + 1, so the labels name the arcs.
    num_states, arcs, final = data
    arcs = [(s, d, k + 1, o, w) for k, (s, d, _, o, w) in enumerate(arcs)]
    data = num_states, arcs, final
    got = found_paths(sj.nbest(build_padded(data), n, unique=unique))
    expected = brute_nbest(data, n, unique)
    assert [g[1:] for g in got] == [as_fields(data, path) for _, path in expected]
    assert [g[0] for g in got] == [score for score, _ in expected]


@settings(max_examples=15, deadline=None)
@given(data=acyclic_fsas(transducer=True), n=NUM_PATHS, unique=st.booleans())
def test_nbest_matches_brute_force(data, n, unique):
    got = found_paths(sj.nbest(build_padded(data), n, unique=unique))
    expected = brute_nbest(data, n, unique)
    assert len(got) == len(expected)
    scores = [score for score, _ in expected]
    np.testing.assert_allclose([g[0] for g in got], scores, rtol=1e-12, atol=1e-12)
    for j, (_, path) in enumerate(expected):
        if untied(scores, j, 1e-9):
            assert got[j][1:] == as_fields(data, path)
    if unique:
        strings = [text(g[2]) for g in got]
        assert len(set(strings)) == len(strings)


@settings(max_examples=15, deadline=None)
@given(data=acyclic_fsas(transducer=True), n=NUM_PATHS, unique=st.booleans())
def test_nbest_matches_openfst(data, n, unique):
    got = found_paths(sj.nbest(build_padded(data, "float32"), n, unique=unique))
    expected = oracles.openfst_nbest(*data, n, unique)
    assert len(got) == len(expected)
    scores = [score for score, _ in expected]
    # OpenFst stores float32 costs: compare to float32 rounding.
    np.testing.assert_allclose([g[0] for g in got], scores, rtol=1e-5, atol=1e-5)
    # A tie with the best path left out (the n + 1-th) is a tie too.
    more = [score for score, _ in oracles.openfst_nbest(*data, n + 1, unique)]
    for j, (_, string) in enumerate(expected):
        if untied(more, j, 1e-4):
            assert text(got[j][2]) == string


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=10, deadline=None)
@given(
    entries=st.lists(acyclic_fsas(transducer=True), min_size=1, max_size=3),
    n=st.integers(1, 4),
    unique=st.booleans(),
)
def test_nbest_batched_is_one_by_one(entries, n, unique, dtype):
    # Entries of different sizes, padded by `stack`; each alone padded to
    # the one shape of `build_padded` (a compile for every draw is slow).
    batch = sj.stack([build(data, dtype) for data in entries], bucket=True)
    paths = sj.nbest(batch, n, unique=unique)
    assert paths.batch_shape == (len(entries), n)
    assert paths.weight.dtype == np.dtype(dtype)
    for b, data in enumerate(entries):
        entry = jax.tree_util.tree_map(lambda leaf, b=b: leaf[b], paths)
        assert found_paths(entry) == found_paths(
            sj.nbest(build_padded(data, dtype), n, unique=unique)
        )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("unique", [False, True])
def test_nbest_batched_entries_of_different_sizes(dtype, unique):
    entries = [
        (
            3,
            [(0, 1, 1, 5, 0.5), (0, 1, 2, 5, 0.0), (1, 2, 3, 0, -1.0), (0, 2, 4, 6, -0.5)],
            {1: -2.0, 2: 0.0},
        ),
        (1, [], {0: 0.25}),
        (2, [(0, 1, 1, 1, 0.0)], {}),  # no path
        (
            5,
            [
                (0, 1, 1, 1, 0.0),
                (1, 2, 2, 0, 1.0),
                (2, 3, 3, 3, 0.0),
                (3, 4, 4, 4, 0.0),
                (0, 4, 5, 1, 0.0),
            ],
            {4: 0.0},
        ),
    ]
    singles = [build(data, dtype) for data in entries]
    paths = sj.nbest(sj.stack(singles), 3, unique=unique)
    assert paths.batch_shape == (4, 3) and paths.weight.dtype == np.dtype(dtype)
    for b, (data, single) in enumerate(zip(entries, singles, strict=True)):
        entry = jax.tree_util.tree_map(lambda leaf, b=b: leaf[b], paths)
        got = found_paths(entry)
        assert got == found_paths(sj.nbest(single, 3, unique=unique))
        assert [g[0] for g in got] == [score for score, _ in brute_nbest(data, 3, unique)]


def test_nbest_small_cases():
    # A single final state: the one path has no arc.
    single = sj.Fsa.from_arcs([], final={0: 0.5}, num_states=1)
    paths = sj.nbest(single, 3)
    assert found_paths(paths) == [(0.5, (), (), (), 0.5)]
    # No path at all: every entry is missing.
    dead = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final=[], num_states=2)
    assert found_paths(sj.nbest(dead, 2)) == []
    np.testing.assert_array_equal(sj.tot_score(sj.nbest(dead, 2)), [-np.inf, -np.inf])
    # -inf arcs and padding arcs are not arcs; fewer than n paths.
    fsa = sj.Fsa.from_arcs(
        [(0, 1, 1, 0.0), (0, 1, 2, -np.inf), (1, 2, 3, 1.0), (0, 2, 4, 1.0)], final=[2]
    )
    batch = sj.stack([fsa, sj.linear_fsa([5, 6, 7, 8, 9])])
    paths = sj.nbest(batch, 4)
    np.testing.assert_array_equal(
        sj.tot_score(paths), [[1.0, 1.0, -np.inf, -np.inf], [0.0, -np.inf, -np.inf, -np.inf]]
    )
    # The tie: arc 0 (then 2) comes before arc 3.
    np.testing.assert_array_equal(paths.label[0, :2, :2], [[1, 3], [4, 0]])
    np.testing.assert_array_equal(paths.label[1, 0], [5, 6, 7, 8, 9])


def test_nbest_stops_before_going_on_in_a_tie():
    # Ending at state 1 (score 0) ties with going on to 2 (0 + 0 + 0).
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0)], final={1: 0.0, 2: 0.0})
    paths = sj.nbest(fsa, 2)
    np.testing.assert_array_equal(paths.label, [[1, 0], [1, 2]])
    np.testing.assert_array_equal(paths.arc_mask, [[True, False], [True, True]])


def test_nbest_unique_keeps_each_strings_best_path():
    # Two paths spell (7,), with the epsilon in different places: the
    # better one (1 3) stands for it.
    fsa = sj.Fsa.from_arcs(
        [
            (0, 1, 1, 7, 0.0),
            (0, 1, 2, 0, 0.5),
            (1, 2, 3, 0, -1.0),
            (1, 2, 4, 7, -2.0),
            (1, 2, 5, 8, -4.0),
        ],
        final=[2],
    )
    assert [p[0] for p in found_paths(sj.nbest(fsa, 6))] == [-0.5, -1.0, -1.5, -2.0, -3.5, -4.0]
    got = found_paths(sj.nbest(fsa, 5, unique=True))
    assert [(p[0], text(p[2])) for p in got] == [
        (-0.5, ()),
        (-1.0, (7,)),
        (-2.0, (7, 7)),
        (-3.5, (8,)),
        (-4.0, (7, 8)),
    ]
    assert got[1][1] == (1, 3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nbest_gradient_counts_the_arcs_of_the_paths(dtype):
    fsa = sj.Fsa.from_arcs(
        [(0, 1, 1, 0.0), (0, 1, 2, -1.0), (1, 2, 3, 0.5), (1, 2, 4, 0.0), (0, 2, 5, -5.0)],
        final={1: -3.0, 2: 0.0},
        dtype=dtype,
    )
    n = 8  # seven paths: the eighth is missing, and its -inf is masked out

    def total(weight, final_weight):
        paths = sj.nbest(fsa.replace(weight=weight, final_weight=final_weight), n)
        scores = sj.tot_score(paths)
        return jnp.sum(jnp.where(scores > -jnp.inf, scores, 0.0))

    arc_grad, final_grad = jax.grad(total, argnums=(0, 1))(
        jnp.asarray(fsa.weight), jnp.asarray(fsa.final_weight)
    )
    # The paths: 1 3, 1 4, 2 3, 2 4, 1 (stop), 2 (stop), 5.
    np.testing.assert_allclose(arc_grad, [3.0, 3.0, 2.0, 2.0, 1.0])
    np.testing.assert_allclose(final_grad, [0.0, 2.0, 5.0])
    assert arc_grad.dtype == np.dtype(dtype)


def test_nbest_on_a_large_lattice_matches_openfst():
    rng = np.random.default_rng(0)
    data = oracles.random_dag(rng, 2000, 10_000)
    got = found_paths(sj.nbest(build(data), 100))
    expected = oracles.openfst_nbest(*data, 100)
    np.testing.assert_allclose([g[0] for g in got], [s for s, _ in expected], atol=1e-3)
    unique = found_paths(sj.nbest(build(data), 100, unique=True))
    expected = oracles.openfst_nbest(*data, 100, unique=True)
    np.testing.assert_allclose([g[0] for g in unique], [s for s, _ in expected], atol=1e-3)
    assert len({text(g[2]) for g in unique}) == 100


def test_nbest_errors():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0)], final=[2])
    cyclic = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 0, 2, 0.0)], final=[1])
    with pytest.raises(ValueError, match=r"nbest: state .* lies on a cycle"):
        sj.nbest(cyclic, 2)
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="nbest: n "):
            sj.nbest(fsa, n)
    with pytest.raises(ValueError, match="nbest: unique must be a bool"):
        sj.nbest(fsa, 2, unique="yes")
    with pytest.raises(ValueError, match=r"nbest: weight is a traced value.*outside jax\.jit"):
        jax.jit(lambda f: sj.nbest(f, 2))(fsa)
    with pytest.raises(ValueError, match="nbest: weight is a traced value"):
        jax.vmap(lambda w: sj.tot_score(sj.nbest(fsa.replace(weight=w), 1)))(
            jnp.zeros((3, 2), fsa.weight.dtype)
        )
    # Traced replacements skip replace's checks; nbest names the culprit.
    bad_arc = jnp.asarray([0.0, jnp.nan], fsa.weight.dtype)
    with pytest.raises(ValueError, match="nbest: arc 1 has weight nan"):
        jax.grad(lambda w: sj.tot_score(sj.nbest(fsa.replace(weight=w), 1)).sum())(bad_arc)
    bad_final = jnp.asarray([0.0, 0.0, jnp.inf], fsa.weight.dtype)
    batch = sj.stack([fsa, fsa])
    with pytest.raises(ValueError, match=r"nbest: final state 2 of batch entry \(1,\) has weight"):
        jax.grad(
            lambda w: sj.tot_score(
                sj.nbest(batch.replace(final_weight=jnp.stack([jnp.zeros_like(w), w])), 1)
            ).sum()
        )(bad_final)
