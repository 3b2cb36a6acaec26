"""The package layout: one home per concept, host code apart, no import circles."""

import ast
import pathlib

import pytest

import semiring_jax

SRC = pathlib.Path(semiring_jax.__file__).parent / "_src"
PACKAGES = [
    "core",
    "scores",
    "dense",
    "transducer",
    "mmi",
    "decoding",
    "structural",
    "io",
    "kernels",
    "cli",
]


def _module_name(path):
    parts = path.relative_to(SRC.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path):
    """Every module `path` imports, at any depth (function-level included);
    the package imports absolutely, never relatively."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


MODULES = {_module_name(path): path for path in SRC.rglob("*.py")}


def _internal_imports(name):
    return sorted({m for m in _imports(MODULES[name]) if m in MODULES and m != name})


def test_every_module_lives_in_a_package_with_a_design_readme():
    for _name, path in MODULES.items():
        relative = path.relative_to(SRC)
        if relative.name == "__init__.py" and len(relative.parts) == 1:
            continue
        assert relative.parts[0] in PACKAGES, f"{relative} is outside the subpackages"
    for package in PACKAGES:
        readme = SRC / package / "README.md"
        assert readme.exists() and readme.read_text().strip(), f"{package}/ has no README.md"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if ".host." in n + "."))
def test_host_code_imports_no_jax_and_no_traced_module(name):
    for imported in _imports(MODULES[name]):
        assert imported.split(".")[0] != "jax", f"{name} imports {imported}"
        if imported.startswith("semiring_jax.") and imported in MODULES:
            assert ".host" in imported or imported.endswith("__init__"), (
                f"host module {name} imports {imported}, which is not host code"
            )


def test_no_import_circles():
    graph = {name: _internal_imports(name) for name in MODULES}
    state = {}

    def visit(name, stack):
        state[name] = "open"
        for dep in graph[name]:
            if state.get(dep) == "open":
                circle = [*stack[stack.index(dep) :], dep]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if dep not in state:
                visit(dep, [*stack, dep])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if n.startswith("semiring_jax._src.kernels."))
)
def test_kernel_glue_imports_no_op_package(name):
    # The glue takes and returns plain arrays; the ops that call it wrap
    # them in their own types, so kernels/ sits below the packages it serves.
    for imported in _imports(MODULES[name]):
        for package in ("semiring_jax._src.decoding", "semiring_jax._src.dense"):
            assert imported != package and not imported.startswith(f"{package}."), (
                f"{name} imports {imported}"
            )


# The most lines a module may hold: past it, it holds more than one concept.
# `core/fsa.py` is held to less: the pytree alone, its conversions and table
# building living in their own modules.
MAX_LINES = 600
MAX_LINES_OF = {"semiring_jax._src.core.fsa": 500}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    limit = MAX_LINES_OF.get(name, MAX_LINES)
    assert lines < limit, f"{name} has {lines} lines; split it by concept (under {limit})"
