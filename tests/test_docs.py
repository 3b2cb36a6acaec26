"""The documentation site: a strict mkdocs build (CI's "warnings are
errors"), every public name in the API reference, every page in the nav,
the quick start's code runnable, and the performance page in step with
benchmarks/results.json."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import types

import yaml

import semiring_jax as sj

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


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = set(_nav_pages(config["nav"]))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert pages == in_nav


def test_quickstart_code_runs(tmp_path):
    # In a fresh interpreter: the page is for users, who run with JAX's
    # defaults (float32, no x64), not with this suite's strict settings.
    code = re.findall(r"```python\n(.*?)```", (DOCS / "quickstart.md").read_text(), re.DOTALL)
    checks = (
        "\nassert abs(float(sj.tot_score(fsa)) - 1.474077) < 1e-5"
        "\nassert jnp.allclose(loss, -total, rtol=1e-5)"
        "\nprint('quick start ran')\n"
    )
    script = tmp_path / "quickstart.py"
    no_display = 'import matplotlib\nmatplotlib.use("Agg")\n'  # for plot_alignment
    script.write_text(no_display + "\n".join(code) + checks)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "quick start ran" in result.stdout


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
