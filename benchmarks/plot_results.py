"""Draws the documentation's performance plot (and tables) from results.json.

Every figure is drawn as a speed-up, peer time / our time, on one log
axis: right of 1 we are faster, left of it slower. The structural ops are
recorded as our time / OpenFst time (a range over runs), so they are
inverted here, and their range is drawn as an error bar.

Run (from the repository root):
    .venv/bin/python benchmarks/plot_results.py            # writes docs/assets/performance.png
    .venv/bin/python benchmarks/plot_results.py --tables   # prints the Markdown tables instead
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.json"
PICTURE = ROOT / "docs" / "assets" / "performance.png"


def load_results(path: pathlib.Path = RESULTS) -> dict[str, Any]:
    """The parsed results.json."""
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def speedups(results: dict[str, Any]) -> list[tuple[str, str, float, float, float]]:
    """Bars to draw: (group, label, speed-up, lowest, highest), top to bottom.

    The speed-up is peer time / our time; lowest and highest bound it where
    results.json gives a range (else they equal the speed-up).
    """
    bars = []
    for row in results["ctc_loss"]["rows"]:
        shape = f"({row['B']}, {row['T']}, {row['V']}, {row['U']})"
        for peer in ("optax", "torch"):
            ratio = row[f"{peer}_over_ours"]
            bars.append(("ctc_loss v+g", f"vs {peer} {shape}", ratio, ratio, ratio))
    for row in results["tot_score"]["rows"]:
        for semiring in ("log", "tropical"):
            ratio = row[semiring]
            label = f"vs OpenFst, {semiring.upper()}, {row['workload']}"
            bars.append(("tot_score v+g", label, ratio, ratio, ratio))
    for row in results["structural"]["rows"]:
        slow, fast = max(row["ours_over_openfst"]), min(row["ours_over_openfst"])
        middle = (slow * fast) ** 0.5
        bars.append(("structural", f"{row['op']} vs OpenFst", 1 / middle, 1 / slow, 1 / fast))
    return bars


def draw(results: dict[str, Any], path: pathlib.Path = PICTURE) -> None:
    """Writes the bar chart of `speedups(results)` as a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = speedups(results)
    colours = {"ctc_loss v+g": "tab:blue", "tot_score v+g": "tab:green", "structural": "tab:red"}
    figure, axes = plt.subplots(figsize=(8.0, 0.32 * len(bars) + 1.4), dpi=100)
    positions = list(range(len(bars)))[::-1]
    for position, (group, _, ratio, lowest, highest) in zip(positions, bars):
        # Bars grow from 1 (parity), to the right where we are faster.
        axes.barh(position, ratio - 1.0, left=1.0, color=colours[group])
        if highest > lowest:
            axes.errorbar(
                ratio,
                position,
                xerr=[[ratio - lowest], [highest - ratio]],
                color="black",
                capsize=3,
                linewidth=1,
            )
        if ratio >= 1.0:
            axes.text(highest * 1.1, position, f"{ratio:.3g}× faster", va="center", fontsize=8)
        else:
            slower = (
                f"{1 / highest:.3g}–{1 / lowest:.3g}" if highest > lowest else f"{1 / ratio:.2g}"
            )
            axes.text(
                lowest / 1.1, position, f"{slower}× slower", va="center", ha="right", fontsize=8
            )
    axes.set_xscale("log")
    axes.set_xlim(0.0004, 2000)
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_yticks(positions, [label for _, label, _, _, _ in bars], fontsize=8)
    axes.set_xlabel("peer time / our time (log scale): right of 1 we are faster")
    environment = results["environment"]
    axes.set_title(
        f"semiring_jax vs peers ({environment['machine']}, "
        f"JAX {environment['jax']}, {environment['date']})",
        fontsize=10,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in colours.values()]
    axes.legend(handles, list(colours), loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Without the Software tag the bytes do not depend on the matplotlib version.
    figure.savefig(path, metadata={"Software": None})
    plt.close(figure)


def tables(results: dict[str, Any]) -> str:
    """The Markdown tables of docs/performance.md, from `results`."""
    ctc = results["ctc_loss"]["rows"]
    lines = [
        "| (B, T, V, U) | ours (ms) | optax (ms) | torch (ms) | optax / ours | torch / ours |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| ({r['B']}, {r['T']}, {r['V']}, {r['U']}) | {r['ours_ms']:.1f} | "
        f"{r['optax_ms']:.1f} | {r['torch_ms']:.1f} | {r['optax_over_ours']:.2f} | "
        f"{r['torch_over_ours']:.2f} |"
        for r in ctc
    ]
    lines += [
        "",
        "| workload | arcs | OpenFst / ours, LOG | OpenFst / ours, TROPICAL "
        "| cold calls: LOG, TROPICAL |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['workload']} | {r['arcs']:,} | {r['log']:g}× | {r['tropical']:g}× "
        f"| {r['log_cold']:g}×, {r['tropical_cold']:g}× |"
        for r in results["tot_score"]["rows"]
    ]
    span = lambda values: f"{min(values):g}–{max(values):g}×"
    lines += [
        "",
        "| op | workload | ours / OpenFst | with the result's tables built |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| `{r['op']}` | {r['workload']} | {span(r['ours_over_openfst'])} | "
        f"{span(r['with_tables_over_openfst'])} |"
        for r in results["structural"]["rows"]
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tables", action="store_true", help="print the Markdown tables instead of drawing"
    )
    args = parser.parse_args()
    results = load_results()
    if args.tables:
        print(tables(results))
    else:
        draw(results)
        print(f"wrote {PICTURE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
