"""The `semiring-jax` command line (`python -m semiring_jax`).

A stand-in for `fstinfo`, `fstshortestdistance`, `fstshortestpath`,
`fstdraw`, `fstcompose`, `fstproject` and `fstdeterminize` in a shell
pipeline: it reads OpenFst (AT&T) or k2 text from a file or stdin and
writes text to stdout or `-o PATH`. A bad file or a failed computation is one line on stderr,
`semiring-jax: error: <message>`, and exit status 2, as for a usage error:
whatever the failure (running out of memory or a bug included), never a
traceback, and never a long line (quoted input is cut, and the message to
`_MESSAGE_LIMIT` characters). An interrupt (Ctrl-C) exits with 130.

This module imports JAX only inside the commands, so parsing arguments and
`--help` cost nothing beyond the package import itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from semiring_jax._src.cli.parser import PROG, build_parser
from semiring_jax._src.core.host import messages
from semiring_jax._src.io.host import openfst_text

if TYPE_CHECKING:
    from semiring_jax._src.core.fsa import Fsa
    from semiring_jax._src.io.host.symbols import SymbolTable

__all__ = ["main"]


class _NoResult(Exception):
    """A well-formed input with nothing to print (exit status 1, like grep)."""


# The longest error line printed (quoted input is already cut to 60).
_MESSAGE_LIMIT = 500


# -- reading and writing ------------------------------------------------------


def _read_text(path: str) -> str:
    """The file's (or stdin's) text; bad UTF-8 names the file and line."""
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # already text (e.g. io.StringIO in tests)
            return sys.stdin.read()
        return messages.decode_utf8(stream.read(), "<stdin>")
    with open(path, "rb") as handle:
        return messages.decode_utf8(handle.read(), path)


def _detect_format(text: str) -> str:
    """k2 if some arc line carries k2's final label -1 (OpenFst has no negative
    labels), else openfst; a k2 text without final arcs reads as OpenFst."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "-1":
            return "k2"
    return "openfst"


def _table(path: str | None) -> SymbolTable | None:
    from semiring_jax._src.io.host.symbols import SymbolTable

    return None if path is None else SymbolTable.read(path)


def _tables(args: argparse.Namespace) -> tuple[SymbolTable | None, SymbolTable | None]:
    """The (input, output) symbol tables of the result, read once."""
    if not hasattr(args, "tables"):
        args.tables = (_table(args.isymbols), _table(args.osymbols))
    return args.tables


def _read_fsa(path: str, args: argparse.Namespace, tables: tuple[Any, Any] | None = None) -> Fsa:
    """Reads one FSA, OpenFst text with `tables` (by default `_tables(args)`)
    as its (input, output) symbols; the error message starts with the file
    name."""
    import numpy as np

    from semiring_jax._src.core.fsa import Fsa

    name = "<stdin>" if path == "-" else path
    text = _read_text(path)
    input_format = _detect_format(text) if args.format == "auto" else args.format
    if getattr(args, "resolved_format", None) is None:
        args.resolved_format = input_format
    dtype = np.float64 if args.float64 else np.float32
    if input_format != "k2":
        # Read outside the `try`: a bad symbol file names itself, not `path`.
        isymbols, osymbols = _tables(args) if tables is None else tables
    try:
        if input_format == "k2":
            return Fsa.from_k2(text, dtype=dtype)
        return Fsa.from_openfst(
            text,
            acceptor=True if args.acceptor else None,
            dtype=dtype,
            isymbols=isymbols,
            osymbols=osymbols,
        )
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _fsa_text(fsa: Fsa, args: argparse.Namespace) -> str:
    """The FSA in `--out-format`, by default the (first) input's format."""
    if (args.out_format or args.resolved_format) == "k2":
        return fsa.to_k2()
    isymbols, osymbols = _tables(args)
    return fsa.to_openfst(isymbols=isymbols, osymbols=osymbols)


def _label_text(labels: Any, table: SymbolTable | None) -> str:
    return " ".join(
        str(label) if table is None else str(table.find(int(label))) for label in labels
    )


def _scores(values: Any, costs: bool) -> list[str]:
    import numpy as np

    values = np.asarray(values).reshape(-1)
    if costs:
        values = 0.0 - values  # 0.0 - x: no -0.0 for a zero score
    return [openfst_text.openfst_number(value) for value in values]


# -- commands -------------------------------------------------------------------

_INFO_LINES = (
    ("# of states", "num_states"),
    ("# of arcs", "num_arcs"),
    ("initial state", None),
    ("# of final states", "num_final_states"),
    ("# of input/output epsilons", "num_epsilons"),
    ("# of input epsilons", "num_input_epsilons"),
    ("# of output epsilons", "num_output_epsilons"),
    ("# of accessible states", "num_accessible"),
    ("# of coaccessible states", "num_coaccessible"),
    ("# of connected states", "num_connected"),
    ("acceptor", "acceptor"),
    ("input deterministic", "input_deterministic"),
    ("output deterministic", "output_deterministic"),
    ("input/output epsilons", "epsilons"),
    ("input epsilons", "input_epsilons"),
    ("output epsilons", "output_epsilons"),
    ("input label sorted", "input_label_sorted"),
    ("output label sorted", "output_label_sorted"),
    ("acyclic", "acyclic"),
    ("top sorted", "top_sorted"),
    ("accessible", "accessible"),
    ("coaccessible", "coaccessible"),
    ("connected", "connected"),
)


def _info(args: argparse.Namespace) -> str:
    from semiring_jax._src.structural.host.properties import fsa_properties

    props = fsa_properties(_read_fsa(args.file, args)._host_arrays("info"))
    fst_type = "acceptor" if props.is_acceptor else "transducer"
    if args.json:
        return json.dumps({"fst_type": fst_type, "start": 0, **props._asdict()}, indent=2) + "\n"
    lines = [f"{'fst type':<40}{fst_type}"]
    for key, field in _INFO_LINES:
        value = 0 if field is None else getattr(props, field)
        text = ("y" if value else "n") if isinstance(value, bool) else str(value)
        lines.append(f"{key:<40}{text}")
    return "\n".join(lines) + "\n"


def _score(args: argparse.Namespace) -> str:
    import semiring_jax as sj

    fsa = _read_fsa(args.file, args)
    semiring = sj.semiring(args.semiring)
    if args.per_state is None:
        return _scores(sj.tot_score(fsa, semiring), args.costs)[0] + "\n"
    by_state = sj.forward_scores if args.per_state == "forward" else sj.backward_scores
    values = _scores(by_state(fsa, semiring), args.costs)
    return "".join(f"{state}\t{value}\n" for state, value in enumerate(values))


def _best_path(args: argparse.Namespace) -> str:
    import numpy as np

    import semiring_jax as sj

    path = sj.connect(sj.best_path(_read_fsa(args.file, args)))
    if not args.labels:
        return _fsa_text(path, args)
    arrays = path._host_arrays("best-path")
    if not np.any(arrays.final_weight > -np.inf):
        raise _NoResult("best-path: no successful path")
    score = _scores(sj.tot_score(path, sj.TROPICAL), args.costs)[0]
    isymbols, osymbols = _tables(args)
    fields = [_label_text(arrays.ilabel, isymbols)]
    if not arrays.is_acceptor:
        fields.append(_label_text(arrays.olabel, osymbols))
    return "\t".join([*fields, score]) + "\n"


def _draw(args: argparse.Namespace) -> str:
    isymbols, osymbols = _tables(args)
    source = _read_fsa(args.file, args).to_dot(
        title=args.title, isymbols=isymbols, osymbols=osymbols
    )
    if args.out_format == "dot":
        return source
    if shutil.which("dot") is None:
        raise ValueError(
            "draw: Graphviz's 'dot' program is not on PATH; install Graphviz "
            "or use --out-format dot"
        )
    result = subprocess.run(
        ["dot", "-Tsvg"], input=source, text=True, capture_output=True, check=False
    )
    if result.returncode != 0:
        raise ValueError(f"draw: dot -Tsvg failed: {result.stderr.strip()}")
    return result.stdout


def _compose(args: argparse.Namespace) -> str:
    import semiring_jax as sj

    if args.first == "-" and args.second == "-":
        raise ValueError("compose: only one of the two inputs can be stdin ('-')")
    isymbols, osymbols = _tables(args)
    middle = _table(args.msymbols)
    first = _read_fsa(args.first, args, (isymbols, middle))
    second = _read_fsa(args.second, args, (middle, osymbols))
    if osymbols is None and second.is_acceptor:
        # The result's output labels are B's one label column.
        args.tables = (isymbols, middle)
    composed = sj.compose(first, second, max_states=args.max_states, max_arcs=args.max_arcs)
    return _fsa_text(composed, args)


def _project(args: argparse.Namespace) -> str:
    import semiring_jax as sj

    side = args.project_type or "input"
    projected = sj.project(_read_fsa(args.file, args), side)
    # The acceptor's one label column is the kept side, with that side's table.
    isymbols, osymbols = _tables(args)
    kept = isymbols if side == "input" else osymbols
    args.tables = (kept, None)
    return _fsa_text(projected, args)


def _determinize(args: argparse.Namespace) -> str:
    import semiring_jax as sj

    fsa = _read_fsa(args.file, args)
    return _fsa_text(
        sj.determinize(fsa, sj.semiring(args.semiring), max_states=args.max_states), args
    )


_COMMANDS: dict[str, Callable[[argparse.Namespace], str]] = {
    "info": _info,
    "score": _score,
    "best-path": _best_path,
    "draw": _draw,
    "compose": _compose,
    "project": _project,
    "determinize": _determinize,
}


# -- running ----------------------------------------------------------------------


def _write(text: str, path: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _one_line(err: BaseException) -> str:
    """The error as one line of at most `_MESSAGE_LIMIT` characters."""
    text = str(err)
    if len(text) > 4 * _MESSAGE_LIMIT:  # do not split a huge message whole
        text = text[: 4 * _MESSAGE_LIMIT]
    return messages.cut(" ".join(text.split()), _MESSAGE_LIMIT)


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status instead of exiting.

    Args:
      argv: the arguments after the program name; `sys.argv[1:]` by default.
    Returns:
      0 on success; 1 when there is nothing to print (`best-path --labels`
      of an FSA with no successful path); 2 for a usage error, a bad file or
      a failed computation, running out of memory included (with one short
      line on stderr, no traceback); 130 on an interrupt (Ctrl-C).
    Examples:
      >>> import os, tempfile
      >>> from semiring_jax._src.cli.main import main
      >>> path = os.path.join(tempfile.mkdtemp(), "a.fst")
      >>> with open(path, "w") as handle:
      ...     _ = handle.write("0 1 5 0.5\\n0 1 6 1.5\\n1 0.25\\n")
      >>> main(["score", path, "--semiring", "tropical", "--costs"])
      0.75
      0
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return int(exit_.code or 0)
    try:
        if args.float64:
            import jax

            jax.config.update("jax_enable_x64", True)
        _write(_COMMANDS[args.command](args), args.output)
    except _NoResult as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: not an error of ours. Point
        # stdout at /dev/null so that the flush at exit does not complain.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError) as err:  # UnicodeDecodeError is a ValueError
        return _error(_one_line(err))
    except MemoryError as err:
        detail = _one_line(err)
        return _error("out of memory" + (f": {detail}" if detail else ""))
    except RecursionError:
        return _error("recursion too deep (past Python's recursion limit) on this input")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug of ours: still one line, never a traceback
        return _error(f"internal error: {type(err).__name__}: {_one_line(err)}")
    return 0
