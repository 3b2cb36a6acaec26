"""The sharding checks' harness: run an op on a batch split over 4 host devices
and compare it with one device.

XLA fixes the device count when jax is imported, so each test module runs its
checks in a subprocess with 4 host CPU devices (`run_in_subprocess`); the rest
of the suite keeps one device. Routes do not depend on the device count, so
these runs check the CPU kernels where they are built, and on the auto-axis
mesh the portable routes too (what GPUs and TPUs run).

`check_op` runs `fn` and the gradient of its outputs (pulled back from a
cotangent sharded like the batch) under `jax.jit`, in these settings:

- an explicit-axis mesh, `jax.make_mesh((4,), ("batch",))` (JAX's default),
  inputs placed with `NamedSharding`, without and with `jax.set_mesh(mesh)`
  (and, where asked, with the lengths replicated rather than split);
- an auto-axis mesh (`axis_types=(AxisType.Auto,)`), inputs placed so: once
  on the CPU routes (values only: XLA cannot split a foreign call, so the
  kernels run on the gathered batch) and once on the portable routes;
- `jax.shard_map` over the explicit mesh, in and out specs `P("batch")`.

In each it asserts that values and gradients equal one device's (on the same
routes), that every output with a batch axis is split by batch (B / 4 rows on
each device), and that the compiled program has no collective: utterances are
independent, so no device needs another's data.
"""

import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from semiring_jax._src.core import routes

NUM_DEVICES = 4
B = 8
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
# An all-reduce of booleans only: a `lax.cond` on whether any utterance of
# the batch needs a slower exact pass, which XLA reduces over the devices
# on an auto-axis mesh (explicit meshes run the op per device).
# (XLA's text numbers a long tuple's elements: "/*index=5*/pred[]".)
CONDITION = (r"= \(?pred\[\](, (/\*index=\d+\*/)?pred\[\])*\)? all-reduce\(",)
# A setting traced on the portable routes (`check_op`).
PORTABLE = object()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_in_subprocess(module: str, *checks: str) -> None:
    """Runs `python -m module` with 4 host devices (only the named `checks`,
    where given); fails with its report."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={NUM_DEVICES}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", module, *checks],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        pytest.fail(f"sharding checks failed:\n{run.stdout}\n{run.stderr}")


def meshes() -> dict[str, jax.sharding.Mesh]:
    """The two kinds of mesh, each with one axis "batch" over 4 devices."""
    explicit = jax.make_mesh((NUM_DEVICES,), ("batch",))
    # JAX's default: the case users meet first, and the stricter one.
    assert explicit.axis_types == (AxisType.Explicit,), explicit.axis_types
    auto = jax.make_mesh((NUM_DEVICES,), ("batch",), axis_types=(AxisType.Auto,))
    return {"explicit": explicit, "auto": auto}


def row_score(out: Any) -> jax.Array:
    """float [B]: each utterance's finite float outputs summed (what the
    gradient check pulls back); -inf and padding count 0."""
    total = jnp.zeros((B,), jnp.float32)
    for leaf in jax.tree.leaves(out):
        if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.shape[:1] == (B,):
            finite = jnp.where(jnp.isfinite(leaf), leaf, 0).astype(jnp.float32)
            total = total + jnp.sum(finite.reshape(B, -1), axis=1)
    return total


def _value_and_grad(fn: Callable, diff: Sequence[int], score: Callable) -> Callable:
    """(cotangent [B], *args) -> (fn(*args), d(cotangent . score(fn))/d args[diff])."""

    def run(cotangent, *args):
        out = fn(*args)
        if not diff:
            return out, ()

        def loss(*diff_args):
            full = list(args)
            for i, value in zip(diff, diff_args):
                full[i] = value
            return jnp.sum(score(fn(*full)) * cotangent)

        return out, jax.grad(loss, argnums=tuple(range(len(diff))))(*[args[i] for i in diff])

    return run


def assert_close(label: str, got: Any, want: Any) -> None:
    """Each leaf of `got` (sharded) equal to `want`'s (one device) to 1e-5."""
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), f"{label}: {len(got_leaves)} outputs"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        np.testing.assert_allclose(
            np.asarray(g),
            np.asarray(w),
            rtol=1e-5,
            atol=1e-5,
            err_msg=f"{label} output {i}: sharded result differs from one device",
        )


def _assert_batch_sharded(label: str, out: Any) -> None:
    for i, leaf in enumerate(jax.tree.leaves(out)):
        if leaf.shape[:1] != (B,):
            continue
        rows = sorted(shard.data.shape[0] for shard in leaf.addressable_shards)
        assert rows == [B // NUM_DEVICES] * NUM_DEVICES, (
            f"{label} output {i}: shards have {rows} rows ({leaf.sharding}); expected "
            f"{B // NUM_DEVICES} on each of {NUM_DEVICES} devices"
        )


def _run_compiled(label: str, jitted: Callable, args: tuple, allowed: Sequence[str]) -> Any:
    """jitted(*args), asserting that its compiled program moves no data
    but by the `allowed` collectives: an op name ("all-reduce") allows it
    whole, a regular expression the instructions it matches."""
    found = []
    for line in jitted.lower(*args).compile().as_text().splitlines():
        ops = [op for op in COLLECTIVES if f"{op}(" in line or f"{op}-start(" in line]
        if ops and ops[0] not in allowed and not any(re.search(p, line) for p in allowed):
            found.append(line.strip()[:160])
    assert not found, (
        f"{label}: the compiled program moves data between devices ({found}); "
        f"a per-utterance op should not"
    )
    return jitted(*args)


def check_op(
    name: str,
    fn: Callable,
    args: tuple,
    *,
    diff: Sequence[int] = (),
    score: Callable = row_score,
    data: Callable = lambda out: out,
    shard_map: bool = True,
    mixed: bool = False,
    collectives: Sequence[str] = (),
    auto_mesh_collectives: Sequence[str] = (),
) -> None:
    """Checks `fn(*args)` and its gradient in the settings of the module doc.

    Args:
      name: the op, for messages.
      fn: the op on per-utterance arguments; anything shared by the batch
        (a graph, a key, a static size) is closed over.
      args: pytrees whose every leaf has a leading batch axis B.
      diff: the positions of the float arguments to differentiate.
      score: float [B] from fn's outputs, pulled back for the gradient.
      data: the outputs that must be split by batch (an Fsa's structure
        may be a constant, which XLA may replicate on an auto-axis mesh).
      shard_map: also run `fn` inside `jax.shard_map` (False where the op
        cannot see only its device's part: concrete per-batch structure).
      mixed: also run with only args[0] split and the rest replicated (on
        the explicit mesh): lengths often come so.
      collectives: those the op needs by definition (a batch statistic).
      auto_mesh_collectives: those XLA adds on the auto-axis mesh alone
        (an op it does not split along the batch), a known cost.
    """
    step = _value_and_grad(fn, diff, score)
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=B), jnp.float32)
    want = jax.jit(step)(cotangent, *args)
    # The portable routes compare with themselves on one device: sharding
    # must not change a result, and routes agree only to their precision
    # (the tests of each op compare them), which a second derivative in
    # float32 can put past these tolerances.
    want_portable = None
    failures = []
    for kind, mesh in meshes().items():
        batch, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
        placed = jax.device_put((cotangent, *args), batch)
        allowed = (*collectives, *auto_mesh_collectives) if kind == "auto" else collectives
        settings = [(f"{kind} mesh", step, placed, None)]
        if kind == "auto":
            # XLA cannot split a foreign call along a sharded axis: on an
            # auto-axis CPU mesh the CPU kernels run on the gathered batch
            # (their values are checked; explicit meshes run them per
            # device). The portable routes, what GPUs and TPUs run, must
            # move no data.
            settings = [
                (f"{kind} mesh, CPU routes", step, placed, None),
                (f"{kind} mesh, portable routes", step, placed, PORTABLE),
            ]
        if kind == "explicit":
            settings.append((f"{kind} mesh under jax.set_mesh", step, placed, mesh))
            if mixed:
                rest = jax.device_put(args[1:], replicated)
                settings.append(
                    (f"{kind} mesh, args[1:] replicated", step, (*placed[:2], *rest), None)
                )
            if shard_map:
                mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
                settings.append(
                    ("jax.shard_map", _value_and_grad(mapped, diff, score), placed, None)
                )
        for setting, traced, inputs, context in settings:
            label = f"{name} ({setting})"
            # The CPU kernels on an auto-axis mesh: values only (above).
            values_only = kind == "auto" and context is None
            where = COLLECTIVES if values_only else allowed
            expected = want
            try:
                if context is None:
                    got = _run_compiled(label, jax.jit(traced), inputs, where)
                elif context is PORTABLE:
                    with routes.force("portable"):
                        if want_portable is None:
                            want_portable = jax.jit(step)(cotangent, *args)
                        got = _run_compiled(label, jax.jit(traced), inputs, where)
                    expected = want_portable
                else:
                    with jax.set_mesh(context):
                        got = _run_compiled(label, jax.jit(traced), inputs, where)
                assert_close(label, got, expected)
                if not values_only:
                    _assert_batch_sharded(label, (data(got[0]), got[1]))
            except Exception as error:  # report every setting, not just the first
                failures.append(f"{label}: {type(error).__name__}: {error}")
    if failures:
        raise AssertionError("\n".join(failures))


def main(checks: Sequence[Callable], names: Sequence[str]) -> int:
    """Runs each check (or those named) and reports every failure."""
    # As strict as tests/conftest.py; x64 stays off, as in most training runs.
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    if jax.device_count() != NUM_DEVICES:
        print(
            f"FAIL: expected {NUM_DEVICES} devices, got {jax.devices()}; run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={NUM_DEVICES}"
        )
        return 1
    failures = 0
    for check in checks:
        if names and check.__name__ not in names:
            continue
        try:
            check(np.random.default_rng(0))
            print(f"ok    {check.__name__}", flush=True)
        except Exception:  # report every check, not just the first failure
            failures += 1
            print(f"FAIL  {check.__name__}\n{traceback.format_exc()}", flush=True)
    return 1 if failures else 0
