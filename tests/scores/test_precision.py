"""float32 stays accurate over long inputs (API.md, Precision): at T = 5,000
frames, values within 1e-5 relative and gradients within 1e-4 absolute of a
float64 run on the same inputs."""

import jax
import jax.numpy as jnp
import numpy as np

import semiring_jax as sj

T = 5000


def _compare(loss_fn, inputs32):
    inputs64 = inputs32.astype(np.float64)
    _value32, grad32 = jax.value_and_grad(lambda x: loss_fn(x).sum())(jnp.asarray(inputs32))
    _value64, grad64 = jax.value_and_grad(lambda x: loss_fn(x).sum())(jnp.asarray(inputs64))
    per_utterance32, per_utterance64 = (
        loss_fn(jnp.asarray(inputs32)),
        loss_fn(jnp.asarray(inputs64)),
    )
    assert np.all(np.isfinite(per_utterance64))
    np.testing.assert_allclose(per_utterance32, per_utterance64, rtol=1e-5)
    assert np.max(np.abs(np.asarray(grad32, np.float64) - grad64)) < 1e-4


def test_ctc_loss_at_5000_frames():
    rng = np.random.default_rng(0)
    batch, vocab_size, max_labels = 2, 20, 400
    logits = rng.normal(size=(batch, T, vocab_size)).astype(np.float32)
    labels = rng.integers(1, vocab_size, size=(batch, max_labels))
    lengths, label_lengths = np.array([T, T - 700]), np.array([max_labels, 300])
    _compare(lambda x: sj.ctc_loss(jax.nn.log_softmax(x), lengths, labels, label_lengths), logits)


def test_dense_tot_score_at_5000_frames():
    rng = np.random.default_rng(1)
    num_states, vocab_size = 30, 12
    arcs = [
        (
            int(rng.integers(num_states)),
            int(rng.integers(num_states)),
            int(rng.integers(vocab_size)),
            float(rng.normal()),
        )
        for _ in range(150)
    ]
    arcs += [(s, s, int(rng.integers(vocab_size)), 0.0) for s in range(num_states)]
    final = {int(s): 0.0 for s in rng.choice(num_states, 5, replace=False)}
    graphs = {
        dtype: sj.Fsa.from_arcs(arcs, final, num_states=num_states, dtype=dtype)
        for dtype in (np.float32, np.float64)
    }
    emissions = jax.nn.log_softmax(rng.normal(size=(2, T, vocab_size))).astype(np.float32)
    lengths = np.array([T, T - 123])

    def loss(x):
        return sj.dense_tot_score(graphs[np.dtype(x.dtype).type], x, lengths)

    _compare(loss, np.asarray(emissions))
