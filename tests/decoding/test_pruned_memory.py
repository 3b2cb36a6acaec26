"""`intersect_dense_pruned`'s memory grows with the graph and the beam, not
with states × frames.

A graph of 10^6 states (4 × 10^6 arcs) is decoded over B = 8 utterances of
400 frames with max_active = 64: one float32 table of states × frames would
be 1.6 GB for a single utterance (k2's dense tables are states × batch),
while the search and lattice need the graph's host copies, the 64 kept
states of each frame and the lattice. The traced search (the CPU kernels
off) is checked the same way on a smaller graph. Each case runs in a
subprocess that reports the peak RSS growth of a full-length call after a
short one (which compiled and built everything else).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BATCH = 8
VOCAB = 50
MAX_ACTIVE = 64


def run_case(num_states: int, frames: int) -> None:
    """Prints, as JSON, the peak RSS growth of one decode and facts about
    its lattice (in a subprocess: RSS is the process's)."""
    import resource

    import jax
    import numpy as np

    import semiring_jax as sj

    def peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    rng = np.random.default_rng(0)
    # Each state: a self-loop and three arcs to random states; every tenth
    # state final, so that most utterances end on a path.
    states = np.arange(num_states)
    src = np.repeat(states, 4)
    dst = np.stack([states, *rng.integers(0, num_states, size=(3, num_states))], axis=1).ravel()
    arcs = np.stack([src, dst, rng.integers(0, VOCAB, src.size), rng.normal(size=src.size)], 1)
    graph = sj.Fsa.from_arcs(arcs, states[::10].tolist(), num_states=num_states)
    logits = rng.normal(size=(BATCH, frames, VOCAB)) * 3
    emissions = jax.nn.log_softmax(logits, axis=-1).astype(np.float32)

    def decode(length):
        return jax.block_until_ready(
            sj.intersect_dense_pruned(
                graph,
                emissions[:, :length],
                np.full(BATCH, length),
                search_beam=10.0,
                output_beam=5.0,
                max_active=MAX_ACTIVE,
            )
        )

    decode(2)
    before = peak()
    lattice = decode(frames)
    growth = peak() - before
    scores = np.asarray(sj.tot_score(lattice, sj.TROPICAL))
    print(
        json.dumps(
            {
                "growth": growth,
                "num_arcs": int(graph.num_arcs),
                "finite": int(np.isfinite(scores).sum()),
                "lattice_arcs": int(np.asarray(lattice.arc_mask).sum()),
            }
        )
    )


def _in_subprocess(num_states: int, frames: int, kernels: bool) -> dict:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from tests.decoding.test_pruned_memory import run_case; "
        "run_case(int(sys.argv[2]), int(sys.argv[3]))"
    )
    env = dict(os.environ, SEMIRING_JAX_CPU_KERNELS="1" if kernels else "0")
    # glibc raises its mmap threshold after a large free, and then keeps
    # freed buffers of the graph's size in its heap: RSS would read what the
    # allocator retains, not what the call holds. A fixed threshold returns
    # them.
    env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), str(num_states), str(frames)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("num_states", "frames", "kernels"),
    [(1_000_000, 400, True), (200_000, 200, False)],
    ids=["kernels", "traced"],
)
def test_memory_grows_with_the_graph_not_states_times_frames(num_states, frames, kernels):
    result = _in_subprocess(num_states, frames, kernels)
    one_table = 4 * num_states * frames  # float32 [T, S], one utterance
    # The graph's host copies (tens of bytes an arc) and a margin for the
    # kept states, the lattice and XLA's buffers.
    bound = 64 * result["num_arcs"] + 64 * 2**20
    assert bound < one_table
    assert result["growth"] < bound, f"grew {result['growth'] / 2**20:.0f} MiB"
    # A real decode: paths found, a lattice no bigger than the beam allows.
    assert result["finite"] >= BATCH // 2
    assert 0 < result["lattice_arcs"] <= BATCH * frames * MAX_ACTIVE * 4
