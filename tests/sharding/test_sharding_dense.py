"""Score ops and losses on a batch sharded over 4 devices match one device, and stay sharded.

XLA fixes the device count when jax is imported, so the checks run in a
subprocess with 4 host CPU devices (`python tests/dense/test_sharding.py`); the
rest of the suite keeps one device. Each check compares values and gradients
with the unsharded computation, asserts that outputs are split by batch
(B/4 rows per device), and that the compiled program has no collective: a
per-sequence op never needs another sequence's data.
"""

import os
import subprocess
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import semiring_jax as sj

NUM_DEVICES = 4
B, T, V = 8, 12, 6
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def test_sharded_batch_matches_one_device():
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={NUM_DEVICES}",
        "JAX_PLATFORMS": "cpu",
    }
    run = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300
    )
    if run.returncode != 0:
        pytest.fail(f"sharding checks failed:\n{run.stdout}\n{run.stderr}")


# -- the checks, run in the subprocess --------------------------------------


def _random_dag(rng: np.random.Generator) -> sj.Fsa:
    """An acyclic Fsa with a chain 0 -> ... -> n-1 plus random skip arcs."""
    num_states = int(rng.integers(2, 7))
    arcs = [(i, i + 1, int(rng.integers(1, V)), float(rng.normal())) for i in range(num_states - 1)]
    for _ in range(int(rng.integers(0, 6))):
        src, dst = sorted(rng.choice(num_states, 2, replace=False).tolist())
        arcs.append((src, dst, int(rng.integers(1, V)), float(rng.normal())))
    return sj.Fsa.from_arcs(arcs, final={num_states - 1: float(rng.normal())})


def _random_loop_chain(rng: np.random.Generator) -> sj.Fsa:
    """A cyclic Fsa: a chain of 2-5 labels, each state with a self-loop."""
    num_states = int(rng.integers(2, 6))
    arcs = []
    for i in range(num_states - 1):
        arcs.append((i, i + 1, int(rng.integers(1, V)), float(rng.normal())))
        arcs.append((i + 1, i + 1, int(rng.integers(0, V)), float(rng.normal())))
    return sj.Fsa.from_arcs(arcs, final=[num_states - 1])


def _assert_close(name, sharded, single):
    np.testing.assert_allclose(
        np.asarray(sharded),
        np.asarray(single),
        rtol=1e-5,
        atol=1e-5,
        err_msg=f"{name}: sharded result differs from one device",
    )


def _assert_batch_sharded(name, out):
    assert not out.sharding.is_fully_replicated, (
        f"{name}: output is fully replicated ({out.sharding}); expected split by batch"
    )
    shard_rows = sorted(shard.data.shape[0] for shard in out.addressable_shards)
    assert shard_rows == [B // NUM_DEVICES] * NUM_DEVICES, (
        f"{name}: output shards have {shard_rows} rows; expected {B // NUM_DEVICES} "
        f"on each of {NUM_DEVICES} devices"
    )


def _assert_no_collectives(name, jitted, *args):
    hlo = jitted.lower(*args).compile().as_text()
    found = [op for op in COLLECTIVES if op in hlo]
    assert not found, (
        f"{name}: the compiled program moves data between devices ({found}); "
        f"a per-sequence op should not"
    )


def _compare(name, fn, args, sharded_args, grad_argnums):
    """fn(*args) and its gradients, on one device and on sharded inputs."""
    value = jax.jit(fn)
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=grad_argnums))
    for label, jitted in [("value", value), ("grad", grad)]:
        single = jitted(*args)
        sharded = jitted(*sharded_args)
        for i, (out_sharded, out_single) in enumerate(
            zip(jax.tree.leaves(sharded), jax.tree.leaves(single))
        ):
            _assert_close(f"{name} {label}[{i}]", out_sharded, out_single)
            _assert_batch_sharded(f"{name} {label}[{i}]", out_sharded)
        _assert_no_collectives(f"{name} {label}", jitted, *sharded_args)


def _ctc_inputs(rng: np.random.Generator):
    log_probs = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32))
    input_lengths = rng.integers(T - 4, T + 1, B).astype(np.int32)
    label_lengths = rng.integers(1, 5, B).astype(np.int32)
    labels = rng.integers(1, V, (B, 4)).astype(np.int32)
    return log_probs, jnp.asarray(input_lengths), jnp.asarray(labels), jnp.asarray(label_lengths)


def check_tot_score(mesh, rng):
    batch = sj.stack([_random_dag(rng) for _ in range(B)])
    sharded = jax.device_put(batch, NamedSharding(mesh, P("batch")))
    _compare(
        "tot_score",
        lambda weight, fsa: sj.tot_score(fsa.replace(weight=weight)),
        (batch.weight, batch),
        (sharded.weight, sharded),
        0,
    )


def check_dense_shared_graph(mesh, rng):
    graph = _random_loop_chain(rng)
    emissions = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
    lengths = jnp.asarray(rng.integers(T - 4, T + 1, B), jnp.int32)
    batch_sharding = NamedSharding(mesh, P("batch"))

    def score(emissions, lengths):
        return sj.dense_tot_score(graph, emissions, lengths)

    _compare(
        "dense_tot_score (shared graph)",
        score,
        (emissions, lengths),
        jax.device_put((emissions, lengths), batch_sharding),
        0,
    )

    mapped = jax.jit(
        jax.shard_map(score, mesh=mesh, in_specs=(P("batch"), P("batch")), out_specs=P("batch"))
    )
    _assert_close(
        "dense_tot_score (shared graph) in shard_map",
        mapped(emissions, lengths),
        score(emissions, lengths),
    )
    grad = jax.grad(lambda e: jnp.sum(mapped(e, lengths)))(emissions)
    _assert_close(
        "dense_tot_score (shared graph) in shard_map, grad",
        grad,
        jax.grad(lambda e: jnp.sum(score(e, lengths)))(emissions),
    )


def check_dense_batched_graph(mesh, rng):
    graphs = sj.stack([_random_loop_chain(rng) for _ in range(B)])
    emissions = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
    lengths = jnp.asarray(rng.integers(T - 4, T + 1, B), jnp.int32)

    def score(emissions, weight, graphs, lengths):
        return sj.dense_tot_score(graphs.replace(weight=weight), emissions, lengths)

    args = (emissions, graphs.weight, graphs, lengths)
    _compare(
        "dense_tot_score (batched graph)",
        score,
        args,
        jax.device_put(args, NamedSharding(mesh, P("batch"))),
        (0, 1),
    )

    mapped = jax.jit(jax.shard_map(score, mesh=mesh, in_specs=P("batch"), out_specs=P("batch")))
    _assert_close("dense_tot_score (batched graph) in shard_map", mapped(*args), score(*args))
    grads = jax.grad(lambda *a: jnp.sum(mapped(*a)), argnums=(0, 1))(*args)
    expected = jax.grad(lambda *a: jnp.sum(score(*a)), argnums=(0, 1))(*args)
    for name, got, want in zip(["emissions", "weight"], grads, expected):
        _assert_close(f"dense_tot_score (batched graph) in shard_map, grad {name}", got, want)


def check_ctc_loss(mesh, rng):
    args = _ctc_inputs(rng)
    _compare(
        "ctc_loss", sj.ctc_loss, args, jax.device_put(args, NamedSharding(mesh, P("batch"))), 0
    )

    mapped = jax.jit(
        jax.shard_map(sj.ctc_loss, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    )
    _assert_close("ctc_loss in shard_map", mapped(*args), sj.ctc_loss(*args))
    grad = jax.grad(lambda lp: jnp.sum(mapped(lp, *args[1:])))(args[0])
    _assert_close(
        "ctc_loss in shard_map, grad",
        grad,
        jax.grad(lambda lp: jnp.sum(sj.ctc_loss(lp, *args[1:])))(args[0]),
    )


def check_rnnt_loss(mesh, rng):
    num_labels = 3
    args = (
        jnp.asarray(rng.normal(size=(B, T, num_labels + 1, V)), jnp.float32),
        jnp.asarray(rng.integers(T - 4, T + 1, B), jnp.int32),
        jnp.asarray(rng.integers(1, V, (B, num_labels)), jnp.int32),
        jnp.asarray(rng.integers(0, num_labels + 1, B), jnp.int32),
    )
    _compare(
        "rnnt_loss", sj.rnnt_loss, args, jax.device_put(args, NamedSharding(mesh, P("batch"))), 0
    )
    mapped = jax.jit(
        jax.shard_map(sj.rnnt_loss, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    )
    _assert_close("rnnt_loss in shard_map", mapped(*args), sj.rnnt_loss(*args))
    _assert_close(
        "rnnt_loss in shard_map, grad",
        jax.grad(lambda x: jnp.sum(mapped(x, *args[1:])))(args[0]),
        jax.grad(lambda x: jnp.sum(sj.rnnt_loss(x, *args[1:])))(args[0]),
    )


CHECKS = [
    check_tot_score,
    check_dense_shared_graph,
    check_dense_batched_graph,
    check_ctc_loss,
    check_rnnt_loss,
]


def main(names) -> int:
    # As strict as tests/conftest.py; x64 stays off, as in most training runs.
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    if jax.device_count() != NUM_DEVICES:
        print(
            f"FAIL: expected {NUM_DEVICES} devices, got {jax.devices()}; run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={NUM_DEVICES}"
        )
        return 1
    mesh = Mesh(jax.devices(), ("batch",))
    failures = 0
    for check in CHECKS:
        if names and check.__name__ not in names:
            continue
        try:
            check(mesh, np.random.default_rng(0))
            print(f"ok    {check.__name__}")
        except Exception:  # report every check, not just the first failure
            failures += 1
            print(f"FAIL  {check.__name__}\n{traceback.format_exc()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
