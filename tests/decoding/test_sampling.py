"""sample_paths: frequencies against enumerated path probabilities, and
every draw a real path of its input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import semiring_jax as sj
from tests import oracles
from tests.paths import both_paths
from tests.strategies import acyclic_fsas, padded

# Every test FSA names its arcs: olabel = arc index + 1, so a drawn path
# tells which input arcs it took.


def tagged(data):
    """`data`'s arcs with olabel k + 1 on arc k."""
    num_states, arcs, final = data
    arcs = [(s, d, i, k + 1, w) for k, (s, d, i, _, w) in enumerate(arcs)]
    return num_states, arcs, final


def build(data, dtype="float64", pad=True):
    num_states, arcs, final = tagged(data)
    rows = [(s, d, i, o, w) for s, d, i, o, w in arcs]
    fsa = sj.Fsa.from_arcs(rows, final, num_states=num_states, dtype=dtype)
    # A transducer even without arcs, so that padded batches agree in kind.
    return padded(fsa) if pad else fsa


def drawn_arcs(paths):
    """The input arcs of each drawn path, in order: a list (per path, the
    paths' batch axes flattened) of tuples."""
    shape = (math.prod(paths.batch_shape), paths.num_arcs)
    arc_mask = np.asarray(paths.arc_mask).reshape(shape)
    olabel = np.asarray(paths.olabel).reshape(shape)
    lengths = arc_mask.sum(axis=1)
    assert all(mask[:length].all() for mask, length in zip(arc_mask, lengths, strict=True))
    return [tuple(int(o) - 1 for o in row[:n]) for row, n in zip(olabel, lengths, strict=True)]


def check_draws(data, paths, rtol):
    """Each draw chains from state 0 to a final state, only its last state
    is final, and its score is its arcs' weights plus its final weight; or,
    where no path succeeds, each draw is missing (-inf)."""
    _, arcs, final = tagged(data)
    total = oracles.brute_tot_score(*tagged(data), "log")
    scores = np.asarray(sj.tot_score(paths)).reshape(-1)
    final_mask = np.asarray(paths.final_mask).reshape(len(scores), paths.num_states)
    for taken, score, is_final in zip(drawn_arcs(paths), scores, final_mask, strict=True):
        if total == -math.inf:
            assert taken == () and not is_final.any() and score == -math.inf
            continue
        state = 0
        for arc in taken:
            assert arcs[arc][0] == state
            state = arcs[arc][1]
        assert state in final
        np.testing.assert_array_equal(is_final.nonzero()[0], [len(taken)])
        expected = sum(arcs[arc][4] for arc in taken) + final[state]
        assert score > -math.inf
        np.testing.assert_allclose(score, expected, rtol=rtol, atol=rtol)


# -- the distribution -------------------------------------------------------------

BRANCHES = (
    5,
    [
        (0, 1, 1, 1, 0.0),
        (0, 1, 2, 2, 0.7),  # parallel to arc 0
        (0, 2, 3, 3, -0.3),
        (1, 3, 4, 4, 0.2),
        (2, 3, 5, 5, 0.0),
        (1, 4, 6, 6, -0.5),
        (3, 4, 7, 7, 0.1),
        (2, 4, 8, 8, -math.inf),  # never drawn
    ],
    {0: -1.5, 3: 0.4, 4: 0.0},  # the empty path too
)
# In-degree 4 at state 3: with `padded`'s two slots per position it sits
# behind a fan tree of helpers.
FAN_IN = (
    4,
    [
        (0, 1, 1, 1, 0.3),
        (0, 2, 2, 2, -0.2),
        (0, 3, 3, 3, 0.0),
        (1, 3, 4, 4, 0.5),
        (2, 3, 5, 5, 0.1),
        (1, 3, 6, 6, -0.4),
    ],
    {3: 0.0, 2: -0.7},
)
DAG = oracles.random_dag(np.random.default_rng(7), 5, 7)


def chi_square_p_value(data, draws):
    """The p-value of the drawn paths' counts against exp(score - total)."""
    paths = oracles.enumerate_paths(*tagged(data))
    total = oracles.brute_tot_score(*tagged(data), "log")
    probable = [(arcs, math.exp(score - total)) for arcs, score in paths if score > -math.inf]
    counts = {arcs: 0 for arcs, _ in probable}
    for taken in draws:
        assert taken in counts, f"drew {taken}, not a path of positive probability"
        counts[taken] += 1
    observed = np.array([counts[arcs] for arcs, _ in probable], np.float64)
    expected = np.array([p for _, p in probable]) * len(draws)
    assert expected.min() > 5  # the test's own premise
    return stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue


# Paths that no draw may take or end: ties, an unreachable state with an
# arc into the start, a dead end, -inf weights.
ODD = (
    5,
    [
        (0, 1, 1, 1, 1.0),
        (0, 1, 2, 2, 1.0),  # tied with arc 0
        (3, 0, 3, 3, 2.0),  # state 3 is unreachable
        (1, 2, 4, 4, 0.0),
        (1, 4, 5, 5, 0.0),  # state 4 is a dead end
        (0, 2, 6, 6, -math.inf),
    ],
    {2: 0.0, 3: 0.0},
)
NO_PATH = (3, [(0, 1, 1, 1, 0.0), (1, 2, 2, 2, -math.inf)], {2: 0.0, 0: -math.inf})
SINGLE = (1, [], {0: 0.25})
EXAMPLES = [BRANCHES, FAN_IN, DAG, ODD, NO_PATH, SINGLE]


@pytest.mark.parametrize("dtype", ["float64", pytest.param("float32", marks=pytest.mark.slow)])
def test_frequencies_follow_the_path_distribution(dtype):
    # One batch, so one compile; `padded` entries put fan trees in FAN_IN.
    batch = sj.stack([build(data, dtype) for data in EXAMPLES])
    num_paths = 1000
    paths = sj.sample_paths(batch, jax.random.key(11), num_paths)
    assert paths.batch_shape == (len(EXAMPLES), num_paths)
    assert paths.weight.dtype == batch.weight.dtype
    draws = drawn_arcs(paths)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    for b, data in enumerate(EXAMPLES):
        entry_paths = jax.tree_util.tree_map(lambda leaf, b=b: leaf[b], paths)
        check_draws(data, entry_paths, rtol)
        if data in (BRANCHES, FAN_IN, DAG, ODD):
            entry_draws = draws[b * num_paths : (b + 1) * num_paths]
            assert chi_square_p_value(data, entry_draws) > 1e-3


# -- every draw a real path ---------------------------------------------------------


# Every draw recompiles (the dense tables' shapes differ), so these are slow.
@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    data=acyclic_fsas(transducer=True),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_every_draw_is_a_real_path(data, seed, dtype):
    fsa = build(data, dtype)
    paths = sj.sample_paths(fsa, jax.random.key(seed), 6)
    check_draws(data, paths, 1e-5 if dtype == "float32" else 1e-12)
    assert paths.weight.dtype == fsa.weight.dtype
    assert paths.is_acceptor == fsa.is_acceptor


def check_batch_is_its_entries(entries, key, num_paths):
    """A batch's draws are those of each entry alone with its entry key."""
    batch = sj.stack([build(data, pad=False) for data in entries], bucket=True)
    paths = sj.sample_paths(batch, key, num_paths)
    assert paths.batch_shape == (len(entries), num_paths)
    entry_keys = jax.random.split(key, len(entries))
    draws = drawn_arcs(paths)
    for b, data in enumerate(entries):
        alone = sj.sample_paths(build(data), entry_keys[b], num_paths)
        assert draws[b * num_paths : (b + 1) * num_paths] == drawn_arcs(alone)
        np.testing.assert_allclose(sj.tot_score(paths)[b], sj.tot_score(alone), rtol=1e-12)
        check_draws(data, alone, 1e-12)


def test_batched_draws_are_the_entries_own():
    check_batch_is_its_entries([BRANCHES, NO_PATH], jax.random.key(9), 5)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(
    entries=st.lists(acyclic_fsas(transducer=True), min_size=1, max_size=3),
    seed=st.integers(0, 2**31 - 1),
)
def test_batched_draws_are_the_entries_own_on_random_batches(entries, seed):
    check_batch_is_its_entries(entries, jax.random.key(seed), 4)


def test_padding_arcs_are_never_drawn():
    short = sj.Fsa.from_arcs([(0, 1, 1, -5.0)], final=[1])
    long = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0), (2, 3, 3, 0.0)], final=[3])
    batch = sj.stack([short, long])
    # Padding weights made large (inside jit, where they are not checked).
    weight = jnp.where(jnp.asarray(batch.arc_mask), jnp.asarray(batch.weight), 50.0)
    paths = jax.jit(lambda w: sj.sample_paths(batch.replace(weight=w), jax.random.key(1), 20))(
        weight
    )
    np.testing.assert_array_equal(np.asarray(paths.arc_mask)[0].sum(axis=-1), 1)
    np.testing.assert_allclose(sj.tot_score(paths)[0], -5.0)


# -- keys, jit, gradients, NaN -----------------------------------------------------------


def test_a_fixed_key_gives_fixed_draws_and_jit_agrees():
    fsa = build(DAG)
    key = jax.random.key(3)
    first, second = sj.sample_paths(fsa, key, 50), sj.sample_paths(fsa, key, 50)
    jitted = jax.jit(sj.sample_paths, static_argnums=2)(fsa, key, 50)
    for other in (second, jitted):
        np.testing.assert_array_equal(first.olabel, other.olabel)
        np.testing.assert_array_equal(first.arc_mask, other.arc_mask)
    other_key = sj.sample_paths(fsa, jax.random.key(4), 50)
    assert not np.array_equal(first.olabel, other_key.olabel)


def test_gradient_counts_the_arcs_and_ends_drawn():
    fsa = build(BRANCHES, pad=False)
    key = jax.random.key(2)

    def scores(weight, final_weight):
        paths = sj.sample_paths(fsa.replace(weight=weight, final_weight=final_weight), key, 40)
        return jnp.sum(sj.tot_score(paths))

    weight, final_weight = jnp.asarray(fsa.weight), jnp.asarray(fsa.final_weight)
    arc_grad, final_grad = jax.grad(scores, argnums=(0, 1))(weight, final_weight)
    paths = sj.sample_paths(fsa, key, 40)
    draws = drawn_arcs(paths)
    arc_counts = np.zeros(fsa.num_arcs)
    final_counts = np.zeros(fsa.num_states)
    _, arcs, _ = tagged(BRANCHES)
    for taken in draws:
        arc_counts[list(taken)] += 1
        final_counts[arcs[taken[-1]][1] if taken else 0] += 1
    np.testing.assert_array_equal(arc_grad, arc_counts)
    np.testing.assert_array_equal(final_grad, final_counts)


def test_nan_weights_give_nan_scores():
    fsa = build(BRANCHES, pad=False)
    sample = jax.jit(
        lambda w, f: sj.sample_paths(fsa.replace(weight=w, final_weight=f), jax.random.key(0), 8)
    )
    weight, final_weight = jnp.asarray(fsa.weight), jnp.asarray(fsa.final_weight)
    for w, f in [
        (weight.at[5].set(jnp.nan), final_weight),  # an arc
        (weight, final_weight.at[3].set(jnp.nan)),  # a final weight
        (weight.at[7].set(jnp.nan), final_weight),  # the arc of weight -inf
    ]:
        assert np.isnan(np.asarray(sj.tot_score(sample(w, f)))).all()
    # A NaN stored at a non-final state is not a final weight: it is ignored.
    paths = sample(weight, final_weight.at[1].set(jnp.nan))
    assert np.isfinite(np.asarray(sj.tot_score(paths))).all()


def test_nan_weights_give_nan_gradients():
    # As tot_score's: NaN in every weight's gradient where the total is NaN
    # (the paths' NaN final weight was a constant, so the gradient was 0).
    fsa = padded(build(BRANCHES, pad=False))
    key = jax.random.key(0)

    def sampled(weight, final_weight):
        paths = sj.sample_paths(fsa.replace(weight=weight, final_weight=final_weight), key, 8)
        return jnp.sum(sj.tot_score(paths))

    def total(weight, final_weight):
        return sj.tot_score(fsa.replace(weight=weight, final_weight=final_weight))

    weight, final_weight = jnp.asarray(fsa.weight), jnp.asarray(fsa.final_weight)
    for w, f in [
        (weight.at[5].set(jnp.nan), final_weight),  # an arc
        (weight, final_weight.at[3].set(jnp.nan)),  # a final weight
    ]:
        exact = jax.grad(total, argnums=(0, 1))(w, f)
        assert np.isnan(exact[0]).all() and np.isnan(exact[1]).sum() == 3
        for value, grads in both_paths(jax.value_and_grad(sampled, argnums=(0, 1)), w, f):
            assert np.isnan(value)
            for got, want in zip(grads, exact, strict=True):
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # A NaN nothing reads (at a non-final state) leaves the gradient finite.
    grads = jax.grad(sampled, argnums=(0, 1))(weight, final_weight.at[1].set(jnp.nan))
    assert all(np.isfinite(g).all() for g in grads)


# -- errors ---------------------------------------------------------------------


def test_errors():
    fsa = build(BRANCHES, pad=False)
    key = jax.random.key(0)
    cyclic = sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 2, 0.0), (2, 1, 3, 0.0)], final=[2])
    with pytest.raises(ValueError, match=r"sample_paths: state [12] lies on a cycle"):
        sj.sample_paths(cyclic, key, 2)
    for bad in (0, -3, 2.0, True, None):
        with pytest.raises(ValueError, match=r"sample_paths: num_paths must be a positive int"):
            sj.sample_paths(fsa, key, bad)
    with pytest.raises(ValueError, match=r"key must be one key, shape \(\), got shape \(2,\)"):
        sj.sample_paths(fsa, jax.random.split(key), 2)
    with pytest.raises(ValueError, match=r"key must be one key.*got uint32 \(2, 2\)"):
        sj.sample_paths(fsa, jax.random.split(jax.random.PRNGKey(0)), 2)
    with pytest.raises(ValueError, match=r"key must be one key.*got int32 \(2,\)"):
        sj.sample_paths(fsa, jnp.array([0, 1], jnp.int32), 2)
    with pytest.raises(TypeError, match=r"sample_paths: key must be a jax\.random key"):
        sj.sample_paths(fsa, 0, 2)
    with pytest.raises(TypeError, match="sample_paths: expected an Fsa, got list"):
        sj.sample_paths([fsa], key, 2)
