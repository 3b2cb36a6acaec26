"""The transducer grid's CPU kernel (`_src/kernels/rnnt.cc`) against the
portable diagonal scans, on bands of every shape.

On the CPU the transducer losses run the kernel; on GPUs and TPUs the
scans of `transducer/diagonal_scan.py` (docs/routes.md). Both must give the same
log-likelihoods and move posteriors (the gradients), the same -inf, NaN
and zeros, and the same second derivatives. The enumeration tests of
`tests/transducer` check the path this machine runs against brute force.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.kernels import loader
from semiring_jax._src.transducer import band as bands
from semiring_jax._src.transducer import grid
from tests.paths import both_paths

TOL = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-11, atol=1e-12)}


def _grid_result(band, blank_lp, emit_lp, frame_lengths, label_lengths):
    log_p, (blank_post, emit_post) = grid.total_and_posteriors(
        band, blank_lp, emit_lp, frame_lengths, label_lengths
    )
    value = grid.total(band, blank_lp, emit_lp, frame_lengths, label_lengths)
    return log_p, value, blank_post, emit_post


@jax.jit
def _kernel_path(band, blank_lp, emit_lp, frame_lengths, label_lengths):
    """(log P, log P by the value-only call, blank and label posteriors),
    by the kernel where it is built."""
    return _grid_result(band, blank_lp, emit_lp, frame_lengths, label_lengths)


@jax.jit
def _scan_path(band, blank_lp, emit_lp, frame_lengths, label_lengths):
    """The same by the scans (the kernel's reference), jitted once per
    shape: `both_paths` would clear the caches for every example."""
    aux = grid._kernel_aux(band, blank_lp, frame_lengths, label_lengths)
    log_p, (blank_post, emit_post) = grid._scan_posteriors((blank_lp, emit_lp), aux)
    return log_p, log_p, blank_post, emit_post


def _both(band, *args):
    return [[np.asarray(x) for x in path(band, *args)] for path in (_kernel_path, _scan_path)]


@st.composite
def band_inputs(draw):
    """(band, blank_lp, emit_lp [B, T, W], frame_lengths, label_lengths):
    the full grid or a band of random non-decreasing starts (some not at 0:
    no path), kept from frame T_b - 1 on as the pruned loss keeps them;
    lengths from 0, move log-probs at any scale. Fixed shapes but W, so
    that few examples compile anew."""
    batch, num_frames, num_labels = 3, 5, 4
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    frame_lengths = rng.integers(0, num_frames + 1, batch)
    label_lengths = rng.integers(0, num_labels + 1, batch)
    width = draw(st.sampled_from([1, 2, 3, num_labels + 1]))
    if width == num_labels + 1 and draw(st.booleans()):
        band = bands.full_grid(batch, num_frames, width)
    else:
        rises = rng.integers(0, width + 1, (batch, num_frames + 1))
        starts = np.minimum(np.cumsum(rises, axis=1) - rises[:, :1], num_labels)
        starts[0] += draw(st.sampled_from([0, 0, 1]))  # a start past (0, 0): no path
        for b, t_b in enumerate(frame_lengths):
            starts[b, max(t_b, 1) :] = starts[b, max(t_b, 1) - 1]
        band = bands.from_starts(jnp.asarray(starts, jnp.int32), num_labels + 1, width)
    scale = draw(st.sampled_from([0.1, 1.0, 30.0]))
    moves = -np.abs(rng.normal(size=(2, batch, num_frames, width))) * scale
    return band, *moves, frame_lengths.astype(np.int32), label_lengths.astype(np.int32)


@settings(max_examples=10, deadline=None)
@given(inputs=band_inputs(), dtype=st.sampled_from(["float32", "float64"]))
def test_kernel_matches_the_scan_on_any_band(inputs, dtype):
    band, blank_lp, emit_lp, frame_lengths, label_lengths = inputs
    args = (jnp.asarray(blank_lp, dtype), jnp.asarray(emit_lp, dtype), frame_lengths, label_lengths)
    kernel, scan = _both(band, *args)
    for ours, theirs in zip(kernel, scan):
        assert ours.dtype == dtype
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
        finite = np.isfinite(theirs)
        np.testing.assert_allclose(ours[finite], theirs[finite], **TOL[dtype])
    log_p, value, blank_post, emit_post = kernel
    np.testing.assert_array_equal(log_p, value)
    no_path = np.isneginf(log_p)
    assert (blank_post[no_path] == 0).all() and (emit_post[no_path] == 0).all()
    for b, (t_b, u_b) in enumerate(zip(frame_lengths, label_lengths)):
        assert (blank_post[b, t_b:] == 0).all() and (emit_post[b, t_b:] == 0).all()
        position = np.asarray(bands.positions(band, blank_lp.shape[1]))
        position = np.broadcast_to(position, blank_lp.shape)[b]
        assert (blank_post[b][position > u_b] == 0).all()
        assert (emit_post[b][position >= u_b] == 0).all()


def test_kernel_is_used_and_its_second_derivatives_are_the_scans():
    if not loader.enabled():
        pytest.skip("the CPU kernels are not built here")
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(2, 5, 4, 6)))
    args = (jnp.asarray([5, 3]), jnp.asarray([[1, 2, 3], [4, 5, 1]]), jnp.asarray([3, 2]))

    def loss(x):
        return sj.rnnt_loss(x, *args, fastemit_lambda=0.1)

    lowered = jax.jit(jax.value_and_grad(lambda x: loss(x).sum())).lower(logits).as_text()
    assert "semiring_jax_rnnt_grad_f64" in lowered
    assert "semiring_jax_rnnt_loss_f64" in jax.jit(loss).lower(logits).as_text()
    hessian_like = jax.grad(lambda x: jnp.sum(jax.grad(lambda y: jnp.sum(loss(y) ** 2))(x) ** 2))
    ours, scan = both_paths(hessian_like, logits)
    np.testing.assert_allclose(ours, scan, rtol=1e-9, atol=1e-12)
    stacked = jnp.stack([logits, logits * 1.5])
    vmapped = jax.vmap(loss)(stacked)
    np.testing.assert_allclose(vmapped[1], loss(stacked[1]), rtol=1e-12)


def test_nan_in_gives_nan_out_and_minus_inf_moves_no_path():
    frame_lengths, label_lengths = (
        np.array([3, 3, 3, 2], np.int32),
        np.array([2, 2, 2, 1], np.int32),
    )
    blank_lp = np.full((4, 3, 3), -1.0)
    emit_lp = np.full((4, 3, 3), -1.0)
    blank_lp[0, 0, 1] = np.nan  # on the grid: NaN
    blank_lp[1, :, :] = -np.inf  # no blank: no path
    emit_lp[2, 2, 2] = np.nan  # u = U_b has no label move: not read
    blank_lp[3, 2:] = np.nan  # past the frames: not read
    band = bands.full_grid(4, 3, 3)
    args = (jnp.asarray(blank_lp), jnp.asarray(emit_lp), frame_lengths, label_lengths)
    for log_p, _, blank_post, emit_post in _both(band, *args):
        assert np.isnan(log_p[0]) and np.isnan(blank_post[0]).any()
        assert log_p[1] == -np.inf and (blank_post[1] == 0).all() and (emit_post[1] == 0).all()
        assert np.isfinite(log_p[2:]).all()
        assert not np.isnan(blank_post[2:]).any() and not np.isnan(emit_post[2:]).any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batches_split_between_threads_match_the_scan(dtype):
    # B * T * W beyond the kernel's serial threshold: entries on several threads.
    rng = np.random.default_rng(5)
    batch, num_frames, num_labels, vocab = 12, 40, 30, 5
    logits = jnp.asarray(rng.normal(size=(batch, num_frames, num_labels + 1, vocab)), dtype)
    labels = rng.integers(1, vocab, (batch, num_labels))
    frame_lengths = rng.integers(1, num_frames + 1, batch)
    label_lengths = rng.integers(0, num_labels + 1, batch)

    def loss_and_grad(x):
        return jax.value_and_grad(
            lambda x: sj.rnnt_loss(x, frame_lengths, labels, label_lengths).sum()
        )(x)

    (value, grad), (scan_value, scan_grad) = both_paths(loss_and_grad, logits)
    np.testing.assert_allclose(value, scan_value, rtol=TOL[dtype]["rtol"])
    np.testing.assert_allclose(grad, scan_grad, atol=1e-5 if dtype == "float32" else 1e-12)


def test_traced_ranges_far_past_the_grid_cost_no_memory():
    # Starts and lengths are clamped to the grid: the kernel's memory stays
    # T (U + W) whatever traced ranges hold; such a band keeps no path.
    rng = np.random.default_rng(6)
    logits = jnp.asarray(rng.normal(size=(2, 4, 2, 5)))
    lengths = (jnp.asarray([4, 4]), jnp.asarray([[1, 2], [3, 4]]), jnp.asarray([2, 2]))
    huge = jnp.full((2, 4, 2), 2**30, jnp.int32) + jnp.arange(2, dtype=jnp.int32)[None, None, :]
    ranges = huge.at[1].set(jnp.asarray([[0, 1], [0, 1], [1, 2], [1, 2]], jnp.int32))
    loss = jax.jit(lambda x, r: sj.rnnt_loss_pruned(x, *lengths, r))
    for value in both_paths(loss, logits, ranges):
        assert value[0] == np.inf and np.isfinite(value[1])
