"""The `.npz` layout of a saved Fsa: its array names by version, and the
sizes `load` holds a file to (the format itself is described in
`io/npz.py`)."""

from __future__ import annotations

import os
from typing import BinaryIO, Union

__all__ = [
    "ARC_FIELDS",
    "DEFLATE_RATIO",
    "FORMAT",
    "FSA_FIELDS",
    "HEADER",
    "LAYOUTS",
    "MAX_BYTES",
    "NAMES",
    "OLD_NAMES",
    "OLD_TABLES",
    "READS",
    "SIZES",
    "SIZE_NAMES",
    "SMALL",
    "VERSION",
    "File",
]


FORMAT = "semiring_jax.Fsa"
VERSION = 4
# Versions `load` reads.
READS = (1, 2, 3, 4)

HEADER = ("format", "version", "batch_shape", "is_acceptor", "cycle")
ARC_FIELDS = ("src", "dst", "ilabel", "olabel", "weight", "arc_mask")
FSA_FIELDS = (*ARC_FIELDS, "final_weight", "final_mask")
# The stored sizes, by kind: (sizes array, field names array).
SIZES = {
    "schedule": ("schedule_shape", "schedule_shape_fields"),
    "dense": ("dense_shape", "dense_shape_fields"),
}
SIZE_NAMES = tuple(name for pair in SIZES.values() for name in pair)
# The tables versions 1 to 3 stored, each with its axes after the batch
# axes: S and A are the Fsa's, "2" is 2, and every other letter a size that
# each table naming it must agree on (L levels, W width, R and K rows and
# slots of the incoming arcs, P and Q of the outgoing ones, C and D rows per
# state, I and J the per-state arc tables' widths).
OLD_TABLES = {
    "state_pos": "S",
    "pos_state": "LW",
    "in_arc": "LRK",
    "in_src_pos": "LRK",
    "in_combine": "LWC",
    "in_row_part": "LR",
    "out_arc": "LPQ",
    "out_dst_pos": "LPQ",
    "out_combine": "LWD",
    "arc_src_pos": "A",
    "arc_dst_pos": "A",
    "arc_grad_index": "A",
    "real_sizes": "2",
    "pull_arc": "A",
    "pull_src": "A",
    "pull_end": "LW",
    "state_in_arcs": "SI",
    "state_out_arcs": "SJ",
}
OLD_NAMES = frozenset(f"schedule.{name}" for name in OLD_TABLES)
# The arrays of each version: version 1 lacked the pull tables, versions 1
# and 2 `final_mask` (Fsa.final_mask did not exist yet).
LAYOUTS = {
    4: frozenset((*HEADER, *FSA_FIELDS, "real_sizes", *SIZE_NAMES)),
    3: frozenset((*HEADER, *FSA_FIELDS)) | OLD_NAMES,
}
LAYOUTS[2] = LAYOUTS[3] - {"final_mask"}
LAYOUTS[1] = LAYOUTS[2] - {
    "schedule.pull_arc",
    "schedule.pull_src",
    "schedule.pull_end",
}
NAMES = frozenset().union(*LAYOUTS.values())

File = Union[str, "os.PathLike[str]", BinaryIO]

# load's default budget: the total size the arrays of a file may declare.
MAX_BYTES = 1 << 32
# The most a deflate stream expands (258 bytes from about 2 bits).
DEFLATE_RATIO = 1032
# Arrays read before the shapes of the others are checked against them.
SMALL = (*HEADER, *SIZE_NAMES)
