"""Routes: which implementation of an op runs, chosen per platform when the
program is lowered.

An op with more than one implementation (a compiled CPU kernel, a portable
scan, a cheaper portable scan for some semirings) has one `Op` record: its
`Route`s in order of preference, each with the platforms it runs on and
the static input conditions it serves (dtype, semiring arithmetic), and
the route the others must agree with (its `reference`, which the tests
compare them to). `core/route_table.py` holds every record; the docs'
route table is generated from them.

`dispatch` picks, for every platform, the first route that serves the
call's static facts there; where platforms differ (the CPU kernel on
"cpu", a scan elsewhere) the choice is staged out with
`jax.lax.platform_dependent`, so one jitted function lowers correctly for
CPU, CUDA and TPU from any host: the branch for the platform being
compiled for is the only one lowered (ahead-of-time compiles for a TPU
from a CPU host included). Nothing reads the process's devices: a host
with several devices runs the routes one device would.

`force` pins routes by name while functions are traced, for tests,
benchmarks, and users who want the portable scan everywhere.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = [
    "EVERY",
    "Op",
    "Route",
    "choose",
    "dispatch",
    "force",
    "forced",
    "kernels_available",
    "on_host",
    "record",
    "register",
]

# The platforms a route may name; "rocm" runs what "cuda" runs.
EVERY = ("cpu", "cuda", "rocm", "tpu")
# The dtypes the compiled kernels take.
KERNEL_DTYPES = ("float32", "float64")
# The pseudo-route `force` accepts: every op's first route that runs on
# every platform (what GPUs and TPUs run).
PORTABLE = "portable"


class Route(NamedTuple):
    """One implementation of an op and where it serves.

    Attributes:
      name: the route's name, e.g. "cpu_kernel" or "frame_scan".
      platforms: the platforms it runs on (a subset of `EVERY`).
      dtypes: the float dtypes it serves (names), or None for any.
      arithmetics: the semiring arithmetics it serves ("log",
        "tropical"; None for a semiring without one), or None for any.
      kernels: whether it needs the compiled CPU library (built on first
        use; absent without a compiler or with SEMIRING_JAX_CPU_KERNELS=0).
      note: anything else about it, for the docs' table.
    """

    name: str
    platforms: tuple[str, ...] = EVERY
    dtypes: tuple[str, ...] | None = None
    arithmetics: tuple[str | None, ...] | None = None
    kernels: bool = False
    note: str = ""

    def serves(self, dtype: Any, arithmetic: str | None) -> bool:
        """Whether the route takes inputs of `dtype` in `arithmetic`."""
        if self.dtypes is not None and np.dtype(dtype).name not in self.dtypes:
            return False
        if self.arithmetics is not None and arithmetic not in self.arithmetics:
            return False
        return not self.kernels or kernels_available()

    @property
    def portable(self) -> bool:
        return set(self.platforms) == set(EVERY)

    def condition(self) -> str:
        """The route's input conditions, in words (the docs' table)."""
        parts = []
        if self.arithmetics is not None:
            names = [a.upper() if a else "other" for a in self.arithmetics]
            parts.append(" or ".join(names))
        if self.dtypes is not None:
            parts.append(" or ".join(self.dtypes))
        if self.kernels:
            parts.append("CPU kernels built")
        if self.note:
            parts.append(self.note)
        return "; ".join(parts) if parts else "always"


class Op(NamedTuple):
    """An op's routes, in order of preference, and the route whose results
    the others must match (the tests compare every route with it)."""

    name: str
    routes: tuple[Route, ...]
    reference: str

    def route(self, name: str) -> Route:
        for route in self.routes:
            if route.name == name:
                return route
        raise ValueError(f"{self.name} has no route {name!r}; its routes: {self.names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(route.name for route in self.routes)


# The records by op name, as `core/route_table.py` registers them (it
# imports this module, so they cannot be imported here).
_RECORDS: dict[str, Op] = {}


def register(*ops: Op) -> None:
    """Makes `ops` known by name to `record` and `force`."""
    for op in ops:
        _RECORDS[op.name] = op


def record(name: str) -> Op:
    """The record of op `name` (a ValueError listing them if there is none)."""
    if name not in _RECORDS:
        raise ValueError(f"no op named {name!r} has routes; those that do: {list(_RECORDS)}")
    return _RECORDS[name]


_FORCED: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "semiring_jax_forced_routes", default=None
)


def forced() -> Mapping[str, str]:
    """The routes `force` pins now: op name (or "*") -> route name."""
    return _FORCED.get() or {}


@contextlib.contextmanager
def force(routes: str | Mapping[str, str]) -> Iterator[None]:
    """Runs the ops traced inside on the routes named.

    `routes` is "portable" (every op on its first route that runs on every
    platform: what GPUs and TPUs run), or a mapping from op names to route
    names (`semiring_jax.routes.table()` lists them), e.g.
    `{"dense_tot_score": "frame_scan"}`. A route is pinned on the
    platforms it runs on; elsewhere the op keeps its usual choice. A
    pinned route that does not serve a call's inputs is a ValueError.

    Routes are chosen when a function is traced, and jitted functions keep
    their traces: so entering and leaving clears JAX's caches
    (`jax.clear_caches()`), and what is traced inside runs inside.

    Examples:
      >>> import jax.numpy as jnp
      >>> import semiring_jax as sj
      >>> log_probs = jnp.log(jnp.full((1, 3, 2), 0.5))
      >>> with sj.routes.force("portable"):
      ...     loss = sj.ctc_loss(log_probs, [3], [[1]], [1])
      >>> print(round(float(loss[0]), 4))
      0.2877
    """
    pins = {"*": PORTABLE} if routes == PORTABLE else dict(routes)  # type: ignore[arg-type]
    for op_name, route_name in pins.items():
        if op_name == "*":
            continue
        record(op_name).route(route_name)  # a ValueError naming both if unknown
    token = _FORCED.set(pins)
    jax.clear_caches()
    try:
        yield
    finally:
        _FORCED.reset(token)
        jax.clear_caches()


def kernels_available() -> bool:
    """Whether the compiled CPU library is built (building it on first use).

    A process whose default backend is not the CPU does not build it (a
    C++ build of up to a minute is no part of what a JAX user there
    expects): its programs lowered for the CPU run the portable routes."""
    from semiring_jax._src.kernels import loader  # kernels import core

    return loader.enabled()


def _pinned(op: Op) -> Route | None:
    pins = forced()
    name = pins.get(op.name, pins.get("*"))
    if name is None:
        return None
    if name == PORTABLE:
        return next(route for route in op.routes if route.portable)
    return op.route(name)


def choose(op: Op, dtype: Any, arithmetic: str | None) -> dict[str, str]:
    """The route each platform runs for inputs of `dtype` in `arithmetic`:
    platform -> route name (static: read at trace time)."""
    pinned = _pinned(op)
    if pinned is not None and not pinned.serves(dtype, arithmetic):
        raise ValueError(
            f"{op.name}: the forced route {pinned.name!r} does not serve these inputs "
            f"(dtype {np.dtype(dtype).name}, arithmetic {arithmetic}); it serves: "
            f"{pinned.condition()}"
        )
    chosen = {}
    for platform in EVERY:
        if pinned is not None and platform in pinned.platforms:
            chosen[platform] = pinned.name
            continue
        for route in op.routes:
            if platform in route.platforms and route.serves(dtype, arithmetic):
                chosen[platform] = route.name
                break
        else:
            raise ValueError(
                f"{op.name}: no route serves dtype {np.dtype(dtype).name} in arithmetic "
                f"{arithmetic} on {platform}"
            )
    return chosen


def dispatch(
    op: Op,
    impls: Mapping[str, Callable[..., Any]],
    *args: Any,
    dtype: Any,
    arithmetic: str | None = "log",
) -> Any:
    """`impls[route](*args)` for the route `choose` gives each platform,
    staged out with `jax.lax.platform_dependent` where platforms differ.

    `impls` maps each of `op`'s route names to its implementation. The
    arguments reach every branch as they are (closed over, so numpy
    tables stay concrete); the branches' results must agree in structure,
    shapes and dtypes.
    """
    if set(impls) != set(op.names):
        raise AssertionError(f"{op.name}: implementations {sorted(impls)} for routes {op.names}")
    chosen = choose(op, dtype, arithmetic)
    names = set(chosen.values())
    if len(names) == 1:
        return impls[names.pop()](*args)
    thunks = {name: _thunk(impls[name], args) for name in names}
    default = chosen["tpu"]
    branches = {platform: thunks[name] for platform, name in chosen.items() if name != default}
    return jax.lax.platform_dependent(default=thunks[default], **branches)


def _thunk(impl: Callable[..., Any], args: tuple[Any, ...]) -> Callable[[], Any]:
    return lambda: impl(*args)


def on_host(op: Op, dtype: Any, arithmetic: str | None = None) -> str:
    """The route of host code (numpy, ctypes) run now, outside any XLA
    program: the CPU's choice, whose kernel routes need a process whose
    default backend is the CPU (`kernels_available`)."""
    return choose(op, dtype, arithmetic)["cpu"]
