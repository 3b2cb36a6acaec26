"""Griffe extension: read the house docstring style as Google sections.

The house style (STYLE.md) writes `Args:`, `Returns:`, `Raises:` and
`Examples:` one after another with no blank line between them, and
documents parameters that share a description together (`a, b: ...`);
a `Returns:` text may contain a colon (`A transducer: input labels of
a, ...`), which griffe would read as "type: description".
Griffe's Google parser only opens a section after a blank line, and takes
`a, b` for one (unknown) parameter name, so without this extension
everything after the first section would render as running text and the
shared items would warn. The extension rewrites the docstring griffe reads
(a blank line before each section title, one item per name, the return
annotation in front of a `Returns:` text whose colon is not a type's); the
source files are left alone. mkdocs.yml reads `Returns:` as one item.

It is loaded by `mkdocs.yml` (mkdocstrings' `extensions` option) and is
excluded from the built site.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SECTION_TITLE = re.compile(
    r"^(Args|Arguments|Parameters|Attributes|Returns|Yields|Raises|Examples|Example|"
    r"Notes|Note|Warnings|Warning|See Also|References|Methods|Functions|Classes):\s*$"
)


def with_blank_lines_before_sections(text: str) -> str:
    """Returns `text` with a blank line before each unindented section title."""
    lines: list[str] = []
    in_fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and _SECTION_TITLE.match(line) and lines and lines[-1].strip():
            lines.append("")
        lines.append(line)
    return "\n".join(lines)


_PARAMETER_SECTIONS = ("Args:", "Arguments:", "Parameters:", "Attributes:")


def with_one_parameter_per_item(text: str) -> str:
    """Returns `text` with each `a, b: description` item split into one per name."""
    lines = text.split("\n")
    result: list[str] = []
    index = 0
    while index < len(lines):
        result.append(lines[index])
        if lines[index].strip() not in _PARAMETER_SECTIONS or lines[index].startswith(" "):
            index += 1
            continue
        index += 1
        indent = None
        while index < len(lines) and (not lines[index].strip() or lines[index].startswith(" ")):
            line = lines[index]
            if not line.strip():
                result.append(line)
                index += 1
                continue
            indent = len(line) - len(line.lstrip()) if indent is None else indent
            continuation_end = index + 1
            while continuation_end < len(lines) and lines[continuation_end].startswith(
                    " " * (indent + 1)):
                continuation_end += 1
            item = lines[index:continuation_end]
            names, colon, description = line.strip().partition(":")
            if colon and "," in names:
                for name in names.split(","):
                    result.append(" " * indent + name.strip() + ":" + description)
                    result.extend(item[1:])
            else:
                result.extend(item)
            index = continuation_end
    return "\n".join(result)


def with_typed_returns(text: str, annotation: str) -> str:
    """Returns `text` with `annotation: ` before a `Returns:` text holding a colon.

    A text that starts with a parenthesised or backquoted tuple of names,
    `(frame_labels, scores): ...`, keeps its colon: that names the parts.
    """
    lines = text.split("\n")
    for index, line in enumerate(lines[:-1]):
        if line.strip() != "Returns:" or line.startswith(" "):
            continue
        first = lines[index + 1]
        body = first.lstrip()
        if ":" in body and not body.startswith(("(", "`(")) and annotation:
            indent = first[:len(first) - len(body)]
            lines[index + 1] = f"{indent}{annotation}: {body}"
    return "\n".join(lines)


class HouseDocstrings(griffe.Extension):
    """Rewrites each object's docstring as it is loaded (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = with_one_parameter_per_item(with_blank_lines_before_sections(obj.docstring.value))
        returns = getattr(obj, "returns", None)
        obj.docstring.value = with_typed_returns(text, str(returns) if returns else "")
