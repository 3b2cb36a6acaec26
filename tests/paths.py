"""Running an op on both paths: the compiled CPU loader, and the portable
scans that GPUs and TPUs run (the kernels switched off at trace time)."""

import contextlib

import jax
import numpy as np

from semiring_jax._src.kernels import loader


@contextlib.contextmanager
def scan_only():
    """Traces score ops with the kernels off (as on a GPU or TPU)."""
    saved = loader.enabled
    loader.enabled = lambda: False
    jax.clear_caches()  # jitted ops keep the choice they were traced with
    try:
        yield
    finally:
        loader.enabled = saved
        jax.clear_caches()


def both_paths(fn, *args):
    """fn(*args) with the loader, then with the scan only, as numpy.

    Where the kernels cannot be built (no compiler, or another backend) the
    first run is the scan too: the per-path checks still test the scan, and
    `test_kernels.py::test_kernels_are_built_and_used_on_the_cpu` fails on a
    CPU machine with a compiler whose kernels did not build."""
    with_kernels = jax.tree_util.tree_map(np.asarray, fn(*args))
    with scan_only():
        with_scan = jax.tree_util.tree_map(np.asarray, fn(*args))
    return with_kernels, with_scan
