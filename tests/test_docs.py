"""The documentation: a strict mkdocs build (CI's "warnings are errors"),
every public name in the API reference, every page in the nav, every
Python snippet of the pages runnable, every command-line option on the
command-line page, the performance page (tables and figure text) in step
with benchmarks/results.json, and the README's test command and links."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest
import yaml

import semiring_jax as sj
from semiring_jax._src.cli.parser import build_parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _module_from(path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_objects() -> list[str]:
    """The `::: semiring_jax.X` targets of the reference pages, in page order."""
    targets = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        targets += re.findall(r"^::: semiring_jax\.(\S+)\s*$", page.read_text(), re.MULTILINE)
    return targets


def _nav_pages(entries: list) -> list[str]:
    pages = []
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, output
    for page in [
        "index.html",
        "reference/scores/index.html",
        "coming-from-k2/index.html",
        "performance/index.html",
        "assets/performance.png",
    ]:
        assert (tmp_path / page).is_file(), page
    # The griffe extension is build machinery, not part of the site.
    assert not list(tmp_path.rglob("*.py"))
    # Docstring sections render as sections (tables, code), never as text;
    # docs/griffe_sections.py makes griffe read the house style so.
    for page in (tmp_path / "reference").rglob("index.html"):
        unparsed = re.findall(r"<p>(?:Args|Returns|Raises|Examples|Attributes):", page.read_text())
        assert not unparsed, f"{page.relative_to(tmp_path)}: {unparsed}"
    scores = (tmp_path / "reference/scores/index.html").read_text()
    assert '<span class="gp">&gt;&gt;&gt; </span>' in scores  # examples are highlighted code


def test_reference_documents_every_public_name_once():
    targets = _documented_objects()
    duplicates = {name for name in targets if targets.count(name) > 1}
    assert not duplicates, f"documented twice: {sorted(duplicates)}"
    missing = set(sj.__all__) - set(targets)
    assert not missing, f"public names missing from docs/reference: {sorted(missing)}"


def test_reference_documents_every_public_fsa_method_and_property():
    page = (DOCS / "reference" / "fsa.md").read_text()
    # The class's own entry lists some members; the others have entries.
    members = re.search(r"::: semiring_jax\.Fsa\n +options:\n +members:\n(.*?)\n\n", page, re.S)
    listed = set(re.findall(r"^ +- (\w+)$", members[1], re.M))
    entries = {t.split(".", 1)[1] for t in _documented_objects() if t.startswith("Fsa.")}
    documented = listed | entries
    public = {
        name
        for name, member in inspect.getmembers(sj.Fsa)
        if not name.startswith("_") and (inspect.isroutine(member) or isinstance(member, property))
    }
    assert public - documented == set(), "Fsa members missing from docs/reference"


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = set(_nav_pages(config["nav"]))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert pages == in_nav


def _python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE)


# Peers whose code a page shows beside ours; we do not install them.
_FOREIGN = {"k2"}


def _imports(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


# Checks appended to a page's snippets: what their comments claim.
_CHECKS = {
    "quickstart.md": (
        "assert abs(float(sj.tot_score(fsa)) - 1.474077) < 1e-5\n"
        "assert jnp.allclose(loss, -total, rtol=1e-5)"
    ),
    "structural-algorithms.md": "assert jnp.allclose(jax.grad(composed_score)(lexicon.weight), 1)",
    "files-and-pictures.md": "assert sj.unstack(batch)[0].num_arcs == same.num_arcs == 3",
    "coming-from-k2.md": "assert pruned.label.tolist() == [1, 3] and grads.shape == (3, 4)",
}

_PAGES_WITH_PYTHON = sorted(page.name for page in DOCS.glob("*.md") if _python_blocks(page))


def test_pages_with_python_are_all_run():
    assert {"index.md", "quickstart.md", "coming-from-k2.md", "coming-from-openfst.md"} <= set(
        _PAGES_WITH_PYTHON
    )


@pytest.mark.parametrize("name", _PAGES_WITH_PYTHON)
def test_python_snippets_of_a_page_run(name, tmp_path):
    # A page's blocks run in order in one fresh interpreter, with JAX's
    # defaults (float32, no x64) as users have them, not this suite's strict
    # settings; each block defines what it uses or takes it from an earlier
    # block. A block of a peer's code (k2) must still be valid Python.
    runnable = []
    for block in _python_blocks(DOCS / name):
        compile(block, name, "exec")
        if not _imports(block) & _FOREIGN:
            runnable.append(block)
    script = tmp_path / "snippets.py"
    script.write_text(
        "\n".join(runnable)
        + "\nimport jax\nimport jax.numpy as jnp\nimport semiring_jax as sj\n"
        + _CHECKS.get(name, "")
        + "\nprint('snippets ran')\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=dict(os.environ, MPLBACKEND="Agg"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "snippets ran" in result.stdout


def test_readme_has_ci_s_one_test_command_and_links_into_the_repository():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in readme.splitlines() if "python -m pytest" in line]
    assert commands == [".venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"]
    assert commands[0] in ci.splitlines()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to a missing file: {target}"
    assert "API.md" not in readme and not re.search(r"\bissue \d", readme)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, tuple[str, ...]]:
    """Each option string of `parser` but help, and the choices it takes."""
    return {
        option: tuple(action.choices or ())
        for action in parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help")
    }


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_command_line_page_describes_every_option():
    page = (DOCS / "command-line.md").read_text()
    sections = {
        title: body for title, body in re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    }
    missing = [option for option in _options(build_parser()) if not _mentions(page, option)]
    commands = _subcommands()
    shared = set.intersection(*(set(_options(sub)) for sub in commands.values()))
    for name, sub in commands.items():
        for option, choices in _options(sub).items():
            # Shared options are described once, before the commands.
            text = page if option in shared else sections.get(name, "")
            missing += [f"{name} {option}"] * (not _mentions(text, option))
            missing += [f"{name} {option} {c}" for c in choices if not _mentions(text, c)]
    assert not missing, f"docs/command-line.md does not describe: {missing}"


def test_command_line_page_covers_every_subcommand():
    result = subprocess.run(
        [sys.executable, "-m", "semiring_jax", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    listed = result.stdout.split("COMMAND\n", 1)[1]
    commands = re.findall(r"^    ([a-z][a-z-]*)", listed, re.MULTILINE)
    assert {"info", "score", "best-path", "draw", "compose", "determinize"} <= set(commands)
    page = (DOCS / "command-line.md").read_text()
    for command in commands:
        assert f"\n## {command}\n" in page, command


def test_performance_page_matches_results_json():
    plot_results = _module_from(ROOT / "benchmarks" / "plot_results.py")
    page = (DOCS / "performance.md").read_text()
    for table in plot_results.tables(plot_results.load_results()).split("\n\n"):
        assert table in page, f"docs/performance.md lacks this table:\n{table}"


def test_performance_figure_text_says_what_the_figure_shows():
    plot_results = _module_from(ROOT / "benchmarks" / "plot_results.py")
    page = (DOCS / "performance.md").read_text()
    (alt,) = re.findall(r"!\[(.*?)\]\(assets/performance\.png\)", page, re.DOTALL)
    alt = " ".join(alt.split())
    bars = plot_results.speedups(plot_results.load_results())

    def span(values):
        low, high = min(values), max(values)
        return f"{low:.3g}–{high:.3g}×"

    for group, peer in [("ctc_loss", "optax"), ("ctc_loss", "torch"), ("tot_score", "OpenFst")]:
        ratios = [r for g, label, r, _, _ in bars if g.startswith(group) and f"vs {peer}" in label]
        assert f"{span(ratios)} faster than {peer}" in alt, (group, peer, alt)
    for group, label, _, lowest, highest in bars:
        if group == "structural":
            op = label.split()[0]
            assert f"{op} {1 / highest:.3g}–{1 / lowest:.3g}×" in alt, (op, alt)
    assert "semiring_jax vs peers" in alt and "log scale" in alt


def test_plot_results_draws_a_png(tmp_path):
    plot_results = _module_from(ROOT / "benchmarks" / "plot_results.py")
    results = plot_results.load_results()
    bars = plot_results.speedups(results)
    # 3 CTC sizes x 2 peers, 4 workloads x 2 semirings, 3 structural ops.
    assert len(bars) == 17
    assert all(lowest <= ratio <= highest for _, _, ratio, lowest, highest in bars)
    path = tmp_path / "performance.png"
    plot_results.draw(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_griffe_extension_reads_the_house_style():
    extension = _module_from(DOCS / "griffe_sections.py")
    text = (
        "Sums.\n\nArgs:\n  a, b: two\n    Fsas.\nReturns:\n  An Fsa: trimmed.\nExamples:\n  >>> 1"
    )
    text = extension.with_blank_lines_before_sections(text)
    assert "\n\nReturns:\n" in text and "\n\nExamples:\n" in text
    text = extension.with_one_parameter_per_item(text)
    assert "  a: two\n    Fsas.\n  b: two\n    Fsas.\n" in text
    assert "  Fsa: An Fsa: trimmed." in extension.with_typed_returns(text, "Fsa")
    named = "Returns:\n  (labels, scores): int32 [B, T]"
    assert extension.with_typed_returns(named, "tuple") == named


def test_route_table_page_matches_the_route_records():
    page = (DOCS / "routes.md").read_text()
    begin, end = "<!-- routes:begin -->\n", "<!-- routes:end -->"
    assert begin in page and end in page, "docs/routes.md lost its table markers"
    written = page[page.index(begin) + len(begin) : page.index(end)]
    assert written == sj.routes.markdown(), (
        "docs/routes.md's table differs from the route records: paste "
        "semiring_jax.routes.markdown() between its markers"
    )
