"""Hygiene checks that CI runs with the tests: types (mypy), lint and format (ruff),
the version, and type hints on the public API.

mypy and ruff read their settings from pyproject.toml. They run from the
project root without caches, so a run here checks what CI checks.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import semiring_jax as sj

ROOT = Path(__file__).resolve().parent.parent
LINTED = ["semiring_jax", "tests", "examples", "benchmarks"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _report(run: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {run.returncode}\n{run.stdout}\n{run.stderr}"


def test_mypy_passes_on_the_package():
    # /dev/null as cache dir: no cache is read or written, as in a fresh CI
    # checkout (about 10 s).
    run = _run("mypy", "--cache-dir", "/dev/null")
    assert run.returncode == 0, _report(run)


def test_ruff_lint_passes():
    run = _run("ruff", "check", "--no-cache", "--output-format", "concise", *LINTED)
    assert run.returncode == 0, _report(run)


def test_ruff_format_is_applied():
    run = _run("ruff", "format", "--check", "--no-cache", "--output-format", "concise", *LINTED)
    assert run.returncode == 0, _report(run) + "\nrun `ruff format` to fix"


def test_version_is_the_installed_distribution_version():
    assert sj.__version__ == importlib.metadata.version("semiring_jax")
    major, minor, patch = sj.__version__.split(".")
    assert major.isdigit() and minor.isdigit() and patch.isdigit(), sj.__version__


def _unannotated(function: Callable[..., Any]) -> list[str]:
    """The parameters (and "return") of `function` that lack a type hint."""
    signature = inspect.signature(function)
    missing = [
        name
        for name, parameter in signature.parameters.items()
        if name not in ("self", "cls") and parameter.annotation is inspect.Parameter.empty
    ]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_public_functions_are_fully_annotated():
    functions = {name: getattr(sj, name) for name in sj.__all__}
    for name, member in inspect.getmembers(sj.Fsa):
        if not name.startswith("_") and inspect.isroutine(member):
            functions[f"Fsa.{name}"] = member
    missing = {
        name: _unannotated(function)
        for name, function in functions.items()
        if inspect.isroutine(function)
    }
    assert not {name: params for name, params in missing.items() if params}
