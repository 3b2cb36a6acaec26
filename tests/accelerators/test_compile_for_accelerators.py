"""The traced public ops compile for accelerators this CPU host does not have.

`compile_check.py` compiles every traced public op -- the losses and score
ops as `jax.jit(jax.value_and_grad(f))`, the decoders' values -- at small
float32 shapes with the library's default settings, for one chip of a TPU
v5e topology (default run) and an NVIDIA H100 (`slow`). It runs in a
subprocess whose PYTHONPATH adds the target's compiler, installed apart
from the test virtualenv (see docs/development.md), so that this suite's
own JAX starts as a user's CPU install does. A missing install fails the
test, naming the command that makes it.

The compiled programs are read too (`hlo_loops.py`): no loop body holds a
`conditional` (on a GPU, a host round-trip per iteration), and every loop
has a trip count fixed at compile time.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import compile_check
import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "compile_check.py"
OPS = set(compile_check.OPS)
# target -> (the folder its compiler is installed in, its requirements file)
INSTALLS = {
    "tpu": (ROOT / ".accelerators" / "tpu", HERE / "requirements-tpu.txt"),
    "h100": (ROOT / ".accelerators" / "cuda", HERE / "requirements-cuda.txt"),
}


def _pins(requirements: pathlib.Path) -> dict[str, str]:
    found = re.findall(r"^([\w.-]+)==(\S+)", requirements.read_text(), re.M)
    return {name.replace("-", "_").lower(): version for name, version in found}


def _installed(folder: pathlib.Path) -> dict[str, str]:
    found = (re.fullmatch(r"(.+)-([^-]+)\.dist-info", p.name) for p in folder.glob("*.dist-info"))
    return {m[1].lower(): m[2] for m in found if m}


def _compile(target: str) -> list[dict]:
    folder, requirements = INSTALLS[target]
    command = (
        f".venv/bin/pip install --upgrade --target {folder.relative_to(ROOT)} "
        f"-r {requirements.relative_to(ROOT)}"
    )
    pins = _pins(requirements)
    have = _installed(folder) if folder.is_dir() else {}
    wrong = {name: have.get(name) for name, version in pins.items() if have.get(name) != version}
    if wrong:
        pytest.fail(
            f"{target}'s compiler is not installed as pinned (found {wrong}, want {pins} in "
            f"{folder}); from the repository root run: {command}",
            pytrace=False,
        )
    env = {
        key: value
        for key, value in os.environ.items()
        # The library's defaults, and the host's own backend the CPU.
        if key not in ("SEMIRING_JAX_CPU_KERNELS", "JAX_PLATFORMS", "XLA_FLAGS", "PYTHONPATH")
    }
    env.update(TPU_SKIP_MDS_QUERY="1", PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), target],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if {line["op"] for line in lines} != OPS:
        pytest.fail(f"compile_check.py {target} stopped early:\n{result.stderr[-3000:]}")
    return lines


def _assert_all_compiled(lines: list[dict]) -> None:
    failed = [f"{line['op']}: {line['error']}" for line in lines if not line["ok"]]
    if failed:
        pytest.fail("did not compile:\n" + "\n".join(failed), pytrace=False)


def _assert_lean_loops(lines: list[dict]) -> None:
    """No `conditional` in a loop body; every trip count static."""
    found = []
    for line in lines:
        loops = line["loops"]
        conditionals = sum(loop["conditionals"] for loop in loops)
        unknown = sum(loop["trips"] is None for loop in loops)
        if conditionals or unknown:
            found.append(
                f"{line['op']}: {conditionals} conditionals in loop bodies, "
                f"{unknown} data-dependent loops"
            )
    assert not found, "loops that are not lean:\n" + "\n".join(found)


def test_the_public_ops_compile_for_a_tpu():
    lines = _compile("tpu")
    assert {line["device"] for line in lines} == {"TPU v5 lite"}
    _assert_all_compiled(lines)
    _assert_lean_loops(lines)
    # The pruned pipeline: the simple loss's scan and the ranges' are one
    # (the same moves, computed alike), then the pruned loss's: two loops
    # of T + U = 8 + 3 steps.
    (pipeline,) = [line for line in lines if line["op"] == "rnnt_pruned_pipeline"]
    assert [loop["trips"] for loop in pipeline["loops"]].count(11) == 2, pipeline["loops"]


@pytest.mark.slow  # a 570 MB install (the CUDA plugin and ptxas); ~40 s to compile
def test_the_public_ops_compile_for_an_h100():
    lines = _compile("h100")
    assert {line["device"] for line in lines} == {"NVIDIA H100 80GB HBM3"}
    _assert_all_compiled(lines)
    _assert_lean_loops(lines)
    # ctc_loss's loops and tot_score's each take two steps (α and β) an
    # iteration in at most 5 launches: the step's kernel, the save, the
    # carry's copy back, the loop's counter and its condition.
    for op in ("ctc_loss", "tot_score"):
        (line,) = [line for line in lines if line["op"] == op]
        assert max(loop["per_iteration"] for loop in line["loops"]) <= 5, (op, line["loops"])
