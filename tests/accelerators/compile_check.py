"""Compile the training ops for an accelerator this host does not have.

    python tests/accelerators/compile_check.py tpu     # a TPU v5e chip (libtpu)
    python tests/accelerators/compile_check.py h100    # an NVIDIA H100 SXM (CUDA plugin)

For each op (`ctc_loss`, `rnnt_loss`, `tot_score`, `dense_tot_score`,
`mmi_loss`) it lowers and compiles `jax.jit(jax.value_and_grad(loss))` at
small float32 shapes for one device of the target's compile-only topology,
and prints one JSON line: the op, whether it compiled, the first line of
the error if not, the seconds spent lowering and compiling, and the
semiring_jax FFI targets the lowered program calls. It exits 1 if any op
failed. Nothing runs: the compiled executables are only built, so no
accelerator is needed, but the compilers are the real ones (libtpu's XLA
TPU compiler; XLA GPU with ptxas for sm_90a).

The host's own backend stays the CPU (`jax_platforms` is set to "cpu"
unless JAX_PLATFORMS says otherwise), as on a user's CPU-only machine.
The target's compiler must be importable, and is kept out of the test
virtualenv (installed, it makes every JAX process probe for devices):

    pip install --target .accelerators/tpu -r tests/accelerators/requirements-tpu.txt
    pip install --target .accelerators/cuda -r tests/accelerators/requirements-cuda.txt

then run this script with PYTHONPATH=.accelerators/tpu:. (or
.accelerators/cuda:.), as tests/accelerators/test_compile_for_accelerators.py
does.
`--ops` picks some of the ops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from hlo_loops import Launches

HERE = pathlib.Path(__file__).resolve().parent
H100_SPEC = HERE / "h100_sxm.txtpb"
TARGETS = ("tpu", "h100")
OPS = [
    "ctc_loss",
    "rnnt_loss",
    "tot_score",
    "dense_tot_score",
    "mmi_loss",
    "tot_score_tropical",
    "arc_posteriors",
    "entropy",
    "kbest_scores",
    "dense_occupancy",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
    "rnnt_loss_pruned",
    "viterbi_decode",
    "forced_align",
    "rnnt_align",
    "edit_distance",
    # Not an op: the pruned transducer pipeline (0.5 simple + pruned loss,
    # the ranges between), whose TPU program shares the simple loss's scan
    # with the ranges'.
    "rnnt_pruned_pipeline",
]
B = 2  # utterances


def topology_device(target: str) -> Any:
    """One device of the target's compile-only topology."""
    from jax.experimental import topologies

    if target == "tpu":
        topology = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
    else:
        topology = topologies.get_topology_desc(
            platform="cuda", target_config=H100_SPEC.read_text(), topology="1x1x1"
        )
    return topology.devices[0]


def _cases() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...] | None]]:
    """op -> (function, example arguments, argnums to differentiate; None:
    the value only)."""
    import jax
    import numpy as np

    import semiring_jax as sj

    rng = np.random.default_rng(0)
    f32, i32 = np.float32, np.int32

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(f32)

    lengths = np.array([8, 6], i32)
    labels = np.array([[1, 2, 3], [4, 4, 0]], i32)
    label_lengths = np.array([3, 2], i32)

    def ctc(log_probs, input_lengths, labels, label_lengths):
        return sj.ctc_loss(log_probs, input_lengths, labels, label_lengths).sum()

    def rnnt(logits, frame_lengths, labels, label_lengths):
        return sj.rnnt_loss(logits, frame_lengths, labels, label_lengths).sum()

    # An acyclic Fsa (the quick start's), weights differentiated.
    arcs = [(0, 1, 1, 0.5), (0, 1, 2, 1.5), (0, 2, 3, 2.0), (1, 3, 4, 0.25), (2, 3, 5, 0.0)]
    acyclic = sj.Fsa.from_arcs([*arcs, (1, 2, 6, 1.0)], final=[3])

    def tot(fsa, weight):
        return sj.tot_score(fsa.replace(weight=weight))

    # A cyclic graph: a blank self-loop, then label 1 repeated.
    graph = sj.Fsa.from_arcs(
        [(0, 0, 0, 0.0), (0, 1, 1, -0.5), (1, 1, 1, -0.25), (1, 1, 0, -1.0)], final=[1]
    )

    def dense(graph, weight, emissions, lengths):
        return sj.dense_tot_score(graph.replace(weight=weight), emissions, lengths).sum()

    topo = sj.hmm_topo(2, pdfs_per_phone=1)
    den = sj.denominator_graph(sj.ngram_fsa([[1, 2], [2, 1, 2]], num_symbols=2), topo)
    num = sj.numerator_graphs([[1, 2], [2]], None, topo)

    def mmi(num, den, log_probs, lengths):
        return sj.mmi_loss(num, den, log_probs, lengths).sum()

    def posteriors(fsa, weight):
        return sj.arc_posteriors(fsa.replace(weight=weight)).sum()

    def tropical(fsa, weight):
        return sj.tot_score(fsa.replace(weight=weight), sj.TROPICAL)

    def entropy(fsa, weight):
        return sj.entropy(fsa.replace(weight=weight))

    def kbest(fsa, weight):
        return sj.kbest_scores(fsa.replace(weight=weight), 2).sum()

    def occupancy(graph, weight, emissions, lengths):
        return sj.dense_occupancy(graph.replace(weight=weight), emissions, lengths).sum()

    am, lm = normal(B, 8, 5), normal(B, 4, 5)
    ranges = np.asarray(sj.rnnt_prune_ranges(am, lm, lengths, labels, label_lengths, 2))

    def simple(am, lm, frame_lengths, labels, label_lengths):
        return sj.rnnt_loss_simple(am, lm, frame_lengths, labels, label_lengths).sum()

    def smoothed(am, lm, frame_lengths, labels, label_lengths):
        return sj.rnnt_loss_smoothed(am, lm, frame_lengths, labels, label_lengths).sum()

    def pruned(logits, frame_lengths, labels, label_lengths, ranges):
        return sj.rnnt_loss_pruned(logits, frame_lengths, labels, label_lengths, ranges).sum()

    def pipeline(am, lm, frame_lengths, labels, label_lengths):
        lengths = (frame_lengths, labels, label_lengths)
        ranges = sj.rnnt_prune_ranges(am, lm, *lengths, 2)
        am_pruned, lm_pruned = sj.rnnt_prune(am, lm, ranges)
        pruned = sj.rnnt_loss_pruned(am_pruned + lm_pruned, *lengths, ranges)
        return (0.5 * sj.rnnt_loss_simple(am, lm, *lengths) + pruned).sum()

    transducer = (lengths, labels, label_lengths)
    log_softmax = lambda x: np.asarray(jax.nn.log_softmax(x, axis=-1))
    emissions = log_softmax(normal(B, 8, 2))
    return {
        "ctc_loss": (ctc, (log_softmax(normal(B, 8, 5)), lengths, labels, label_lengths), (0,)),
        "rnnt_loss": (rnnt, (normal(B, 8, 4, 5), lengths, labels, label_lengths), (0,)),
        "tot_score": (tot, (acyclic, acyclic.weight), (1,)),
        "dense_tot_score": (
            dense,
            (graph, graph.weight, log_softmax(normal(B, 8, 2)), lengths),
            (1, 2),
        ),
        "mmi_loss": (mmi, (num, den, log_softmax(normal(B, 8, 2)), lengths), (2,)),
        "tot_score_tropical": (tropical, (acyclic, acyclic.weight), (1,)),
        "arc_posteriors": (posteriors, (acyclic, acyclic.weight), (1,)),
        "entropy": (entropy, (acyclic, acyclic.weight), (1,)),
        "kbest_scores": (kbest, (acyclic, acyclic.weight), (1,)),
        "dense_occupancy": (occupancy, (graph, graph.weight, emissions, lengths), (1, 2)),
        "rnnt_loss_simple": (simple, (am, lm, *transducer), (0, 1)),
        "rnnt_loss_smoothed": (smoothed, (am, lm, *transducer), (0, 1)),
        "rnnt_loss_pruned": (pruned, (normal(B, 8, 2, 5), *transducer, ranges.astype(i32)), (0,)),
        "rnnt_pruned_pipeline": (pipeline, (am, lm, *transducer), (0, 1)),
        # Decoding: values only.
        "viterbi_decode": (sj.viterbi_decode, (graph, emissions, lengths), None),
        "forced_align": (sj.forced_align, (emissions, lengths, labels[:, :1], lengths // 8), None),
        "rnnt_align": (sj.rnnt_align, (normal(B, 8, 4, 5), *transducer), None),
        "edit_distance": (
            sj.edit_distance,
            (labels, label_lengths, labels[::-1], label_lengths[::-1]),
            None,
        ),
    }


def abstract(args: tuple[Any, ...], sharding: Any) -> tuple[Any, ...]:
    """Every array leaf (an Fsa's included) as a ShapeDtypeStruct placed on
    the target device: nothing concrete reaches the target's program."""
    import jax
    import numpy as np

    def leaf(x: Any) -> Any:
        x = np.asarray(x)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(leaf, args)


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def check(target: str, ops: list[str]) -> list[dict[str, Any]]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    device = topology_device(target)
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    cases = _cases()
    results = []
    for op in ops:
        loss, args, argnums = cases[op]
        result: dict[str, Any] = {
            "target": target,
            "device": device.device_kind,
            "op": op,
            "cpu_kernels": os.environ.get("SEMIRING_JAX_CPU_KERNELS", "default"),
            "ok": False,
        }
        start = time.perf_counter()
        try:
            program = loss if argnums is None else jax.value_and_grad(loss, argnums=argnums)
            lowered = jax.jit(program).lower(*abstract(args, sharding))
            result["lower_s"] = round(time.perf_counter() - start, 2)
            result["ffi_targets"] = sorted(set(re.findall(r"semiring_jax_\w+", lowered.as_text())))
            start = time.perf_counter()
            compiled = lowered.compile()
            result["compile_s"] = round(time.perf_counter() - start, 2)
            launches = Launches(compiled.as_text())
            launches.sequential()
            result["loops"] = [dataclasses.asdict(loop) for loop in launches.loops]
            result["ok"] = True
        except Exception as error:
            result["error"] = _first_line(error)
            result["failed_after_s"] = round(time.perf_counter() - start, 2)
        results.append(result)
        print(json.dumps(result), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--ops", nargs="+", choices=OPS, default=OPS)
    options = parser.parse_args(argv)
    import jax

    if "JAX_PLATFORMS" not in os.environ:
        jax.config.update("jax_platforms", "cpu")
    # libtpu would ask a cloud metadata server for the TPU it runs on.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    results = check(options.target, options.ops)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
