"""`sj.mmi_loss` against a float64 numpy forward algorithm (Kaldi's leaky
HMM and `SetInitialProbs` included), central finite differences, the
infeasible-numerator rule, batching, NaN propagation and input checks; on
the compiled CPU kernel and on the portable scan.

Compilation dominates the run time, so the random graphs keep one set of
static sizes: every state has exactly K incoming and K outgoing arcs (K
permutations of the states, the first the identity, whose arc 0 -> 0 comes
first), which fixes the padded tables and the cycle the library records.
Parallel arcs, self-loops, unreachable states (permutations that keep a
block of states apart, or arcs of weight -inf) and several final states
come from the draws.

The gradient tests draw denominators whose every state can be reached;
`test_leak_with_an_unreachable_state_on_the_scan` covers the other case.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import semiring_jax as sj
from semiring_jax._src.kernels import loader
from tests.paths import both_paths

B, T, V = 4, 5, 4  # batch, frames, pdf columns
NUM_STATES, NUM_K = 5, 2  # numerator graphs: S, arcs per state (A = S K)
DEN_STATES, DEN_K = 6, 3  # the denominator graph
LEAKS = {"float32": [0.0, 1e-5, 0.1], "float64": [0.0, 0.1]}
ITERATIONS = 100  # Kaldi's SetInitialProbs
TOLERANCE = {"float32": {"rtol": 1e-5, "atol": 1e-4}, "float64": {"rtol": 1e-10, "atol": 1e-10}}


@pytest.fixture(params=["kernel", "scan"])
def path(request, monkeypatch):
    """The compiled CPU kernel, or the portable scan (the kernel switched
    off). jit keeps the choice made when it traced, so the caches are
    cleared before and after."""
    jax.clear_caches()
    if request.param == "kernel":
        if not loader.enabled():
            pytest.skip("the compiled CPU kernels are not available here")
    else:
        monkeypatch.setattr(loader, "enabled", lambda: False)
    yield request.param
    jax.clear_caches()


def test_leaky_hmm_under_strict_dtype_promotion():
    # conftest enables x64 and strict dtype promotion, as a user may.
    graph = sj.Fsa.from_arcs([(0, 0, 0, 0.0)], final=[0])
    log_probs = jnp.zeros((1, 2, 1), jnp.float32)
    loss = sj.mmi_loss(sj.stack([graph]), graph, log_probs, jnp.array([2]), leaky_hmm=1e-5)
    # α' = α (1 + ε) at each of the 3 frame boundaries; num = 0. float32
    # logs are good to ~1e-7 absolute (this loss is 3e-5).
    np.testing.assert_allclose(loss, [3 * np.log1p(1e-5)], rtol=1e-5, atol=1e-7)


# -- graphs ------------------------------------------------------------------


def random_graph(rng, num_states, k, dtype, dead=0.2, connected=False):
    """An unbatched acceptor whose every state has k arcs in and k out,
    the first a self-loop; a fraction `dead` of the arcs (never 0 -> 0)
    weigh -inf. Unless `connected` (a cycle through every state), some
    states may be unreachable."""
    perms = [np.arange(num_states)]
    # Half of the time the permutations keep states [0, r) among themselves:
    # states r and above are then unreachable.
    r = num_states if connected or rng.random() < 0.5 else int(rng.integers(2, num_states))

    def permutation():
        return np.concatenate([rng.permutation(r), r + rng.permutation(num_states - r)])

    for i in range(k - 1):
        if connected and i == 0:
            order = np.concatenate([[0], 1 + rng.permutation(num_states - 1)])
            perm = np.empty(num_states, int)
            perm[order] = np.roll(order, -1)
            perms.append(perm)
        else:
            # Now and then the previous permutation again: parallel arcs.
            perms.append(perms[-1] if rng.random() < 0.3 else permutation())
    arcs = []
    for perm in perms:
        for s in range(num_states):
            weight = float(rng.uniform(-1.5, 1.0))
            if arcs and rng.random() < dead:
                weight = -np.inf
            arcs.append((s, int(perm[s]), int(rng.integers(V)), weight))
    count = int(rng.integers(1, 4))
    final_states = rng.choice(num_states, size=count, replace=False)
    final = {int(s): float(rng.uniform(-1.0, 0.5)) for s in final_states}
    return sj.Fsa.from_arcs(arcs, final=final, num_states=num_states, dtype=np.dtype(dtype))


def random_setup(seed, dtype, dead=0.2, den_dead=None, den_connected=False):
    """(num_graphs [B], den_graph, log_probs [B, T, V]) of one seed."""
    rng = np.random.default_rng(seed)
    num = sj.stack([random_graph(rng, NUM_STATES, NUM_K, dtype, dead) for _ in range(B)])
    den_dead = dead if den_dead is None else den_dead
    den = random_graph(rng, DEN_STATES, DEN_K, dtype, den_dead, den_connected)
    log_probs = jnp.asarray(rng.normal(0.0, 1.5, (B, T, V)).astype(dtype))
    return num, den, log_probs


def arrays(fsa):
    """(src, dst, label, weight, final) in float64, -inf on padding arcs
    and non-final states."""
    weight = np.where(fsa.arc_mask, np.asarray(fsa.weight, np.float64), -np.inf)
    final = np.where(fsa.final_mask, np.asarray(fsa.final_weight, np.float64), -np.inf)
    label = np.where(fsa.arc_mask, fsa.ilabel, 0)
    return np.asarray(fsa.src), np.asarray(fsa.dst), np.asarray(label), weight, final


def entry(graph, b):
    """The arrays of entry b of a batched Fsa."""
    return tuple(np.asarray(x)[b] for x in arrays(graph))


# -- the oracle ----------------------------------------------------------------


def oracle_initial_probs(src, dst, weight, final):
    """Kaldi's SetInitialProbs: 100 averaged steps of the locally
    normalised graph from state 0."""
    num_states = final.shape[0]
    prob = np.exp(weight)
    total = np.bincount(src, prob, minlength=num_states) + np.exp(final)
    cur = np.zeros(num_states)
    cur[0] = 1.0
    avg = np.zeros(num_states)
    for _ in range(ITERATIONS):
        avg += cur / ITERATIONS
        nxt = np.zeros(num_states)
        for s, d, p in zip(src, dst, prob):
            if total[s] > 0:
                nxt[d] += cur[s] * p / total[s]
        mass = nxt.sum()
        cur = nxt / mass if mass > 0 else nxt
    return avg


def oracle_total(graph, log_probs, length, leak=None):
    """log Σ over paths of `length` frames (linear-space forward
    algorithm), with α += leak · Σ α at every frame boundary if given."""
    src, dst, label, weight, final = graph
    alpha = np.zeros(final.shape[0])
    alpha[0] = 1.0

    def leaked(a):
        return a if leak is None else a + leak * a.sum()

    alpha = leaked(alpha)
    for t in range(length):
        new = np.zeros_like(alpha)
        np.add.at(new, dst, alpha[src] * np.exp(weight + log_probs[t, label]))
        alpha = leaked(new)
    total = np.sum(alpha * np.exp(final))
    if np.isnan(total):
        return np.nan
    return np.log(total) if total > 0 else -np.inf


def oracle_loss(num, den, log_probs, lengths, den_scale=1.0, leaky_hmm=0.0, leak=None):
    """The [B] losses in float64; `leak` (ε p) overrides the computed one."""
    log_probs = np.asarray(log_probs, np.float64)
    den_arrays = arrays(den)
    if leak is None and leaky_hmm:
        src, dst, _, weight, final = den_arrays
        leak = leaky_hmm * oracle_initial_probs(src, dst, weight, final)
    losses = []
    for b, length in enumerate(np.asarray(lengths)):
        n = oracle_total(entry(num, b), log_probs[b], int(length))
        d = oracle_total(den_arrays, log_probs[b], int(length), leak)
        losses.append(np.inf if n == -np.inf else den_scale * d - n)
    return np.array(losses)


def test_oracle_initial_probs_on_a_two_state_chain():
    # 0 -> 1 with probability 1; state 1 loops (1/2) or ends (1/2): the flow
    # sits at 0 for the first step only, then at state 1.
    src, dst = np.array([0, 1]), np.array([1, 1])
    weight = np.log([1.0, 0.5])
    final = np.array([-np.inf, np.log(0.5)])
    np.testing.assert_allclose(oracle_initial_probs(src, dst, weight, final), [0.01, 0.99])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_initial_probs_on_the_host_and_traced_agree_with_the_oracle(seed):
    """A concrete graph's initial probabilities are computed on the host
    (float64), a traced one's in JAX: both are Kaldi's (the oracle)."""
    from semiring_jax._src.mmi import leaky

    graph = random_graph(np.random.default_rng(seed), DEN_STATES, DEN_K, "float64")
    src, dst, _, weight, final = arrays(graph)
    want = oracle_initial_probs(src, dst, weight, final)
    np.testing.assert_allclose(leaky.initial_probs(graph), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(jax.jit(leaky.initial_probs)(graph), want, rtol=1e-10, atol=1e-14)


# -- 1. values against the oracle ----------------------------------------------


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
    den_scale=st.sampled_from([1.0, 0.5, 1.7]),
    lengths=st.lists(st.integers(0, T), min_size=B - 2, max_size=B - 2),
)
def test_matches_the_oracle(path, dtype, seed, data, den_scale, lengths):
    # Each leak is one more compilation: float64 leaves Kaldi's 1e-5 to the
    # LF-MMI test below.
    leaky_hmm = data.draw(st.sampled_from(LEAKS[dtype]), label="leaky_hmm")
    num, den, log_probs = random_setup(seed, dtype)
    lengths = np.array([T, 0, *lengths], np.int32)
    got = sj.mmi_loss(num, den, log_probs, lengths, den_scale=den_scale, leaky_hmm=leaky_hmm)
    assert got.shape == (B,) and got.dtype == np.dtype(dtype)
    want = oracle_loss(num, den, log_probs, lengths, den_scale, leaky_hmm)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, **TOLERANCE[dtype])


def test_matches_the_oracle_on_unreachable_and_dead_states(path):
    # States 3 and 4 cannot be reached, 2 is a dead end, and state 0 has
    # a self-loop and parallel arcs to 1. The leak (denominator) reaches
    # every state with p > 0; p is 0 on the unreachable ones.
    dtype = "float64"
    arcs = [(0, 0, 1, -0.3), (0, 1, 0, -0.5), (0, 1, 0, 0.2), (1, 1, 2, -0.1), (1, 2, 3, 0.0)]
    arcs += [(1, 0, 1, -1.0), (3, 1, 2, 0.4), (4, 3, 0, 0.1), (3, 4, 1, -0.2)]
    kw = {"num_states": 5, "dtype": np.dtype(dtype)}
    den = sj.Fsa.from_arcs(arcs, final={1: -0.2, 0: 0.1, 4: 0.0}, **kw)
    num = sj.stack(
        [
            sj.Fsa.from_arcs(arcs, final={1: 0.0}, **kw),
            sj.Fsa.from_arcs(arcs[:3], final=[1, 3], **kw),
        ]
    )
    rng = np.random.default_rng(0)
    log_probs = jnp.asarray(rng.normal(size=(2, T, V)).astype(dtype))
    lengths = np.array([T, 1])
    got = sj.mmi_loss(num, den, log_probs, lengths, den_scale=0.8, leaky_hmm=0.1)
    want = oracle_loss(num, den, log_probs, lengths, 0.8, 0.1)
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got, want, **TOLERANCE[dtype])
    src, dst, _, weight, final = arrays(den)
    p = oracle_initial_probs(src, dst, weight, final)
    assert np.all(p[3:] == 0) and np.all(p[:3] > 0)


# -- 2. gradients against finite differences -----------------------------------


def feasible_setup(dtype="float64"):
    """A random setup without -inf weights whose every numerator has a
    path: no infinite loss, so finite differences apply."""
    lengths = np.array([T, 3, 1, 4], np.int32)
    for seed in range(100):
        # A denominator state that cannot be reached (p = 0) breaks the
        # scan's leaky gradients: see test_leak_with_an_unreachable_state_on_the_scan.
        num, den, log_probs = random_setup(seed, dtype, dead=0.0, den_connected=True)
        if np.all(np.isfinite(oracle_loss(num, den, log_probs, lengths))):
            return num, den, log_probs, lengths
    raise AssertionError("no feasible seed")


def central_differences(fn, x, h=1e-6):
    """∂fn/∂x by central differences at every finite entry of x (0 at the
    -inf entries, which a perturbation leaves -inf)."""
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for i in zip(*np.nonzero(np.isfinite(x))):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (fn(up) - fn(down)) / (2 * h)
    return grad


@pytest.mark.parametrize(
    "path", ["kernel", pytest.param("scan", marks=pytest.mark.slow)], indirect=True
)  # the scan's gradients: test_kernel_and_scan_agree
def test_gradients_match_finite_differences(path):
    num, den, log_probs, lengths = feasible_setup()
    den_scale = 0.7
    args = (log_probs, num.weight, num.final_weight, den.weight, den.final_weight)
    for leaky_hmm in (0.0, 0.1):

        def total(lp, nw, nf, dw, df, leaky_hmm=leaky_hmm):
            num_graphs = num.replace(weight=nw, final_weight=nf)
            den_graph = den.replace(weight=dw, final_weight=df)
            losses = sj.mmi_loss(
                num_graphs, den_graph, lp, lengths, den_scale=den_scale, leaky_hmm=leaky_hmm
            )
            return losses.sum()

        # One program for the gradients and for every finite difference.
        value_and_grad = jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2, 3, 4)))

        def along(i, value_and_grad=value_and_grad, leaky_hmm=leaky_hmm):
            def fn(x):
                value, _ = value_and_grad(*args[:i], jnp.asarray(x), *args[i + 1 :])
                return float(value)

            return fn

        _, grads = value_and_grad(*args)
        for i in range(3):  # log_probs, the numerators' weights and final weights
            want = central_differences(along(i), args[i])
            np.testing.assert_allclose(grads[i], want, rtol=1e-6, atol=1e-7)
        if not leaky_hmm:
            for i in (3, 4):
                want = central_differences(along(i), args[i])
                np.testing.assert_allclose(grads[i], want, rtol=1e-6, atol=1e-7)
            continue
        # With the leak, p (a function of the denominator's weights) is a
        # constant: differentiate the oracle with p held at its value.
        src, dst, _, weight, final = arrays(den)
        leak = leaky_hmm * oracle_initial_probs(src, dst, weight, final)

        def oracle_sum(dw, df):
            graph = den.replace(weight=jnp.asarray(dw), final_weight=jnp.asarray(df))
            return oracle_loss(num, graph, log_probs, lengths, den_scale, leak=leak).sum()

        want_w = central_differences(lambda dw: oracle_sum(dw, args[4]), args[3])
        want_f = central_differences(lambda df: oracle_sum(args[3], df), args[4])
        np.testing.assert_allclose(grads[3], want_w, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(grads[4], want_f, rtol=1e-6, atol=1e-7)
        assert np.all(np.asarray(grads[4])[~np.asarray(den.final_mask)] == 0)


# -- 3. an infeasible numerator, with the graph builders -----------------------


def lf_mmi_setup(dtype):
    """A small LF-MMI setup: 2 phones (4 pdfs), a bigram phone LM, and 4
    utterances of which 1 (3 phones in 2 frames) and 3 (no phones in 4
    frames) have no numerator path."""
    topo = sj.hmm_topo(2, dtype=np.dtype(dtype))
    lm = sj.ngram_fsa([[1, 2], [2, 1, 2], [1]], num_symbols=2, dtype=np.dtype(dtype))
    den = sj.denominator_graph(lm, topo)
    phones = [[1, 2], [1, 2, 1], [2], []]
    lengths = np.array([T, 2, 3, 4], np.int32)
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(len(phones), T, 4)).astype(dtype)
    log_probs = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
    return phones, topo, den, log_probs, lengths


def test_infeasible_numerator_is_inf_with_zero_gradients_and_nan(path):
    phones, topo, den, log_probs, lengths = lf_mmi_setup("float64")
    num = sj.numerator_graphs(phones, None, topo)
    leaky_hmm = 1e-5

    def summed(lp, nw, dw, lengths, counted):
        losses = sj.mmi_loss(
            num.replace(weight=nw), den.replace(weight=dw), lp, lengths, leaky_hmm=leaky_hmm
        )
        return jnp.where(counted, losses, 0.0).sum(), losses

    run = jax.jit(jax.value_and_grad(summed, argnums=(0, 1, 2), has_aux=True))
    args = (log_probs, num.weight, den.weight)
    (_, losses), (g_lp, g_num, g_den) = run(*args, lengths, np.full(B, True))
    want = oracle_loss(num, den, log_probs, lengths, leaky_hmm=leaky_hmm)
    np.testing.assert_allclose(losses, want, rtol=1e-10)
    assert np.isposinf(losses[1]) and np.isposinf(losses[3])
    assert np.all(np.isfinite(losses[::2]))
    for g in (g_lp, g_num, g_den):
        assert np.all(np.isfinite(g))
    assert np.all(np.asarray(g_lp)[1::2] == 0)
    assert np.all(np.asarray(g_num)[1::2] == 0)
    assert np.any(np.asarray(g_lp)[::2] != 0)

    # The feasible utterances without the others (utterances 1 and 3 given
    # lengths with a path, and left out of the sum): the same losses and
    # gradients, so the infeasible ones add nothing to the denominator's.
    feasible = np.array([T, 3, 3, 0], np.int32)
    (_, alone), (a_lp, a_num, a_den) = run(*args, feasible, np.arange(B) % 2 == 0)
    assert np.all(np.isfinite(alone))
    np.testing.assert_allclose(alone[::2], losses[::2], rtol=1e-12)
    np.testing.assert_allclose(g_lp, a_lp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_num, a_num, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_den, a_den, rtol=1e-10, atol=1e-12)

    # 5. NaN where utterance 0 reads it (frame 0, its first phone's forward
    # pdf 0) gives NaN there and leaves the other utterances alone, their
    # gradients included. (The same program: no new compilation.)
    poisoned = log_probs.at[0, 0, 0].set(jnp.nan)
    (_, got), (n_lp, _, _) = run(poisoned, *args[1:], lengths, np.arange(B) != 0)
    assert np.isnan(got[0])
    np.testing.assert_allclose(got[1:], losses[1:], rtol=1e-12)
    np.testing.assert_allclose(n_lp[1:], g_lp[1:], rtol=1e-10, atol=1e-12)

    # NaN past utterance 2's 3 frames changes nothing, gradients included.
    poisoned = log_probs.at[2, 4, :].set(jnp.nan)
    (_, got), nan_grads = run(poisoned, *args[1:], lengths, np.full(B, True))
    np.testing.assert_allclose(got, losses, rtol=1e-12)
    for g, want in zip(nan_grads, (g_lp, g_num, g_den)):
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-14)


def test_leak_with_an_unreachable_state_on_the_scan(monkeypatch):
    # State 1 cannot be reached, so p = [1, 0]: den = 3 log 1.1 + Σ
    # log_probs = num + 3 log 1.1, and every gradient is 0.
    den = sj.Fsa.from_arcs([(0, 0, 0, 0.0), (1, 1, 0, 0.0)], final=[0], dtype=np.float64)
    num = sj.stack([den])

    def loss(lp):
        return sj.mmi_loss(num, den, lp, np.array([2]), leaky_hmm=0.1).sum()

    jax.clear_caches()
    monkeypatch.setattr(loader, "enabled", lambda: False)
    try:
        value, grad = jax.jit(jax.value_and_grad(loss))(jnp.zeros((1, 2, 1)))
    finally:
        jax.clear_caches()
    np.testing.assert_allclose(value, 3 * np.log(1.1), rtol=1e-12)
    np.testing.assert_allclose(grad, 0.0, atol=1e-12)


# -- 4. batching ------------------------------------------------------------------


def test_batch_equals_one_by_one(transform):
    dtype = "float32"
    num, den, log_probs = random_setup(7, dtype)
    lengths = np.array([T, 2, 0, 4], np.int32)
    inner = transform(
        lambda num, den, lp, lengths: sj.mmi_loss(num, den, lp, lengths, leaky_hmm=0.1)
    )

    def fn(*args):
        return inner(*args)

    batch = fn(num, den, log_probs, lengths)
    np.testing.assert_allclose(
        batch, oracle_loss(num, den, log_probs, lengths, leaky_hmm=0.1), **TOLERANCE[dtype]
    )
    for b, graph in enumerate(sj.unstack(num)):
        one = fn(sj.stack([graph]), den, log_probs[b : b + 1], lengths[b : b + 1])
        assert one.shape == (1,)
        np.testing.assert_allclose(one[0], batch[b], rtol=1e-6, atol=1e-6)


def test_vmap_over_an_extra_axis():
    dtype = "float32"
    num, den, log_probs = random_setup(7, dtype)
    lengths = np.array([T, 2, 0, 4], np.int32)
    stacked = jnp.stack([log_probs, log_probs[::-1] * 0.5])
    mapped = jax.vmap(lambda lp: sj.mmi_loss(num, den, lp, lengths, leaky_hmm=0.1))(stacked)
    assert mapped.shape == (2, B)
    for lp, got in zip(stacked, mapped):
        want = oracle_loss(num, den, lp, lengths, leaky_hmm=0.1)
        np.testing.assert_allclose(got, want, **TOLERANCE[dtype])


# -- 6. input checks ---------------------------------------------------------------


def test_errors():
    num, den, log_probs = random_setup(0, "float32")
    lengths = np.full(B, T, np.int32)
    with pytest.raises(ValueError, match="log_probs"):
        sj.mmi_loss(num, den, log_probs[0], lengths)
    with pytest.raises(ValueError, match="log_probs"):
        sj.mmi_loss(num, den, log_probs[None], lengths)
    with pytest.raises(ValueError, match="lengths"):
        sj.mmi_loss(num, den, log_probs, np.array([T, T + 1, 0, 1]))
    with pytest.raises(ValueError, match="lengths"):
        sj.mmi_loss(num, den, log_probs, np.array([T, -1, 0, 1]))
    with pytest.raises(ValueError, match="num_graphs"):
        sj.mmi_loss(sj.unstack(num)[0], den, log_probs, lengths)
    with pytest.raises(ValueError, match="num_graphs"):
        sj.mmi_loss(sj.stack(sj.unstack(num)[:3]), den, log_probs, lengths)
    with pytest.raises(ValueError, match="den_graph"):
        sj.mmi_loss(num, num, log_probs, lengths)
    with pytest.raises(ValueError, match="leaky_hmm"):
        sj.mmi_loss(num, den, log_probs, lengths, leaky_hmm=-1e-5)
    with pytest.raises(ValueError, match="label"):
        sj.mmi_loss(num, den, log_probs[..., : V - 1], lengths)  # labels reach V - 1
    with pytest.raises(ValueError, match="label 4"):
        big = sj.Fsa.from_arcs([(0, 0, 4, 0.0)], final=[0], dtype=np.float32)
        sj.mmi_loss(num, big, log_probs, lengths)
    with pytest.raises(ValueError, match="float64"):
        sj.mmi_loss(num, den, log_probs.astype(jnp.float64), lengths)


def test_non_finite_hyper_parameters_are_refused():
    # inf or NaN would not fail: every loss would be inf or NaN.
    num, den, log_probs = random_setup(0, "float32")
    lengths = np.full(B, T, np.int32)
    for bad in (np.inf, np.nan):
        with pytest.raises(ValueError, match="mmi_loss: leaky_hmm must be finite"):
            sj.mmi_loss(num, den, log_probs, lengths, leaky_hmm=bad)
        with pytest.raises(ValueError, match="mmi_loss: den_scale must be finite"):
            sj.mmi_loss(num, den, log_probs, lengths, den_scale=bad)
        with pytest.raises(ValueError, match="mmi_loss: den_scale must be finite"):
            sj.mmi_loss(num, den, log_probs, lengths, den_scale=jnp.float32(bad))


# -- 7. kernel and scan agree -------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", ["float64", pytest.param("float32", marks=pytest.mark.slow)]
)  # float32 agreement: test_matches_the_oracle on both paths
def test_kernel_and_scan_agree(dtype, monkeypatch):
    jax.clear_caches()
    if not loader.enabled():
        pytest.skip("the compiled CPU kernels are not available here")
    lengths = np.array([T, 3, 0, 4], np.int32)
    for seed in range(100):  # a batch with infinite and finite losses
        num, den, log_probs = random_setup(seed, dtype, 0.05, den_dead=0.0, den_connected=True)
        want = oracle_loss(num, den, log_probs, lengths, 0.9, 0.1)
        if np.isposinf(want).sum() == 1 and np.isfinite(want).sum() == B - 1:
            break

    def summed(lp, nw, nf, dw, df):
        losses = sj.mmi_loss(
            num.replace(weight=nw, final_weight=nf),
            den.replace(weight=dw, final_weight=df),
            lp,
            lengths,
            den_scale=0.9,
            leaky_hmm=0.1,
        )
        return jnp.where(jnp.isfinite(losses), losses, 0.0).sum(), losses

    args = (log_probs, num.weight, num.final_weight, den.weight, den.final_weight)
    grad = jax.jit(jax.value_and_grad(summed, argnums=(0, 1, 2, 3, 4), has_aux=True))

    def run(*args):
        return grad(*args)

    (_, kernel), kernel_grads = run(*args)
    monkeypatch.setattr(loader, "enabled", lambda: False)
    jax.clear_caches()
    try:
        (_, scan), scan_grads = run(*args)
    finally:
        jax.clear_caches()
    assert np.any(np.isposinf(kernel)) and np.any(np.isfinite(kernel))
    np.testing.assert_allclose(kernel, scan, **TOLERANCE[dtype])
    for k, s in zip(kernel_grads, scan_grads):
        assert np.any(k != 0)
        np.testing.assert_allclose(k, s, **TOLERANCE[dtype])


# -- 8. a common offset on the log-probs --------------------------------------------


def oracle_gradient(num, den, log_probs, lengths, leaky_hmm):
    """∂ Σ_b loss_b / ∂ log_probs [B, T, V] (den_scale 1) by central
    differences of the float64 oracle, one utterance at a time."""
    den_arrays = arrays(den)
    src, dst, _, weight, final = den_arrays
    leak = leaky_hmm * oracle_initial_probs(src, dst, weight, final) if leaky_hmm else None
    grads = []
    for b, length in enumerate(np.asarray(lengths).tolist()):
        num_arrays = entry(num, b)

        def loss(lp, num_arrays=num_arrays, length=length):
            return oracle_total(den_arrays, lp, length, leak) - oracle_total(num_arrays, lp, length)

        grads.append(central_differences(loss, log_probs[b]))
    return np.stack(grads)


def test_a_large_offset_in_float32_cancels():
    """Raw network outputs: num and den each shift by the sum of the
    per-frame offsets, so the loss and its gradient are those of the same
    float32 inputs without the offset (the oracle: float64, the offset
    subtracted exactly), plus (den_scale - 1) times that sum. Both totals
    are ~T · offset; rounding each to float32 before the subtraction gave
    0.0 at 1e9 and 3e-3 off at 1e4. Utterances 3k..3k+2 carry offset k."""
    phones, topo, den, log_probs, lengths = lf_mmi_setup("float32")
    phones = phones[:3] * 3
    num = sj.numerator_graphs(phones, None, topo)
    lengths = np.array([T, 4, 3] * 3, np.int32)  # every numerator feasible
    # Each frame its own offset; float32 rounds the inputs themselves.
    offsets = np.repeat([1e4, 1e6, 1e9], 3)[:, None] * (1.0 + np.arange(T) / T)  # [9, T]
    base = np.tile(np.asarray(log_probs[:3], np.float64), (3, 1, 1))
    shifted = (base + offsets[..., None]).astype(np.float32)
    exact = np.asarray(shifted, np.float64) - offsets[..., None]
    offset_sum = np.where(np.arange(T) < lengths[:, None], offsets, 0.0).sum(axis=1)

    def loss_and_grad(lp, den_scale, leaky_hmm):
        def summed(lp, den_scale):
            losses = sj.mmi_loss(num, den, lp, lengths, den_scale=den_scale, leaky_hmm=leaky_hmm)
            return losses.sum(), losses

        run = jax.jit(jax.value_and_grad(summed, argnums=(0, 1), has_aux=True))
        (_, one), (grad, grad_scale) = run(lp, jnp.float32(1.0))
        (_, scaled), _ = run(lp, den_scale)
        return one, grad, scaled, grad_scale

    for leaky_hmm in (0.0, 1e-5):
        want = oracle_loss(num, den, exact, lengths, leaky_hmm=leaky_hmm)
        assert np.all(np.isfinite(want)), want
        want_scaled = oracle_loss(num, den, exact, lengths, 0.9, leaky_hmm) - 0.1 * offset_sum
        want_grad = oracle_gradient(num, den, exact, lengths, leaky_hmm)
        # d loss / d den_scale at 1: the sum of the true (offset) den totals.
        want_den = (want_scaled - want) / (0.9 - 1.0)
        both = both_paths(loss_and_grad, jnp.asarray(shifted), jnp.float32(0.9), leaky_hmm)
        for got, got_grad, got_scaled, got_grad_scale in both:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got_scaled, want_scaled, rtol=1e-6)
            np.testing.assert_allclose(got_grad_scale, want_den.sum(), rtol=1e-6)
