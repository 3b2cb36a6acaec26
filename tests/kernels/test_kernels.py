"""The compiled CPU score kernels against the portable scan and brute force.

On the CPU, `tot_score` and `arc_posteriors` in LOG and TROPICAL run the
kernels of `_src/kernels/scores.cc`; every other backend runs the level
scans of `scores/level_pairs.py`. Both must give the same values, gradients (the
same best path, ties included) and second derivatives.
"""

import functools
import math
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.kernels import loader
from semiring_jax._src.scores import tot_score as tot_score_module
from tests import oracles
from tests.paths import both_paths, scan_only
from tests.strategies import acyclic_fsas, as_rows, padded

SETTINGS = settings(max_examples=25, deadline=None)
TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-10, atol=1e-12)}
SEMIRINGS = {"log": sj.LOG, "tropical": sj.TROPICAL}


def build(data, dtype):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs), final, num_states=num_states, dtype=dtype)


def scores_and_gradients(fsa, semiring):
    """(total, ∂/∂weight, ∂/∂final_weight, arc_posteriors); batched Fsas
    give per-entry gradients (of the sum of the totals)."""
    total = sj.tot_score(fsa, semiring)
    weight_grad, final_grad = jax.grad(
        lambda w, f: jnp.sum(sj.tot_score(fsa.replace(weight=w, final_weight=f), semiring)),
        argnums=(0, 1),
    )(fsa.weight, fsa.final_weight)
    return total, weight_grad, final_grad, sj.arc_posteriors(fsa, semiring)


@jax.jit
def scan_reference(fsa, semiring):
    """What the public ops compute with the kernels off (unbatched Fsa)."""
    total, (weight_grad, final_grad) = tot_score_module._scan_value_and_grads(
        semiring, *tot_score_module._score_inputs(fsa, semiring)
    )
    return total, weight_grad, final_grad, weight_grad


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no compiler")
def test_kernels_are_built_and_used_on_the_cpu():
    assert jax.default_backend() == "cpu"
    assert loader.enabled()
    fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 6, 1.0)], final=[1])
    text = jax.jit(lambda f: sj.tot_score(f)).lower(fsa).as_text()
    assert "semiring_jax_log_total_f32" in text
    with scan_only():
        assert "semiring_jax" not in jax.jit(lambda f: sj.tot_score(f)).lower(fsa).as_text()


@SETTINGS
@given(
    data=acyclic_fsas(),
    semiring=st.sampled_from(["log", "tropical"]),
    dtype=st.sampled_from(["float32", "float64"]),
    pad=st.booleans(),
)
def test_kernels_match_the_scan_and_brute_force(data, semiring, dtype, pad):
    fsa = padded(build(data, dtype)) if pad else build(data, dtype)
    num_states, arcs, _ = data
    ours = jax.tree_util.tree_map(np.asarray, scores_and_gradients(fsa, SEMIRINGS[semiring]))
    scan = scan_reference(fsa, SEMIRINGS[semiring])
    total, weight_grad, final_grad, posteriors = ours
    tol = TOL[dtype]
    np.testing.assert_allclose(total, oracles.brute_tot_score(*data, semiring), **tol)
    np.testing.assert_allclose(
        posteriors[: len(arcs)], oracles.brute_arc_posteriors(*data, semiring), **tol
    )
    for mine, theirs in zip(ours, scan):
        if semiring == "tropical":  # one best path, the same tie rule
            np.testing.assert_array_equal(mine, theirs)
        else:
            np.testing.assert_allclose(mine, theirs, **tol)
    assert total.dtype == dtype and weight_grad.dtype == dtype
    np.testing.assert_array_equal(weight_grad, posteriors)
    assert np.all(np.isfinite(weight_grad)) and np.all(np.isfinite(final_grad))
    assert np.all(final_grad[num_states:] == 0)


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_batches_and_vmap(semiring, dtype):
    rng = np.random.default_rng(0)
    fsas = []
    for size in (3, 7, 1, 5):
        arcs = [
            (i, j, 1, float(rng.normal()))
            for i in range(size)
            for j in range(i + 1, size)
            if rng.random() < 0.6
        ]
        fsas.append(sj.Fsa.from_arcs(arcs, final=list(range(size)), dtype=dtype))
    batch = sj.stack(fsas)
    one_by_one = [scores_and_gradients(fsa, SEMIRINGS[semiring]) for fsa in fsas]
    batched = scores_and_gradients(batch, SEMIRINGS[semiring])
    for b, fsa in enumerate(fsas):
        np.testing.assert_allclose(batched[0][b], one_by_one[b][0], **TOL[dtype])
        for mine, theirs, size in zip(
            batched[1:], one_by_one[b][1:], (fsa.num_arcs, fsa.num_states, fsa.num_arcs)
        ):
            np.testing.assert_allclose(mine[b][:size], theirs, **TOL[dtype])
    # vmap over weights alone: the tables are shared, not batched.
    fsa = fsas[1]
    weights = jnp.stack([fsa.weight, fsa.weight * 2, fsa.weight - 1])
    vmapped = jax.vmap(lambda w: sj.tot_score(fsa.replace(weight=w), SEMIRINGS[semiring]))
    ours, scan = both_paths(vmapped, weights)
    np.testing.assert_allclose(ours, scan, **TOL[dtype])


@pytest.mark.slow  # ~25 s; test_tot_score's forward-mode-and-hessians compares them too
def test_second_order_matches_the_scan():
    rng = np.random.default_rng(1)
    arcs = [(i, j, 1, float(rng.normal())) for i in range(6) for j in range(i + 1, 6)]
    fsa = sj.Fsa.from_arcs(arcs, final={4: 0.3, 5: -0.2}, dtype="float64")
    hessian = lambda w: jax.jacrev(jax.grad(lambda v: sj.tot_score(fsa.replace(weight=v))))(w)
    entropy_like = jax.grad(lambda w: jnp.sum(sj.arc_posteriors(fsa.replace(weight=w)) ** 2))
    for fn in (hessian, entropy_like):
        ours, scan = both_paths(fn, fsa.weight)
        np.testing.assert_allclose(ours, scan, rtol=1e-10, atol=1e-12)
    jax.test_util.check_grads(
        lambda w: sj.tot_score(fsa.replace(weight=w)), (fsa.weight,), order=2, modes=("rev",)
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_terms_far_apart(dtype):
    # In one level, one state's terms sit ~500 below another's: shifted by
    # the level's best term they would underflow, so the kernel shifts that
    # state by its own best term.
    arcs = [(0, 1, 1, 0.0), (0, 2, 1, -500.0), (0, 2, 2, -501.0), (1, 3, 1, 0.0)]
    arcs += [(2, 4, 1, 0.0), (0, 5, 1, -1e30), (0, 6, 1, -math.inf)]
    final = {3: 0.0, 4: 0.0, 5: 0.0, 6: 0.0}
    fsa = sj.Fsa.from_arcs(arcs, final, dtype=dtype)
    data = (7, [(s, d, i, i, w) for s, d, i, w in arcs], final)
    forward = np.asarray(sj.tot_score(fsa))
    np.testing.assert_allclose(forward, oracles.brute_tot_score(*data, "log"), **TOL[dtype])
    (ours, scan) = both_paths(lambda f: sj.arc_posteriors(f), fsa)
    np.testing.assert_allclose(ours, scan, **TOL[dtype])
    # Alone, state 2's arcs share its mass e^-500 : e^-501.
    alone = sj.Fsa.from_arcs([*arcs[1:3], (2, 4, 1, 0.0)], {4: 0.0}, dtype=dtype)
    share = np.asarray(sj.arc_posteriors(alone))[:2]
    np.testing.assert_allclose(share, [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))], rtol=1e-6)


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_no_successful_path_has_zero_gradient(semiring):
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (2, 3, 1, 0.1)], final={3: 0.0})
    total, weight_grad, final_grad, _ = scores_and_gradients(fsa, SEMIRINGS[semiring])
    assert total == -np.inf
    assert np.all(np.asarray(weight_grad) == 0) and np.all(np.asarray(final_grad) == 0)


def _run(code, env):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result


CHECK = """
    import warnings
    import semiring_jax as sj
    from semiring_jax._src.kernels import loader
    fsa = sj.Fsa.from_arcs([(0, 1, 5, 0.0), (0, 1, 6, 0.0)], final=[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        print(loader.enabled(), sj.arc_posteriors(fsa).tolist())
    for warning in caught:
        print("WARNING", warning.message)
"""


def test_switched_off_or_without_a_compiler_the_scan_serves(tmp_path):
    off = _run(CHECK, {"SEMIRING_JAX_CPU_KERNELS": "0"})
    assert off.stdout.splitlines() == ["False [0.5, 0.5]"]
    missing = _run(
        CHECK, {"CXX": "no-such-compiler", "SEMIRING_JAX_CACHE_DIR": str(tmp_path / "cache")}
    )
    lines = missing.stdout.splitlines()
    assert lines[0] == "False [0.5, 0.5]"
    assert "no C++ compiler found (tried 'no-such-compiler'" in lines[1]


@pytest.mark.slow  # a fresh build (~20 s); test_builds_into_the_cache_dir builds one too
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no compiler")
def test_an_unwritable_home_falls_back_to_the_temporary_folder(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    env = {"HOME": str(blocked), "XDG_CACHE_HOME": "", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    result = _run(CHECK, env)
    assert result.stdout.splitlines() == ["True [0.5, 0.5]"]
    assert [p.name for p in (tmp_path / "tmp").iterdir()] == [f"semiring_jax-{os.getuid()}"]


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no compiler")
def test_builds_into_the_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    built = _run(CHECK, {"SEMIRING_JAX_CACHE_DIR": str(cache)})
    assert built.stdout.splitlines() == ["True [0.5, 0.5]"]
    (library,) = cache.iterdir()
    assert library.name.startswith("scores-") and library.suffix == ".so"
    again = _run(CHECK, {"SEMIRING_JAX_CACHE_DIR": str(cache)})  # reuses it
    assert again.stdout.splitlines() == ["True [0.5, 0.5]"]
    assert list(cache.iterdir()) == [library]


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_large_batches_split_between_threads_match_the_scan(semiring):
    # Over the kernels' threshold (16,384 arcs in all), so the entries are
    # shared between the calling thread and XLA's pool.
    rng = np.random.default_rng(2)
    fsas = []
    for _ in range(6):
        num_states = 300
        src = rng.integers(0, num_states - 1, 4000)
        dst = np.minimum(src + rng.integers(1, 20, 4000), num_states - 1)
        arcs = [(int(s), int(d), 1, float(w)) for s, d, w in zip(src, dst, rng.normal(size=4000))]
        fsas.append(sj.Fsa.from_arcs(arcs, final={num_states - 1: 0.0}, dtype="float64"))
    batch = sj.stack(fsas)
    ours, scan = both_paths(scores_and_gradients, batch, SEMIRINGS[semiring])
    # The scans add on compensated pairs, the kernels in double: float64
    # totals may differ in the last bit; the best paths may not.
    np.testing.assert_allclose(ours[0], scan[0], rtol=1e-14)
    for mine, theirs in zip(ours[1:], scan[1:]):
        if semiring == "tropical":
            np.testing.assert_array_equal(mine, theirs)
        else:
            np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-12)


# -- the CTC loss kernel -------------------------------------------------------


@functools.partial(jax.jit, static_argnums=4)
def scan_ctc(log_probs, input_lengths, labels, label_lengths, blank):
    """The loss and its gradient by the portable scan, as the kernels-off path."""
    from semiring_jax._src.dense import ctc

    aux = (input_lengths, labels, label_lengths)
    log_z, grad = ctc._scan_log_likelihood_and_grad(blank, log_probs, aux)
    return ctc._loss(log_z), -grad


@functools.partial(jax.jit, static_argnums=4)
def kernel_ctc(log_probs, input_lengths, labels, label_lengths, blank):
    loss = sj.ctc_loss(log_probs, input_lengths, labels, label_lengths, blank)
    grad = jax.grad(
        lambda lp: jnp.sum(
            sj.ctc_loss(lp, input_lengths, labels, label_lengths, blank, zero_infinity=True)
        )
    )(log_probs)
    return loss, grad


@st.composite
def ctc_inputs(draw):
    """Fixed shapes (one compile per dtype and blank), random contents:
    lengths from 0 (no frames, no labels) to infeasible, repeats, scales."""
    batch, frames, vocab, max_labels = 3, 9, 5, 5
    blank = draw(st.sampled_from([0, vocab - 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    others = [v for v in range(vocab) if v != blank]
    labels = rng.choice(others, (batch, max_labels))
    if draw(st.booleans()):
        labels[:, 1] = labels[:, 0]  # a repeat: needs a blank between
    label_lengths = rng.integers(0, max_labels + 1, batch)
    input_lengths = rng.integers(0, frames + 1, batch)
    scale = draw(st.sampled_from([0.1, 1.0, 10.0]))
    logits = rng.normal(size=(batch, frames, vocab)) * scale
    return (
        logits,
        input_lengths.astype(np.int32),
        labels.astype(np.int32),
        label_lengths.astype(np.int32),
        blank,
    )


@settings(max_examples=30, deadline=None)
@given(inputs=ctc_inputs(), dtype=st.sampled_from(["float32", "float64"]))
def test_ctc_kernel_matches_the_scan(inputs, dtype):
    logits, input_lengths, labels, label_lengths, blank = inputs
    log_probs = jax.nn.log_softmax(jnp.asarray(logits, dtype))
    args = (log_probs, jnp.asarray(input_lengths), jnp.asarray(labels), jnp.asarray(label_lengths))
    loss, grad = (np.asarray(x) for x in kernel_ctc(*args, blank))
    scan_loss, scan_grad = (np.asarray(x) for x in scan_ctc(*args, blank))
    tol = TOL[dtype]
    np.testing.assert_array_equal(np.isinf(loss), np.isinf(scan_loss))
    finite = ~np.isinf(loss)
    np.testing.assert_allclose(loss[finite], scan_loss[finite], rtol=tol["rtol"], atol=1e-5)
    np.testing.assert_allclose(grad, scan_grad, rtol=tol["rtol"], atol=1e-5)
    assert loss.dtype == dtype and np.all(loss >= 0)
    assert np.all(grad[np.isinf(loss)] == 0)  # infeasible: exactly 0
    for b, length in enumerate(input_lengths):
        assert np.all(grad[b, length:] == 0)  # past the length: exactly 0


def test_ctc_kernel_is_used_and_its_second_derivatives_are_the_scans():
    rng = np.random.default_rng(3)
    log_probs = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 7, 4)), jnp.float64))
    args = (
        jnp.asarray([7, 5], jnp.int32),
        jnp.asarray([[1, 2, 2], [3, 1, 0]], jnp.int32),
        jnp.asarray([3, 2], jnp.int32),
    )
    text = jax.jit(lambda lp: sj.ctc_loss(lp, *args)).lower(log_probs).as_text()
    assert "semiring_jax_ctc_loss_f64" in text
    hessian_like = jax.grad(
        lambda lp: jnp.sum(jax.grad(lambda x: jnp.sum(sj.ctc_loss(x, *args) ** 2))(lp) ** 2)
    )
    ours, scan = both_paths(hessian_like, log_probs)
    np.testing.assert_allclose(ours, scan, rtol=1e-9, atol=1e-12)
    # vmap over a leading axis runs the kernel once per row.
    stacked = jnp.stack([log_probs, log_probs * 1.5])
    vmapped = jax.vmap(lambda lp: sj.ctc_loss(lp, *args))(stacked)
    np.testing.assert_allclose(vmapped[1], sj.ctc_loss(stacked[1], *args), rtol=1e-12)


# -- precision, dtypes and tables that belong to another Fsa ---------------------


def test_float64_kernels_compute_in_double():
    # exp(-100) terms next to exp(0) ones: float32 arithmetic shows at 1e-9.
    arcs = [(0, 1, 1, 0.0), (0, 1, 2, 0.1), (0, 2, 1, -100.0), (0, 2, 2, -100.3)]
    fsa = sj.Fsa.from_arcs([*arcs, (1, 3, 1, 0.0), (2, 3, 1, 100.0)], final=[3], dtype="float64")
    exact = math.log(2 * math.exp(0.0) + math.exp(0.1) + math.exp(-0.3))
    kernel, scan = both_paths(lambda f: sj.tot_score(f), fsa)
    assert abs(float(kernel) - exact) <= 1e-12 * abs(exact)
    assert abs(float(scan) - exact) <= 1e-12 * abs(exact)
    posteriors, scan_posteriors = both_paths(lambda f: sj.arc_posteriors(f), fsa)
    np.testing.assert_allclose(posteriors, scan_posteriors, rtol=1e-12)


def test_a_schedule_of_another_fsa_is_an_error_not_a_crash():
    import dataclasses

    small, big = sj.linear_fsa([1, 2]), sj.linear_fsa(list(range(1, 30)))
    from semiring_jax._src.core.tables import Tables

    mixed = dataclasses.replace(small, tables=Tables(big.schedule, small.cycle, small.shapes))
    for op in (sj.tot_score, sj.arc_posteriors, sj.forward_scores):
        with pytest.raises(
            ValueError, match=r"schedule.s pull_arc has shape \(29,\) but the Fsa has 2 arcs"
        ):
            op(mixed)


def test_the_kernels_check_their_tables():
    # Tables of the right shapes whose indices point outside the Fsa: the
    # kernel refuses them (an error from the call, never a stray read).
    from semiring_jax._src.kernels import score_ops

    if not loader.enabled():
        pytest.skip("no kernels")
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 1, 0.5)], final=[2])
    bad = dataclasses_replace_schedule(fsa, src=np.array([0, 7], np.int32))
    with pytest.raises(Exception, match="index outside the Fsa's 3 states and 2 arcs"):
        jax.block_until_ready(score_ops.total(sj.LOG, bad, fsa.weight, fsa.final_weight))


def test_the_kbest_kernel_checks_the_level_order():
    # In-range tables that pull from a later state: the lazy search (which
    # walks back along the pulls) refuses them rather than loop.
    from semiring_jax._src.kernels import score_ops

    if not loader.enabled():
        pytest.skip("no kernels")
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 1, 0.5)], final=[2])
    bad = dataclasses_replace_schedule(fsa, src=np.array([2, 1], np.int32))
    with pytest.raises(Exception, match="not in level order"):
        jax.block_until_ready(score_ops.kbest(bad, fsa.weight, fsa.final_weight, 2))


def test_the_kernels_take_typed_buffers():
    # The handlers declare their dtypes: XLA refuses a mismatch by itself.
    if not loader.enabled():
        pytest.skip("no kernels")
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5)], final=[1])
    schedule = fsa.schedule
    tables = [schedule.levels.pos_state, schedule.pull.end, schedule.pull.arc, schedule.pull.src]
    call = jax.ffi.ffi_call("semiring_jax_log_total_f32", jax.ShapeDtypeStruct((), jnp.float32))
    weight, final = jnp.asarray(fsa.weight), jnp.asarray(fsa.final_weight)
    final_mask = jnp.asarray(fsa.final_mask)
    ints = [jnp.asarray(t, jnp.int32) for t in tables]
    assert float(call(weight, final, final_mask, *ints)) == 0.5
    with pytest.raises(Exception, match=r"(?i)type"):
        longs = [jnp.asarray(t, jnp.int64) for t in tables]
        jax.block_until_ready(call(weight, final, final_mask, *longs))


def dataclasses_replace_schedule(fsa, **pull):
    """fsa's schedule with some of its pull tables replaced."""
    import dataclasses

    schedule = fsa.schedule
    return dataclasses.replace(schedule, pull=schedule.pull._replace(**pull))


def test_the_kernel_sources_compile_without_warnings():
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        pytest.skip("no compiler")
    sources = [str(path) for path in loader._SOURCES]
    flags = [flag for flag in loader._FLAGS if flag not in ("-shared", "-O3")]
    for native in ([loader._NATIVE], []):  # the build, and its fallback
        command = [compiler, "-fsyntax-only", "-Werror", *flags, *native]
        result = subprocess.run(
            [*command, "-isystem", jax.ffi.include_dir(), *sources], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-3000:]
