"""What an optimized HLO module runs: its loops, their trip counts, the
`conditional`s inside them and the kernels it launches.

`Launches(compiled.as_text())` reads the text of a compiled executable
(`jax.jit(f).lower(...).compile()`), for any target. A launch is an
instruction that runs as a kernel of its own: everything but the
bookkeeping ones (parameters, tuples, their elements, constants,
bitcasts) -- fusions, custom calls (cuDNN, cuBLAS, FFI targets), copies,
and ops XLA left unfused. A loop's condition runs once per iteration too,
so its launches count. On a GPU these are kernel launches; on a TPU the
same count reads as the program's sequential steps.

Used by tests/accelerators/compile_check.py and
benchmarks/bench_accelerators.py.
"""

from __future__ import annotations

import dataclasses
import math
import re

# Instructions that launch nothing: they name buffers or pass them on.
_FREE = {
    "parameter",
    "get-tuple-element",
    "tuple",
    "constant",
    "bitcast",
    "after-all",
    "add-dependency",
    "opt-barrier",
    "partition-id",
    "replica-id",
}
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?<![\w.\-])([a-z][a-z0-9\-]*)\(")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


@dataclasses.dataclass
class Loop:
    """One while loop: its trip count (None: data-dependent) and the
    launches of one iteration (body and condition, nested loops counted
    sequentially)."""

    trips: int | None
    per_iteration: int
    conditionals: int  # `conditional`s in its body (and in nested bodies)


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    """The optimized HLO's computations: name -> instruction lines, and the
    entry computation's name."""
    computations: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and current is None and not line.lstrip().startswith(("ROOT", "%" + "}")):
            current = header.group(1)
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif line.strip() == "}":
            current = None
        elif current is not None:
            computations[current].append(line)
    return computations, entry


def _opcode(rest: str) -> str:
    # The instruction's type comes first (a shape, or a tuple of shapes
    # whose layouts may hold upper-case tiles such as T(8,128)).
    match = _OPCODE.search(rest)
    return match.group(1) if match else ""


def _called(rest: str, key: str) -> list[str]:
    """The computations an instruction's attribute `key` names."""
    listed = re.search(rf"\b{key}=\{{([^}}]*)\}}", rest)
    if listed:
        return [name.strip().lstrip("%") for name in listed.group(1).split(",") if name.strip()]
    single = re.search(rf"\b{key}=%?([\w.\-]+)", rest)
    return [single.group(1)] if single else []


class Launches:
    """Counts an optimized HLO module's launches, loops and conditionals."""

    def __init__(self, hlo: str):
        self.computations, self.entry = _computations(hlo)
        self.loops: list[Loop] = []

    def sequential(self, name: str | None = None, *, top: bool = True) -> float:
        """Launches of computation `name` (the entry's by default) in
        sequence; inf where a loop's trip count is unknown. Records the
        entry's outermost loops in `self.loops`."""
        if name is None:
            self.loops = []
        total = 0.0
        for line in self.computations.get(name or self.entry, []):
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            rest = match.group(1)
            op = _opcode(rest)
            if op in _FREE:
                continue
            if op == "while":
                body = _called(rest, "body")
                condition = _called(rest, "condition")
                per = sum(self.sequential(c, top=False) for c in body + condition)
                trips_match = _TRIPS.search(rest)
                trips = int(trips_match.group(1)) if trips_match else self.counted(condition)
                if top:
                    self.loops.append(
                        Loop(
                            trips,
                            int(per) if math.isfinite(per) else -1,
                            sum(self.conditionals(c) for c in body),
                        )
                    )
                total += (trips if trips is not None else math.inf) * per
            elif op == "conditional":
                branches = _called(rest, "branch_computations") or (
                    _called(rest, "true_computation") + _called(rest, "false_computation")
                )
                # One branch runs; loops in a top-level branch are outermost loops.
                total += 1 + max((self.sequential(b, top=top) for b in branches), default=0)
            elif op == "call":
                # A call runs its computation in place (XLA:CPU wraps loops in one).
                total += sum(self.sequential(c, top=top) for c in _called(rest, "to_apply"))
            else:
                total += 1
        return total

    def counted(self, conditions: list[str]) -> int | None:
        """The trip count of a loop whose condition is `counter < N` with N
        a constant (how JAX lowers scan and fori_loop; the TPU's HLO
        carries no known_trip_count); None for any other condition."""
        lines = self.computations.get(conditions[0], []) if len(conditions) == 1 else []
        constants = {}
        for line in lines:
            found = re.match(r"^\s*%?([\w.\-]+)\s*=\s*s32\[\]\S*\s+constant\((\d+)\)", line)
            if found:
                constants[found.group(1)] = int(found.group(2))
        root = next((line for line in lines if line.lstrip().startswith("ROOT")), "")
        compare = re.search(r"compare\(%?[\w.\-]+,\s*%?([\w.\-]+)\),\s*direction=LT", root)
        return constants.get(compare.group(1)) if compare else None

    def conditionals(self, name: str) -> int:
        """`conditional`s in computation `name` and in the loops and calls it runs."""
        count = 0
        for line in self.computations.get(name, []):
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            rest = match.group(1)
            op = _opcode(rest)
            if op == "conditional":
                count += 1
            if op in ("while", "call", "conditional"):
                for key in ("body", "to_apply", "branch_computations"):
                    count += sum(self.conditionals(c) for c in _called(rest, key))
        return count
