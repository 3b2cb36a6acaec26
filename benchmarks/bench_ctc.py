"""Benchmark: CTC loss value + gradient against optax and torch, and dense_tot_score.

Times the whole chain a training step runs,

    logits [B, T, V] -> log_softmax -> CTC loss [B] -> sum -> gradient w.r.t. logits,

for three contestants in the same process, on the same seeded inputs:

  * ours:  jax.jit(value_and_grad(sum(sj.ctc_loss(jax.nn.log_softmax(logits), ...))));
  * optax: jax.jit(value_and_grad(sum(optax.ctc_loss(logits, paddings, ...)))) --
    optax.ctc_loss applies jax.nn.log_softmax itself, so it is given the raw
    logits (same work as ours); it takes padding masks (1.0 = padded) instead
    of lengths, built once outside the timing;
  * torch: torch.log_softmax(logits, -1).transpose(0, 1) -> F.ctc_loss(
    reduction='none').sum().backward() on CPU with torch.set_num_threads(2)
    (the [T, B, V] view torch wants; of the transpose / contiguous variants
    this one was the fastest on this machine).

at (B, T, V, U) = (8, 200, 64, 40), (16, 500, 256, 100), (32, 1000, 1024, 200),
and ours alone for `sj.dense_tot_score` (LOG, value + gradient w.r.t. the
emissions) with a shared LF-MMI-like denominator graph at B=16, T=500, V=256.

Run:
    .venv/bin/python benchmarks/bench_ctc.py           # full run, about 5 minutes on 2 cores
    .venv/bin/python benchmarks/bench_ctc.py --quick   # smoke run: smallest size, fewer repeats

Inputs (numpy default_rng([SEED, size index])): logits N(0, 1) float32;
input lengths uniform in [ceil(0.8 T), T] with one sequence of length T;
label lengths uniform in [ceil(U / 2), U] with one of length U; labels uniform
in [1, V) (blank is 0), padded with 0 past the label length. Every sequence
is feasible (input length >= label length + repeated neighbours; checked).
Before timing, each size checks that the per-sequence losses of ours agree
with optax and torch to 1e-4 relative, and compares every contestant's losses
and gradient with a float64 reference (the torch chain in float64). Gradient
entries lie in [-1, 1]; float32 errors grow with the loss magnitude (about
1e-2 for the peers at the largest size), so they are printed, not judged.

Timing: one untimed warm-up call each, then contestants interleaved round by
round (so machine drift hits all alike); median of >= 5 calls (3 with
--quick). Every timed call blocks until its outputs are ready
(jax.block_until_ready; torch is synchronous on CPU). Ratios are
peer time / our time, so > 1 means we are faster. JAX compile time is the
first call of a fresh jitted function minus the steady-state median (trace +
compile); the memory subprocess also reports `jit(f).lower(...).compile()`
wall time ("AOT compile").

Peak memory: each (contestant, size) runs in a fresh subprocess (this script
with the hidden `--measure-one IMPL INDEX`), started with
MALLOC_MMAP_THRESHOLD_=65536 so that glibc serves large buffers by mmap and
returns them to the OS on free (otherwise freed heap stays in the RSS and
hides later peaks). After imports and input creation (inputs live in host
memory for all three), the subprocess resets the kernel's peak-RSS mark
(`echo 5 > /proc/self/clear_refs`) and reads VmRSS, makes the first call, and
reads VmHWM: "first-call peak" = VmHWM - RSS before, which for JAX includes
XLA compilation. It then makes a second (warm) call, frees its outputs,
resets the mark again and makes five more calls (freeing each call's
outputs): "run peak" = VmHWM - RSS before these calls, the steady-state
memory a training step needs beyond its inputs, outputs included. It varies
by up to about 20 MB from one subprocess to the next at the middle size (the
XLA CPU runtime runs independent operations concurrently, so which buffers
are live together depends on timing); XLA's static figure does not. The goal
compares run peaks. Where clear_refs is not writable the subprocess falls back
to ru_maxrss (lifetime peak) and says so. For JAX the subprocess also prints
XLA's static `memory_analysis()` of the compiled function: temp + output bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import denominator
import numpy as np
from timing import Reps, first_call_seconds, interleaved_medians

SEED = 20240611
CTC_SIZES = [(8, 200, 64, 40), (16, 500, 256, 100), (32, 1000, 1024, 200)]
DENSE = dict(batch=16, frames=500, vocab=256, states=500, arcs=5000, finals=10)
LOSS_RTOL = 1e-4  # agreement check on per-sequence losses
SPEED_GOALS = [1.0, 2.0, 2.0]  # optax / ours at each CTC size
STEADY_CALLS = 5  # calls whose peak RSS makes the "run peak"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


# -- inputs ----------------------------------------------------------------------------


@dataclasses.dataclass
class CtcInputs:
    """Host arrays for one CTC size (blank 0; labels padded with 0)."""

    logits: np.ndarray  # float32 [B, T, V]
    input_lengths: np.ndarray  # int32 [B]
    labels: np.ndarray  # int32 [B, U]
    label_lengths: np.ndarray  # int32 [B]

    @property
    def logit_paddings(self) -> np.ndarray:
        t = self.logits.shape[1]
        return (np.arange(t)[None, :] >= self.input_lengths[:, None]).astype(np.float32)

    @property
    def label_paddings(self) -> np.ndarray:
        u = self.labels.shape[1]
        return (np.arange(u)[None, :] >= self.label_lengths[:, None]).astype(np.float32)


def make_ctc_inputs(index: int) -> CtcInputs:
    """Seeded inputs for CTC_SIZES[index]; asserts every sequence is feasible."""
    b, t, v, u = CTC_SIZES[index]
    rng = np.random.default_rng([SEED, index])
    logits = rng.standard_normal((b, t, v), dtype=np.float32)
    input_lengths = rng.integers(math.ceil(0.8 * t), t + 1, size=b)
    input_lengths[rng.integers(b)] = t
    label_lengths = rng.integers(math.ceil(0.5 * u), u + 1, size=b)
    label_lengths[rng.integers(b)] = u
    labels = rng.integers(1, v, size=(b, u))
    labels[np.arange(u)[None, :] >= label_lengths[:, None]] = 0
    for i in range(b):
        seq = labels[i, : label_lengths[i]]
        needed = label_lengths[i] + int(np.sum(seq[1:] == seq[:-1]))
        assert input_lengths[i] >= needed, f"infeasible sequence {i} at size {index}"
    return CtcInputs(
        logits,
        input_lengths.astype(np.int32),
        labels.astype(np.int32),
        label_lengths.astype(np.int32),
    )


@dataclasses.dataclass
class DenseInputs:
    """The shared denominator-like graph and a batch of emissions."""

    arcs: np.ndarray  # float64 [A, 4] rows (src, dst, label, weight)
    final: list[int]
    emissions: np.ndarray  # float32 [B, T, V], log-probabilities
    lengths: np.ndarray  # int32 [B]


def make_dense_inputs() -> DenseInputs:
    """The graph of `denominator.random_graph` (start 0, `finals` final
    states). Emissions are log_softmax of N(0, 1) logits; lengths uniform in
    [ceil(0.8 T), T], one of length T."""
    d = DENSE
    rng = np.random.default_rng([SEED, 100])
    graph = denominator.random_graph(rng, d["states"], d["arcs"], d["vocab"], d["finals"])
    arcs = np.stack([graph.src, graph.dst, graph.label, graph.weight], axis=1)
    logits = rng.standard_normal((d["batch"], d["frames"], d["vocab"]))
    emissions = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    lengths = rng.integers(math.ceil(0.8 * d["frames"]), d["frames"] + 1, d["batch"])
    lengths[0] = d["frames"]
    return DenseInputs(
        arcs, graph.final.tolist(), emissions.astype(np.float32), lengths.astype(np.int32)
    )


def numpy_dense_total(inp: DenseInputs) -> np.ndarray:
    """Reference LOG totals [B] in float64: per-frame forward over the arcs."""
    src, dst, label = (inp.arcs[:, i].astype(np.int64) for i in range(3))
    final = np.asarray(inp.final)
    graph = denominator.Graph(src, dst, label, inp.arcs[:, 3], final, DENSE["states"])
    return denominator.numpy_log_totals(graph, inp.emissions, inp.lengths)


# -- contestants -----------------------------------------------------------------------
# Each builder returns (call, check): `call()` runs one value + gradient and
# blocks until the outputs are ready, returning them; `check()` returns
# (per-sequence losses [B], gradient w.r.t. the logits) as numpy arrays.


def have_ours(name: str) -> bool:
    import semiring_jax as sj

    return hasattr(sj, name)


def jax_contestant(fn: Callable, args: tuple) -> tuple[Callable, Callable, Callable]:
    """(call, check, aot) for `fn(x, *rest) -> [B]`, gradient w.r.t. x."""
    import jax
    import jax.numpy as jnp

    args = tuple(jax.device_put(a) for a in args)
    total = lambda x, *rest: jnp.sum(fn(x, *rest))
    vg = jax.jit(jax.value_and_grad(total))
    per_seq = jax.jit(fn)

    def call():
        return jax.block_until_ready(vg(*args))

    def check():
        _, grad = vg(*args)
        return np.asarray(per_seq(*args)), np.asarray(grad)

    def aot():
        start = time.perf_counter()
        compiled = jax.jit(jax.value_and_grad(total)).lower(*args).compile()
        seconds = time.perf_counter() - start
        try:
            stats = compiled.memory_analysis()
            xla = {
                "temp": stats.temp_size_in_bytes,
                "output": stats.output_size_in_bytes,
                "argument": stats.argument_size_in_bytes,
            }
        except Exception:  # memory_analysis is optional in XLA backends
            xla = None
        return seconds, xla

    return call, check, aot


def build_ours(inp: CtcInputs):
    import jax

    import semiring_jax as sj

    def loss(logits, input_lengths, labels, label_lengths):
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return sj.ctc_loss(log_probs, input_lengths, labels, label_lengths, blank=0)

    return jax_contestant(loss, (inp.logits, inp.input_lengths, inp.labels, inp.label_lengths))


def build_optax(inp: CtcInputs):
    import optax

    def loss(logits, logit_paddings, labels, label_paddings):
        return optax.ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id=0)

    return jax_contestant(loss, (inp.logits, inp.logit_paddings, inp.labels, inp.label_paddings))


def build_torch(inp: CtcInputs):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    logits = torch.from_numpy(inp.logits).requires_grad_(True)
    targets = torch.from_numpy(inp.labels.astype(np.int64))
    input_lengths = torch.from_numpy(inp.input_lengths.astype(np.int64))
    target_lengths = torch.from_numpy(inp.label_lengths.astype(np.int64))

    def per_seq():
        log_probs = torch.log_softmax(logits, dim=-1).transpose(0, 1)  # [T, B, V]
        return F.ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            blank=0,
            reduction="none",
            zero_infinity=False,
        )

    def call():
        logits.grad = None
        total = per_seq().sum()
        total.backward()
        return total.detach(), logits.grad

    def check():
        losses = per_seq().detach().numpy().copy()
        _, grad = call()
        return losses, grad.numpy().copy()

    def release():
        logits.grad = None

    call.release = release
    return call, check, None


def build_dense(inp: DenseInputs):
    import semiring_jax as sj

    graph = sj.Fsa.from_arcs(inp.arcs, inp.final, num_states=DENSE["states"], dtype=np.float32)

    def total(emissions, graph, lengths):
        return sj.dense_tot_score(graph, emissions, lengths, sj.LOG)

    return jax_contestant(total, (inp.emissions, graph, inp.lengths))


BUILDERS = {"ours": build_ours, "optax": build_optax, "torch": build_torch}


# -- timing ----------------------------------------------------------------------------


FULL_REPS = Reps(min_runs=5, max_runs=15, budget_s=3.0)
QUICK_REPS = Reps(min_runs=3, max_runs=3, budget_s=0.0)


# -- memory (subprocess) ---------------------------------------------------------------


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_kb(resettable: bool) -> int:
    if resettable:
        return _status_kb("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def measure_one(impl: str, index: int) -> dict:
    """Runs in a fresh process: peak RSS of the first call and of steady calls."""
    if impl == "dense":
        call, _, aot = build_dense(make_dense_inputs())
    else:
        call, _, aot = BUILDERS[impl](make_ctc_inputs(index))
    release = getattr(call, "release", lambda: None)
    gc.collect()
    resettable = _reset_peak()
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    out = call()
    first_s = time.perf_counter() - start
    first_peak = _peak_kb(resettable) - before
    del out
    release()
    out = call()  # warm
    del out
    release()
    gc.collect()
    resettable = _reset_peak()
    before = _status_kb("VmRSS")
    for _ in range(STEADY_CALLS):
        out = call()
        del out
        release()
    run_peak = _peak_kb(resettable) - before
    result = {
        "impl": impl,
        "index": index,
        "first_peak_kb": first_peak,
        "run_peak_kb": run_peak,
        "first_call_s": first_s,
        "resettable": resettable,
        "aot_s": None,
        "xla": None,
    }
    if aot is not None:
        result["aot_s"], result["xla"] = aot()
    return result


def measure_in_subprocess(impl: str, index: int) -> dict | None:
    env = dict(os.environ, **MALLOC_ENV)
    cmd = [sys.executable, os.path.abspath(__file__), "--measure-one", impl, str(index)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  memory subprocess {impl} {index} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- one size --------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One CTC size (or the dense workload: optax/torch absent); seconds."""

    name: str
    times: dict[str, float]
    compile_s: dict[str, float]
    checks: list[str]
    mem: dict[str, dict | None] = dataclasses.field(default_factory=dict)

    def ratio(self, peer: str) -> float | None:
        if "ours" not in self.times or peer not in self.times:
            return None
        return self.times[peer] / self.times["ours"]


def rel_loss_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b) / np.abs(b.astype(np.float64))))


def torch_float64_reference(inp: CtcInputs) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence losses and the gradient w.r.t. the logits, torch in float64."""
    import torch
    import torch.nn.functional as F

    logits = torch.from_numpy(inp.logits.astype(np.float64)).requires_grad_(True)
    log_probs = torch.log_softmax(logits, dim=-1).transpose(0, 1)
    losses = F.ctc_loss(
        log_probs,
        torch.from_numpy(inp.labels.astype(np.int64)),
        torch.from_numpy(inp.input_lengths.astype(np.int64)),
        torch.from_numpy(inp.label_lengths.astype(np.int64)),
        blank=0,
        reduction="none",
        zero_infinity=False,
    )
    losses.sum().backward()
    return losses.detach().numpy(), logits.grad.numpy()


def run_ctc_size(index: int, impls: list[str], reps: Reps) -> Row:
    b, t, v, u = CTC_SIZES[index]
    inp = make_ctc_inputs(index)
    built = {name: BUILDERS[name](inp) for name in impls}
    compile_s, first = {}, {}
    for name, (call, _, _) in built.items():
        first[name] = first_call_seconds(call)
    results = {name: check() for name, (_, check, _) in built.items()}
    ref_loss, ref_grad = torch_float64_reference(inp)
    checks = []
    for x, y in [("ours", "optax"), ("ours", "torch")]:
        if x in results and y in results:
            dl = rel_loss_diff(results[x][0], results[y][0])
            checks.append(
                f"{x} vs {y}: loss max rel diff {dl:.1e} {'ok' if dl <= LOSS_RTOL else 'MISMATCH'}"
            )
    for name, (loss, grad) in results.items():
        dl = rel_loss_diff(loss, ref_loss)
        dg = float(np.max(np.abs(grad - ref_grad)))
        checks.append(f"{name} vs float64: loss max rel err {dl:.1e}, grad max abs err {dg:.1e}")
    times = interleaved_medians({name: c[0] for name, c in built.items()}, reps)
    for name, (_, _, aot) in built.items():
        if aot is not None:
            compile_s[name] = max(first[name] - times[name], 0.0)
    del built, results
    gc.collect()
    return Row(f"({b}, {t}, {v}, {u})", times, compile_s, checks)


def run_dense(reps: Reps) -> Row:
    inp = make_dense_inputs()
    call, check, _ = build_dense(inp)
    first = first_call_seconds(call)
    totals, grad = check()
    ref = numpy_dense_total(inp)
    dl = rel_loss_diff(totals, ref)
    # The gradient w.r.t. emissions is the label occupancy: each frame within
    # the length sums to 1, frames past it to 0.
    occ = grad.sum(axis=-1)
    want = (np.arange(inp.emissions.shape[1])[None, :] < inp.lengths[:, None]).astype(float)
    dg = float(np.max(np.abs(occ - want)))
    checks = [
        f"total vs numpy float64 forward: max rel diff {dl:.1e} "
        f"{'ok' if dl <= LOSS_RTOL else 'MISMATCH'}; "
        f"gradient sums per frame: max |sum - (t < length)| {dg:.1e}"
    ]
    times = interleaved_medians({"ours": call}, reps)
    d = DENSE
    return Row(
        f"dense B={d['batch']} T={d['frames']} V={d['vocab']}",
        times,
        {"ours": max(first - times["ours"], 0.0)},
        checks,
    )


# -- reporting -------------------------------------------------------------------------


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def mem_mb(row: Row, impl: str, key: str = "run_peak_kb") -> float | None:
    m = row.mem.get(impl)
    return None if m is None else m[key] / 1024


def print_environment() -> None:
    import jax
    import optax
    import torch

    import semiring_jax as sj

    print(
        f"python {platform.python_version()}  jax {jax.__version__}  optax "
        f"{optax.__version__}  torch {torch.__version__}  numpy {np.__version__}  "
        f"semiring_jax {sj.__version__}"
    )
    print(
        f"jax.devices(): {jax.devices()}  os.cpu_count(): {os.cpu_count()}  "
        f"torch threads: 2  XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')}  "
        f"load average at start: {os.getloadavg()[0]:.2f}"
    )


def print_inputs(indices: list[int]) -> None:
    print(f"\nInputs (seed {SEED}; blank 0, labels in [1, V)):")
    for i in indices:
        inp = make_ctc_inputs(i)
        print(
            f"  (B, T, V, U) = {CTC_SIZES[i]}: input lengths "
            f"{inp.input_lengths.min()}..{inp.input_lengths.max()}, label lengths "
            f"{inp.label_lengths.min()}..{inp.label_lengths.max()}"
        )


def print_table(rows: list[Row]) -> None:
    print(
        "\nCTC value + gradient w.r.t. logits (logits -> log_softmax -> loss -> sum ->"
        " grad); median ms, compile s, run peak MB:"
    )
    header = (
        f"{'(B, T, V, U)':<23}{'ours':>9}{'optax':>9}{'torch':>9}{'optax/ours':>12}"
        f"{'torch/ours':>12}{'cmp ours':>10}{'cmp optax':>10}{'mem ours':>10}"
        f"{'mem optax':>10}{'mem torch':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        t = r.times
        print(
            f"{r.name:<23}{fmt(t.get('ours'), '.1f', 1e3):>9}"
            f"{fmt(t.get('optax'), '.1f', 1e3):>9}{fmt(t.get('torch'), '.1f', 1e3):>9}"
            f"{fmt(r.ratio('optax'), '.2f'):>12}{fmt(r.ratio('torch'), '.2f'):>12}"
            f"{fmt(r.compile_s.get('ours'), '.2f'):>10}"
            f"{fmt(r.compile_s.get('optax'), '.2f'):>10}"
            f"{fmt(mem_mb(r, 'ours'), '.0f'):>10}{fmt(mem_mb(r, 'optax'), '.0f'):>10}"
            f"{fmt(mem_mb(r, 'torch'), '.0f'):>10}"
        )
    print(
        "Ratios are peer / ours (> 1: ours faster). cmp = first jitted call minus"
        " steady median. mem = run peak\n  (steady-state peak RSS above the inputs,"
        " outputs included; see the docstring)."
    )


def print_dense(row: Row) -> None:
    d = DENSE
    print(
        f"\nsj.dense_tot_score, LOG, value + gradient w.r.t. emissions; shared graph of"
        f" {d['states']} states, {d['arcs']} arcs\n  (cyclic, {d['finals']} finals),"
        f" B={d['batch']}, T={d['frames']}, V={d['vocab']}; no peer:"
    )
    m = row.mem.get("ours")
    xla = m and m.get("xla")
    print(
        f"  median {fmt(row.times.get('ours'), '.1f', 1e3)} ms, compile "
        f"{fmt(row.compile_s.get('ours'), '.2f')} s, run peak "
        f"{fmt(mem_mb(row, 'ours'), '.0f')} MB, first-call peak "
        f"{fmt(mem_mb(row, 'ours', 'first_peak_kb'), '.0f')} MB, XLA temp+output "
        f"{fmt(xla and (xla['temp'] + xla['output']) / 2**20, '.0f')} MB"
    )


def print_memory(rows: list[Row]) -> None:
    print("\nMemory details (MB; fresh subprocess per cell, MALLOC_MMAP_THRESHOLD_=65536):")
    print(
        f"  {'workload':<30}{'impl':<7}{'run peak':>10}{'first-call peak':>17}"
        f"{'XLA temp+out':>14}{'AOT compile s':>15}"
    )
    for r in rows:
        for impl, m in r.mem.items():
            if m is None:
                print(f"  {r.name:<30}{impl:<7}   (measurement failed)")
                continue
            xla = m["xla"]
            note = "" if m["resettable"] else "  (ru_maxrss: lifetime peak)"
            print(
                f"  {r.name:<30}{impl:<7}{m['run_peak_kb'] / 1024:>10.0f}"
                f"{m['first_peak_kb'] / 1024:>17.0f}"
                f"{fmt(xla and (xla['temp'] + xla['output']) / 2**20, '.0f'):>14}"
                f"{fmt(m['aot_s'], '.2f'):>15}{note}"
            )
    print("  first-call peak includes XLA compilation for the JAX contestants.")


def print_checks(rows: list[Row]) -> None:
    print("\nCorrectness checks (before timing):")
    for r in rows:
        for c in r.checks:
            print(f"  {r.name:<30}{c}")


def print_goals(rows: list[Row], indices: list[int]) -> None:
    print(
        "\nGoals: value+grad >= 2x faster than optax at the two larger sizes and no"
        " slower at the smallest;\n  no slower than torch at any size; run peak memory"
        " <= optax's."
    )
    met_all = True
    for r, i in zip(rows, indices):
        items = []
        for label, value, goal in [
            ("optax/ours", r.ratio("optax"), SPEED_GOALS[i]),
            ("torch/ours", r.ratio("torch"), 1.0),
        ]:
            if value is None:
                items.append(f"{label} >= {goal:.0f}: not measured")
                met_all = False
            else:
                met = value >= goal
                met_all &= met
                items.append(f"{label} {value:.2f} >= {goal:.0f}: {'MET' if met else 'NOT MET'}")
        mo, mp = mem_mb(r, "ours"), mem_mb(r, "optax")
        if mo is None or mp is None:
            items.append("memory: not measured")
            met_all = False
        else:
            met = mo <= mp
            met_all &= met
            items.append(f"memory {mo:.0f} <= {mp:.0f} MB: {'MET' if met else 'NOT MET'}")
        print(f"  {r.name:<23}" + "; ".join(items))
    print(f"  Overall: {'all goals met' if met_all else 'some goals NOT met'}.")


# -- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: smallest CTC size only, fewer repetitions"
    )
    parser.add_argument("--no-dense", action="store_true", help="skip the dense_tot_score workload")
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory subprocesses"
    )
    parser.add_argument("--measure-one", nargs=2, metavar=("IMPL", "INDEX"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_one:
        print(json.dumps(measure_one(args.measure_one[0], int(args.measure_one[1]))))
        return

    reps = QUICK_REPS if args.quick else FULL_REPS
    indices = [0] if args.quick else list(range(len(CTC_SIZES)))
    start = time.perf_counter()
    print_environment()
    print(f"repetitions: {reps}")
    impls = ["optax", "torch"]
    if have_ours("ctc_loss"):
        impls.insert(0, "ours")
    else:
        print("sj.ctc_loss is missing: the 'ours' columns read n/a.")
    dense = not args.no_dense and have_ours("dense_tot_score")
    if not args.no_dense and not dense:
        print("sj.dense_tot_score is missing: the dense workload is skipped.")
    print_inputs(indices)

    rows = []
    for i in indices:
        rows.append(run_ctc_size(i, impls, reps))
        print(
            f"  timed {rows[-1].name} ({time.perf_counter() - start:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    dense_row = None
    if dense:
        dense_row = run_dense(reps)
        print(f"  timed dense ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    if not args.no_memory:
        for r, i in zip(rows, indices):
            for impl in impls:
                r.mem[impl] = measure_in_subprocess(impl, i)
            print(
                f"  memory {r.name} ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        if dense_row is not None:
            dense_row.mem["ours"] = measure_in_subprocess("dense", 0)

    print_table(rows)
    if dense_row is not None:
        print_dense(dense_row)
    all_rows = rows + ([dense_row] if dense_row is not None else [])
    print_checks(all_rows)
    if not args.no_memory:
        print_memory(all_rows)
    print_goals(rows, indices)
    print(
        f"\nTotal wall time {time.perf_counter() - start:.0f} s; load average at end "
        f"{os.getloadavg()[0]:.2f} (other processes on the 2 cores inflate all times)."
    )


if __name__ == "__main__":
    main()
