"""Which implementation of each op runs where, and how to pin one.

An op with more than one implementation (a compiled CPU kernel, portable
scans) chooses among its routes per platform when its program is lowered:
the CPU runs the kernel, GPUs and TPUs the portable scan, from one jitted
function (ahead-of-time compiles for another platform included). `table`
lists the routes; `force` pins them while functions are traced.

Examples:
  >>> import semiring_jax as sj
  >>> sorted({row.route for row in sj.routes.table() if row.op == "dense_tot_score"})
  ['arc_scan', 'cpu_kernel', 'frame_scan']
"""

from semiring_jax._src.core.route_docs import Row, markdown, table
from semiring_jax._src.core.routes import force

__all__ = ["Row", "force", "markdown", "table"]
