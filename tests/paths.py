"""Running an op on both paths: the compiled CPU kernels, and the portable
scans that GPUs and TPUs run (the kernels switched off at trace time)."""

import contextlib

import jax
import numpy as np

from semiring_jax._src import kernels


@contextlib.contextmanager
def scan_only():
    """Traces score ops with the kernels off (as on a GPU or TPU)."""
    saved = kernels.enabled
    kernels.enabled = lambda: False
    jax.clear_caches()  # jitted ops keep the choice they were traced with
    try:
        yield
    finally:
        kernels.enabled = saved
        jax.clear_caches()


def both_paths(fn, *args):
    """fn(*args) with the kernels, then with the scan only, as numpy."""
    with_kernels = jax.tree_util.tree_map(np.asarray, fn(*args))
    with scan_only():
        with_scan = jax.tree_util.tree_map(np.asarray, fn(*args))
    return with_kernels, with_scan
