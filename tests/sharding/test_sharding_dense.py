"""The dense ops, CTC and LF-MMI on a sharded batch.

Covered (traced, per utterance): dense_tot_score (a graph shared by the
batch, and one graph per utterance), viterbi_decode, dense_occupancy,
intersect_dense (the lattice's arrays; its structure and lengths are
concrete, built on the host; not inside `jax.shard_map`, where a device
would need its own part of them), ctc_loss, forced_align, mmi_loss. Each runs
through `harness.check_op`: explicit- and auto-axis meshes, `jax.set_mesh`,
and `jax.shard_map`, value and gradient equal to one device, outputs split
by batch, no collective. A graph shared by the batch is closed over
(replicated); the gradient is taken with respect to the per-utterance
inputs, as a shared graph's weight gradient is a sum over the batch.
Left out: ctc_graph, ctc_topo, numerator_graphs, denominator_graph build
graphs on the host; intersect_dense_pruned searches on the host.
"""

import contextlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import semiring_jax as sj
from semiring_jax._src.core import routes
from tests.sharding.harness import (
    CONDITION,
    B,
    assert_close,
    check_op,
    main,
    meshes,
    run_in_subprocess,
)

T, V = 12, 6


# Two processes, each within run_in_subprocess's timeout on a loaded
# machine (the second derivatives of dense_occupancy take the most time).
@pytest.mark.parametrize("part", ["shared graph", "batched graph and the rest"])
def test_dense_ops_on_a_sharded_batch(part):
    names = [check.__name__ for check in CHECKS]
    split = names.index("check_dense_batched_graph")
    chosen = names[:split] if part == "shared graph" else names[split:]
    run_in_subprocess("tests.sharding.test_sharding_dense", *chosen)


def _random_loop_chain(rng: np.random.Generator) -> sj.Fsa:
    """A cyclic Fsa: a chain of 2-5 labels, each state with a self-loop."""
    num_states = int(rng.integers(2, 6))
    arcs = []
    for i in range(num_states - 1):
        arcs.append((i, i + 1, int(rng.integers(1, V)), float(rng.normal())))
        arcs.append((i + 1, i + 1, int(rng.integers(0, V)), float(rng.normal())))
    return sj.Fsa.from_arcs(arcs, final=[num_states - 1])


def _emissions(rng: np.random.Generator) -> tuple[jax.Array, jax.Array]:
    emissions = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32))
    return emissions, jnp.asarray(rng.integers(T - 4, T + 1, B), jnp.int32)


def check_dense_shared_graph(rng):
    graph = _random_loop_chain(rng)
    args = _emissions(rng)
    for name, op in [
        ("dense_tot_score (shared graph)", sj.dense_tot_score),
        ("viterbi_decode", sj.viterbi_decode),
        ("dense_occupancy", sj.dense_occupancy),
    ]:
        check_op(
            name,
            lambda e, n, op=op: op(graph, e, n),
            args,
            diff=(0,),
            auto_mesh_collectives=CONDITION,
        )


def check_route_ignores_the_device_count(rng):
    """With several devices an unsharded call runs the route one device
    runs (the CPU kernel, where built), and a sharded one its values."""
    graph = _random_loop_chain(rng)
    emissions, lengths = _emissions(rng)
    step = jax.jit(lambda e, n: sj.dense_tot_score(graph, e, n))
    text = step.lower(emissions, lengths).compile().as_text()
    uses_kernel = "semiring_jax_dense_log_total" in text
    assert uses_kernel == routes.kernels_available(), "the unsharded call changed route"
    want = step(emissions, lengths)
    for kind, mesh in meshes().items():
        placed = jax.device_put((emissions, lengths), NamedSharding(mesh, P("batch")))
        assert_close(f"dense_tot_score ({kind} mesh)", step(*placed), want)


def check_shared_graph_gradient(rng):
    """The gradient with respect to a graph shared by the batch sums over
    the utterances: the one collective it needs, and one device's value."""
    graph = _random_loop_chain(rng)
    emissions, lengths = _emissions(rng)
    weights = jnp.arange(B, dtype=jnp.float32)  # a cotangent per utterance

    def grads(weight, emissions, lengths):
        def loss(weight, emissions):
            scores = sj.dense_tot_score(graph.replace(weight=weight), emissions, lengths)
            return jnp.sum(scores * weights)

        return jax.grad(loss, argnums=(0, 1))(weight, emissions)

    want = jax.jit(grads)(graph.weight, emissions, lengths)
    for kind, mesh in meshes().items():
        placed = jax.device_put((emissions, lengths), NamedSharding(mesh, P("batch")))
        for context in [contextlib.nullcontext(), jax.set_mesh(mesh)]:
            with context:
                got = jax.jit(grads)(graph.weight, *placed)
            # outputs: 0 the graph's weight, 1 the emissions
            assert_close(f"shared graph gradient ({kind} mesh, {context})", got, want)


def check_dense_batched_graph(rng):
    graphs = sj.stack([_random_loop_chain(rng) for _ in range(B)])
    emissions, lengths = _emissions(rng)
    for name, op in [
        ("dense_tot_score (batched graph)", sj.dense_tot_score),
        ("viterbi_decode (batched graph)", sj.viterbi_decode),
        ("dense_occupancy (batched graph)", sj.dense_occupancy),
    ]:
        check_op(
            name,
            lambda e, w, g, n, op=op: op(g.replace(weight=w), e, n),
            (emissions, graphs.weight, graphs, lengths),
            diff=(0, 1),
            auto_mesh_collectives=CONDITION,
        )


def check_intersect_dense(rng):
    graph = _random_loop_chain(rng)
    emissions, lengths = _emissions(rng)
    lengths = np.asarray(lengths)  # concrete: it decides the lattice's structure
    check_op(
        "intersect_dense",
        lambda e: sj.intersect_dense(graph, e, lengths),
        (emissions,),
        diff=(0,),
        score=sj.tot_score,
        # The final weights are the graph's, constants XLA may replicate.
        data=lambda lattice: lattice.weight,
        shard_map=False,  # the lengths, concrete, are the whole batch's
    )


def _ctc_inputs(rng: np.random.Generator):
    log_probs, input_lengths = _emissions(rng)
    label_lengths = rng.integers(1, 5, B).astype(np.int32)
    labels = rng.integers(1, V, (B, 4)).astype(np.int32)
    return log_probs, input_lengths, jnp.asarray(labels), jnp.asarray(label_lengths)


def check_ctc(rng):
    args = _ctc_inputs(rng)
    check_op("ctc_loss", sj.ctc_loss, args, diff=(0,), mixed=True)
    check_op("forced_align", sj.forced_align, args, diff=(0,))


def check_mmi_loss(rng):
    topo = sj.hmm_topo(V // 2, pdfs_per_phone=2)
    phones = [rng.integers(1, V // 2 + 1, 3).tolist() for _ in range(B)]
    den = sj.denominator_graph(sj.ngram_fsa(phones, num_symbols=V // 2), topo)
    num = sj.numerator_graphs(phones, None, topo)
    log_probs, lengths = _emissions(rng)
    for name, kwargs in [("mmi_loss", {}), ("mmi_loss leaky", {"leaky_hmm": 0.1})]:
        check_op(
            name,
            lambda x, g, n, kwargs=kwargs: sj.mmi_loss(g, den, x, n, **kwargs),
            (log_probs, num, lengths),
            diff=(0,),
            mixed=True,
            auto_mesh_collectives=CONDITION,
        )


CHECKS = [
    check_route_ignores_the_device_count,
    check_dense_shared_graph,
    check_shared_graph_gradient,
    check_dense_batched_graph,
    check_intersect_dense,
    check_ctc,
    check_mmi_loss,
]

if __name__ == "__main__":
    sys.exit(main(CHECKS, sys.argv[1:]))
