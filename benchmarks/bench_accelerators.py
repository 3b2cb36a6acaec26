"""Benchmark: the programs GPUs and TPUs run, compiled here without one.

For each op, value + gradient under `jax.jit` at the standard sizes of the
other benchmarks, lowered and compiled (never run) for one device of a TPU
v5e (libtpu) and of an H100 SXM (the CUDA plugin's compile-only topology),
beside the peer program the op has:

  * `ctc_loss` (B, T, V, U) = (32, 1000, 1024, 200), log_softmax inside;
    peer `optax.ctc_loss` (which applies it itself);
  * `dense_tot_score`, the 500-state / 5,000-arc graph of `bench_dense.py`
    at (16, 500, 256); peer its plain JAX program (a frame scan by
    autodiff);
  * `rnnt_loss` (B, T, U, V) = (8, 200, 50, 256), log_softmax inside; peer
    an anti-diagonal RNN-T written here in plain JAX and differentiated by
    autodiff (`rnnt_peer`);
  * `rnnt_pruned`, the pruned pipeline of `bench_rnnt.py` at (8, 200, 50,
    256): 0.5 simple + pruned loss, the ranges (s_range 5) and the pruned
    joiner inputs between them, gradients with respect to `am` and `lm`;
    no peer: its row shows the sequential steps (the loops' trip counts),
    k2's design needing the simple loss's forward and backward and the
    pruned loss's;
  * `tot_score` on the 1,000-level lattice of `bench_scores.py` (LOG, the
    gradient with respect to the arc weights); `mmi_loss` on the dense
    workload with `bench_dense.py`'s numerators; no peers.

Per op and target it prints: compile seconds, XLA's temporary device
buffers ("HBM temp", `memory_analysis()`), the while loops of the
optimized HLO with their trip counts ("?" where XLA found none: a
data-dependent loop), `conditional`s inside loop bodies, kernels launched
per iteration of each loop, and the launches of the whole program counted
sequentially (trip count times launches per iteration, nested loops
multiplied out) -- ours, the peer's, and their ratios. Only the H100's
counts are kernel launches; on the TPU the same count reads as the
program's sequential steps. With `--save` the rows go into
`benchmarks/results.json` under "aot".

A launch is an instruction of the optimized HLO that runs as a kernel of
its own (`tests/accelerators/hlo_loops.py`, shared with the compile test).
A `conditional` outside loops (the dense ops' fallbacks) counts its
costliest branch, so a program with one reads as its worst case: read the
loops' per-iteration counts for the path that usually runs.

Each target compiles in a subprocess whose PYTHONPATH holds its compiler
(`.accelerators/tpu`, `.accelerators/cuda`: see
`tests/accelerators/requirements-*.txt`), with the host's own backend the
CPU, as on a user's CPU-only machine. A target whose compiler is not
installed is reported and skipped.

Run:
    .venv/bin/python benchmarks/bench_accelerators.py            # both targets, a few minutes
    .venv/bin/python benchmarks/bench_accelerators.py --target tpu --ops ctc_loss
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
COMPILE_TEST = ROOT / "tests" / "accelerators"
RESULTS = HERE / "results.json"
# target -> the folder its compiler is installed in
TARGETS = {"tpu": ROOT / ".accelerators" / "tpu", "h100": ROOT / ".accelerators" / "cuda"}
OPS = ("ctc_loss", "dense_tot_score", "rnnt_loss", "rnnt_pruned", "tot_score", "mmi_loss")
CTC_SIZE = (32, 1000, 1024, 200)
RNNT_SIZE = (8, 200, 50, 256)
SEED = 20261206

# The HLO reader, the targets' devices and the abstract inputs are the
# compile test's (tests/accelerators).
sys.path.insert(0, str(COMPILE_TEST))
from compile_check import abstract, topology_device  # noqa: E402
from hlo_loops import Launches  # noqa: E402

# -- the programs --------------------------------------------------------------------


def rnnt_peer(logits, frame_lengths, labels, label_lengths):
    """The RNN-T loss [B] a JAX user writes without a library: log_softmax,
    the blank and label log-probs [B, T, U + 1], then one `lax.scan` over
    the T + U anti-diagonals of the (t, u) grid (each a vector over u),
    differentiated by autodiff."""
    import jax
    import jax.numpy as jnp

    # A large finite zero: logaddexp(-inf, -inf) has a NaN gradient.
    NEG = -1e30
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [B, T, U + 1, V]
    b, t, u1, _ = log_probs.shape
    blank = log_probs[..., 0]  # [B, T, U + 1]
    label = jnp.take_along_axis(log_probs[:, :, :-1, :], labels[:, None, :, None], axis=-1)[
        ..., 0
    ]  # [B, T, U]
    label = jnp.pad(label, ((0, 0), (0, 0), (0, 1)), constant_values=NEG)
    # Skewed: row n holds cell (n - u, u) at column u.
    rows = jnp.arange(t + u1 - 1)[:, None] - jnp.arange(u1)[None, :]  # [N, U + 1]
    inside = (rows >= 0) & (rows < t)
    safe = jnp.clip(rows, 0, t - 1)
    columns = jnp.arange(u1)[None, :]

    def skew(x):  # [B, T, U + 1] -> [N, B, U + 1]
        return jnp.where(inside[:, None, :], x[:, safe, columns].transpose(1, 0, 2), NEG)

    blank_s, label_s = skew(blank), skew(label)
    end_n = frame_lengths - 1 + label_lengths  # the final cell's diagonal
    batch = jnp.arange(b)

    def step(carry, xs):
        alpha, loss = carry  # [B, U + 1], [B]
        n, blank_prev, label_prev, blank_here = xs
        from_blank = alpha + blank_prev  # (t - 1, u) -> (t, u)
        from_label = jnp.pad(alpha + label_prev, ((0, 0), (1, 0)), constant_values=NEG)[
            :, :-1
        ]  # (t, u - 1) -> (t, u)
        new = jnp.where(
            n == 0, jnp.where(columns == 0, 0.0, NEG), jnp.logaddexp(from_blank, from_label)
        )
        final = new[batch, label_lengths] + blank_here[batch, label_lengths]
        loss = jnp.where(n == end_n, -final, loss)
        return (new, loss), None

    shifted = lambda x: jnp.concatenate([jnp.full_like(x[:1], NEG), x[:-1]])
    xs = (jnp.arange(t + u1 - 1), shifted(blank_s), shifted(label_s), blank_s)
    init = (jnp.full((b, u1), NEG), jnp.zeros(b))
    (_, loss), _ = jax.lax.scan(step, init, xs)
    return loss


def check_rnnt_peer() -> float:
    """The largest difference, loss and gradient, between `rnnt_peer` and
    `sj.rnnt_loss` on small random inputs (zero lengths included), on the
    CPU: the peer computes the same loss."""
    import jax
    import numpy as np

    import semiring_jax as sj

    rng = np.random.default_rng(SEED)
    logits = rng.normal(size=(3, 7, 5, 6)).astype(np.float32)
    frame_lengths = np.array([7, 5, 6], np.int32)
    label_lengths = np.array([4, 2, 0], np.int32)
    labels = rng.integers(1, 6, (3, 4)).astype(np.int32)
    worst = 0.0
    ours = jax.value_and_grad(lambda x: sj.rnnt_loss(x, frame_lengths, labels, label_lengths).sum())
    peer = jax.value_and_grad(lambda x: rnnt_peer(x, frame_lengths, labels, label_lengths).sum())
    for a, b in zip(ours(logits), jax.jit(peer)(logits)):
        worst = max(worst, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
    return worst


@dataclasses.dataclass
class Case:
    """One op's program and its peer's: value + gradient functions and
    their example arguments (host arrays; made abstract per target)."""

    ours: tuple[Callable[..., Any], tuple[Any, ...]]
    peer: tuple[Callable[..., Any], tuple[Any, ...]] | None
    peer_name: str = ""


def _ctc() -> Case:
    import bench_ctc
    import jax
    import optax

    import semiring_jax as sj

    index = bench_ctc.CTC_SIZES.index(CTC_SIZE)
    inp = bench_ctc.make_ctc_inputs(index)

    def ours(logits, input_lengths, labels, label_lengths):
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return sj.ctc_loss(log_probs, input_lengths, labels, label_lengths).sum()

    def peer(logits, logit_paddings, labels, label_paddings):
        return optax.ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id=0).sum()

    return Case(
        (jax.value_and_grad(ours), (inp.logits, inp.input_lengths, inp.labels, inp.label_lengths)),
        (
            jax.value_and_grad(peer),
            (inp.logits, inp.logit_paddings, inp.labels, inp.label_paddings),
        ),
        "optax",
    )


def _dense_inputs():
    import bench_dense

    return bench_dense, bench_dense.make_inputs(0)


def _dense() -> Case:
    import jax
    import jax.numpy as jnp

    import semiring_jax as sj

    bench_dense, inp = _dense_inputs()
    graph = bench_dense.our_graph(inp)

    def ours(graph, emissions, lengths):
        return jnp.sum(sj.dense_tot_score(graph, emissions, lengths, sj.LOG))

    # The plain program closes over its graph's arrays, as a user's would.
    plain = bench_dense.plain_jax(inp)
    return Case(
        (jax.value_and_grad(ours, argnums=1), (graph, inp.emissions, inp.lengths)),
        (plain, (inp.emissions, inp.lengths)),
        "plain JAX",
    )


def _rnnt() -> Case:
    import bench_rnnt
    import jax

    import semiring_jax as sj

    data = bench_rnnt.inputs(1, RNNT_SIZE)
    args = (
        data["logits"],
        data["frame_lengths"].astype("int32"),
        data["labels"].astype("int32"),
        data["label_lengths"].astype("int32"),
    )

    def ours(logits, frame_lengths, labels, label_lengths):
        return sj.rnnt_loss(logits, frame_lengths, labels, label_lengths).sum()

    def peer(logits, frame_lengths, labels, label_lengths):
        return rnnt_peer(logits, frame_lengths, labels, label_lengths).sum()

    return Case((jax.value_and_grad(ours), args), (jax.value_and_grad(peer), args), "anti-diagonal")


def _rnnt_pruned() -> Case:
    import bench_rnnt
    import jax

    import semiring_jax as sj

    data = bench_rnnt.inputs(1, RNNT_SIZE)
    am, lm = bench_rnnt.am_lm(data)
    lengths = tuple(data[k].astype("int32") for k in ("frame_lengths", "labels", "label_lengths"))
    s_range = min(bench_rnnt.S_RANGE, lm.shape[1])

    def ours(am, lm, frame_lengths, labels, label_lengths):
        lengths = (frame_lengths, labels, label_lengths)
        simple = sj.rnnt_loss_simple(am, lm, *lengths)
        ranges = sj.rnnt_prune_ranges(am, lm, *lengths, s_range)
        am_pruned, lm_pruned = sj.rnnt_prune(am, lm, ranges)
        pruned = sj.rnnt_loss_pruned(am_pruned + lm_pruned, *lengths, ranges)
        return (0.5 * simple + pruned).sum()

    return Case((jax.value_and_grad(ours, argnums=(0, 1)), (am, lm, *lengths)), None)


def _tot_score() -> Case:
    import bench_scores

    workload = next(w for w in bench_scores.make_workloads() if w.name == "lattice-1000x10")
    fsa = bench_scores.build_ours(workload)
    _, value_and_grad = bench_scores.ours_functions(bench_scores.SEMIRINGS["LOG"])
    return Case((value_and_grad, (fsa, fsa.weight)), None)


def _mmi() -> Case:
    import jax
    import jax.numpy as jnp

    import semiring_jax as sj

    bench_dense, inp = _dense_inputs()
    den, num = bench_dense.our_graph(inp), bench_dense.numerator_graphs(inp)

    def ours(num, den, emissions, lengths):
        return jnp.sum(sj.mmi_loss(num, den, emissions, lengths, leaky_hmm=1e-5))

    return Case((jax.value_and_grad(ours, argnums=2), (num, den, inp.emissions, inp.lengths)), None)


CASES: dict[str, Callable[[], Case]] = {
    "ctc_loss": _ctc,
    "dense_tot_score": _dense,
    "rnnt_loss": _rnnt,
    "rnnt_pruned": _rnnt_pruned,
    "tot_score": _tot_score,
    "mmi_loss": _mmi,
}

# -- one target, in its own process -------------------------------------------------


def measure(
    fn: Callable[..., Any], args: tuple[Any, ...], sharding: Any, dump: pathlib.Path | None = None
) -> dict[str, Any]:
    """Compile `fn` for the target: seconds, temp bytes, loops, launches;
    the optimized HLO written to `dump` if given."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*abstract(args, sharding)).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    hlo = compiled.as_text()
    if dump is not None:
        dump.write_text(hlo)
    launches = Launches(hlo)
    total = launches.sequential()
    return {
        "compile_s": round(seconds, 2),
        "temp_mb": None if memory is None else round(memory.temp_size_in_bytes / 2**20, 1),
        "loops": [dataclasses.asdict(loop) for loop in launches.loops],
        "conditionals_in_loops": sum(loop.conditionals for loop in launches.loops),
        "launches": total if math.isfinite(total) else None,
    }


def run_target(target: str, ops: list[str], dump: pathlib.Path | None = None) -> None:
    """Prints one JSON line per op: ours and the peer's measures."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS") or "cpu")
    device = topology_device(target)
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    for op in ops:
        case = CASES[op]()
        row: dict[str, Any] = {"target": target, "device": device.device_kind, "op": op}
        for who, program in (("ours", case.ours), ("peer", case.peer)):
            if program is None:
                continue
            try:
                hlo = None if dump is None else dump / f"{op}.{target}.{who}.hlo"
                row[who] = measure(program[0], program[1], sharding, hlo)
            except Exception as error:  # reported, and the other rows go on
                lines = [line for line in str(error).splitlines() if line.strip()]
                row[who] = {"error": f"{type(error).__name__}: {lines[0] if lines else ''}"}
        if case.peer is not None:
            row["peer_name"] = case.peer_name
        print(json.dumps(row), flush=True)


# -- the parent: one subprocess per target, then the table --------------------------


def _in_subprocess(
    target: str, ops: list[str], dump: pathlib.Path | None = None
) -> list[dict[str, Any]]:
    folder = TARGETS[target]
    if not folder.is_dir():
        print(f"{target}: no compiler in {folder} (see tests/accelerators); skipped")
        return []
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env.update(
        TPU_SKIP_MDS_QUERY="1",
        PYTHONPATH=os.pathsep.join([str(folder), str(ROOT), str(HERE)]),
    )
    command = [sys.executable, __file__, "--child", target, "--ops", *ops]
    if dump is not None:
        command += ["--dump", str(dump)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3000)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or len(rows) != len(ops):
        print(f"{target}: the compile process stopped early:\n{result.stderr[-2000:]}")
    return rows


def _ratio(ours: Any, peer: Any) -> str:
    if not isinstance(ours, (int, float)) or not isinstance(peer, (int, float)) or not peer:
        return "-"
    return f"{ours / peer:.2f}"


def _loops(measures: dict[str, Any]) -> str:
    if not measures.get("loops"):
        return "none"
    parts = []
    for loop in measures["loops"]:
        trips = "?" if loop["trips"] is None else loop["trips"]
        parts.append(f"{trips}x{loop['per_iteration']}")
    return " ".join(parts)


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'op':<16}{'target':<7}{'who':<15}{'compile s':>10}{'temp MB':>10}"
        f"{'launches':>11}{'conds':>6}  loops (trips x launches per iteration)"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for who in ("ours", "peer"):
            m = row.get(who)
            if m is None:
                continue
            name = "ours" if who == "ours" else row.get("peer_name", "peer")
            if "error" in m:
                print(f"{row['op']:<16}{row['target']:<7}{name:<15}  {m['error'][:90]}")
                continue
            launches = "?" if m["launches"] is None else f"{m['launches']:.0f}"
            print(
                f"{row['op']:<16}{row['target']:<7}{name:<15}{m['compile_s']:>10.2f}"
                f"{m['temp_mb'] if m['temp_mb'] is not None else '-':>10}{launches:>11}"
                f"{m['conditionals_in_loops']:>6}  {_loops(m)}"
            )
        ours, peer = row.get("ours", {}), row.get("peer")
        if peer and "error" not in ours and "error" not in peer:
            print(
                f"{'':<16}{'':<7}{'ours / peer':<15}"
                f"{_ratio(ours['compile_s'], peer['compile_s']):>10}"
                f"{_ratio(ours['temp_mb'], peer['temp_mb']):>10}"
                f"{_ratio(ours['launches'], peer['launches']):>11}"
            )


def save(rows: list[dict[str, Any]]) -> None:
    """Puts the rows into results.json under "aot", its last key, leaving
    the other entries' text as it is."""
    text = RESULTS.read_text()
    marker = ',\n  "aot": '
    if marker in text:  # a previous run's rows: replaced
        text = text[: text.index(marker)] + "\n}\n"
    aot = {
        "description": (
            "bench_accelerators.py: value + gradient compiled (not run) on this CPU host for "
            "one TPU v5e and one H100 SXM device; compile seconds, XLA temp MB, loops, "
            "launches counted in the optimized HLO"
        ),
        "rows": rows,
    }
    body = text.rstrip()
    assert body.endswith("}"), RESULTS
    RESULTS.write_text(body[:-1].rstrip() + marker + json.dumps(aot) + "\n}\n")
    json.loads(RESULTS.read_text())  # still JSON


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), action="append")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--save", action="store_true", help="write the rows into results.json")
    parser.add_argument(
        "--dump", type=pathlib.Path, help="write each program's optimized HLO into this folder"
    )
    parser.add_argument("--child", choices=sorted(TARGETS), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.dump is not None:
        options.dump = options.dump.resolve()
        options.dump.mkdir(parents=True, exist_ok=True)
    if options.child:
        run_target(options.child, options.ops, options.dump)
        return 0
    if "rnnt_loss" in options.ops:
        worst = check_rnnt_peer()
        print(f"rnnt_peer vs sj.rnnt_loss (CPU, small): largest difference {worst:.1e}")
        if not worst < 1e-4:
            print("rnnt_peer disagrees with sj.rnnt_loss: its rows compare unlike programs")
    rows = []
    for target in options.target or list(TARGETS):
        rows += _in_subprocess(target, options.ops, options.dump)
    print_rows(rows)
    if options.save and rows:
        save(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
