"""The route table in words: rows for the docs, from the route records.

docs/routes.md holds `markdown()`'s text between two markers, and a test
fails when the page and the records (`core/route_table.py`) disagree.
"""

from __future__ import annotations

from typing import NamedTuple

from semiring_jax._src.core.route_table import RECORDS
from semiring_jax._src.core.routes import EVERY

__all__ = ["Row", "markdown", "table"]

# Column headings of the platforms; "rocm" runs what "cuda" runs.
_PLATFORM_NAMES = {"cpu": "CPU", "cuda": "GPU", "tpu": "TPU"}


class Row(NamedTuple):
    """One route of one op: where it runs and what it serves.

    Attributes:
      op: the route record's name (`semiring_jax.routes.force` takes it).
      functions: the public functions that run it.
      route: the route's name.
      platforms: where it may run ("cpu", "cuda", "rocm", "tpu").
      serves: its input conditions, in words.
      reference: whether the op's other routes are checked against it.
    """

    op: str
    functions: tuple[str, ...]
    route: str
    platforms: tuple[str, ...]
    serves: str
    reference: bool


def table() -> list[Row]:
    """Every op's routes, in order of preference: on each platform an op
    runs its first route that runs there and serves the inputs.

    Examples:
      >>> import semiring_jax as sj
      >>> [(row.route, row.platforms) for row in sj.routes.table() if row.op == "ctc_loss"]
      [('cpu_kernel', ('cpu',)), ('frame_scan', ('cpu', 'cuda', 'rocm', 'tpu'))]
    """
    return [
        Row(
            op.name,
            functions,
            route.name,
            route.platforms,
            route.condition(),
            route.name == op.reference,
        )
        for op, functions in RECORDS.items()
        for route in op.routes
    ]


def markdown() -> str:
    """The table as the Markdown of docs/routes.md."""
    platforms = [p for p in EVERY if p in _PLATFORM_NAMES]
    head = ["op", "functions", "route", *(_PLATFORM_NAMES[p] for p in platforms), "serves"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table():
        marks = ["✓" if p in row.platforms else "" for p in platforms]
        route = f"`{row.route}`" + (" (reference)" if row.reference else "")
        functions = ", ".join(f"`{f}`" if " " not in f else f for f in row.functions)
        cells = [f"`{row.op}`", functions, route, *marks, row.serves]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
