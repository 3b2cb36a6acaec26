"""rnnt_loss and rnnt_align against enumeration, warprnnt_numba and float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from tests import oracles


@st.composite
def transducer_batches(draw, num_frames=4, num_labels=3, vocab=5):
    """(logits float64 [B, T, U+1, V], frame_lengths, labels, label_lengths,
    blank): padded batches of fixed array shapes (one compile serves all
    examples) with random lengths, zero-length label sequences and blank
    0 or V - 1."""
    batch = 3
    blank = draw(st.sampled_from([0, vocab - 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    logits = rng.normal(scale=2.0, size=(batch, num_frames, num_labels + 1, vocab))
    others = [v for v in range(vocab) if v != blank]
    labels = rng.choice(others, size=(batch, num_labels))
    frame_lengths = rng.integers(1, num_frames + 1, batch)
    label_lengths = rng.integers(0, num_labels + 1, batch)
    return logits, frame_lengths, labels, label_lengths, blank


def _entry(batch, b):
    logits, frame_lengths, labels, label_lengths, _ = batch
    t, u = frame_lengths[b], label_lengths[b]
    return logits[b, :t, : u + 1], labels[b, :u]


@settings(max_examples=2, deadline=None)
@given(batch=transducer_batches(), fastemit_lambda=st.sampled_from([0.0, 0.5]))
def test_loss_and_gradient_match_enumeration(batch, fastemit_lambda):
    logits, frame_lengths, labels, label_lengths, blank = batch

    def ours(x):
        return sj.rnnt_loss(
            x, frame_lengths, labels, label_lengths, blank=blank, fastemit_lambda=fastemit_lambda
        )

    def theirs(x):
        return jnp.stack(
            [
                oracles.brute_rnnt_nll(
                    x[b, : frame_lengths[b], : label_lengths[b] + 1],
                    labels[b, : label_lengths[b]],
                    blank,
                    fastemit_lambda,
                )
                for b in range(len(frame_lengths))
            ]
        )

    x = jnp.asarray(logits)
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-12)
    weights = jnp.asarray(np.linspace(0.5, 1.5, len(frame_lengths)))  # a non-uniform cotangent
    got = jax.grad(lambda x: (ours(x) * weights).sum())(x)
    want = jax.grad(lambda x: (theirs(x) * weights).sum())(x)
    np.testing.assert_allclose(got, want, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(batch=transducer_batches())
def test_align_matches_enumeration(batch):
    logits, frame_lengths, labels, label_lengths, blank = batch
    frames, scores = sj.rnnt_align(logits, frame_lengths, labels, label_lengths, blank=blank)
    for b in range(len(frame_lengths)):
        entry_logits, entry_labels = _entry(batch, b)
        want_frames, want_score = oracles.brute_rnnt_align(entry_logits, entry_labels, blank)
        np.testing.assert_allclose(scores[b], want_score, rtol=1e-12)
        u = label_lengths[b]
        np.testing.assert_array_equal(frames[b, :u], want_frames)
        assert (np.asarray(frames[b, u:]) == -1).all()


def _warprnnt(logits, frame_lengths, labels, label_lengths, blank, fastemit_lambda):
    from warprnnt_numba.rnnt_loss.rnnt_pytorch import rnnt_loss

    acts = torch.tensor(np.asarray(logits), requires_grad=True)
    loss = rnnt_loss(
        acts,
        torch.tensor(np.asarray(labels), dtype=torch.int32),
        torch.tensor(np.asarray(frame_lengths), dtype=torch.int32),
        torch.tensor(np.asarray(label_lengths), dtype=torch.int32),
        blank=blank,
        reduction="none",
        fastemit_lambda=fastemit_lambda,
    )
    loss.sum().backward()
    return loss.detach().numpy(), acts.grad.numpy()


@pytest.mark.parametrize("fastemit_lambda", [0.0, 0.01, 0.3])
def test_matches_warprnnt_numba(fastemit_lambda):
    pytest.importorskip("warprnnt_numba")
    rng = np.random.default_rng(7)
    batch, num_frames, num_labels, vocab, blank = 3, 6, 4, 7, 0
    logits = rng.normal(size=(batch, num_frames, num_labels + 1, vocab)).astype(np.float32)
    labels = rng.integers(1, vocab, (batch, num_labels))
    frame_lengths = np.array([6, 4, 5])
    label_lengths = np.array([4, 2, 0])
    value, grad = jax.value_and_grad(
        lambda x: sj.rnnt_loss(
            x, frame_lengths, labels, label_lengths, blank=blank, fastemit_lambda=fastemit_lambda
        ).sum()
    )(jnp.asarray(logits))
    ours = sj.rnnt_loss(
        logits, frame_lengths, labels, label_lengths, blank=blank, fastemit_lambda=fastemit_lambda
    )
    their_value, their_grad = _warprnnt(
        logits, frame_lengths, labels, label_lengths, blank, fastemit_lambda
    )
    # warprnnt_numba's value is (1 + λ) times the negative log-likelihood.
    np.testing.assert_allclose(ours * (1 + fastemit_lambda), their_value, rtol=1e-5)
    np.testing.assert_allclose(grad, their_grad, atol=1e-5)
    assert np.isfinite(value)


def test_no_path_no_frames_and_padding():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 3, 3, 4))
    labels = np.array([[1, 2], [1, 2], [1, 2], [3, 3]])
    frame_lengths = np.array([0, 3, 2, 3])
    label_lengths = np.array([1, 2, 1, 2])
    logits[1, :, :, 0] = -np.inf  # no blank anywhere: no path
    logits[2, 2:] = np.nan  # padding frames: read by nothing
    logits[2, :, 2:] = np.nan  # padding label positions too
    loss_fn = lambda x: sj.rnnt_loss(x, frame_lengths, labels, label_lengths)
    loss = loss_fn(logits)
    assert loss[0] == np.inf and loss[1] == np.inf and np.isfinite(loss[2:]).all()
    grad = jax.grad(lambda x: jnp.where(jnp.isfinite(loss_fn(x)), loss_fn(x), 0.0).sum())(
        jnp.asarray(logits)
    )
    assert not np.isnan(grad).any()
    np.testing.assert_array_equal(grad[:2], 0.0)
    np.testing.assert_array_equal(grad[2, 2:], 0.0)
    np.testing.assert_array_equal(grad[2, :, 2:], 0.0)
    # A NaN the utterance reads gives a NaN loss and gradient.
    logits[3, 0, 0, 1] = np.nan
    assert np.isnan(loss_fn(logits)[3])
    assert np.isnan(jax.grad(lambda x: loss_fn(x)[3])(jnp.asarray(logits))[3]).any()


def test_very_negative_logits_give_finite_values_and_gradients():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 5, 4, 6)).astype(np.float32) * 1e3 - 1e4
    labels, lengths = np.array([[1, 2, 3], [4, 5, 1]]), np.array([5, 3])
    loss, grad = jax.value_and_grad(
        lambda x: sj.rnnt_loss(x, lengths, labels, np.array([3, 2])).sum()
    )(jnp.asarray(logits))
    assert np.isfinite(loss) and np.isfinite(grad).all()


def test_float32_is_close_to_float64_on_a_long_grid():
    rng = np.random.default_rng(5)
    num_frames, num_labels, vocab = 1000, 200, 8
    logits = rng.normal(scale=2.0, size=(1, num_frames, num_labels + 1, vocab))
    labels = rng.integers(1, vocab, (1, num_labels))
    args = (np.array([num_frames]), labels, np.array([num_labels]))
    results = {}
    for dtype in (np.float32, np.float64):
        results[dtype] = jax.value_and_grad(lambda x: sj.rnnt_loss(x, *args).sum())(
            jnp.asarray(logits, dtype)
        )
    (value32, grad32), (value64, grad64) = results[np.float32], results[np.float64]
    np.testing.assert_allclose(value32, value64, rtol=1e-5)
    np.testing.assert_allclose(grad32, grad64, atol=1e-4)


def test_jit_vmap_and_grad_compose():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2, 3, 4, 3, 5))  # a leading axis of 2 batches
    labels = rng.integers(1, 5, (2, 3, 2))
    frame_lengths, label_lengths = (
        np.array([[4, 2, 1], [3, 4, 4]]),
        np.array([[2, 1, 0], [2, 2, 1]]),
    )
    vmapped = jax.jit(jax.vmap(sj.rnnt_loss))(logits, frame_lengths, labels, label_lengths)
    for i in range(2):
        np.testing.assert_allclose(
            vmapped[i], sj.rnnt_loss(logits[i], frame_lengths[i], labels[i], label_lengths[i])
        )
    grads = jax.vmap(jax.grad(lambda x, f, y, n: sj.rnnt_loss(x, f, y, n).sum()))(
        jnp.asarray(logits), frame_lengths, labels, label_lengths
    )
    assert grads.shape == logits.shape


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(logits=np.zeros((1, 2, 3))), r"logits must have rank 4"),
        (dict(labels=np.array([[1, 2]])), r"logits has U \+ 1 = 2 label positions"),
        (dict(labels=np.array([[0]])), r"labels\[0, 0\] = 0 is outside .* or equals blank = 0"),
        (dict(frame_lengths=np.array([3])), r"frame_lengths\[0\] = 3 is outside \[0, T\]"),
        (dict(label_lengths=np.array([2])), r"label_lengths\[0\] = 2"),
        (dict(blank=4), r"blank = 4 is outside \[0, V\)"),
        (dict(fastemit_lambda=-0.5), r"fastemit_lambda must be >= 0"),
    ],
)
def test_bad_inputs_are_named(change, message):
    args = dict(
        logits=np.zeros((1, 2, 2, 4)),
        frame_lengths=np.array([2]),
        labels=np.array([[1]]),
        label_lengths=np.array([1]),
    )
    keywords = {k: change.pop(k) for k in ("blank", "fastemit_lambda") if k in change}
    args.update(change)
    with pytest.raises(ValueError, match=message):
        sj.rnnt_loss(**args, **keywords)


def test_medium_grids_match_a_numpy_reference():
    # Too many alignments to enumerate (C(39, 9) at T = 30, U = 9): the
    # textbook node-by-node α/β recursions in numpy float64 instead.
    rng = np.random.default_rng(8)
    batch, num_frames, num_labels, vocab = 2, 30, 10, 7
    logits = rng.normal(scale=2.0, size=(batch, num_frames, num_labels + 1, vocab))
    labels = rng.integers(1, vocab, (batch, num_labels))
    frame_lengths, label_lengths = np.array([30, 22]), np.array([9, 10])
    value, grad = jax.value_and_grad(
        lambda x: sj.rnnt_loss(x, frame_lengths, labels, label_lengths).sum()
    )(jnp.asarray(logits))
    losses = sj.rnnt_loss(logits, frame_lengths, labels, label_lengths)
    for b in range(batch):
        t, u = frame_lengths[b], label_lengths[b]
        want_loss, want_grad = oracles.numpy_rnnt(logits[b, :t, : u + 1], labels[b, :u])
        np.testing.assert_allclose(losses[b], want_loss, rtol=1e-12)
        np.testing.assert_allclose(grad[b, :t, : u + 1], want_grad, atol=1e-12)
        np.testing.assert_array_equal(grad[b, t:], 0.0)
        np.testing.assert_array_equal(grad[b, :, u + 1 :], 0.0)
    assert np.isfinite(value)


def test_gradients_match_finite_differences():
    from jax.test_util import check_grads

    rng = np.random.default_rng(9)
    logits = jnp.asarray(rng.normal(size=(2, 4, 3, 4)))
    args = (np.array([4, 3]), np.array([[1, 2], [3, 1]]), np.array([2, 1]))
    check_grads(lambda x: sj.rnnt_loss(x, *args), (logits,), order=1, modes=("rev",))
    am, lm = jnp.asarray(rng.normal(size=(2, 4, 4))), jnp.asarray(rng.normal(size=(2, 3, 4)))
    check_grads(
        lambda a, b: sj.rnnt_loss_smoothed(a, b, *args, am_only_scale=0.1, delay_penalty=0.2),
        (am, lm),
        order=1,
        modes=("rev",),
    )
