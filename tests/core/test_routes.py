"""Routes: one jitted function lowers for CPU, GPU and TPU from this host,
each platform on its own route; `force` pins routes; the records hold."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import semiring_jax as sj
from semiring_jax._src.core import route_table, routes

LOG_PROBS = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (2, 6, 4), jnp.float32))
LOGITS = jax.random.normal(jax.random.key(1), (2, 5, 3, 4), jnp.float32)
LATTICE = sj.Fsa.from_arcs([(0, 1, 5, 0.5), (0, 1, 6, 1.0), (1, 2, 3, 0.2)], final=[2])
LOOP = sj.Fsa.from_arcs([(0, 0, 1, 0.0), (0, 1, 2, 0.0), (1, 1, 3, 0.0)], final=[1])
NUMS = sj.stack([sj.Fsa.from_arcs([(0, 1, 1, 0.0), (1, 1, 1, 0.0), (1, 2, 2, 0.0)], final=[2])] * 2)
LENGTHS = jnp.array([6, 5])

# Each routed op, as (function of one float array, that array), whose
# value and gradient are lowered.
OPS = {
    "ctc_loss": (
        lambda x: sj.ctc_loss(x, LENGTHS, jnp.array([[1, 2], [3, 0]]), jnp.array([2, 1])).sum(),
        LOG_PROBS,
    ),
    "rnnt_loss": (
        lambda x: sj.rnnt_loss(
            x, jnp.array([5, 4]), jnp.array([[1, 2], [3, 0]]), jnp.array([2, 1])
        ).sum(),
        LOGITS,
    ),
    "tot_score": (lambda w: sj.tot_score(LATTICE.replace(weight=w)), LATTICE.weight),
    "kbest_scores": (lambda w: sj.kbest_scores(LATTICE.replace(weight=w), 2).sum(), LATTICE.weight),
    "entropy": (lambda w: sj.entropy(LATTICE.replace(weight=w)), LATTICE.weight),
    "dense_tot_score": (lambda x: sj.dense_tot_score(LOOP, x).sum(), LOG_PROBS),
    "viterbi_decode": (lambda x: sj.viterbi_decode(LOOP, x)[1].sum(), LOG_PROBS),
    "mmi_loss": (lambda x: sj.mmi_loss(NUMS, LOOP, x, LENGTHS).sum(), LOG_PROBS),
    "mmi_loss leaky": (
        lambda x: sj.mmi_loss(NUMS, LOOP, x, LENGTHS, leaky_hmm=0.1).sum(),
        LOG_PROBS,
    ),
}


def _lowered(fn, x, platform: str) -> str:
    step = jax.jit(jax.value_and_grad(fn))
    return step.trace(x).lower(lowering_platforms=(platform,)).as_text()


def _kernel_calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if "custom_call @semiring_jax_" in line]


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_platform_lowers_its_own_route(name):
    fn, x = OPS[name]
    for platform in ("tpu", "cuda"):
        assert not _kernel_calls(_lowered(fn, x, platform)), f"{name}: a CPU kernel on {platform}"
    if routes.kernels_available():
        assert _kernel_calls(_lowered(fn, x, "cpu")), f"{name}: no CPU kernel on the CPU"


def test_forcing_the_portable_routes_runs_them_with_the_same_results():
    fn, x = OPS["ctc_loss"]
    value, grad = jax.jit(jax.value_and_grad(fn))(x)
    with sj.routes.force("portable"):
        assert not _kernel_calls(_lowered(fn, x, "cpu"))
        portable = jax.jit(jax.value_and_grad(fn))(x)
    np.testing.assert_allclose(portable[0], value, rtol=1e-5)
    np.testing.assert_allclose(portable[1], grad, rtol=1e-4, atol=1e-6)
    assert routes.forced() == {}


def test_forcing_one_op_leaves_the_others():
    with sj.routes.force({"dense_tot_score": "frame_scan"}):
        assert routes.choose(route_table.DENSE_TOT_SCORE, np.float32, "log") == dict.fromkeys(
            routes.EVERY, "frame_scan"
        )
        chosen = routes.choose(route_table.CTC_LOSS, np.float32, "log")
        assert chosen["tpu"] == "frame_scan"
        if routes.kernels_available():
            assert chosen["cpu"] == "cpu_kernel"


def test_the_cpu_runs_the_first_route_that_serves():
    chosen = routes.choose(route_table.DENSE_TOT_SCORE, np.float32, "tropical")
    assert chosen["tpu"] == chosen["cuda"] == "frame_scan"  # the arc scan is LOG's only
    assert chosen["cpu"] == ("cpu_kernel" if routes.kernels_available() else "frame_scan")
    # An int or float16 total has no kernel: the scans serve it everywhere.
    assert set(routes.choose(route_table.DENSE_TOT_SCORE, np.float16, "log").values()) == {
        "arc_scan"
    }


def test_forcing_names_what_is_wrong():
    with pytest.raises(ValueError, match="no op named 'dense'"), sj.routes.force({"dense": "x"}):
        pass
    with (
        pytest.raises(ValueError, match="dense_tot_score has no route 'scan'"),
        sj.routes.force({"dense_tot_score": "scan"}),
    ):
        pass
    graph = sj.Fsa.from_arcs([(0, 1, 1, 0.0)], final=[1])
    with (
        pytest.raises(ValueError, match="forced route 'arc_scan' does not serve"),
        sj.routes.force({"dense_tot_score": "arc_scan"}),
    ):
        sj.dense_tot_score(graph, LOG_PROBS[:, :, :2], semiring=sj.TROPICAL)


def test_every_record_names_its_reference_and_a_portable_route():
    for op in route_table.RECORDS:
        assert op.reference in op.names, op.name
        assert any(route.portable for route in op.routes), op.name
        assert len(set(op.names)) == len(op.names), op.name


def test_table_lists_every_route_once():
    rows = sj.routes.table()
    assert len(rows) == sum(len(op.routes) for op in route_table.RECORDS)
    assert {(row.op, row.route) for row in rows} == {
        (op.name, route.name) for op in route_table.RECORDS for route in op.routes
    }
