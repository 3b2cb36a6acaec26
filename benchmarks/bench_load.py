"""Benchmark: `sj.load` of a saved 32-entry batch (and `sj.save`, and the
`sj.stack` that made it, for scale).

Workload (numpy default_rng(SEED)): 32 random acyclic acceptors of 150 to
300 states and about 4 arcs per state (each arc goes 1 to 8 states up, a
chain keeps every state on a path; N(0, 1) scores), stacked, saved
uncompressed to a temporary file. Prints the file's format version and
size, then the median wall time of each call.

A format that stores the structure only (version 4) builds the tables
again in `load`, once per entry; older versions stored the tables and
`load` rebuilt them to compare. To time another tree (e.g. a copy of an
older commit), put it first on the path:

    PYTHONPATH=/tmp/baseline .venv/bin/python benchmarks/bench_load.py

Run:
    .venv/bin/python benchmarks/bench_load.py           # about 30 s on 2 cores
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
from timing import median_seconds

import semiring_jax as sj

SEED = 20240611
BATCH = 32


def random_dag(rng: np.random.Generator) -> sj.Fsa:
    """An acyclic acceptor: a chain through every state, plus random arcs
    going up 1 to 8 states."""
    num_states = int(rng.integers(150, 301))
    extra = 3 * num_states
    src = rng.integers(0, num_states - 1, extra)
    dst = np.minimum(src + rng.integers(1, 9, extra), num_states - 1)
    chain = np.arange(num_states - 1)
    src, dst = np.concatenate([chain, src]), np.concatenate([chain + 1, dst])
    labels = rng.integers(1, 50, src.size)
    rows = np.stack([src, dst, labels, rng.normal(size=src.size)], axis=1)
    return sj.Fsa.from_arcs(rows, [num_states - 1], num_states=num_states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    fsas = [random_dag(rng) for _ in range(BATCH)]
    batch = sj.stack(fsas)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "batch.npz")
        sj.save(path, batch)
        with np.load(path) as data:
            version = int(data["version"])
        size = os.path.getsize(path)
        rows = [
            ("stack (32 entries)", median_seconds(lambda: sj.stack(fsas), args.runs)),
            ("save", median_seconds(lambda: sj.save(path, batch), args.runs)),
            ("load", median_seconds(lambda: sj.load(path), args.runs)),
        ]
    print(
        f"batch: {BATCH} entries, S = {batch.num_states}, A = {batch.num_arcs} (padded); "
        f"file version {version}, {size / 1e6:.2f} MB; semiring_jax from "
        f"{os.path.dirname(sj.__file__)}"
    )
    print(f"{'call':22s} {'median ms':>10s}")
    for name, seconds in rows:
        print(f"{name:22s} {seconds * 1e3:10.1f}")


if __name__ == "__main__":
    main()
