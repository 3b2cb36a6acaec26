"""edit_distance against the textbook dynamic program of the oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles

LABELS = st.integers(0, 3)  # few labels: matches and substitutions both common


@st.composite
def padded_batches(draw, max_batch=4, max_size=6):
    """(hyp [B, N], hyp_lengths, ref [B, M], ref_lengths), with garbage past
    each length; B, N and M may be 0."""
    batch = draw(st.integers(0, max_batch))
    hyp_size, ref_size = draw(st.integers(0, max_size)), draw(st.integers(0, max_size))
    hyp = draw(
        st.lists(
            st.lists(LABELS, min_size=hyp_size, max_size=hyp_size), min_size=batch, max_size=batch
        )
    )
    ref = draw(
        st.lists(
            st.lists(LABELS, min_size=ref_size, max_size=ref_size), min_size=batch, max_size=batch
        )
    )
    hyp_lengths = draw(st.lists(st.integers(0, hyp_size), min_size=batch, max_size=batch))
    ref_lengths = draw(st.lists(st.integers(0, ref_size), min_size=batch, max_size=batch))
    return (
        np.asarray(hyp, np.int32).reshape(batch, hyp_size),
        np.asarray(hyp_lengths, np.int32),
        np.asarray(ref, np.int32).reshape(batch, ref_size),
        np.asarray(ref_lengths, np.int32),
    )


def expected(hyp, hyp_lengths, ref, ref_lengths):
    return [
        oracles.levenshtein(list(h[:n]), list(r[:m]))
        for h, n, r, m in zip(hyp, hyp_lengths, ref, ref_lengths, strict=True)
    ]


def test_oracle_on_known_pairs():
    assert oracles.levenshtein("kitten", "sitting") == 3
    assert oracles.levenshtein("", "abc") == 3
    assert oracles.levenshtein("flaw", "lawn") == 2


@settings(max_examples=50, deadline=None)
@given(batch=padded_batches())
def test_matches_the_oracle(batch):
    distances = sj.edit_distance(*batch)
    assert distances.dtype == jnp.int32 and distances.shape == batch[0].shape[:1]
    np.testing.assert_array_equal(distances, expected(*batch))


@settings(max_examples=30, deadline=None)
@given(batch=padded_batches(max_batch=3, max_size=5))
def test_under_jit_and_one_by_one(batch):
    jitted = jax.jit(sj.edit_distance)(*batch)
    np.testing.assert_array_equal(jitted, expected(*batch))
    singles = [sj.edit_distance(*entry) for entry in zip(*batch, strict=True)]
    assert all(single.shape == () for single in singles)
    np.testing.assert_array_equal(jitted, np.asarray(singles, np.int32).reshape(-1))


def test_garbage_past_the_lengths_is_ignored():
    ref = np.array([[1, 2, 3, 9, 9]])
    clean = sj.edit_distance(np.array([[1, 3, 0, 0]]), [2], ref, [3])
    dirty = sj.edit_distance(np.array([[1, 3, 7, 8]]), [2], ref, [3])
    np.testing.assert_array_equal(clean, [1])
    np.testing.assert_array_equal(dirty, [1])


def test_empty_sides():
    none = np.zeros((2, 0), np.int32)
    labels = np.array([[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(sj.edit_distance(none, [0, 0], labels, [3, 1]), [3, 1])
    np.testing.assert_array_equal(sj.edit_distance(labels, [2, 0], none, [0, 0]), [2, 0])
    no_batch = np.zeros((0, 4), np.int32), np.zeros(0, np.int32)
    assert sj.edit_distance(*no_batch, *no_batch).shape == (0,)


def test_vmap_and_traced_lengths():
    hyp = jnp.array([[[1, 2, 3], [3, 3, 3]]])  # [1, B=2, N=3]
    ref = jnp.array([[[1, 3], [3, 0]]])
    hyp_lengths, ref_lengths = jnp.array([[3, 2]]), jnp.array([[2, 1]])
    mapped = jax.vmap(sj.edit_distance)(hyp, hyp_lengths, ref, ref_lengths)
    np.testing.assert_array_equal(mapped, [[1, 1]])
    # Traced lengths out of range are clamped to [0, N] / [0, M].
    clamped = jax.jit(sj.edit_distance)(hyp[0], jnp.array([9, -1]), ref[0], jnp.array([2, 1]))
    np.testing.assert_array_equal(clamped, [1, 1])


def test_mixed_label_dtypes_and_lists():
    hyp = np.array([[1, 2]], np.int64)
    ref = np.array([[1, 5]], np.int16)
    np.testing.assert_array_equal(sj.edit_distance(hyp, [2], ref, [2]), [1])
    np.testing.assert_array_equal(sj.edit_distance([[2**33, 1]], [2], [[1]], [1]), [1])


def test_labels_are_checked_at_full_width():
    big = 2**32 + 1
    # Without x64 labels are compared as int32: 2**32 + 1 wrapped to 1.
    with jax.enable_x64(False):
        for hyp in (np.array([[big]], np.int64), [[big]]):
            with pytest.raises(
                ValueError, match=r"edit_distance: hyp\[0, 0\] = 4294967297 is outside int32"
            ):
                sj.edit_distance(hyp, [1], [[1]], [1])
        with pytest.raises(ValueError, match=r"edit_distance: ref\[1\] = -4294967297 is outside"):
            sj.edit_distance([1, 1], 2, np.array([1, -big], np.int64), 2)
        # Past the lengths, any value is ignored.
        padded = np.array([[1, big]], np.int64)
        np.testing.assert_array_equal(sj.edit_distance(padded, [1], [[1]], [1]), [0])
    # With x64, uint64 and int64 labels meet as int64: 2**64 - 1 wrapped to -1.
    with pytest.raises(ValueError, match=r"hyp\[0, 0\] = 18446744073709551615 is outside int64"):
        sj.edit_distance(np.array([[2**64 - 1]], np.uint64), [1], np.array([[-1]], np.int64), [1])
    np.testing.assert_array_equal(sj.edit_distance([[big]], [1], [[1]], [1]), [1])


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((1, 2, 3), int), [2], [[1]], [1]), r"hyp must have rank 2, \[B, N\]"),
        (([[1]], [1], 5, 1), r"ref must have rank 2, \[B, M\].*got shape \(\)"),
        (([[1.5]], [1], [[1]], [1]), "hyp must hold integers, got float"),
        (([[1]], [1], [[True]], [1]), "ref must hold integers, got bool"),
        (([[1]], [1], [1], 1), r"hyp has shape \(1, 1\) but ref has shape \(1,\)"),
        (([[1], [2]], [1, 1], [[1]], [1]), "hyp has B = 2 sequences but ref has B = 1"),
        (([[1]], [1, 1], [[1]], [1]), r"hyp_lengths must have shape \[B\] = \(1,\), got \(2,\)"),
        (([[1]], 1, [[1]], [1]), r"hyp_lengths must have shape \[B\] = \(1,\), got \(\)"),
        (([1], [1], [1], 1), r"hyp_lengths must have shape \[\] .*got \(1,\)"),
        (([[1]], [1.0], [[1]], [1]), "hyp_lengths must hold integers, got float"),
        (([[1], [2]], [1, 3], [[1], [1]], [1, 1]), r"hyp_lengths\[1\] = 3 is outside \[0, 1\]"),
        (([[1]], [1], [[1, 2]], [-1]), r"ref_lengths\[0\] = -1 is outside \[0, 2\]"),
        (([[1]], [1], [[1]], [2**32 + 1]), r"ref_lengths\[0\] = 4294967297 is outside"),
        (([1, 2], 3, [1], 1), r"edit_distance: hyp_lengths = 3 is outside \[0, 2\]"),
        (([[1, [2]]], [1], [[1]], [1]), "hyp must be an array"),
    ],
)
def test_errors(args, match):
    with pytest.raises(ValueError, match=match):
        sj.edit_distance(*args)
