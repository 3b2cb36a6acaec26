"""The transducer losses, pruning and alignment on a sharded batch.

Covered (traced, per utterance): rnnt_loss, rnnt_loss_simple,
rnnt_loss_smoothed, rnnt_prune_ranges, rnnt_prune, rnnt_loss_pruned, the
pruned pipeline (ranges from the simple loss, then the pruned loss), and
rnnt_align. Each runs through `harness.check_op`: explicit- and auto-axis
meshes, `jax.set_mesh`, and `jax.shard_map`, value and gradient equal to one
device, outputs split by batch, no collective (no gather of `lm` or of index
tables: each utterance's pruned window is built where it lives). But
rnnt_loss_smoothed's AM-only term reads a unigram averaged over the whole
batch (as k2's), so it needs one collective (an all-reduce of [V]); it must
still equal one device's (inside `jax.shard_map` the batch is the device's).
On an auto-axis mesh the simple loss (so also the smoothed loss, the prune
ranges and the pipeline) all-reduces one boolean: whether any node of the
batch needs the exact normaliser (`lax.cond`); no data moves.
"""

import sys

import jax.numpy as jnp
import numpy as np

import semiring_jax as sj
from tests.sharding.harness import CONDITION, B, check_op, main, run_in_subprocess

T, U, V, S_RANGE = 6, 3, 5, 2
# The simple loss's one predicate, on an auto-axis mesh (module doc): an
# all-reduce of booleans only (XLA may combine several into a tuple).


def test_transducer_ops_on_a_sharded_batch():
    run_in_subprocess("tests.sharding.test_sharding_transducer")


def _lengths_and_labels(rng: np.random.Generator):
    return (
        jnp.asarray(rng.integers(T - 3, T + 1, B), jnp.int32),
        jnp.asarray(rng.integers(1, V, (B, U)), jnp.int32),
        jnp.asarray(rng.integers(0, U + 1, B), jnp.int32),
    )


def _am_lm(rng: np.random.Generator):
    return (
        jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32),
        jnp.asarray(rng.normal(size=(B, U + 1, V)), jnp.float32),
    )


def check_rnnt_loss_and_align(rng):
    logits = jnp.asarray(rng.normal(size=(B, T, U + 1, V)), jnp.float32)
    args = (logits, *_lengths_and_labels(rng))
    check_op("rnnt_loss", sj.rnnt_loss, args, diff=(0,), mixed=True)
    check_op("rnnt_align", sj.rnnt_align, args, diff=(0,))


def check_rnnt_loss_simple(rng):
    args = (*_am_lm(rng), *_lengths_and_labels(rng))
    check_op(
        "rnnt_loss_simple",
        sj.rnnt_loss_simple,
        args,
        diff=(0, 1),
        auto_mesh_collectives=CONDITION,
    )
    # The AM-only term's unigram is the mean LM distribution over the whole
    # batch (k2's): one all-reduce of [V], and the same on every device.
    check_op(
        "rnnt_loss_smoothed",
        sj.rnnt_loss_smoothed,
        args,
        diff=(0, 1),
        collectives=("all-reduce",),
    )
    check_op(
        "rnnt_loss_smoothed (am_only_scale 0.3)",
        lambda *a: sj.rnnt_loss_smoothed(*a, am_only_scale=0.3),
        args,
        diff=(0, 1),
        collectives=("all-reduce",),
        # Inside shard_map the unigram is the device's utterances' (as k2's
        # under data parallelism, one batch per process).
        shard_map=False,
    )


def check_rnnt_prune(rng):
    am, lm = _am_lm(rng)
    lengths_and_labels = _lengths_and_labels(rng)
    args = (am, lm, *lengths_and_labels)
    check_op(
        "rnnt_prune_ranges",
        lambda *a: sj.rnnt_prune_ranges(*a, S_RANGE),
        args,
        auto_mesh_collectives=CONDITION,
    )
    ranges = sj.rnnt_prune_ranges(*args, S_RANGE)
    check_op("rnnt_prune", sj.rnnt_prune, (am, lm, ranges), diff=(0, 1))
    logits = jnp.asarray(rng.normal(size=(B, T, S_RANGE, V)), jnp.float32)
    check_op(
        "rnnt_loss_pruned",
        lambda x, n, y, m, r: sj.rnnt_loss_pruned(x, n, y, m, r),
        (logits, *lengths_and_labels, ranges),
        diff=(0,),
    )


def check_pruned_pipeline(rng):
    """k2's recipe: the simple loss's ranges prune a joiner's input."""
    am, lm = _am_lm(rng)

    def pipeline(am, lm, frame_lengths, labels, label_lengths):
        ranges = sj.rnnt_prune_ranges(am, lm, frame_lengths, labels, label_lengths, S_RANGE)
        am_pruned, lm_pruned = sj.rnnt_prune(am, lm, ranges)
        logits = jnp.tanh(am_pruned + lm_pruned)  # a joiner
        simple = sj.rnnt_loss_simple(am, lm, frame_lengths, labels, label_lengths)
        pruned = sj.rnnt_loss_pruned(logits, frame_lengths, labels, label_lengths, ranges)
        return simple + pruned

    check_op(
        "pruned pipeline",
        pipeline,
        (am, lm, *_lengths_and_labels(rng)),
        diff=(0, 1),
        auto_mesh_collectives=CONDITION,
    )


CHECKS = [
    check_rnnt_loss_and_align,
    check_rnnt_loss_simple,
    check_rnnt_prune,
    check_pruned_pipeline,
]

if __name__ == "__main__":
    sys.exit(main(CHECKS, sys.argv[1:]))
