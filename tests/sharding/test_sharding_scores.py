"""The score ops on Fsas, sampling, MWER and edit distance on a sharded batch.

Covered (traced, per utterance): tot_score, forward_scores, backward_scores,
arc_posteriors, best_path, kbest_scores, entropy, kl_divergence,
sample_paths, mwer_loss (with a key: the sampled paths; without one it
searches on the host), edit_distance. Each runs through `harness.check_op`:
explicit- and auto-axis meshes, `jax.set_mesh`, and `jax.shard_map`, value
and gradient equal to one device, outputs split by batch, no collective
(kbest_scores on the auto-axis mesh excepted: XLA gathers for its top_k).
Inside `jax.shard_map` sample_paths (and so mwer_loss with a key) splits
its key over the entries it sees, a device's B / n, so its draws differ
from one device's (pass each device its own key, e.g. folded with
`jax.lax.axis_index`); those two are checked on the meshes only.
Left out: nbest (and mwer_loss without a key) and intersect_dense_pruned
search on the host and refuse tracers; the structural ops (compose,
determinize, ...) build new structure on the host.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import semiring_jax as sj
from tests.sharding.harness import B, check_op, main, run_in_subprocess

V = 6


def test_score_ops_on_a_sharded_batch():
    run_in_subprocess("tests.sharding.test_sharding_scores")


def _random_dag(rng: np.random.Generator) -> sj.Fsa:
    """An acyclic Fsa with a chain 0 -> ... -> n-1 plus random skip arcs."""
    num_states = int(rng.integers(2, 7))
    arcs = [(i, i + 1, int(rng.integers(1, V)), float(rng.normal())) for i in range(num_states - 1)]
    for _ in range(int(rng.integers(0, 6))):
        src, dst = sorted(rng.choice(num_states, 2, replace=False).tolist())
        arcs.append((src, dst, int(rng.integers(1, V)), float(rng.normal())))
    return sj.Fsa.from_arcs(arcs, final={num_states - 1: float(rng.normal())})


def _dags(rng: np.random.Generator) -> sj.Fsa:
    return sj.stack([_random_dag(rng) for _ in range(B)])


def _with_weight(op):
    """op on fsa with its arc weights as a separate (differentiable) argument."""
    return lambda weight, fsa: op(fsa.replace(weight=weight))


def check_tot_score_and_friends(rng):
    fsas = _dags(rng)
    for name, op in [
        ("tot_score", sj.tot_score),
        ("forward_scores", sj.forward_scores),
        ("backward_scores", sj.backward_scores),
        ("arc_posteriors", sj.arc_posteriors),
        ("entropy", sj.entropy),
    ]:
        check_op(name, _with_weight(op), (fsas.weight, fsas), diff=(0,))
    # XLA does not split top_k along a batch an auto-axis mesh shards (a
    # sort would be, at 10-17x the scan's time); explicit meshes, JAX's
    # default, run each device's part alone.
    check_op(
        "kbest_scores",
        _with_weight(lambda fsa: sj.kbest_scores(fsa, 3)),
        (fsas.weight, fsas),
        diff=(0,),
        auto_mesh_collectives=("all-gather",),
    )


def check_best_path(rng):
    fsas = _dags(rng)
    check_op(
        "best_path",
        _with_weight(sj.best_path),
        (fsas.weight, fsas),
        diff=(0,),
        score=lambda path: sj.tot_score(path, sj.TROPICAL),
        data=lambda path: (path.weight, path.final_weight),
    )


def check_kl_divergence(rng):
    p = _dags(rng)
    q_weight = p.weight + jnp.asarray(rng.normal(size=p.weight.shape), p.weight.dtype)
    check_op(
        "kl_divergence",
        lambda p_weight, q_weight, fsa: sj.kl_divergence(
            fsa.replace(weight=p_weight), fsa.replace(weight=q_weight)
        ),
        (p.weight, q_weight, p),
        diff=(0, 1),
    )


def check_sample_paths(rng):
    fsas = _dags(rng)
    key = jax.random.key(3)
    check_op(
        "sample_paths",
        _with_weight(lambda fsa: sj.sample_paths(fsa, key, 3)),
        (fsas.weight, fsas),
        diff=(0,),
        score=lambda paths: jnp.sum(sj.tot_score(paths), axis=1),
        data=lambda paths: (paths.weight, paths.final_weight),
        shard_map=False,  # the key is split over the entries a call sees (module doc)
    )


def check_mwer_loss(rng):
    lattices = _dags(rng)
    ref = jnp.asarray(rng.integers(1, V, (B, 4)), jnp.int32)
    ref_lengths = jnp.asarray(rng.integers(0, 5, B), jnp.int32)
    key = jax.random.key(4)
    check_op(
        "mwer_loss (sampled paths)",
        lambda weight, lattice, ref, ref_lengths: sj.mwer_loss(
            lattice.replace(weight=weight), ref, ref_lengths, n=3, key=key
        ),
        (lattices.weight, lattices, ref, ref_lengths),
        diff=(0,),
        shard_map=False,  # as sample_paths
    )


def check_edit_distance(rng):
    hyp = jnp.asarray(rng.integers(1, V, (B, 5)), jnp.int32)
    ref = jnp.asarray(rng.integers(1, V, (B, 4)), jnp.int32)
    hyp_lengths = jnp.asarray(rng.integers(0, 6, B), jnp.int32)
    ref_lengths = jnp.asarray(rng.integers(0, 5, B), jnp.int32)
    check_op("edit_distance", sj.edit_distance, (hyp, hyp_lengths, ref, ref_lengths))


CHECKS = [
    check_tot_score_and_friends,
    check_best_path,
    check_kl_divergence,
    check_sample_paths,
    check_mwer_loss,
    check_edit_distance,
]

if __name__ == "__main__":
    sys.exit(main(CHECKS, sys.argv[1:]))
