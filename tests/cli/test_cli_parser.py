"""Tests of the command line's argument parser (`_src/cli_parser.py`)."""

import pytest

import semiring_jax as sj
from semiring_jax._src.cli.parser import build_parser


def test_help_lists_every_command_with_a_summary():
    text = build_parser().format_help()
    for name, summary in [
        ("info", "fstinfo"),
        ("score", "fstshortestdistance"),
        ("best-path", "fstshortestpath"),
        ("draw", "fstdraw"),
        ("compose", "fstcompose"),
        ("project", "fstproject"),
        ("determinize", "fstdeterminize"),
    ]:
        assert f"\n    {name}" in text and f"like {summary}" in text, name


def test_options_may_follow_the_command_and_file():
    args = build_parser().parse_args(
        ["best-path", "a.fst", "--format", "k2", "--labels", "-o", "out.txt", "--float64"]
    )
    assert (args.command, args.file, args.format, args.labels) == ("best-path", "a.fst", "k2", True)
    assert (args.output, args.float64, args.out_format) == ("out.txt", True, None)


def test_file_defaults_to_stdin_but_compose_needs_both():
    assert build_parser().parse_args(["info"]).file == "-"
    args = build_parser().parse_args(["compose", "a.fst", "-", "--msymbols", "m.syms"])
    assert (args.first, args.second, args.msymbols) == ("a.fst", "-", "m.syms")
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["compose", "a.fst"])
    assert exit_.value.code == 2


def test_draw_writes_dot_or_svg_and_fsas_openfst_or_k2():
    parser = build_parser()
    assert parser.parse_args(["draw"]).out_format == "dot"
    assert parser.parse_args(["draw", "--out-format", "svg"]).out_format == "svg"
    assert parser.parse_args(["determinize", "--out-format", "k2"]).out_format == "k2"
    for argv in (["draw", "--out-format", "k2"], ["determinize", "--out-format", "svg"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


def test_project_keeps_the_input_side_unless_told():
    parser = build_parser()
    assert parser.parse_args(["project"]).project_type is None  # the input side
    assert parser.parse_args(["project", "--project-type", "output"]).project_type == "output"
    assert parser.parse_args(["project", "--project-output"]).project_type == "output"
    for argv in (["project", "--project-type", "both"], ["project", "--project-output", "x", "y"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2


def test_version_prints_the_program_and_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"semiring-jax {sj.__version__}\n"
