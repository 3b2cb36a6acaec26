"""Structural algorithms against OpenFst (pynini) and brute force.

For each op: the result's total score equals OpenFst's result of the same
operation (shortest distance, LOG and TROPICAL) and, on acyclic results, our
`tot_score` and brute-force path enumeration; gradients through the op
match finite differences; batched operands give the same as one by one.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pynini
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import semiring_jax as sj
from tests import oracles
from tests.strategies import acyclic_fsas, as_rows

SETTINGS = settings(max_examples=20, deadline=None)
FINITE = st.floats(-3.0, 3.0, width=32)
# Cycles (closure) converge in OpenFst only when every cycle loses weight.
NEGATIVE = st.floats(-3.0, -0.5, width=32)


def build(data, transducer=True, dtype=np.float64):
    num_states, arcs, final = data
    return sj.Fsa.from_arcs(as_rows(arcs, transducer), final, num_states=num_states, dtype=dtype)


def as_data(fsa):
    """An unbatched Fsa as the oracles' (num_states, arcs, final)."""
    real = np.asarray(fsa.arc_mask)
    columns = [
        np.asarray(getattr(fsa, name))[real]
        for name in ("src", "dst", "ilabel", "olabel", "weight")
    ]
    arcs = [(int(s), int(d), int(i), int(o), float(w)) for s, d, i, o, w in zip(*columns)]
    final = {int(s): float(w) for s, w in enumerate(np.asarray(fsa.final_weight)) if w > -np.inf}
    return fsa.num_states, arcs, final


def openfst_total(fst, arc_type):
    distances = pynini.shortestdistance(fst, delta=1e-9, reverse=True)
    start = fst.start()
    if start < 0 or start >= len(distances):
        return -math.inf
    return 0.0 - float(distances[start])


def ours_total(fsa, arc_type):
    fst = oracles.to_pynini(*as_data(fsa), arc_type)
    return openfst_total(fst, arc_type)


def pynini_of(data, arc_type):
    return oracles.to_pynini(*data, arc_type)


UNARY = {
    "invert": (sj.invert, lambda f: f.invert()),
    "project_input": (lambda f: sj.project(f, "input"), lambda f: f.project("input")),
    "project_output": (lambda f: sj.project(f, "output"), lambda f: f.project("output")),
    "arc_sort": (sj.arc_sort, lambda f: f.arcsort("ilabel")),
    "connect": (sj.connect, lambda f: f.connect()),
    "reverse": (sj.reverse, pynini.reverse),
}


@SETTINGS
@given(data=acyclic_fsas(transducer=True, weights=FINITE), name=st.sampled_from(sorted(UNARY)))
def test_unary_ops_match_openfst_and_brute_force(data, name):
    ours, theirs = UNARY[name]
    result = ours(build(data))
    for arc_type, semiring in (("log", sj.LOG), ("tropical", sj.TROPICAL)):
        want = openfst_total(theirs(pynini_of(data, arc_type).copy()), arc_type)
        np.testing.assert_allclose(ours_total(result, arc_type), want, rtol=1e-5, atol=1e-5)
        got = float(sj.tot_score(result, semiring))
        brute = oracles.brute_tot_score(*as_data(result), arc_type)
        np.testing.assert_allclose(got, brute, rtol=1e-9, atol=1e-9)
        # These ops keep the weighted language, so the total too.
        np.testing.assert_allclose(
            got, float(sj.tot_score(build(data), semiring)), rtol=1e-9, atol=1e-9
        )


@SETTINGS
@given(data=acyclic_fsas(transducer=True, weights=FINITE))
def test_top_sort_orders_arcs_upwards(data):
    fsa = build(data)
    dst = np.asarray(fsa.dst)
    if (dst == 0).any():
        with pytest.raises(ValueError, match="into the start state 0"):
            sj.top_sort(fsa)
        return
    result = sj.top_sort(fsa)
    assert np.all(np.asarray(result.src) < np.asarray(result.dst))
    np.testing.assert_allclose(sj.tot_score(result), sj.tot_score(fsa), rtol=1e-9)
    fst = pynini_of(data, "log").copy()
    fst.topsort()
    np.testing.assert_allclose(
        ours_total(result, "log"), openfst_total(fst, "log"), rtol=1e-5, atol=1e-5
    )


@SETTINGS
@given(
    a=acyclic_fsas(weights=FINITE),
    b=acyclic_fsas(weights=FINITE),
    op=st.sampled_from(["union", "concat"]),
)
def test_binary_ops_match_openfst(a, b, op):
    # Acceptors: an empty arc list builds an acceptor, and kinds must match.
    a, b = build(a, transducer=False), build(b, transducer=False)
    result = getattr(sj, op)(a, b)
    a, b = as_data(a), as_data(b)
    combine = {"union": jnp.logaddexp, "concat": jnp.add}[op]
    for arc_type, semiring in (("log", sj.LOG), ("tropical", sj.TROPICAL)):
        theirs = getattr(pynini, op)(pynini_of(a, arc_type), pynini_of(b, arc_type))
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-5, atol=1e-5
        )
        if semiring is sj.LOG:
            want = combine(sj.tot_score(build(a)), sj.tot_score(build(b)))
            np.testing.assert_allclose(sj.tot_score(result), want, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(data=acyclic_fsas(transducer=True, weights=NEGATIVE))
def test_closure_matches_openfst_and_is_refused_by_score_ops(data):
    result = sj.closure(build(data))
    for arc_type in ("log", "tropical"):
        theirs = pynini.closure(pynini_of(data, arc_type))
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-4, atol=1e-4
        )
    if result.cycle:
        with pytest.raises(ValueError, match="cycle"):
            sj.tot_score(result)
        assert sj.arc_sort(result).cycle  # structural ops still take it


def test_gradients_flow_through_every_op():
    a = build((3, [(0, 1, 1, 2, 0.3), (1, 2, 3, 3, -0.2), (0, 2, 2, 1, 0.1)], {2: 0.2, 1: -1.0}))
    b = build((2, [(0, 1, 4, 4, -0.4), (0, 1, 5, 5, 0.6)], {1: 0.0}))
    ops = [
        sj.invert,
        sj.project,
        sj.arc_sort,
        sj.top_sort,
        sj.connect,
        sj.reverse,
        lambda f: sj.union(f, b),
        lambda f: sj.concat(b, f),
    ]
    for op in ops:

        def total(w, f, op=op):
            return sj.tot_score(op(a.replace(weight=w, final_weight=f)))

        check_grads(total, (a.weight, a.final_weight), order=1, modes=("rev",))


def test_ops_run_under_jit_with_traced_weights():
    a = build((3, [(0, 1, 1, 2, 0.3), (1, 2, 3, 3, -0.2)], {2: 0.2}))
    jitted = jax.jit(lambda w: sj.tot_score(sj.reverse(sj.connect(a.replace(weight=w)))))
    np.testing.assert_allclose(jitted(a.weight), sj.tot_score(a), rtol=1e-12)


def test_batched_operands_give_the_same_as_one_by_one():
    fsas = [
        build((3, [(0, 1, 1, 1, 0.3), (1, 2, 2, 2, -0.2)], {2: 0.0})),
        build((2, [(0, 1, 3, 3, 0.5)], {1: 0.1, 0: -2.0})),
    ]
    batch = sj.stack(fsas)
    for op in (sj.reverse, sj.connect, sj.invert, lambda f: sj.union(f, f)):
        np.testing.assert_allclose(
            sj.tot_score(op(batch)), [float(sj.tot_score(op(fsa))) for fsa in fsas], rtol=1e-12
        )


def test_bad_input_is_named():
    acceptor = sj.linear_fsa([1, 2])
    transducer = sj.Fsa.from_arcs([(0, 1, 1, 2, 0.0)], final=[1])
    with pytest.raises(ValueError, match="operand 1 is a transducer"):
        sj.union(acceptor, transducer)
    with pytest.raises(ValueError, match="operand 1 has float64"):
        sj.concat(acceptor, sj.linear_fsa([1], dtype=np.float64))
    with pytest.raises(ValueError, match="state 1 lies on a cycle"):
        sj.top_sort(sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 2, 1, 0.0), (2, 1, 1, 0.0)], final=[2]))
    with pytest.raises(ValueError, match="side must be"):
        sj.project(acceptor, "left")
    with pytest.raises(ValueError, match="by must be"):
        sj.arc_sort(acceptor, "weight")
    with pytest.raises(ValueError, match="traced"):
        jax.jit(lambda src: sj.connect(acceptor.replace(src=src)))(acceptor.src)


def _strings(data, side):
    """{label string without epsilons: [path scores]} of the successful paths."""
    num_states, arcs, final = data
    out = {}
    for path in oracles.enumerate_paths(num_states, arcs, final):
        labels = tuple(arcs[i][2 if side == "input" else 3] for i in path[0])
        labels = tuple(label for label in labels if label != 0)
        out.setdefault(labels, []).append(path[1])
    return out


def _brute_compose_total(a, b, semiring):
    """⊕ over pairs of successful paths whose strings match (a's output, b's input)."""
    a_out, b_in = _strings(a, "output"), _strings(b, "input")
    scores = [x + y for key in a_out.keys() & b_in.keys() for x in a_out[key] for y in b_in[key]]
    return oracles._plus(scores, semiring)


@SETTINGS
@given(
    a=acyclic_fsas(transducer=True, weights=FINITE), b=acyclic_fsas(transducer=True, weights=FINITE)
)
def test_compose_matches_openfst_and_brute_force(a, b):
    result = sj.compose(build(a), build(b))
    for arc_type, semiring in (("log", sj.LOG), ("tropical", sj.TROPICAL)):
        theirs = pynini.compose(pynini_of(a, arc_type), pynini_of(b, arc_type))
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            float(sj.tot_score(result, semiring)),
            _brute_compose_total(a, b, arc_type),
            rtol=1e-9,
            atol=1e-9,
        )


@SETTINGS
@given(a=acyclic_fsas(weights=FINITE), b=acyclic_fsas(weights=FINITE))
def test_intersect_matches_openfst(a, b):
    fa, fb = build(a, transducer=False), build(b, transducer=False)
    result = sj.intersect(fa, fb)
    assert result.is_acceptor
    a, b = as_data(fa), as_data(fb)
    for arc_type in ("log", "tropical"):
        theirs = pynini.intersect(pynini_of(a, arc_type), pynini_of(b, arc_type))
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-5, atol=1e-5
        )


def test_ctc_topology_composed_with_labels_is_the_ctc_graph():
    labels = [1, 1, 2]
    linear = sj.Fsa.from_arcs(
        [(i, i + 1, label, 0.0) for i, label in enumerate(labels)], final=[len(labels)]
    )
    graph = sj.compose(sj.ctc_topo(3), linear)
    log_probs = jax.nn.log_softmax(
        jnp.asarray(np.random.default_rng(0).normal(size=(1, 9, 3)), jnp.float32)
    )
    np.testing.assert_allclose(
        sj.dense_tot_score(graph, log_probs),
        -sj.ctc_loss(log_probs, np.array([9]), np.array([labels]), np.array([3])),
        rtol=1e-5,
    )


def test_compose_gradients_and_kinds():
    a = build((2, [(0, 1, 1, 2, 0.3), (0, 1, 1, 0, -0.2)], {1: 0.1}))
    b = build((3, [(0, 1, 2, 5, 0.4), (1, 2, 0, 6, 0.2), (0, 2, 2, 7, -0.5)], {2: 0.0}))
    check_grads(
        lambda w, v: sj.tot_score(sj.compose(a.replace(weight=w), b.replace(weight=v))),
        (a.weight, b.weight),
        order=1,
        modes=("rev",),
    )
    with pytest.raises(ValueError, match="operand 0 is a transducer"):
        sj.intersect(a, sj.linear_fsa([1], dtype=np.float64))
    # Kinds follow OpenFst: acceptor o acceptor is an acceptor (equal labels
    # on every arc), any transducer operand makes a transducer.
    word = sj.linear_fsa([2, 0, 2], dtype=np.float64)
    both = sj.compose(word, sj.closure(sj.linear_fsa([2], dtype=np.float64)))
    assert both.is_acceptor
    np.testing.assert_array_equal(both.ilabel, both.olabel)
    assert not sj.compose(word, b).is_acceptor
    assert not sj.compose(a, word).is_acceptor


@SETTINGS
@given(data=acyclic_fsas(weights=FINITE), beam=st.sampled_from([0.0, 0.5, 2.0, math.inf]))
def test_prune_matches_openfst(data, beam):
    fsa = build(data, transducer=False)
    result = sj.prune(fsa, beam)
    data = as_data(fsa)
    theirs = (
        pynini.prune(pynini_of(data, "tropical"), weight=beam, delta=1e-9)
        if beam < math.inf
        else pynini_of(data, "tropical").connect()
    )
    # The best path survives, and with it the same LOG mass as OpenFst keeps.
    np.testing.assert_allclose(
        float(sj.tot_score(result, sj.TROPICAL)),
        float(sj.tot_score(fsa, sj.TROPICAL)),
        rtol=1e-9,
        atol=1e-9,
    )
    np.testing.assert_allclose(
        ours_total(result, "log"), openfst_total(_as_log(theirs), "log"), rtol=1e-4, atol=1e-4
    )


def _as_log(fst):
    return pynini.arcmap(fst, map_type="to_log")


def test_prune_keeps_a_tie_that_rounding_moved():
    # A final weight of -2.2e-16 ties the best path 0 at beam 0, as in
    # OpenFst (its delta); found by hypothesis.
    fsa = sj.Fsa.from_arcs([(0, 1, 0, 0.0)], {0: -2.220446049250313e-16, 1: 0.0}, dtype=np.float64)
    result = sj.prune(fsa, 0.0)
    assert bool(np.asarray(result.final_mask)[0]) and result.num_arcs == 1


def test_prune_refuses_traced_weights():
    fsa = sj.linear_fsa([1, 2])
    with pytest.raises(ValueError, match="weight is a traced value"):
        jax.jit(lambda w: sj.prune(fsa.replace(weight=w), 1.0).weight)(fsa.weight)
    with pytest.raises(ValueError, match="beam must be >= 0"):
        sj.prune(fsa, -1.0)


def _host_and_traced_agree(op, fsa, semirings):
    """`op(fsa, semiring)` on concrete weights (computed in numpy) and on
    traced ones (in JAX): the same structure and, to rounding, the same
    weights."""
    for semiring in semirings:
        host = op(fsa, semiring)
        traced = jax.jit(
            lambda w, f, semiring=semiring: op(fsa.replace(weight=w, final_weight=f), semiring)
        )(jnp.asarray(fsa.weight), jnp.asarray(fsa.final_weight))
        assert isinstance(host.weight, np.ndarray)
        for name in ("src", "dst", "ilabel", "olabel", "final_mask"):
            np.testing.assert_array_equal(getattr(host, name), getattr(traced, name))
        for name in ("weight", "final_weight"):
            np.testing.assert_allclose(
                getattr(host, name), getattr(traced, name), rtol=1e-12, atol=1e-12
            )


@SETTINGS
@given(data=acyclic_fsas(transducer=True, weights=FINITE))
def test_remove_epsilon_weights_on_host_equal_the_traced_ones(data):
    # Traced weights go through the level scan of the pair graph.
    _host_and_traced_agree(sj.remove_epsilon, build(data), (sj.LOG, sj.TROPICAL))


@SETTINGS
@given(data=acyclic_fsas(transducer=True, weights=FINITE))
def test_remove_epsilon_matches_openfst(data):
    fsa = build(data)
    for arc_type, semiring in (("log", sj.LOG), ("tropical", sj.TROPICAL)):
        result = sj.remove_epsilon(fsa, semiring)
        labels = np.stack([np.asarray(result.ilabel), np.asarray(result.olabel)])
        assert not np.any((labels[0] == 0) & (labels[1] == 0)), "an epsilon arc is left"
        np.testing.assert_allclose(
            float(sj.tot_score(result, semiring)),
            float(sj.tot_score(fsa, semiring)),
            rtol=1e-9,
            atol=1e-9,
        )
        theirs = pynini.rmepsilon(pynini_of(data, arc_type))
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-5, atol=1e-5
        )


def test_remove_epsilon_of_a_wide_fsa_matches_openfst():
    # 300 states: the pair graph reaches its 300 (p, p) pairs through a tree
    # of several layers, and epsilon closures overlap over many levels.
    rng = np.random.default_rng(7)
    num_states = 300
    src = rng.integers(0, num_states - 1, 1200)
    dst = np.minimum(src + 1 + rng.integers(0, 6, src.size), num_states - 1)
    labels = np.where(rng.random(src.size) < 0.4, 0, rng.integers(1, 9, src.size))
    arcs = [
        (int(s), int(d), int(x), int(x), float(w))
        for s, d, x, w in zip(src, dst, labels, rng.normal(size=src.size))
    ]
    arcs += [(i, i + 1, 1, 1, 0.0) for i in range(num_states - 1)]
    data = (num_states, arcs, {num_states - 1: 0.0, num_states // 2: -1.0})
    fsa = build(data)
    for arc_type, semiring in (("log", sj.LOG), ("tropical", sj.TROPICAL)):
        result = sj.remove_epsilon(fsa, semiring)
        assert not np.any((np.asarray(result.ilabel) == 0) & (np.asarray(result.olabel) == 0))
        theirs = pynini.rmepsilon(pynini_of(data, arc_type))
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-6
        )


def test_remove_epsilon_gradients_batches_and_cycles():
    a = build(
        (
            4,
            [
                (0, 1, 0, 0, 0.3),
                (0, 2, 0, 0, -0.1),
                (1, 2, 0, 0, 0.2),
                (2, 3, 5, 5, 0.4),
                (1, 3, 6, 6, -0.3),
            ],
            {3: 0.1, 2: -0.5},
        )
    )
    check_grads(
        lambda w, f: sj.tot_score(sj.remove_epsilon(a.replace(weight=w, final_weight=f))),
        (a.weight, a.final_weight),
        order=1,
        modes=("rev",),
    )
    b = build((2, [(0, 1, 0, 0, 0.5), (1, 1, 3, 3, -1.0)], {1: 0.0}))  # cyclic, epsilon-free loop
    assert sj.remove_epsilon(b).cycle
    batch = sj.stack([a, sj.connect(a)])
    np.testing.assert_allclose(
        sj.tot_score(sj.remove_epsilon(batch)), [float(sj.tot_score(a))] * 2, rtol=1e-12
    )
    with pytest.raises(ValueError, match="cycle of epsilon arcs"):
        sj.remove_epsilon(build((2, [(0, 1, 0, 0, 0.0), (1, 0, 0, 0, 0.0)], {1: 0.0})))


@SETTINGS
@given(data=acyclic_fsas(weights=FINITE))
def test_determinize_matches_openfst(data):
    fsa = build(data, transducer=False)
    data = as_data(fsa)
    for arc_type, semiring in (("log", sj.LOG), ("tropical", sj.TROPICAL)):
        result = sj.determinize(fsa, semiring)
        src, label = np.asarray(result.src), np.asarray(result.label)
        assert len(set(zip(src.tolist(), label.tolist()))) == src.size, "not deterministic"
        np.testing.assert_allclose(
            float(sj.tot_score(result, semiring)),
            float(sj.tot_score(fsa, semiring)),
            rtol=1e-9,
            atol=1e-9,
        )
        theirs = pynini.determinize(pynini_of(data, arc_type), delta=1e-9)
        np.testing.assert_allclose(
            ours_total(result, arc_type), openfst_total(theirs, arc_type), rtol=1e-5, atol=1e-5
        )
        assert result.num_states >= min(theirs.num_states(), 1)


# A user's semiring that declares LOG's arithmetic takes the host path too.
LOG_LIKE = sj.Semiring(
    name="log_like",
    plus=sj.LOG.plus,
    times=sj.LOG.times,
    sum=sj.LOG.sum,
    zero=-np.inf,
    one=0.0,
    sum_grad=sj.LOG.sum_grad,
    arithmetic="log",
)


@SETTINGS
@given(
    data=acyclic_fsas(weights=st.one_of(st.integers(-2, 2).map(float), FINITE, st.just(-np.inf)))
)
def test_determinize_weights_on_host_equal_the_traced_ones(data):
    # Ties and zeros included; a user's log-like semiring takes the host path.
    fsa = build(data, transducer=False)
    _host_and_traced_agree(sj.determinize, fsa, (sj.LOG, sj.TROPICAL, LOG_LIKE))


def test_determinize_keeps_each_strings_weight():
    # Two paths for "5 6" (LOG: their log-sum), one for "5 7".
    fsa = build(
        (
            5,
            [
                (0, 1, 5, 5, 0.5),
                (0, 2, 5, 5, 1.0),
                (1, 3, 6, 6, 0.0),
                (2, 3, 6, 6, 0.2),
                (2, 4, 7, 7, -0.3),
            ],
            {3: 0.0, 4: 0.1},
        ),
        transducer=False,
    )
    result = sj.determinize(fsa)
    for labels, want in [((5, 6), np.logaddexp(0.5, 1.2)), ((5, 7), 0.8)]:
        linear = sj.linear_fsa(list(labels), dtype=np.float64)
        np.testing.assert_allclose(
            float(sj.tot_score(sj.intersect(result, linear))), want, rtol=1e-12
        )
    check_grads(
        lambda w: sj.tot_score(sj.determinize(fsa.replace(weight=w))),
        (fsa.weight,),
        order=1,
        modes=("rev",),
    )
    with pytest.raises(ValueError, match="max_states = 3"):
        sj.determinize(fsa, max_states=3)
    with pytest.raises(ValueError, match="takes an acceptor"):
        sj.determinize(build((2, [(0, 1, 1, 2, 0.0)], {1: 0.0})))


def test_compose_by_waves_equals_the_per_state_loop(monkeypatch):
    # The wave-by-wave composition and the per-state loop (which serves
    # pair spaces too large to index densely) build the same result.
    from semiring_jax._src.structural.host import pairing as host_compose

    rng = np.random.default_rng(5)
    for _ in range(20):
        operands = []
        for transducer in (True, False):
            num_states = int(rng.integers(1, 6))
            arcs = [
                (
                    int(rng.integers(num_states)),
                    int(rng.integers(num_states)),
                    int(rng.integers(3)),
                    int(rng.integers(3)),
                    float(rng.normal()),
                )
                for _ in range(int(rng.integers(0, 10)))
            ]
            final = {int(s): 0.0 for s in rng.choice(num_states, 2)}
            operands.append(build((num_states, arcs, final), transducer=transducer))
        by_waves = sj.compose(*operands)
        monkeypatch.setattr(host_compose, "_DENSE_PAIRS", 0)
        by_loop = sj.compose(*operands)
        monkeypatch.undo()
        for field in ("src", "dst", "ilabel", "olabel", "weight", "final_weight"):
            np.testing.assert_array_equal(getattr(by_waves, field), getattr(by_loop, field))


def _dense_operand(num_states, per_state, seed):
    """An acceptor with `per_state` arcs labelled 1 out of every state, all final."""
    rng = np.random.default_rng(seed)
    src = np.repeat(np.arange(num_states), per_state)
    dst = rng.integers(0, num_states, src.size)
    arcs = np.stack([src, dst, np.ones(src.size), np.zeros(src.size)], axis=1)
    return sj.Fsa.from_arcs(arcs, final=list(range(num_states)), dtype=np.float32)


@pytest.mark.parametrize("path", ["waves", "loop"])
def test_compose_has_a_budget(monkeypatch, path):
    # The case (1,000 states, 10 arcs per state on label 1, more
    # than 4 GB before) stops at the default budget of arcs, with little
    # memory taken; a budget of states is kept too, on both paths.
    from semiring_jax._src.structural.host import pairing as host_compose

    if path == "loop":
        monkeypatch.setattr(host_compose, "_DENSE_PAIRS", 0)
        big = _dense_operand(100, 10, 0)  # the loop is slow: the same shape, smaller
        with pytest.raises(ValueError, match=r"compose: more than max_arcs = 5000 arcs"):
            sj.compose(big, big, max_arcs=5000)
    else:
        big = _dense_operand(1000, 10, 0)
        with pytest.raises(
            ValueError,
            match=r"compose: more than max_arcs = 10000000 arcs \(built before trimming\); "
            r".* pass a larger max_arcs= to allow more",
        ):
            sj.compose(big, big)
    small = _dense_operand(20, 2, 1)
    with pytest.raises(ValueError, match=r"compose: more than max_states = 5 pair states"):
        sj.compose(small, small, max_states=5)
    with pytest.raises(ValueError, match=r"intersect: more than max_arcs = 3 arcs"):
        sj.intersect(small, small, max_arcs=3)
    with pytest.raises(ValueError, match=r"compose: max_states must be a positive int, got 0"):
        sj.compose(small, small, max_states=0)
    full = sj.compose(small, small)
    within = sj.compose(small, small, max_states=full.num_states * 2, max_arcs=10_000)
    np.testing.assert_array_equal(within.src, full.src)


def test_compose_waves_in_chunks_build_the_same_result(monkeypatch):
    # A wave of pair states is expanded a chunk at a time (so that memory
    # stays bounded); chunks of one state give the same result.
    from semiring_jax._src.structural.host import pairing as host_compose

    a, b = _dense_operand(30, 3, 2), _dense_operand(30, 3, 3)
    whole = sj.compose(a, b)
    monkeypatch.setattr(host_compose, "_CHUNK", 1)
    chunked = sj.compose(a, b)
    for field in ("src", "dst", "ilabel", "olabel", "weight", "final_weight"):
        np.testing.assert_array_equal(getattr(chunked, field), getattr(whole, field))


def test_final_weight_gradient_through_closure_and_intersect():
    # The case: a traced final_weight used to make every state a
    # final candidate, so the closure got an epsilon loop at its old start
    # and the intersection a cycle that tot_score refuses.
    fsa = sj.Fsa.from_k2("0 1 1 0.1\n1 2 2 0.2\n2 3 -1 0.3\n3\n", dtype="float64")
    four = sj.linear_fsa([1, 2, 1, 2], dtype="float64")

    def total(final_weight):
        return sj.tot_score(sj.intersect(sj.closure(fsa.replace(final_weight=final_weight)), four))

    np.testing.assert_allclose(jax.grad(total)(fsa.final_weight), [0.0, 0.0, 2.0])  # stops twice
    # Values at non-final states are ignored, finite or not.
    finite = jnp.array([0.7, -0.4, 0.3])
    np.testing.assert_allclose(total(finite), sj.tot_score(sj.intersect(sj.closure(fsa), four)))
    check_grads(total, (finite,), order=1, modes=("rev",))


# Final at states 1-3; state 4 is not final (and unreachable). Label 0 is
# an epsilon for remove_epsilon and compose, an ordinary label elsewhere.
FINALS_A = build(
    (5, [(0, 1, 1, 1, 0.1), (0, 2, 2, 2, -0.3), (1, 2, 0, 0, 0.2), (1, 3, 2, 2, 0.4),
         (2, 3, 1, 1, -0.1), (4, 3, 1, 1, 0.3)], {1: 0.5, 2: 0.3, 3: -0.2}),
    transducer=False,
)  # fmt: skip
FINALS_B = build(
    (3, [(0, 1, 1, 1, -0.4), (0, 1, 2, 2, 0.6), (1, 2, 1, 1, 0.0)], {1: 0.1, 2: 0.0}),
    transducer=False,
)
FINALS_T = build(
    (2, [(0, 1, 1, 5, 0.2), (0, 1, 2, 6, 0.1), (1, 1, 1, 5, -0.3), (1, 1, 2, 6, 0.0)],
     {0: -0.5, 1: 0.0}),
)  # fmt: skip
THREE = sj.linear_fsa([1, 2, 1], dtype=np.float64)
FINAL_WEIGHT_OPS = {
    "closure+intersect": lambda a, b: sj.intersect(sj.closure(a), THREE),
    # Both operands' finals: a's through two compositions, b's as the second.
    "compose": lambda a, b: sj.compose(sj.invert(sj.compose(a, FINALS_T)), b),
    "union": sj.union,
    "concat": sj.concat,
    "reverse": lambda a, b: sj.reverse(a),
    "connect": lambda a, b: sj.connect(a),
    "determinize": lambda a, b: sj.determinize(a),
    "remove_epsilon": lambda a, b: sj.remove_epsilon(a),
    "invert": lambda a, b: sj.invert(a),
    "project": lambda a, b: sj.project(a, "output"),
    "arc_sort": lambda a, b: sj.arc_sort(a),
    "top_sort": lambda a, b: sj.top_sort(a),
}


@pytest.mark.parametrize("name", FINAL_WEIGHT_OPS)
def test_final_weight_gradients_reach_through_structural_ops(name):
    """Replacing final_weight, traced or not, keeps which states are final:
    the result's structure is the one built from the Fsas as they are, and
    the gradient with respect to every operand's final weights matches
    finite differences. Non-final states hold finite values, to be ignored."""
    op = FINAL_WEIGHT_OPS[name]
    structure = lambda fsa: (fsa.num_states, fsa.num_arcs, np.asarray(fsa.final_mask).tolist())
    expected = structure(op(FINALS_A, FINALS_B))
    final_a = jnp.array([0.9, 0.5, 0.3, -0.2, 1.5])
    final_b = jnp.array([-0.7, 0.1, 0.0])

    def total(fa, fb):
        result = op(FINALS_A.replace(final_weight=fa), FINALS_B.replace(final_weight=fb))
        assert structure(result) == expected
        return sj.tot_score(result)

    np.testing.assert_allclose(
        total(final_a, final_b), sj.tot_score(op(FINALS_A, FINALS_B)), rtol=1e-12
    )
    grads = jax.grad(total, argnums=(0, 1))(final_a, final_b)
    assert np.asarray(grads[0])[[0, 4]].tolist() == [0.0, 0.0]  # not final: ignored
    assert np.asarray(grads[1])[0] == 0.0
    check_grads(total, (final_a, final_b), order=1, modes=("rev",))


def test_final_weight_gradients_reach_through_best_path_and_intersect_dense():
    final_a = jnp.array([0.9, 0.5, 0.3, -0.2, 1.5])
    # best_path: its one final state carries the input's final weight.
    through_path = jax.grad(
        lambda f: sj.tot_score(sj.best_path(FINALS_A.replace(final_weight=f)), sj.TROPICAL)
    )(final_a)
    direct = jax.grad(lambda f: sj.tot_score(FINALS_A.replace(final_weight=f), sj.TROPICAL))(
        final_a
    )
    np.testing.assert_array_equal(through_path, direct)
    assert np.asarray(direct).sum() == 1.0
    path = sj.best_path(FINALS_A)
    assert np.asarray(path.final_mask).sum() == 1  # only where the path stops
    # intersect_dense: the lattice's final states are the graph's.
    emissions = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 3)))
    final_b = jnp.array([-0.7, 0.1, 0.0])

    def lattice_total(f):
        lattice = sj.intersect_dense(FINALS_B.replace(final_weight=f), emissions)
        return sj.tot_score(lattice).sum()

    dense = lambda f: sj.dense_tot_score(FINALS_B.replace(final_weight=f), emissions).sum()
    np.testing.assert_allclose(
        jax.grad(lattice_total)(final_b), jax.grad(dense)(final_b), rtol=1e-10, atol=1e-12
    )
    assert jax.grad(dense)(final_b)[0] == 0.0  # state 0 is not final
    check_grads(lattice_total, (final_b,), order=1, modes=("rev",))


def test_replace_keeps_the_final_states_and_final_mask_changes_them():
    fsa = sj.Fsa.from_arcs([(0, 1, 1, 0.5), (1, 2, 2, 0.25)], final={1: -1.0, 2: 0.0})
    # A -inf final weight keeps the state final (with weight zero), as a
    # -inf arc weight keeps the arc; a value at a non-final state is ignored.
    replaced = fsa.replace(final_weight=np.array([3.0, -np.inf, 0.0], np.float32))
    np.testing.assert_array_equal(replaced.final_mask, [False, True, True])
    np.testing.assert_allclose(sj.tot_score(replaced), 0.75)
    assert sj.connect(replaced).num_states == 3
    assert sj.closure(replaced).num_arcs == fsa.num_arcs + 3  # eps arcs from both finals
    assert "0\t3.0" not in replaced.to_openfst()  # a non-final state is written as such
    # Changing which states are final is a replace of final_mask.
    only_start = fsa.replace(final_mask=np.array([True, False, False]))
    np.testing.assert_allclose(sj.tot_score(only_start), -np.inf)  # final weight -inf
    np.testing.assert_allclose(
        sj.tot_score(only_start.replace(final_weight=np.zeros(3, np.float32))), 0.0
    )
    assert sj.connect(only_start).num_states == 1
    with pytest.raises(ValueError, match="replace: final_mask must be bool"):
        fsa.replace(final_mask=np.ones(3, np.int32))
    with pytest.raises(ValueError, match=r"replace: final_mask must have shape \[..., S\]"):
        fsa.replace(final_mask=np.ones(2, bool))
    # from_arcs: a state named in `final` is final, weight -inf included.
    named = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final={1: -np.inf})
    np.testing.assert_array_equal(named.final_mask, [False, True])
