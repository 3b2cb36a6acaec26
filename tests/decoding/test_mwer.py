"""mwer_loss against a numpy computation of its definition over brute-force
enumerated paths, finite differences, sampled paths, and its errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles, strategies
from tests.paths import both_paths


def _lattice(drawn, dtype):
    num_states, arcs, final = drawn
    return sj.Fsa.from_arcs(
        strategies.as_rows(arcs, transducer=True), final, num_states=num_states, dtype=dtype
    )


def _words(arcs, path):
    return tuple(arcs[k][3] for k in path if arcs[k][3] != 0)


def _oracle(drawn, ref, n, temperature):
    """The definition: the n best distinct word strings (each at its best
    path's score), softmax of score / temperature, times Levenshtein."""
    num_states, arcs, final = drawn
    best = {}
    for path, score in oracles.enumerate_paths(num_states, arcs, final):
        if score == -math.inf:
            continue
        words = _words(arcs, path)
        best[words] = max(best.get(words, -math.inf), score)
    chosen = sorted(best.items(), key=lambda item: -item[1])[:n]
    if not chosen:
        return 0.0
    scores = np.array([s for _, s in chosen]) / temperature
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    errors = np.array([oracles.levenshtein(list(w), list(ref)) for w, _ in chosen])
    return float(np.sum(probs * errors))


def _distinct_strings(drawn):
    num_states, arcs, final = drawn
    scores = {}
    for path, score in oracles.enumerate_paths(num_states, arcs, final):
        if score > -math.inf:
            words = _words(arcs, path)
            scores[words] = max(scores.get(words, -math.inf), score)
    return sorted(scores.values(), reverse=True)


@settings(max_examples=20, deadline=None)
@given(
    drawn=strategies.acyclic_fsas(transducer=True),
    ref=st.lists(st.integers(1, 3), max_size=4),
    n=st.integers(1, 6),
    temperature=st.sampled_from([0.5, 1.0, 3.0]),
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_nbest_loss_is_its_definition(drawn, ref, n, temperature, dtype):
    strings = _distinct_strings(drawn)
    # Which strings are the n best is ambiguous only at a tie across the cut.
    assume(len(strings) <= n or strings[n - 1] != strings[n])
    lattice = sj.stack([_lattice(drawn, dtype)])
    padded_ref = np.zeros((1, 5), np.int32)
    padded_ref[0, : len(ref)] = ref
    loss = sj.mwer_loss(lattice, padded_ref, [len(ref)], n=n, temperature=temperature)
    assert loss.dtype == jnp.dtype(dtype) and loss.shape == (1,)
    expected = _oracle(drawn, ref, n, temperature)
    np.testing.assert_allclose(float(loss[0]), expected, rtol=1e-4, atol=1e-5)


def test_batched_equals_one_by_one():
    rng = np.random.default_rng(0)
    drawn = [oracles.random_dag(rng, 6, 14) for _ in range(3)]
    transducers = []
    for num_states, arcs, final in drawn:
        arcs = [(s, d, i, int(rng.integers(0, 4)), w) for s, d, i, _, w in arcs]
        transducers.append((num_states, arcs, final))
    lattices = [_lattice(x, np.float64) for x in transducers]
    ref = np.array([[1, 2, 0], [3, 0, 0], [1, 1, 2]], np.int32)
    lengths = np.array([2, 1, 3], np.int32)
    batched = sj.mwer_loss(sj.stack(lattices), ref, lengths, n=4)
    for b, lattice in enumerate(lattices):
        one = sj.mwer_loss(sj.stack([lattice]), ref[b : b + 1], lengths[b : b + 1], n=4)
        np.testing.assert_allclose(batched[b], one[0], rtol=1e-12)
        expected = _oracle(transducers[b], list(ref[b, : lengths[b]]), 4, 1.0)
        np.testing.assert_allclose(batched[b], expected, rtol=1e-9)


def _three_word_lattice():
    arcs = [
        (0, 1, 1, 1, 0.3),
        (0, 1, 2, 2, -0.2),
        (0, 1, 3, 0, -1.1),
        (1, 2, 1, 1, 0.1),
        (1, 2, 2, 0, -0.6),
    ]
    return sj.Fsa.from_arcs(arcs, {2: 0.25}, dtype=np.float64)


def test_gradient_matches_finite_differences():
    lattice = sj.stack([_three_word_lattice()])
    ref, lengths = jnp.array([[1, 1]], jnp.int32), jnp.array([2], jnp.int32)

    def loss(weight, final_weight):
        changed = lattice.replace(weight=weight, final_weight=final_weight)
        return jnp.sum(sj.mwer_loss(changed, ref, lengths, n=4, temperature=0.7))

    weight, final_weight = jnp.asarray(lattice.weight), jnp.asarray(lattice.final_weight)
    grad_w, grad_f = jax.grad(loss, argnums=(0, 1))(weight, final_weight)
    step = 1e-6
    for k in range(weight.shape[-1]):
        bump = jnp.zeros_like(weight).at[0, k].set(step)
        numeric = (loss(weight + bump, final_weight) - loss(weight - bump, final_weight)) / (
            2 * step
        )
        np.testing.assert_allclose(grad_w[0, k], numeric, atol=1e-7)
    # One final state, on every path: a shift of all scores changes nothing.
    np.testing.assert_allclose(grad_f, 0.0, atol=1e-12)
    assert float(jnp.abs(grad_w).max()) > 1e-3


def test_sampled_paths_are_deduplicated_and_renormalised():
    lattice = sj.stack([_three_word_lattice()])
    key = jax.random.key(3)
    ref, lengths = jnp.array([[1, 1]], jnp.int32), jnp.array([2], jnp.int32)
    loss = sj.mwer_loss(lattice, ref, lengths, n=8, key=key)
    paths = sj.sample_paths(lattice, key, 8)
    seen = {}
    for j in range(8):
        mask = np.asarray(paths.arc_mask[0, j])
        words = tuple(int(x) for x in np.asarray(paths.olabel[0, j])[mask] if x != 0)
        score = float(sj.tot_score(jax.tree_util.tree_map(lambda x, j=j: x[0, j], paths)))
        seen.setdefault(words, score)
    scores = np.array(list(seen.values()))
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    errors = np.array([oracles.levenshtein(list(w), [1, 1]) for w in seen])
    np.testing.assert_allclose(float(loss[0]), float(np.sum(probs * errors)), rtol=1e-9)
    # Under jit with the key traced too.
    jitted = jax.jit(lambda k: sj.mwer_loss(lattice, ref, lengths, n=8, key=k))(key)
    np.testing.assert_allclose(jitted, loss, rtol=1e-12)


def test_no_path_gives_zero_and_a_zero_gradient():
    lattice = sj.stack([sj.Fsa.from_arcs([(0, 1, 1, 1, 0.5)], final=[], num_states=2)])

    def loss(weight):
        return jnp.sum(sj.mwer_loss(lattice.replace(weight=weight), [[1]], [1], n=3))

    assert float(loss(lattice.weight)) == 0.0
    np.testing.assert_array_equal(jax.grad(loss)(lattice.weight), 0.0)


def test_nan_weight_gives_nan_sampled_and_an_error_for_the_nbest():
    lattice = sj.stack([_three_word_lattice()])
    weight = jnp.asarray(lattice.weight).at[0, 0].set(jnp.nan)
    loss = jax.jit(
        lambda w: sj.mwer_loss(lattice.replace(weight=w), [[1, 1]], [2], n=4, key=jax.random.key(0))
    )(weight)
    assert bool(jnp.isnan(loss).all())
    with pytest.raises(ValueError, match="weight nan"):
        jax.grad(lambda w: sj.mwer_loss(lattice.replace(weight=w), [[1, 1]], [2]).sum())(weight)


def test_nan_weight_gives_a_nan_gradient_with_a_key():
    # The sampled paths' NaN scores carry NaN gradients (they were 0).
    lattice = sj.stack([_three_word_lattice()])

    def loss(weight):
        changed = lattice.replace(weight=weight)
        return jnp.sum(sj.mwer_loss(changed, [[1, 1]], [2], n=4, key=jax.random.key(0)))

    weight = jnp.asarray(lattice.weight)
    for value, grad in both_paths(jax.value_and_grad(loss), weight.at[0, 0].set(jnp.nan)):
        assert np.isnan(value) and np.isnan(grad).all()
    assert np.isfinite(jax.grad(loss)(weight)).all()


def test_reference_words_are_checked_at_full_width():
    # Lattice labels are int32: word 2**32 + 1 was read as word 1.
    lattice = sj.stack([_three_word_lattice()])
    ref = np.array([[1, 2**32 + 1]], np.int64)
    for key in (None, jax.random.key(0)):
        with pytest.raises(ValueError, match=r"mwer_loss: ref\[0, 1\] = 4294967297 is outside"):
            sj.mwer_loss(lattice, ref, [2], key=key)
        with jax.enable_x64(False), pytest.raises(ValueError, match=r"ref\[0, 1\] = 4294967297"):
            sj.mwer_loss(lattice, ref.tolist(), [2], key=key)
    # Past the length, any value is ignored.
    np.testing.assert_allclose(
        sj.mwer_loss(lattice, ref, [1]), sj.mwer_loss(lattice, [[1, 0]], [1]), rtol=1e-12
    )
    # Traced (x64), the word is compared at its width: it matches no label.
    jitted = jax.jit(lambda r: sj.mwer_loss(lattice, r, [2], n=8, key=jax.random.key(0)))
    np.testing.assert_allclose(jitted(ref), jitted(np.array([[1, 99]])), rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(ref=[[1]], ref_lengths=[2]), r"ref_lengths\[0\] = 2 is outside \[0, M\]"),
        (dict(ref=[1], ref_lengths=[1]), r"ref must have shape \[B, M\]"),
        (dict(ref=[[1.0]], ref_lengths=[1]), "ref must hold integers"),
        (dict(ref=[[1]], ref_lengths=[1], n=0), "n"),
        (dict(ref=[[1]], ref_lengths=[1], temperature=0.0), "temperature must be > 0"),
    ],
)
def test_bad_arguments_are_located(kwargs, match):
    lattice = sj.stack([_three_word_lattice()])
    with pytest.raises(ValueError, match=match):
        sj.mwer_loss(lattice, **kwargs)


def test_an_unbatched_lattice_is_refused():
    with pytest.raises(ValueError, match=r"batched Fsa with batch shape \[B\]"):
        sj.mwer_loss(_three_word_lattice(), [[1]], [1])
