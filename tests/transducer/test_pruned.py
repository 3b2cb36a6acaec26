"""The pruned transducer family against the full loss, properties and fast_rnnt."""

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
def am_lm_batches(draw, num_frames=6, num_labels=4, vocab=6):
    """(am [B, T, V], lm [B, U+1, V], frame_lengths, labels, label_lengths,
    blank) in float64, of fixed array shapes (one compile serves all
    examples), every utterance with at least one frame."""
    batch = 3
    blank = draw(st.sampled_from([0, vocab - 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    others = [v for v in range(vocab) if v != blank]
    return (
        rng.normal(size=(batch, num_frames, vocab)),
        rng.normal(size=(batch, num_labels + 1, vocab)),
        rng.integers(1, num_frames + 1, batch),
        rng.choice(others, size=(batch, num_labels)),
        rng.integers(0, num_labels + 1, batch),
        blank,
    )


@settings(max_examples=4, deadline=None)
@given(data=am_lm_batches())
def test_simple_loss_is_the_full_loss_of_the_additive_joiner(data):
    am, lm, frame_lengths, labels, label_lengths, blank = data
    lengths = (frame_lengths, labels, label_lengths)

    def simple(a, b):
        return sj.rnnt_loss_simple(a, b, *lengths, blank=blank)

    def full(a, b):
        return sj.rnnt_loss(a[:, :, None, :] + b[:, None, :, :], *lengths, blank=blank)

    np.testing.assert_allclose(simple(am, lm), full(am, lm), rtol=1e-12)
    got = jax.grad(lambda a, b: simple(a, b).sum(), argnums=(0, 1))(am, lm)
    want = jax.grad(lambda a, b: full(a, b).sum(), argnums=(0, 1))(am, lm)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-12)
    # No smoothing is the simple loss.
    smoothed = sj.rnnt_loss_smoothed(
        am, lm, *lengths, lm_only_scale=0.0, am_only_scale=0.0, blank=blank
    )
    np.testing.assert_allclose(smoothed, simple(am, lm), rtol=1e-12)


@settings(max_examples=4, deadline=None)
@given(data=am_lm_batches(), s_range=st.integers(2, 4))
def test_ranges_hold_a_path_and_the_pruned_loss_at_full_range_is_the_full_loss(data, s_range):
    am, lm, frame_lengths, labels, label_lengths, blank = data
    lengths = (frame_lengths, labels, label_lengths)
    ranges = np.asarray(sj.rnnt_prune_ranges(am, lm, *lengths, s_range, blank=blank))
    num_labels = labels.shape[1]
    assert ranges.shape[:2] == am.shape[:2] and ranges.shape[2] <= num_labels + 1
    assert (ranges >= 0).all() and (ranges <= num_labels).all()
    assert (np.diff(ranges, axis=2) == 1).all()  # consecutive positions
    for b, (t_b, u_b) in enumerate(zip(frame_lengths, label_lengths)):
        starts = ranges[b, :t_b, 0]
        assert (np.diff(starts) >= 0).all(), "starts must not decrease"
        assert ranges[b, t_b - 1, -1] >= u_b >= ranges[b, t_b - 1, 0]  # the end is kept
    am_pruned, lm_pruned = sj.rnnt_prune(am, lm, ranges)
    logits = jnp.tanh(am_pruned + lm_pruned)
    loss = sj.rnnt_loss_pruned(logits, *lengths, ranges, blank=blank)
    assert np.isfinite(loss).all(), "the kept positions must hold a complete path"
    # Keeping every position gives the full loss, and its gradient.
    every = np.broadcast_to(np.arange(num_labels + 1), (*am.shape[:2], num_labels + 1))
    joint = jnp.tanh(am[:, :, None, :] + lm[:, None, :, :])
    np.testing.assert_allclose(
        sj.rnnt_loss_pruned(joint, *lengths, every, blank=blank),
        sj.rnnt_loss(joint, *lengths, blank=blank),
        rtol=1e-12,
    )
    got = jax.grad(lambda x: sj.rnnt_loss_pruned(x, *lengths, every, blank=blank).sum())(joint)
    want = jax.grad(lambda x: sj.rnnt_loss(x, *lengths, blank=blank).sum())(joint)
    np.testing.assert_allclose(got, want, atol=1e-12)


@st.composite
def pruned_batches(draw, num_frames=4, num_labels=3, width=2, vocab=5):
    """(logits float64 [B, T, S, V], frame_lengths, labels, label_lengths,
    ranges [B, T, S], blank): random bands of consecutive positions whose
    starts rise by 0 .. S - 1 a frame from 0 (some leave out the end
    node: no path), of fixed array shapes."""
    batch = 3
    blank = draw(st.sampled_from([0, vocab - 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    rises = rng.integers(0, width, (batch, num_frames))
    rises[:, 0] = 0
    starts = np.minimum(np.cumsum(rises, axis=1), num_labels + 1 - width)
    others = [v for v in range(vocab) if v != blank]
    return (
        rng.normal(scale=2.0, size=(batch, num_frames, width, vocab)),
        rng.integers(1, num_frames + 1, batch),
        rng.choice(others, size=(batch, num_labels)),
        rng.integers(0, num_labels + 1, batch),
        starts[:, :, None] + np.arange(width),
        blank,
    )


@settings(max_examples=3, deadline=None)
@given(batch=pruned_batches())
def test_pruned_loss_and_gradient_match_enumeration_over_the_kept_positions(batch):
    logits, frame_lengths, labels, label_lengths, ranges, blank = batch
    lengths = (frame_lengths, labels, label_lengths)

    def ours(x):
        return sj.rnnt_loss_pruned(x, *lengths, ranges, blank=blank)

    value, grad = ours(logits), jax.grad(lambda x: ours(x).sum())(logits)
    for b, (t_b, u_b) in enumerate(zip(frame_lengths, label_lengths)):

        def oracle(x, b=b, t_b=t_b, u_b=u_b):
            return oracles.brute_pruned_rnnt_nll(x, ranges[b, :t_b, 0], labels[b, :u_b], blank)

        entry = logits[b, :t_b]
        np.testing.assert_allclose(value[b], oracle(entry), rtol=1e-10)
        np.testing.assert_allclose(grad[b, :t_b], jax.grad(oracle)(entry), atol=1e-10)
        assert (grad[b, t_b:] == 0).all()


def test_ranges_that_are_not_a_band_are_named_or_give_nan():
    logits = np.zeros((2, 3, 2, 4))
    lengths = (np.array([3, 3]), np.array([[1, 2], [1, 2]]), np.array([2, 2]))
    good = np.array([[0, 1], [0, 1], [1, 2]])
    gap = np.array([[0, 1], [0, 2], [1, 2]])
    fall = np.array([[0, 1], [1, 2], [0, 1]])
    for bad, message in (
        (gap, r"ranges\[1, 1\] = \[0, 2\] are not consecutive"),
        (fall, r"ranges\[1, 2\] starts at 0, below frame 1's 1"),
    ):
        with pytest.raises(ValueError, match=message):
            sj.rnnt_loss_pruned(logits, *lengths, np.stack([good, bad]))
        # Traced ranges cannot be checked before the call: the entry is NaN.
        traced = jax.jit(lambda r: sj.rnnt_loss_pruned(logits, *lengths, r))
        loss = traced(np.stack([good, bad]))
        assert np.isfinite(loss[0]) and np.isnan(loss[1])


def test_prune_gathers_and_its_gradient_sums_back():
    rng = np.random.default_rng(3)
    am, lm = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 4, 3))
    ranges = np.array(
        [[[0, 1], [0, 1], [1, 2], [2, 3], [2, 3]], [[0, 1], [1, 2], [1, 2], [3, 2], [0, 0]]]
    )
    weights = rng.normal(size=(2, 5, 2, 3))

    def total(a, b):
        am_pruned, lm_pruned = sj.rnnt_prune(a, b, ranges)
        return (weights * (am_pruned + 2.0 * lm_pruned)).sum()

    am_grad, lm_grad = jax.grad(total, argnums=(0, 1))(am, lm)
    at = (ranges[..., None] == np.arange(4)).astype(float)  # [B, T, S, U+1]
    np.testing.assert_allclose(am_grad, weights.sum(axis=2), atol=1e-12)
    np.testing.assert_allclose(lm_grad, 2.0 * np.einsum("btsu,btsc->buc", at, weights), atol=1e-12)


def test_ranges_widen_where_no_window_admits_a_path():
    am, lm = np.zeros((1, 2, 4)), np.zeros((1, 6, 4))
    lengths = (np.array([2]), np.array([[1, 2, 3, 1, 2]]), np.array([5]))
    # 5 labels in 2 frames need windows of (5 - 1) // 2 + 2 = 4 positions.
    assert sj.rnnt_prune_ranges(am, lm, *lengths, 2).shape == (1, 2, 4)


def _fast_rnnt_inputs(rng, batch=3, num_frames=7, num_labels=4, vocab=6):
    am = rng.normal(size=(batch, num_frames, vocab))
    lm = rng.normal(size=(batch, num_labels + 1, vocab))
    labels = rng.integers(1, vocab, (batch, num_labels))
    frame_lengths, label_lengths = np.array([7, 5, 6]), np.array([4, 2, 3])
    boundary = torch.zeros((batch, 4), dtype=torch.int64)
    boundary[:, 2] = torch.tensor(label_lengths)
    boundary[:, 3] = torch.tensor(frame_lengths)
    return am, lm, labels, frame_lengths, label_lengths, boundary


@pytest.mark.parametrize("delay_penalty", [0.0, 0.3])
def test_matches_fast_rnnt(delay_penalty):
    fast_rnnt = pytest.importorskip("fast_rnnt")
    am, lm, labels, frame_lengths, label_lengths, boundary = _fast_rnnt_inputs(
        np.random.default_rng(1)
    )
    lengths = (frame_lengths, labels, label_lengths)
    their_am, their_lm = torch.tensor(am, requires_grad=True), torch.tensor(lm, requires_grad=True)
    symbols = torch.tensor(labels)
    common = dict(symbols=symbols, termination_symbol=0, boundary=boundary, reduction="none")
    theirs = fast_rnnt.rnnt_loss_simple(
        lm=their_lm, am=their_am, delay_penalty=delay_penalty, **common
    )
    ours = sj.rnnt_loss_simple(am, lm, *lengths, delay_penalty=delay_penalty)
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-6)
    their_grads = torch.autograd.grad(theirs.sum(), (their_am, their_lm))
    our_grads = jax.grad(
        lambda a, b: sj.rnnt_loss_simple(a, b, *lengths, delay_penalty=delay_penalty).sum(),
        argnums=(0, 1),
    )(am, lm)
    for g, w in zip(our_grads, their_grads):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6)
    smoothed = fast_rnnt.rnnt_loss_smoothed(
        lm=their_lm,
        am=their_am,
        lm_only_scale=0.25,
        am_only_scale=0.1,
        delay_penalty=delay_penalty,
        **common,
    )
    np.testing.assert_allclose(
        sj.rnnt_loss_smoothed(
            am, lm, *lengths, lm_only_scale=0.25, am_only_scale=0.1, delay_penalty=delay_penalty
        ),
        smoothed.detach().numpy(),
        rtol=1e-6,
    )
    # The ranges come from the simple loss's posteriors (no delay penalty).
    _, (px_grad, py_grad) = fast_rnnt.rnnt_loss_simple(
        lm=their_lm.detach(), am=their_am.detach(), return_grad=True, **common
    )
    for s_range in (2, 3, 5):
        their_ranges = fast_rnnt.get_rnnt_prune_ranges(
            px_grad=px_grad, py_grad=py_grad, boundary=boundary, s_range=s_range
        )
        ranges = sj.rnnt_prune_ranges(am, lm, *lengths, s_range)
        np.testing.assert_array_equal(ranges, their_ranges.numpy())
        am_pruned, lm_pruned = fast_rnnt.do_rnnt_pruning(
            am=their_am, lm=their_lm, ranges=their_ranges
        )
        their_logits = torch.tanh(am_pruned + lm_pruned).detach().requires_grad_(True)
        their_loss = fast_rnnt.rnnt_loss_pruned(
            logits=their_logits, ranges=their_ranges, delay_penalty=delay_penalty, **common
        )
        their_loss.sum().backward()
        our_am, our_lm = sj.rnnt_prune(am, lm, ranges)
        np.testing.assert_allclose(our_am + our_lm, (am_pruned + lm_pruned).detach().numpy())
        logits = jnp.tanh(our_am + our_lm)
        value, grad = jax.value_and_grad(
            lambda x: sj.rnnt_loss_pruned(x, *lengths, ranges, delay_penalty=delay_penalty).sum()
        )(logits)
        np.testing.assert_allclose(value, their_loss.sum().item(), rtol=1e-6)
        np.testing.assert_allclose(grad, their_logits.grad.numpy(), atol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda a, b, *r: sj.rnnt_prune_ranges(a, b, *r, 1), r"s_range must be >= 2"),
        (lambda a, b, *r: sj.rnnt_loss_simple(a, b[:, :2], *r), r"lm has U \+ 1 = 2"),
        (lambda a, b, *r: sj.rnnt_loss_simple(a[:, :, :3], b, *r), r"does not match am"),
        (
            lambda a, b, *r: sj.rnnt_loss_pruned(
                jnp.zeros((1, 3, 2, 4)), *r, jnp.full((1, 3, 2), 5)
            ),
            r"ranges must lie in \[0, U\] = \[0, 2\]",
        ),
    ],
)
def test_bad_inputs_are_named(call, message):
    am, lm = np.zeros((1, 3, 4)), np.zeros((1, 3, 4))
    with pytest.raises(ValueError, match=message):
        call(am, lm, np.array([3]), np.array([[1, 2]]), np.array([2]))


def test_ranges_of_an_utterance_shorter_than_s_range_start_at_0():
    # Documented: s_range > U_b + 1 cannot fit in [0, U_b]; the utterance
    # keeps 0 .. s_range - 1 at every frame (positions past U_b: no node).
    rng = np.random.default_rng(11)
    am, lm = rng.normal(size=(2, 5, 6)), rng.normal(size=(2, 6, 6))
    labels = np.array([[1, 2, 3, 4, 5], [1, 2, 0, 0, 0]])
    ranges = sj.rnnt_prune_ranges(am, lm, np.array([5, 4]), labels, np.array([5, 1]), 4)
    np.testing.assert_array_equal(ranges[1], np.broadcast_to(np.arange(4), (5, 4)))
    assert ranges[0].max() == 5
