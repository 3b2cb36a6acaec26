"""The transducer losses' numerics on both routes (the CPU kernel and the
portable scans): matmul precision, offsets and magnitudes, NaN, empty
batches and non-finite hyper-parameters; float64 is the oracle."""

import ast
import pathlib

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from tests.paths import both_paths


def _inputs(rng, batch=2, num_frames=5, num_labels=3, vocab=6):
    labels = rng.integers(1, vocab, (batch, num_labels))
    frame_lengths = np.array([num_frames, num_frames - 2][:batch])
    label_lengths = np.array([num_labels, num_labels - 1][:batch])
    return frame_lengths, labels, label_lengths


def _full_ranges(batch, num_frames, width):
    return np.broadcast_to(np.arange(width), (batch, num_frames, width)).copy()


# Matmul precision: a TPU's default is one bfloat16 pass, Ampere's and
# Hopper's TF32. Every dot in a loss or recursion asks for HIGHEST.


def _dot_precisions(jaxpr):
    """The precision of every dot_general in a jaxpr and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, jex.core.ClosedJaxpr):
                    found += _dot_precisions(sub.jaxpr)
                elif isinstance(sub, jex.core.Jaxpr):
                    found += _dot_precisions(sub)
    return found


def _is_highest(precision):
    highest = jax.lax.Precision.HIGHEST
    return precision is not None and all(p == highest for p in precision)


def _with_bf16_dots(fn):
    """fn evaluated with the operands of every dot_general that does not ask
    for HIGHEST rounded to bfloat16: what a TPU's default precision does
    (and, to about 10 bits, TF32 on a GPU)."""

    def evaluate(jaxpr, consts, args):
        env = {}
        read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]
        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            values = [read(v) for v in eqn.invars]
            if eqn.primitive.name in ("pjit", "jit", "closed_call"):
                inner = eqn.params["jaxpr"]
                out = evaluate(inner.jaxpr, inner.consts, values)
            else:
                if eqn.primitive.name == "dot_general" and not _is_highest(eqn.params["precision"]):
                    values = [x.astype(jnp.bfloat16).astype(x.dtype) for x in values]
                out = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
                out = out if eqn.primitive.multiple_results else [out]
            env.update(zip(eqn.outvars, out))
        return [read(v) for v in jaxpr.outvars]

    def run(*args):
        closed = jax.make_jaxpr(fn)(*args)
        result = evaluate(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(fn(*args)), result)

    return run


def test_every_dot_in_the_losses_asks_for_highest_precision():
    rng = np.random.default_rng(0)
    lengths = _inputs(rng)
    am, lm = rng.normal(size=(2, 5, 6)), rng.normal(size=(2, 4, 6))
    logits = rng.normal(size=(2, 5, 4, 6))
    losses = {
        "simple": lambda a, b: sj.rnnt_loss_simple(a, b, *lengths).sum(),
        "smoothed": lambda a, b: sj.rnnt_loss_smoothed(a, b, *lengths, am_only_scale=0.1).sum(),
        "ranges": lambda a, b: sj.rnnt_prune_ranges(a, b, *lengths, 2).sum().astype(a.dtype),
    }
    for name, loss in losses.items():
        jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(am, lm).jaxpr
        precisions = _dot_precisions(jaxpr)
        assert all(_is_highest(p) for p in precisions), (name, precisions)
    full = jax.make_jaxpr(jax.grad(lambda x: sj.rnnt_loss(x, *lengths).sum()))(logits).jaxpr
    assert all(_is_highest(p) for p in _dot_precisions(full))


_MATMULS = {"einsum", "matmul", "dot", "tensordot", "inner", "vdot", "dot_general"}


def test_every_matmul_in_the_package_states_its_precision():
    # Source-wide, so that a new loss or recursion cannot fall back to the
    # accelerators' default (a bfloat16 pass on a TPU) unnoticed.
    package = pathlib.Path(sj.__file__).parent
    unstated = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(package)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                unstated.append(f"{where} (@ takes no precision)")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _MATMULS
                and not any(k.arg == "precision" for k in node.keywords)
            ):
                unstated.append(where)
    assert not unstated, unstated


def test_simple_loss_gradient_and_ranges_survive_bfloat16_default_matmuls():
    rng = np.random.default_rng(1)
    batch, num_frames, num_labels, vocab = 2, 30, 8, 40
    am = rng.normal(size=(batch, num_frames, vocab)).astype(np.float32)
    lm = rng.normal(size=(batch, num_labels + 1, vocab)).astype(np.float32)
    lengths = (np.array([30, 24]), rng.integers(1, vocab, (batch, num_labels)), np.array([8, 6]))
    loss = lambda a, b: sj.rnnt_loss_simple(a, b, *lengths).sum()
    grads = _with_bf16_dots(jax.grad(loss, argnums=(0, 1)))(am, lm)
    want = jax.grad(loss, argnums=(0, 1))(am.astype(np.float64), lm.astype(np.float64))
    for grad, exact in zip(grads, want):
        np.testing.assert_allclose(grad, exact, atol=2e-5)
    # The ranges are argmaxes of window sums, some within float32's rounding
    # of a tie: the oracle is float32 on the CPU, whose matmuls are exact.
    ranges = lambda a, b: sj.rnnt_prune_ranges(a, b, *lengths, 3)
    np.testing.assert_array_equal(_with_bf16_dots(ranges)(am, lm), ranges(am, lm))


# Magnitudes: scores of ~1e10 (logits x 1e9) or ~1e30 carry a compensation
# term of hundreds or more; the scan's log-add must not exponentiate it.


def _huge_cases(rng):
    frame_lengths, labels, label_lengths = _inputs(rng)
    lengths = (frame_lengths, labels, label_lengths)
    logits = rng.normal(size=(2, 5, 4, 6)).astype(np.float32)
    column = logits.copy()
    column[..., 2] = 1e30
    am, lm = rng.normal(size=(2, 5, 6)).astype(np.float32), rng.normal(size=(2, 4, 6))
    ranges = _full_ranges(2, 5, 4)
    return {
        "logits x 1e9": (lambda x: sj.rnnt_loss(x, *lengths), (logits * np.float32(1e9),)),
        "a column at 1e30": (lambda x: sj.rnnt_loss(x, *lengths), (column,)),
        "pruned x 1e9": (
            lambda x: sj.rnnt_loss_pruned(x, *lengths, ranges),
            (logits * np.float32(1e9),),
        ),
        "am x 1e30": (
            lambda a, b: sj.rnnt_loss_simple(a, b, *lengths),
            (am * np.float32(1e30), lm.astype(np.float32)),
        ),
    }


@pytest.mark.parametrize("case", ["logits x 1e9", "a column at 1e30", "pruned x 1e9", "am x 1e30"])
def test_huge_log_probs_give_the_float64_loss_on_both_routes(case):
    loss, args = _huge_cases(np.random.default_rng(2))[case]
    want = loss(*(x.astype(np.float64) for x in args))
    assert np.isfinite(want).all()
    for got in both_paths(loss, *args):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    grad = jax.grad(lambda *a: loss(*a).sum(), argnums=tuple(range(len(args))))
    want_grads = grad(*(x.astype(np.float64) for x in args))
    for grads in both_paths(grad, *args):
        for got, exact in zip(grads, want_grads):
            np.testing.assert_allclose(got, exact, atol=1e-6)


# A common offset: the loss of a softmax must not depend on it. Float32
# logits near 1e9 are multiples of 64, so the oracle is the float64 loss of
# the same float32 inputs (where subtracting the offset is exact).


@pytest.mark.parametrize("offset", [1e6, 1e9])
def test_a_common_offset_changes_neither_loss_nor_gradient(offset):
    rng = np.random.default_rng(3)
    lengths = _inputs(rng)
    logits = (rng.normal(scale=2.0, size=(2, 5, 4, 6)) + offset).astype(np.float32)
    am = (rng.normal(scale=2.0, size=(2, 5, 6)) + offset).astype(np.float32)
    lm = (rng.normal(scale=2.0, size=(2, 4, 6)) - offset).astype(np.float32)
    ranges = _full_ranges(2, 5, 4)
    cases = [
        (lambda x: sj.rnnt_loss(x, *lengths).sum(), (logits,)),
        (lambda x: sj.rnnt_loss_pruned(x, *lengths, ranges).sum(), (logits,)),
        (lambda a, b: sj.rnnt_loss_simple(a, b, *lengths).sum(), (am, lm)),
        (lambda a, b: sj.rnnt_loss_smoothed(a, b, *lengths, am_only_scale=0.1).sum(), (am, lm)),
    ]
    for loss, args in cases:
        value_and_grad = jax.value_and_grad(loss, argnums=tuple(range(len(args))))
        want, want_grads = value_and_grad(*(x.astype(np.float64) for x in args))
        assert 1 < want < 1e3
        for got, grads in both_paths(value_and_grad, *args):
            np.testing.assert_allclose(got, want, rtol=2e-6)
            for grad, exact in zip(grads, want_grads):
                np.testing.assert_allclose(grad, exact, atol=2e-6)


def test_align_scores_nan_where_the_loss_is_nan():
    rng = np.random.default_rng(4)
    lengths = _inputs(rng)
    logits = rng.normal(size=(2, 5, 4, 6))
    logits[0, 0, 0, 3] = np.nan  # read by utterance 0 (the row's normaliser), on no best path
    assert np.isnan(sj.rnnt_loss(logits, *lengths)[0])
    for frames, score in both_paths(lambda x: sj.rnnt_align(x, *lengths), logits):
        assert np.isnan(score[0]) and np.isfinite(score[1])
        np.testing.assert_array_equal(frames[0], -1)


def test_align_score_gradient_is_the_returned_alignments_at_ties():
    # Zero logits tie every alignment: the score's gradient must be that of
    # the one path returned (blank first), not an average over the tied ones.
    logits = np.zeros((1, 3, 2, 3))
    lengths = (np.array([3]), np.array([[2]]), np.array([1]))

    def path_score(x, frame):
        log_probs = jax.nn.log_softmax(x[0], axis=-1)  # [T, U+1, V]
        blanks = [(t, 0) for t in range(frame)] + [(t, 1) for t in range(frame, 3)]
        return log_probs[frame, 0, 2] + sum(log_probs[t, u, 0] for t, u in blanks)

    def align_grad(x):
        frames = sj.rnnt_align(x, *lengths)[0]
        return frames, jax.grad(lambda y: sj.rnnt_align(y, *lengths)[1].sum())(x)

    for frames, grad in both_paths(align_grad, logits):
        assert 0 <= frames[0, 0] < 3
        want = jax.grad(path_score)(logits, int(frames[0, 0]))
        np.testing.assert_allclose(grad, want, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.int16, np.uint32, np.int64, np.uint64])
def test_traced_ranges_of_any_integer_dtype_keep_their_values(dtype):
    rng = np.random.default_rng(5)
    am, lm = rng.normal(size=(1, 4, 5)), rng.normal(size=(1, 3, 5))
    ranges = np.array([[[0, 1], [0, 1], [1, 2], [1, 2]]])
    want = sj.rnnt_prune(am, lm, ranges.astype(np.int32))
    with jax.enable_x64(True):
        got = jax.jit(lambda r: sj.rnnt_prune(am, lm, r))(ranges.astype(dtype))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_ranges_outside_int32_are_refused_not_wrapped():
    am, lm = np.zeros((1, 3, 4)), np.zeros((1, 3, 4))
    ranges = np.broadcast_to(np.arange(2), (1, 3, 2)) + np.int64(2**32)  # would wrap to 0, 1
    lengths = (np.array([3]), np.array([[1, 2]]), np.array([2]))
    with pytest.raises(ValueError, match=r"rnnt_loss_pruned: ranges must lie in \[0, U\]"):
        sj.rnnt_loss_pruned(np.zeros((1, 3, 2, 4)), *lengths, ranges)
    with pytest.raises(ValueError, match=r"rnnt_prune: ranges must lie in \[0, U\] = \[0, 2\]"):
        sj.rnnt_prune(am, lm, ranges)
    with pytest.raises(ValueError, match=r"rnnt_prune: ranges must lie in \[0, U\]"):
        sj.rnnt_prune(am, lm, ranges - np.int64(2**32) - 1)
    # Traced (inside jit) they cannot be checked: a NaN loss, not the loss at k.
    traced = jax.jit(lambda r: sj.rnnt_loss_pruned(np.zeros((1, 3, 2, 4)), *lengths, r))
    assert np.isnan(traced(ranges)).all()


@pytest.mark.parametrize("batch, num_frames", [(0, 3), (2, 0)])
def test_no_utterances_or_no_frames_on_both_routes(batch, num_frames):
    num_labels, vocab = 2, 4
    logits = np.zeros((batch, num_frames, num_labels + 1, vocab), np.float32)
    am = np.zeros((batch, num_frames, vocab), np.float32)
    lm = np.zeros((batch, num_labels + 1, vocab), np.float32)
    lengths = (np.zeros(batch, int), np.ones((batch, num_labels), int), np.ones(batch, int))
    ranges = _full_ranges(batch, num_frames, 2)
    for loss, args in [
        (lambda x: sj.rnnt_loss(x, *lengths), (logits,)),
        (lambda a, b: sj.rnnt_loss_simple(a, b, *lengths), (am, lm)),
        (lambda a, b: sj.rnnt_loss_smoothed(a, b, *lengths), (am, lm)),
        (lambda x: sj.rnnt_loss_pruned(x, *lengths, ranges), (logits[:, :, :2],)),
    ]:
        for value, grads in both_paths(
            jax.value_and_grad(lambda *a: loss(*a).sum(), range(len(args))), *args
        ):
            assert value == (np.inf if batch else 0.0)
            for grad, arg in zip(grads, args):
                np.testing.assert_array_equal(grad, np.zeros_like(arg))
        for value in both_paths(loss, *args):
            np.testing.assert_array_equal(value, np.full(batch, np.inf, np.float32))
    for ranges in both_paths(lambda a, b: sj.rnnt_prune_ranges(a, b, *lengths, 2), am, lm):
        assert ranges.shape == (batch, num_frames, 2)
    for frames, score in both_paths(lambda x: sj.rnnt_align(x, *lengths), logits):
        np.testing.assert_array_equal(frames, np.full((batch, num_labels), -1))
        np.testing.assert_array_equal(score, np.full(batch, -np.inf, np.float32))


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_hyper_parameters_are_named(value):
    rng = np.random.default_rng(5)
    lengths = _inputs(rng)
    logits, am, lm = np.zeros((2, 5, 4, 6)), np.zeros((2, 5, 6)), np.zeros((2, 4, 6))
    ranges = _full_ranges(2, 5, 4)
    calls = {
        ("rnnt_loss", "fastemit_lambda"): lambda v: sj.rnnt_loss(
            logits, *lengths, fastemit_lambda=v
        ),
        ("rnnt_loss_simple", "delay_penalty"): lambda v: sj.rnnt_loss_simple(
            am, lm, *lengths, delay_penalty=v
        ),
        ("rnnt_loss_smoothed", "delay_penalty"): lambda v: sj.rnnt_loss_smoothed(
            am, lm, *lengths, delay_penalty=v
        ),
        ("rnnt_loss_smoothed", "lm_only_scale"): lambda v: sj.rnnt_loss_smoothed(
            am, lm, *lengths, lm_only_scale=v
        ),
        ("rnnt_loss_smoothed", "am_only_scale"): lambda v: sj.rnnt_loss_smoothed(
            am, lm, *lengths, am_only_scale=v
        ),
        ("rnnt_loss_pruned", "delay_penalty"): lambda v: sj.rnnt_loss_pruned(
            logits, *lengths, ranges, delay_penalty=v
        ),
    }
    for (fn, name), call in calls.items():
        with pytest.raises(ValueError, match=rf"{fn}: {name} must be finite"):
            call(value)


def test_a_nan_logit_makes_the_utterances_whole_gradient_nan_on_both_routes():
    rng = np.random.default_rng(6)
    frame_lengths, labels, label_lengths = _inputs(rng)
    logits = rng.normal(size=(2, 5, 4, 6))
    logits[0, 2, 1, 4] = np.nan
    grad_fn = jax.grad(lambda x: sj.rnnt_loss(x, frame_lengths, labels, label_lengths).sum())
    with_kernel, with_scan = both_paths(grad_fn, logits)
    for grad in (with_kernel, with_scan):
        assert np.isnan(grad[0]).all()  # T_0 = 5 frames, U_0 + 1 = 4 positions: all read
        assert np.isfinite(grad[1]).all()
    np.testing.assert_allclose(with_kernel[1], with_scan[1], atol=1e-12)


def test_simple_loss_of_large_am_and_lm_matches_float64_on_both_routes():
    # am + lm of ~300 put a node's normaliser hundreds below the rows'
    # maxima: each shifted exponential's product underflowed in float32.
    rng = np.random.default_rng(7)
    lengths = _inputs(rng, num_frames=6, num_labels=4, vocab=5)
    am = (rng.normal(size=(2, 6, 5)) * 300).astype(np.float32)
    lm = (rng.normal(size=(2, 5, 5)) * 300).astype(np.float32)
    loss = lambda a, b: sj.rnnt_loss_simple(a, b, *lengths).sum()
    value_and_grad = jax.value_and_grad(loss, argnums=(0, 1))
    want, want_grads = value_and_grad(am.astype(np.float64), lm.astype(np.float64))
    for got, grads in both_paths(value_and_grad, am, lm):
        np.testing.assert_allclose(got, want, rtol=1e-6)
        for grad, exact in zip(grads, want_grads):
            np.testing.assert_allclose(grad, exact, atol=1e-5)
    ranges = lambda a, b: sj.rnnt_prune_ranges(a, b, *lengths, 2)
    for got in both_paths(ranges, am, lm):
        np.testing.assert_array_equal(got, ranges(am.astype(np.float64), lm.astype(np.float64)))


def test_second_derivatives_match_finite_differences_on_both_routes():
    # The scan is the kernel's derivative: grad of grad runs through the
    # scans' log-add, whose derivative at -inf cells was NaN.
    rng = np.random.default_rng(8)
    lengths = _inputs(rng)
    logits, am, lm = (
        rng.normal(size=(2, 5, 4, 6)),
        rng.normal(size=(2, 5, 6)),
        rng.normal(size=(2, 4, 6)),
    )
    cases = {
        "rnnt_loss": lambda s: sj.rnnt_loss(logits * s, *lengths).sum(),
        "simple": lambda s: sj.rnnt_loss_simple(am * s, lm * s, *lengths).sum(),
    }
    for name, loss in cases.items():
        slope = jax.grad(loss)
        want = (slope(1.0 + 1e-5) - slope(1.0 - 1e-5)) / 2e-5
        for got in both_paths(jax.grad(slope), 1.0):
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
