"""ctc_loss, ctc_graph, ctc_topo and forced_align against optax, torch and
brute-force enumeration of frame token sequences."""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from tests import oracles
from tests.paths import both_paths, scan_only


def random_batch(seed, batch, num_frames, vocab_size, max_labels, dtype=np.float32, feasible=True):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, num_frames, vocab_size)).astype(dtype)
    labels = rng.integers(1, vocab_size, size=(batch, max_labels))
    label_lengths = rng.integers(0, max_labels + 1, size=batch)
    label_lengths[0] = max_labels
    # Feasible: room for each label plus a blank between repeats.
    needed = np.array(
        [
            n + sum(labels[b, i] == labels[b, i - 1] for i in range(1, n))
            for b, n in enumerate(label_lengths)
        ]
    )
    low = needed if feasible else np.zeros_like(needed)
    input_lengths = rng.integers(low, num_frames + 1)
    input_lengths[0] = num_frames
    return logits, input_lengths, labels, label_lengths


def ours(logits, input_lengths, labels, label_lengths, **options):
    def loss(x):
        return sj.ctc_loss(jax.nn.log_softmax(x), input_lengths, labels, label_lengths, **options)

    values, pullback = jax.vjp(loss, jnp.asarray(logits))
    return np.asarray(values), np.asarray(pullback(jnp.ones_like(values))[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_optax_and_torch(dtype, seed):
    batch = random_batch(seed, 6, 50, 7, 12, dtype)
    loss, grad = ours(*batch)
    assert loss.dtype == dtype and grad.dtype == dtype
    for peer in (oracles.optax_ctc, oracles.torch_ctc):
        peer_loss, peer_grad = peer(*batch)
        np.testing.assert_allclose(loss, peer_loss, rtol=1e-4)
        np.testing.assert_allclose(grad, peer_grad, atol=1e-4 if dtype == np.float32 else 1e-9)


def test_matches_brute_force_enumeration():
    rng = np.random.default_rng(5)
    for labels in [(), (1,), (1, 1), (2, 1), (1, 2, 2)]:
        for length in range(0, 5):
            log_probs = np.log(rng.dirichlet(np.ones(3), size=4))  # T=4, V=3
            want_total, want_best = oracles.brute_ctc(log_probs, length, labels)
            padded = np.array([list(labels) + [1] * (3 - len(labels))])
            args = (log_probs[None], np.array([length]), padded, np.array([len(labels)]))
            loss = sj.ctc_loss(*args)
            np.testing.assert_allclose(-loss, [want_total], rtol=1e-12)
            frames, best = sj.forced_align(*args)
            np.testing.assert_allclose(best, [want_best], rtol=1e-12)
            if want_best > -np.inf:
                path = np.asarray(frames[0, :length])
                assert oracles.ctc_collapse(path.tolist()) == labels
                np.testing.assert_allclose(log_probs[np.arange(length), path].sum(), want_best)


def test_infeasible_gives_inf_with_zero_gradient_or_zero_on_request():
    logits = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    labels = np.array([[1, 1, 2], [1, 2, 3]])  # "1 _ 1 2" needs 4 frames
    args = (logits, np.array([3, 3]), labels, np.array([3, 3]))
    loss, grad = ours(*args)
    assert loss[0] == np.inf and np.isfinite(loss[1])
    assert not grad[0].any() and np.isfinite(grad).all()
    loss, grad = ours(*args, zero_infinity=True)
    assert loss[0] == 0.0 and not grad[0].any()


def test_float32_loss_is_never_negative():
    # An almost certain alignment: the true loss is ~1e-8, and rounding must
    # not push it below zero.
    log_probs = np.full((4, 30, 5), -40.0, np.float32)
    log_probs[:, :, 0] = 0.0
    log_probs[:, 10, 0], log_probs[:, 10, 3] = -40.0, 0.0
    loss = sj.ctc_loss(log_probs, np.full(4, 30), np.full((4, 1), 3), np.ones(4, int))
    assert np.all(np.asarray(loss) >= 0)


def test_frames_past_input_lengths_get_zero_gradient():
    logits, input_lengths, labels, label_lengths = random_batch(3, 4, 20, 5, 4)
    _, grad = ours(logits, input_lengths, labels, label_lengths)
    for b, n in enumerate(input_lengths):
        assert not grad[b, n:].any()


def test_ctc_graph_scores_equal_minus_ctc_loss():
    logits, input_lengths, labels, label_lengths = random_batch(4, 5, 12, 6, 4, np.float64)
    log_probs = jax.nn.log_softmax(logits)
    graph = sj.ctc_graph(labels, label_lengths, dtype=np.float64)
    np.testing.assert_allclose(
        sj.dense_tot_score(graph, log_probs, input_lengths),
        -sj.ctc_loss(log_probs, input_lengths, labels, label_lengths),
        rtol=1e-12,
    )
    frames, scores = sj.forced_align(log_probs, input_lengths, labels, label_lengths)
    np.testing.assert_allclose(
        scores, sj.dense_tot_score(graph, log_probs, input_lengths, sj.TROPICAL), rtol=1e-12
    )
    graph_frames, _ = sj.viterbi_decode(graph, log_probs, input_lengths)
    chex.assert_trees_all_equal(frames, graph_frames)


@pytest.mark.parametrize("num_frames", [1, 2, 5, 8])
def test_portable_gradient_equals_the_ctc_graphs_at_odd_and_even_lengths(num_frames):
    # The portable ctc_loss computes α and β in one scan that meets in the
    # middle frame (odd T) or between two (even T), and forms each
    # occupancy in the second half; dense_tot_score of the CTC graph sums
    # slot posteriors by emission column instead. Lengths 0..T, infeasible
    # ones included (their gradients are 0).
    logits, input_lengths, labels, label_lengths = random_batch(
        11, 6, num_frames, 5, 3, np.float64, feasible=False
    )
    input_lengths[1:3] = [0, num_frames - 1]
    log_probs = jax.nn.log_softmax(jnp.asarray(logits))
    graph = sj.ctc_graph(labels, label_lengths, dtype=np.float64)

    def graph_loss(lp):
        scores = sj.dense_tot_score(graph, lp, input_lengths)
        return -jnp.sum(jnp.where(jnp.isfinite(scores), scores, 0.0))  # infeasible: no gradient

    with scan_only():
        loss, grad = _loss_and_grad(log_probs, input_lengths, labels, label_lengths)
        expected = jax.grad(graph_loss)(log_probs)
    np.testing.assert_allclose(
        loss, -sj.dense_tot_score(graph, log_probs, input_lengths), rtol=1e-12
    )
    np.testing.assert_allclose(grad, expected, atol=1e-12)
    for b, n in enumerate(input_lengths):
        assert not grad[b, n:].any()


def test_forced_align_is_batched_and_marks_padding():
    logits, input_lengths, labels, label_lengths = random_batch(6, 5, 15, 6, 5)
    frames, _scores = sj.forced_align(
        jax.nn.log_softmax(logits), input_lengths, labels, label_lengths
    )
    chex.assert_shape(frames, (5, 15))
    assert frames.dtype == jnp.int32
    for b in range(5):
        n = input_lengths[b]
        assert np.all(np.asarray(frames[b, n:]) == -1)
        assert oracles.ctc_collapse(np.asarray(frames[b, :n]).tolist()) == tuple(
            labels[b, : label_lengths[b]].tolist()
        )


def test_ctc_topo_collapses_every_frame_sequence():
    topo = sj.ctc_topo(3)
    assert topo.num_arcs == 9 and not topo.is_acceptor and topo.cycle
    src, dst = np.asarray(topo.src), np.asarray(topo.dst)
    ilabel, olabel = np.asarray(topo.ilabel), np.asarray(topo.olabel)
    for frames in itertools.product(range(3), repeat=4):
        state, output = 0, []
        for token in frames:  # deterministic on the input token
            (arc,) = np.flatnonzero((src == state) & (ilabel == token))
            state = dst[arc]
            output += [int(olabel[arc])] if olabel[arc] != 0 else []
        assert tuple(output) == oracles.ctc_collapse(frames)
    # Every frame sequence is accepted once: normalised emissions total 0.
    log_probs = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 3))))
    np.testing.assert_allclose(
        sj.dense_tot_score(sj.ctc_topo(3, dtype=np.float64), log_probs), 0.0, atol=1e-12
    )


def test_modified_ctc_topo_has_linear_size():
    for vocab_size in (2, 5, 10):
        topo = sj.ctc_topo(vocab_size, modified=True)
        assert topo.num_arcs == 4 * vocab_size - 3 and topo.num_states == vocab_size
        assert np.asarray(topo.final_weight)[0] == 0 and np.all(
            np.asarray(topo.final_weight)[1:] == -np.inf
        )


def test_ctc_loss_under_jit_with_traced_labels():
    logits, input_lengths, labels, label_lengths = random_batch(7, 3, 10, 5, 3)
    log_probs = jax.nn.log_softmax(logits)
    jitted = jax.jit(sj.ctc_loss)(log_probs, input_lengths, labels, label_lengths)
    np.testing.assert_allclose(
        jitted, sj.ctc_loss(log_probs, input_lengths, labels, label_lengths), rtol=1e-6
    )


def test_bad_input_is_named():
    log_probs = np.zeros((2, 5, 4), np.float32)
    labels = np.array([[1, 2], [3, 1]])
    good = (log_probs, np.array([5, 5]), labels, np.array([2, 2]))
    with pytest.raises(ValueError, match="rank 3"):
        sj.ctc_loss(log_probs[0], *good[1:])
    with pytest.raises(ValueError, match=r"input_lengths\[1\] = 6"):
        sj.ctc_loss(log_probs, np.array([5, 6]), labels, np.array([2, 2]))
    with pytest.raises(ValueError, match=r"labels\[1, 0\] = 4"):
        sj.ctc_loss(log_probs, good[1], np.array([[1, 2], [4, 1]]), good[3])
    with pytest.raises(ValueError, match=r"labels\[0, 1\] = 0 .* blank"):
        sj.forced_align(log_probs, good[1], np.array([[1, 0], [3, 1]]), good[3])
    with pytest.raises(ValueError, match=r"label_lengths\[0\] = 3 is outside \[0, U\] = \[0, 2\]"):
        sj.ctc_loss(log_probs, good[1], labels, np.array([3, 1]))
    with pytest.raises(ValueError, match=r"labels must have shape \[B, U\] with B = 2"):
        sj.ctc_loss(log_probs, good[1], labels[:1], good[3])
    with pytest.raises(ValueError, match=r"labels\[0\]\[1\] = 0"):
        sj.ctc_graph([[1, 0]])
    with pytest.raises(ValueError, match="blank = 3"):
        sj.ctc_topo(3, blank=3)


def test_python_lists_and_tuples_are_accepted():
    # Lists and tuples crashed in numpy ("Field elements must be 2- or 3-tuples").
    log_probs = np.log(np.full((2, 4, 3), 1 / 3, np.float32))
    lengths, labels, label_lengths = np.array([4, 3]), np.array([[1, 2], [2, 0]]), np.array([2, 1])
    want = sj.ctc_loss(log_probs, lengths, labels, label_lengths)
    as_lists = (log_probs.tolist(), lengths.tolist(), labels.tolist(), label_lengths.tolist())
    np.testing.assert_allclose(sj.ctc_loss(*as_lists), want, rtol=1e-6)
    as_tuples = tuple(tuple(np.asarray(x).tolist()) for x in as_lists)
    np.testing.assert_allclose(sj.ctc_loss(*as_tuples), want, rtol=1e-6)
    frames, scores = sj.forced_align(*as_lists)
    want_frames, want_scores = sj.forced_align(log_probs, lengths, labels, label_lengths)
    np.testing.assert_array_equal(frames, want_frames)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    with pytest.raises(
        ValueError, match=r"ctc_loss: labels must be an array, or a rectangular list"
    ):
        sj.ctc_loss(*as_lists[:2], [[1, 2], [2]], as_lists[3])
    with pytest.raises(ValueError, match=r"ctc_loss: labels must hold integers, got float"):
        sj.ctc_loss(*as_lists[:2], [[1.0, 2.0], [2.0, 0.0]], as_lists[3])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda lp, *a: sj.ctc_loss(lp, *a, blank=0.5), r"ctc_loss: blank must be an int, got "),
        (lambda lp, *a: sj.ctc_loss(lp, *a, blank=True), r"ctc_loss: blank must be an int, got "),
        (
            lambda lp, *a: sj.forced_align(lp, *a, blank=np.float32(0)),
            r"forced_align: blank must be an int, got float32 0.0",
        ),
        (lambda lp, *a: sj.ctc_topo(3, blank=0.5), r"ctc_topo: blank must be an int, got float"),
        (lambda lp, *a: sj.ctc_topo(2.5), r"ctc_topo: vocab_size must be an int, got float 2.5"),
        (lambda lp, *a: sj.ctc_graph([1], blank=0.5), r"ctc_graph: blank must be an int"),
        (lambda lp, *a: sj.ctc_graph([1], blank=-1), r"ctc_graph: blank = -1 is outside"),
        # Labels beyond int32 are refused, not wrapped.
        (
            lambda lp, *a: sj.ctc_graph([1, 2**40]),
            r"ctc_graph: labels\[1\] = 1099511627776 is above 2\*\*31 - 1",
        ),
        (
            lambda lp, *a: sj.ctc_graph(np.array([[1, 2**40]])),
            r"ctc_graph: labels\[0, 1\] = 1099511627776 is above",
        ),
        (lambda lp, *a: sj.ctc_graph([[1.5]]), r"ctc_graph: labels\[0\] must hold integers"),
        # int64 lengths of 2**31 and more are refused, not wrapped.
        (
            lambda lp, n, *a: sj.ctc_loss(lp, np.array([2**32 + 2]), *a),
            r"ctc_loss: input_lengths\[0\] = 4294967298 is outside \[0, T\] = \[0, 4\]",
        ),
    ],
)
def test_blank_labels_and_lengths_are_checked_before_any_cast(call, message):
    log_probs = np.zeros((1, 4, 3), np.float32)
    with pytest.raises(ValueError, match=message):
        call(log_probs, np.array([4]), np.array([[1, 2]]), np.array([2]))
    assert sj.ctc_topo(3, blank=np.int64(2)).num_arcs == 9
    assert sj.ctc_loss(log_probs, [4], [[1, 2]], [2], blank=np.int32(0)).shape == (1,)


def test_traced_int64_lengths_are_clamped_not_wrapped():
    # Under jit with x64, an int64 length of 2**32 + 2 used to wrap to 2.
    log_probs = jnp.log(jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(3), (1, 4))))
    log_probs = log_probs.astype(jnp.float32)
    labels, label_lengths = jnp.array([[1, 2]]), jnp.array([2])
    loss = jax.jit(lambda n, u: sj.ctc_loss(log_probs, n, labels, u))
    at_t = sj.ctc_loss(log_probs, jnp.array([4]), labels, label_lengths)
    at_2 = sj.ctc_loss(log_probs, jnp.array([2]), labels, label_lengths)
    huge = jnp.array([2**32 + 2], jnp.int64)
    np.testing.assert_allclose(loss(huge, label_lengths), at_t, rtol=1e-6)
    assert not np.allclose(at_t, at_2)
    # label_lengths too: 2**32 + 1 clamps to U = 2, not 1.
    np.testing.assert_allclose(loss(jnp.array([4]), jnp.array([2**32 + 1], jnp.int64)), at_t)


def test_empty_inputs_and_empty_labels():
    # No frames: only the empty label sequence fits (loss 0); no labels: the
    # all-blank alignment (here 3 frames of probability 1/3 each).
    empty = np.zeros((2, 0, 3), np.float32)
    loss = sj.ctc_loss(empty, np.array([0, 0]), np.ones((2, 2), int), np.array([0, 1]))
    np.testing.assert_array_equal(loss, [0.0, np.inf])
    grad = jax.grad(
        lambda x: sj.ctc_loss(x, np.array([0, 0]), np.ones((2, 2), int), np.array([0, 1])).sum()
    )(jnp.asarray(empty))
    chex.assert_shape(grad, (2, 0, 3))
    frames, scores = sj.forced_align(
        empty, np.array([0, 0]), np.ones((2, 2), int), np.array([0, 1])
    )
    chex.assert_shape(frames, (2, 0))
    np.testing.assert_array_equal(scores, [0.0, -np.inf])
    uniform = np.log(np.full((1, 3, 3), 1 / 3, np.float32))
    np.testing.assert_allclose(
        sj.ctc_loss(uniform, np.array([3]), np.zeros((1, 0), int), np.array([0])),
        [np.log(27)],
        rtol=1e-6,
    )


def test_ctc_graph_of_one_sequence_is_unbatched_and_outputs_the_labels():
    graph = sj.ctc_graph([2, 2, 3])
    assert graph.batch_shape == () and graph.num_states == 7
    # Output labels (API.md): the label where it starts, 0 on blanks and repeats.
    assert sorted(set(np.asarray(graph.olabel).tolist())) == [0, 2, 3]
    starts = np.asarray(graph.olabel) != 0
    np.testing.assert_array_equal(
        np.asarray(graph.ilabel)[starts], np.asarray(graph.olabel)[starts]
    )
    topo = sj.ctc_topo(4, blank=3)
    blank_arcs = np.asarray(topo.ilabel) == 3
    assert not np.asarray(topo.olabel)[blank_arcs].any()


# -- numerics on both paths (the CPU kernel and the portable scan) --------------


def _loss_and_grad(log_probs, input_lengths, labels, label_lengths, **options):
    def loss(lp):
        return sj.ctc_loss(lp, input_lengths, labels, label_lengths, **options)

    return jax.jit(lambda lp: (loss(lp), jax.grad(lambda x: jnp.sum(loss(x)))(lp)))(log_probs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masked_label_gradient_is_minus_the_posterior_at_any_magnitude(dtype):
    # Labels [2, 1, 2] in 4 frames, column 2 masked (one utterance per
    # mask value): every alignment uses it exactly twice, so the posteriors
    # are those of the unmasked case.
    masks = np.array([-1e4, -1e8, -1e30, np.finfo(np.float32).min])
    log_probs = np.full((4, 4, 3), np.log(1 / 3), dtype)
    log_probs[:, :, 2] = masks[:, None]
    args = (np.full(4, 4), np.tile([[2, 1, 2]], (4, 1)), np.full(4, 3))
    # A loss of 6.8e38 overflows float32: +inf, with gradient 0, as if
    # infeasible; every other loss is finite and right.
    overflow = np.array([False, False, False, dtype == "float32"])
    for loss, grad in both_paths(_loss_and_grad, jnp.asarray(log_probs), *args):
        assert np.all(loss[overflow] == np.inf) and not grad[overflow].any()
        assert np.isfinite(loss[~overflow]).all()
        expected = np.tile([-0.2, 0.0, -0.8], (int((~overflow).sum()), 1))
        np.testing.assert_allclose(grad[~overflow, 0], expected, atol=1e-5)
        np.testing.assert_allclose(grad[~overflow].sum(-1), -1.0, atol=1e-5)
        assert grad.min() >= -1 and grad.max() <= 0


def test_a_huge_loss_is_finite_on_the_scan_and_the_kernel():
    # One path of log-probability -3.2e9: the compensated scan overflowed.
    log_probs = jnp.full((1, 3, 2), -1074358974.0, jnp.float32)
    args = (np.array([3]), np.array([[1]]), np.array([1]))
    for loss, grad in both_paths(_loss_and_grad, log_probs, *args):
        np.testing.assert_allclose(loss, [3 * 1074358974.0 - np.log(6)], rtol=1e-7)
        np.testing.assert_allclose(grad[0, 1], [-1 / 3, -2 / 3], atol=1e-4)


def test_nan_in_gives_nan_out_on_every_path():
    logits, input_lengths, labels, label_lengths = random_batch(5, 3, 10, 5, 3)
    log_probs = np.array(jax.nn.log_softmax(jnp.asarray(logits)))
    log_probs[0, 4, labels[0, 1]] = np.nan  # a label column, inside the length
    args = (input_lengths, labels, label_lengths)
    for zero_infinity in (False, True):
        for loss, grad in both_paths(
            functools.partial(_loss_and_grad, zero_infinity=zero_infinity),
            jnp.asarray(log_probs),
            *args,
        ):
            assert np.isnan(loss[0]) and np.isfinite(loss[1:]).all()
            assert np.isnan(grad[0]).all() and np.isfinite(grad[1:]).all()
    all_nan = jnp.full((2, 6, 4), jnp.nan, jnp.float32)
    args = (np.array([6, 6]), np.array([[1, 2], [3, 3]]), np.array([2, 2]))
    for loss, grad in both_paths(
        functools.partial(_loss_and_grad, zero_infinity=True), all_nan, *args
    ):
        assert np.isnan(loss).all() and np.isnan(grad).all()


def test_unnormalised_scores_give_one_answer_on_every_path():
    # log Z > 0: the value is clamped at 0 (API: never negative), and the
    # gradient is minus the posteriors all the same, summing to -1 per frame.
    scores = jnp.full((2, 6, 4), 5.0, jnp.float32)
    args = (np.array([6, 6]), np.array([[1, 2], [3, 1]]), np.array([2, 2]))
    kernel, scan = both_paths(_loss_and_grad, scores, *args)
    for loss, grad in (kernel, scan):
        np.testing.assert_array_equal(loss, [0.0, 0.0])
        np.testing.assert_allclose(grad.sum(-1), -1.0, rtol=1e-5)
    np.testing.assert_allclose(kernel[1], scan[1], atol=1e-5)


def test_forward_mode_works_on_every_path():
    logits, input_lengths, labels, label_lengths = random_batch(6, 2, 7, 4, 2, np.float64)
    log_probs = jax.nn.log_softmax(jnp.asarray(logits))

    def loss(lp):
        return jnp.sum(sj.ctc_loss(lp, input_lengths, labels, label_lengths) ** 2)

    tangent = jnp.asarray(np.random.default_rng(0).normal(size=log_probs.shape))

    def derivatives(lp):
        _, forward = jax.jvp(loss, (lp,), (tangent,))
        return forward, jnp.vdot(jax.grad(loss)(lp), tangent), jax.hessian(loss)(lp)

    kernel, scan = both_paths(derivatives, log_probs)
    for forward, reverse, hessian in (kernel, scan):
        np.testing.assert_allclose(forward, reverse, rtol=1e-10)
        np.testing.assert_allclose(
            hessian.reshape(log_probs.size, -1).T, hessian.reshape(log_probs.size, -1), atol=1e-10
        )
    for mine, theirs in zip(kernel, scan):
        np.testing.assert_allclose(mine, theirs, rtol=1e-8, atol=1e-10)
