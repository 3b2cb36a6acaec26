"""Conversion to and from pynini (OpenFst) FSTs; pynini is an optional extra.

OpenFst weights are costs and ours are scores, so each conversion negates.
`to_pynini` builds through pynini's own API. `from_pynini` reads OpenFst's
binary serialisation (`fst.write_to_string()`), because pynini only shows
a weight as text with 9 significant digits, which would round "log64"
weights; the binary form holds them exactly.

The binary layout of a "vector" FST (OpenFst's `FstHeader` and
`VectorFst::WriteFst`, all little-endian, strings as int32 length + bytes):
magic int32, fst type, arc type, version int32, flags int32, properties
uint64, start int64, states int64, arcs int64; the input and then the
output symbol table if flags has bit 1 / bit 2; then per state its final
weight, its number of arcs (int64) and its arcs as (ilabel int32, olabel
int32, weight, nextstate int32), a weight being float32, or float64 for
"log64".
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from semiring_jax._src.core.host import build
from semiring_jax._src.io.host import openfst_text
from semiring_jax._src.io.host.symbols import SymbolTable, import_pynini

__all__ = ["ARC_WEIGHT_DTYPES", "from_pynini", "to_pynini"]

# OpenFst arc type -> the numpy dtype of its weights.
ARC_WEIGHT_DTYPES: dict[str, np.dtype] = {
    "standard": np.dtype("<f4"),
    "log": np.dtype("<f4"),
    "log64": np.dtype("<f8"),
}

_FST_MAGIC = 2125659606
_SYMBOL_TABLE_MAGIC = 2125658996
_HAS_ISYMBOLS, _HAS_OSYMBOLS = 1, 2


class _Reader:
    """Reads OpenFst's binary fields from a bytes buffer, in order."""

    def __init__(self, data: bytes, fn: str) -> None:
        self.data, self.offset, self.fn = data, 0, fn

    def take(self, size: int) -> bytes:
        if self.offset + size > len(self.data):
            raise ValueError(
                f"{self.fn}: the FST's binary form ends early, at byte "
                f"{self.offset} of {len(self.data)}"
            )
        piece = self.data[self.offset : self.offset + size]
        self.offset += size
        return piece

    def number(self, fmt: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.number("<i")).decode("utf-8", errors="replace")

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        return np.frombuffer(self.take(dtype.itemsize * count), dtype=dtype, count=count)

    def skip_symbol_table(self) -> None:
        if self.number("<i") != _SYMBOL_TABLE_MAGIC:
            raise ValueError(f"{self.fn}: unexpected symbol table in the FST's binary form")
        self.string()  # name
        self.number("<q")  # available key
        for _ in range(self.number("<q")):
            self.string()
            self.number("<q")


def _vector_fst_bytes(fst: Any, fn: str) -> bytes:
    """The binary form of `fst` as a "vector" FST (converted if need be)."""
    pynini = import_pynini(fn)
    if not isinstance(fst, pynini.Fst):
        import pywrapfst

        if not isinstance(fst, pywrapfst.Fst):
            raise TypeError(f"{fn}: fst must be a pynini.Fst, got {type(fst).__name__}")
        if fst.fst_type() != "vector":
            fst = pywrapfst.convert(fst, fst_type="vector")
    return fst.write_to_string()


def _read_arcs(data: bytes, fn: str) -> tuple[int, int, np.ndarray, list[np.ndarray]]:
    """(start, num_states, final costs [S], per-state structured arc arrays)."""
    reader = _Reader(data, fn)
    if reader.number("<i") != _FST_MAGIC:
        raise ValueError(f"{fn}: not an OpenFst binary FST")
    fst_type, arc_type = reader.string(), reader.string()
    if arc_type not in ARC_WEIGHT_DTYPES:
        raise ValueError(
            f"{fn}: arc type {arc_type!r} is not supported; expected one of "
            f"{sorted(ARC_WEIGHT_DTYPES)}"
        )
    if fst_type != "vector":
        raise ValueError(f"{fn}: cannot read an FST of type {fst_type!r}")
    reader.number("<i")  # version
    flags = reader.number("<i")
    reader.number("<Q")  # properties
    start, num_states = reader.number("<q"), reader.number("<q")
    reader.number("<q")  # arcs
    for bit in (_HAS_ISYMBOLS, _HAS_OSYMBOLS):
        if flags & bit:
            reader.skip_symbol_table()
    weight_dtype = ARC_WEIGHT_DTYPES[arc_type]
    arc_dtype = np.dtype(
        [("ilabel", "<i4"), ("olabel", "<i4"), ("weight", weight_dtype), ("nextstate", "<i4")]
    )
    final_costs = np.empty(num_states, np.float64)
    arcs = []
    for state in range(num_states):
        final_costs[state] = reader.array(weight_dtype, 1)[0]
        arcs.append(reader.array(arc_dtype, reader.number("<q")))
    return start, num_states, final_costs, arcs


def from_pynini(fst: Any, *, dtype: np.dtype) -> build.ArcArrays:
    """The host arrays of `Fsa.from_pynini` (which assembles them)."""
    fn = "from_pynini"
    start, num_states, final_costs, per_state = _read_arcs(_vector_fst_bytes(fst, fn), fn)
    if start < 0:  # no start state: no path
        return build.arcs_from_rows(np.zeros((0, 4)), {}, num_states=1, start=0, dtype=dtype, fn=fn)
    counts = [arcs.shape[0] for arcs in per_state]
    src = np.repeat(np.arange(num_states, dtype=np.float64), counts)
    arcs = np.concatenate(per_state)  # a start state means num_states >= 1
    is_acceptor = bool(np.array_equal(arcs["ilabel"], arcs["olabel"]))
    scores = 0.0 - arcs["weight"].astype(np.float64)  # 0.0 - x: a cost of 0 is a score of 0
    columns = [src, arcs["nextstate"], arcs["ilabel"]]
    columns += [] if is_acceptor else [arcs["olabel"]]
    rows = np.stack([np.asarray(c, np.float64) for c in columns] + [scores], axis=1)
    finite = np.flatnonzero(final_costs != math.inf)
    final = {int(s): 0.0 - float(final_costs[s]) for s in finite}
    return build.arcs_from_rows(
        rows, final, num_states=num_states, start=int(start), dtype=dtype, fn=fn
    )


def _check_labels(
    labels: np.ndarray, table: SymbolTable | None, field: str, table_name: str, fn: str
) -> None:
    if table is None:
        return
    for a, label in enumerate(labels.tolist()):
        if label not in table:
            raise ValueError(f"{fn}: arc {a} has {field}={label}, which {table_name} does not hold")


def to_pynini(
    arrays: build.ArcArrays,
    *,
    arc_type: str,
    isymbols: SymbolTable | None,
    osymbols: SymbolTable | None,
) -> Any:
    """See `Fsa.to_pynini`; `arrays` are the real arcs of one Fsa."""
    fn = "to_pynini"
    if arc_type not in ARC_WEIGHT_DTYPES:
        raise ValueError(
            f"{fn}: arc_type must be one of {sorted(ARC_WEIGHT_DTYPES)}, got {arc_type!r}"
        )
    itable, otable = openfst_text.label_tables(arrays.is_acceptor, isymbols, osymbols, fn)
    _check_labels(
        arrays.ilabel,
        itable,
        "label" if arrays.is_acceptor else "ilabel",
        "isymbols" if isymbols is not None else "osymbols",
        fn,
    )
    if not arrays.is_acceptor:
        _check_labels(arrays.olabel, otable, "olabel", "osymbols", fn)
    pynini = import_pynini(fn)
    fst = pynini.Fst(arc_type=arc_type)
    weight_type = fst.weight_type()
    # Python floats: pynini reads a weight through its shortest repr, which
    # gives back the same float64 ("log64") or the nearest float32.
    cost = lambda score: pynini.Weight(weight_type, 0.0 - float(score))
    fst.add_states(arrays.num_states)
    fst.set_start(0)
    for src, dst, ilabel, olabel, score in zip(
        arrays.src.tolist(),
        arrays.dst.tolist(),
        arrays.ilabel.tolist(),
        arrays.olabel.tolist(),
        arrays.weight.tolist(),
    ):
        fst.add_arc(src, pynini.Arc(ilabel, olabel, cost(score), dst))
    for state in np.flatnonzero(arrays.final_weight > -math.inf).tolist():
        fst.set_final(state, cost(arrays.final_weight[state]))
    if itable is not None:
        fst.set_input_symbols(itable.to_pynini())
    if otable is not None:
        fst.set_output_symbols(otable.to_pynini())
    return fst
