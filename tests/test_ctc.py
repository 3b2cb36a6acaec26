"""ctc_loss, ctc_graph, ctc_topo and forced_align against optax, torch and
brute-force enumeration of frame token sequences."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from tests import oracles


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
    with pytest.raises(ValueError, match=r"label_lengths\[0\] = 3 .* U = 2"):
        sj.ctc_loss(log_probs, good[1], labels, np.array([3, 1]))
    with pytest.raises(ValueError, match=r"labels must have shape \[B, U\] with B = 2"):
        sj.ctc_loss(log_probs, good[1], labels[:1], good[3])
    with pytest.raises(ValueError, match=r"labels\[0\]\[1\] = 0"):
        sj.ctc_graph([[1, 0]])
    with pytest.raises(ValueError, match="blank = 3"):
        sj.ctc_topo(3, blank=3)


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
