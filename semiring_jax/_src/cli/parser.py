"""The argument parser of the `semiring-jax` command line (see `cli/main.py`).

Every command takes the same input and output options (`--format`,
`--acceptor`, `--float64`, `--isymbols`, `--osymbols`, `-o`); commands
that write an FSA add `--out-format`. `--version` prints the package's
version.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["PROG", "build_parser", "count"]

PROG = "semiring-jax"
_FORMATS = ("openfst", "k2", "auto")
_DIGITS = re.compile(r"[0-9]{1,18}")


def count(text: str) -> int:
    """A positive integer option: ASCII digits only (Python's `int` would
    also take `1_000`, spaces and non-ASCII digits).

    Examples:
      >>> count("100000")
      100000
    """
    if not _DIGITS.fullmatch(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer (ASCII digits), got {text[:60]!r}"
        )
    return int(text)


def _input_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("input and output")
    group.add_argument(
        "--format",
        choices=_FORMATS,
        default="openfst",
        help="input text format (default: openfst); auto: k2 if an arc has label -1",
    )
    group.add_argument(
        "--acceptor",
        action="store_true",
        help="read OpenFst arc lines as 'src dst label [cost]', as fstcompile --acceptor does",
    )
    group.add_argument(
        "--float64",
        action="store_true",
        help="enable jax_enable_x64 and compute in float64 (default float32)",
    )
    group.add_argument(
        "--isymbols",
        metavar="FILE",
        default=None,
        help="OpenFst symbol table of the input labels (text and drawings show its symbols)",
    )
    group.add_argument(
        "--osymbols", metavar="FILE", default=None, help="OpenFst symbol table of the output labels"
    )
    group.add_argument(
        "-o", "--output", default="-", metavar="PATH", help="write here instead of stdout"
    )
    return options


def _fsa_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out-format",
        choices=("openfst", "k2"),
        default=None,
        help="output text format (default: the input's)",
    )


def _semiring_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--semiring",
        choices=("log", "tropical"),
        default=default,
        help=f"the semiring (default: {default})",
    )


def _costs_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--costs",
        action="store_true",
        help="print costs (negated scores, OpenFst's convention) instead of scores",
    )


def _file_argument(
    parser: argparse.ArgumentParser, name: str = "file", metavar: str = "FILE"
) -> None:
    if name == "file":
        parser.add_argument(
            name, nargs="?", default="-", metavar=metavar, help="input text; '-' or omitted: stdin"
        )
    else:
        parser.add_argument(name, metavar=metavar, help="input text; '-': stdin")


def build_parser() -> argparse.ArgumentParser:
    """The `semiring-jax` argument parser; `args.command` names the command.

    Returns:
      An `argparse.ArgumentParser` whose subcommands share the input and
      output options.
    Examples:
      >>> args = build_parser().parse_args(["score", "a.fst", "--semiring", "tropical"])
      >>> args.command, args.file, args.semiring, args.format
      ('score', 'a.fst', 'tropical', 'openfst')
    """
    # Imported on call, so that this module never takes part in the package's import.
    from semiring_jax import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Weighted finite-state acceptors and transducers from the "
        "shell: reads OpenFst (AT&T) or k2 text. Weights are scores (higher is better); "
        "OpenFst text holds costs.",
        epilog="Errors: one line on stderr and exit status 2.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"{PROG} {__version__}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    parent = [_input_options()]

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=parent, help=summary, description=summary)
        sub.set_defaults(command=name, resolved_format=None)
        return sub

    info = command("info", "structural properties, like fstinfo")
    _file_argument(info)
    info.add_argument("--json", action="store_true", help="machine-readable output")

    score = command("score", "total score, or per-state distances like fstshortestdistance")
    _file_argument(score)
    _semiring_option(score, "log")
    _costs_option(score)
    score.add_argument(
        "--per-state",
        choices=("forward", "backward"),
        default=None,
        help="print 'state<TAB>value' lines: forward (from the start, "
        "without final weights) or backward (to the end, with them; "
        "fstshortestdistance --reverse)",
    )

    best = command("best-path", "the best (tropical) path, like fstshortestpath")
    _file_argument(best)
    _fsa_output(best)
    best.add_argument(
        "--labels",
        action="store_true",
        help="print 'ilabels<TAB>[olabels<TAB>]score' instead of an FSA",
    )
    _costs_option(best)

    draw = command("draw", "Graphviz drawing (dot source or SVG), like fstdraw")
    _file_argument(draw)
    draw.add_argument(
        "--out-format",
        choices=("dot", "svg"),
        default="dot",
        help="dot source (default) or SVG through Graphviz's dot",
    )
    draw.add_argument("--title", default="", help="a title for the drawing")

    compose = command("compose", "the composition A o B, like fstcompose")
    _file_argument(compose, "first", "A")
    _file_argument(compose, "second", "B")
    _fsa_output(compose)
    compose.add_argument(
        "--msymbols",
        metavar="FILE",
        default=None,
        help="symbol table of A's output and B's input labels (A reads "
        "--isymbols:--msymbols, B --msymbols:--osymbols)",
    )
    compose.add_argument(
        "--max-states",
        type=count,
        default=1_000_000,
        help="give up beyond this many pair states (default 1000000)",
    )
    compose.add_argument(
        "--max-arcs",
        type=count,
        default=10_000_000,
        help="give up beyond this many arcs (default 10000000)",
    )

    project = command("project", "the acceptor of one side's labels, like fstproject")
    _file_argument(project)
    _fsa_output(project)
    # OpenFst spells this --project_type (and, before 1.8, --project_output);
    # argparse options use dashes, as the other options here do.
    sides = project.add_mutually_exclusive_group()
    sides.add_argument(
        "--project-type",
        choices=("input", "output"),
        default=None,
        help="keep the input labels (default) or the output labels",
    )
    sides.add_argument(
        "--project-output",
        dest="project_type",
        action="store_const",
        const="output",
        help="the same as --project-type output",
    )

    determinize = command(
        "determinize", "an equivalent deterministic acceptor, like fstdeterminize"
    )
    _file_argument(determinize)
    _fsa_output(determinize)
    _semiring_option(determinize, "log")
    determinize.add_argument(
        "--max-states",
        type=count,
        default=100_000,
        help="give up beyond this many result states (default 100000)",
    )
    return parser
