"""Running an op on both paths: the routes chosen for the CPU (the compiled
kernels), and the portable routes that GPUs and TPUs run."""

import contextlib
import functools

import jax
import numpy as np

from semiring_jax._src.core import routes


@contextlib.contextmanager
def scan_only():
    """Traces ops on their portable routes (as on a GPU or TPU)."""
    with routes.force("portable"):
        yield


def portable(fn):
    """`fn`, traced and run on the portable routes."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with scan_only():
            return fn(*args, **kwargs)

    return run


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
