"""`SymbolTable`: names for labels, in OpenFst's symbol-table text format.

The text format (what `fstsymbols`, `fstcompile --isymbols` and pynini's
`SymbolTable.read_text` read) is one `symbol key` pair per line, separated
by tabs or spaces; keys are non-negative integers (ASCII digits, int32:
at most 2**31 - 1, since they are labels), need not be contiguous, and
blank lines are skipped. A symbol therefore holds no space or tab. Files
are UTF-8; errors name the line and quote it, cut to 60 characters.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from semiring_jax._src.core.host.messages import cut, decode_utf8, quote

__all__ = ["SymbolTable"]

_SEPARATORS = re.compile(r"[ \t]+")
_DIGITS = re.compile(r"[0-9]+")
_FORBIDDEN = " \t\r\n"
_REPR_SYMBOLS = 8
_INT32_MAX = 2**31 - 1


def _key(value: Any, fn: str) -> int:
    """`value` as a non-negative Python int (numpy integers included)."""
    if isinstance(value, bool):
        raise TypeError(f"{fn}: a key must be an int, got {value!r}")
    try:
        key = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{fn}: a key must be an int, got {type(value).__name__} {cut(repr(value))}"
        ) from None
    if key < 0:
        raise ValueError(f"{fn}: key {key} is negative; keys are non-negative integers")
    if key > _INT32_MAX:
        raise ValueError(f"{fn}: key {key} is above 2**31 - 1; keys are labels, which are int32")
    return key


def _check_symbol(symbol: Any, fn: str) -> str:
    if not isinstance(symbol, str):
        raise TypeError(
            f"{fn}: a symbol must be a str, got {type(symbol).__name__} {cut(repr(symbol))}"
        )
    if not symbol or any(c in _FORBIDDEN for c in symbol):
        raise ValueError(
            f"{fn}: symbol {quote(symbol)} is empty or holds a space, tab or "
            f"newline, which the text format cannot store"
        )
    return symbol


class SymbolTable:
    """A two-way map between symbols (str) and keys (non-negative int).

    Keys need not be contiguous. The text form is OpenFst's: one
    `symbol<TAB>key` line per entry, in key order. Lookups of a missing
    symbol or key raise `ValueError`; test first with `in`.

    Args:
      symbols: None (empty), an iterable of str (keys 0, 1, 2, ... in
        order), or a mapping from symbol to key.
      name: the table's name (OpenFst keeps one; equality ignores it).
    Raises:
      TypeError: for a symbol that is not a str or a key that is not an int.
      ValueError: for a duplicate symbol or key, a negative key or one
        above `2**31 - 1` (keys are labels, which are int32), or a symbol
        that is empty or holds whitespace.
    Examples:
      >>> import semiring_jax as sj
      >>> table = sj.SymbolTable(["<eps>", "a", "b"], name="letters")
      >>> table.find("b"), table.find(1)
      (2, 'a')
      >>> table.add_symbol("z", 26)
      26
      >>> print(table.to_text(), end="")  # doctest: +NORMALIZE_WHITESPACE
      <eps>	0
      a	1
      b	2
      z	26
      >>> sj.SymbolTable.from_text("x 3\\ny 1\\n") == sj.SymbolTable({"y": 1, "x": 3})
      True
    """

    def __init__(
        self, symbols: Iterable[str] | Mapping[str, int] | None = None, *, name: str = ""
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"SymbolTable: name must be a str, got {type(name).__name__}")
        self.name = name
        self._key_of: dict[str, int] = {}
        self._symbol_of: dict[int, str] = {}
        if symbols is None:
            return
        if isinstance(symbols, str):
            raise TypeError(
                "SymbolTable: symbols must be an iterable of str or a mapping, got a single str"
            )
        pairs = (
            symbols.items()
            if isinstance(symbols, Mapping)
            else ((symbol, key) for key, symbol in enumerate(symbols))
        )
        for symbol, key in pairs:
            self._insert(symbol, key, "SymbolTable")

    def _insert(self, symbol: Any, key: Any, fn: str) -> int:
        """Adds a new pair; raises if the symbol or the key is taken."""
        symbol, key = _check_symbol(symbol, fn), _key(key, fn)
        if symbol in self._key_of:
            raise ValueError(
                f"{fn}: duplicate symbol {quote(symbol)} (already key {self._key_of[symbol]})"
            )
        if key in self._symbol_of:
            raise ValueError(
                f"{fn}: duplicate key {key} (already symbol {quote(self._symbol_of[key])})"
            )
        self._key_of[symbol] = key
        self._symbol_of[key] = symbol
        return key

    # -- text format -----------------------------------------------------------

    @classmethod
    def from_text(cls, text: str, *, name: str = "") -> SymbolTable:
        """Parses OpenFst's symbol-table text (`symbol key` per line).

        Args:
          text: the text; fields separated by tabs or spaces, blank lines
            skipped.
          name: the table's name.
        Returns:
          A new SymbolTable.
        Raises:
          ValueError: naming the line number and the line, for a wrong number
            of fields, a key that is not a non-negative integer (ASCII
            digits) at most `2**31 - 1`, or a duplicate symbol or key.
        Examples:
          >>> import semiring_jax as sj
          >>> sj.SymbolTable.from_text("<eps>\\t0\\nhello\\t7\\n").find("hello")
          7
        """
        fn = "SymbolTable.from_text"
        table = cls(name=name)
        for line_number, line in enumerate(text.splitlines(), start=1):
            fields = [field for field in _SEPARATORS.split(line.strip(" \t\r")) if field]
            if not fields:
                continue
            where = f"{fn}: line {line_number}"
            if len(fields) != 2:
                raise ValueError(f"{where}: expected 'symbol key', got {quote(line)}")
            symbol, key_text = fields
            if not _DIGITS.fullmatch(key_text):
                raise ValueError(
                    f"{where}: key {quote(key_text)} is not a non-negative integer in {quote(line)}"
                )
            if len(key_text.lstrip("0")) > 10:  # int() refuses over 4300 digits
                raise ValueError(
                    f"{where}: key {quote(key_text)} is above 2**31 - 1; keys are labels, "
                    f"which are int32, in {quote(line)}"
                )
            try:
                table._insert(symbol, int(key_text), where)
            except ValueError as err:
                raise ValueError(f"{err} in {quote(line)}") from None
        return table

    @classmethod
    def read(cls, path: str | os.PathLike) -> SymbolTable:
        """Reads a symbol-table text file (UTF-8); its name is the path.

        Args:
          path: the file to read.
        Returns:
          A new SymbolTable.
        Raises:
          ValueError: as `from_text`, with the path in the message; also for
            a file that is not UTF-8 (naming the line and column).
        Examples:
          >>> import os, tempfile
          >>> import semiring_jax as sj
          >>> path = os.path.join(tempfile.mkdtemp(), "letters.syms")
          >>> sj.SymbolTable(["<eps>", "a"]).write(path)
          >>> sj.SymbolTable.read(path).find("a")
          1
        """
        path = os.fspath(path)
        with open(path, "rb") as stream:
            data = stream.read()
        text = decode_utf8(data, f"{path}: SymbolTable.read")
        try:
            return cls.from_text(text, name=str(path))
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def to_text(self) -> str:
        """OpenFst's text form: `symbol<TAB>key` lines in key order.

        Returns:
          The text, each line ending in a newline.
        Examples:
          >>> import semiring_jax as sj
          >>> print(sj.SymbolTable({"b": 5, "a": 2}).to_text(), end="")
          ... # doctest: +NORMALIZE_WHITESPACE
          a	2
          b	5
        """
        return "".join(f"{symbol}\t{key}\n" for key, symbol in self)

    def write(self, path: str | os.PathLike) -> None:
        """Writes `to_text()` to a file (UTF-8).

        Args:
          path: the file to write.
        Examples:
          >>> import os, tempfile
          >>> import semiring_jax as sj
          >>> path = os.path.join(tempfile.mkdtemp(), "words.syms")
          >>> sj.SymbolTable(["<eps>", "hi"]).write(path)
          >>> open(path).read()
          '<eps>\\t0\\nhi\\t1\\n'
        """
        with open(os.fspath(path), "w", encoding="utf-8") as stream:
            stream.write(self.to_text())

    # -- pynini ----------------------------------------------------------------

    @classmethod
    def from_pynini(cls, table: Any) -> SymbolTable:
        """A copy of a `pynini.SymbolTable` (any OpenFst symbol table).

        Args:
          table: a pynini (or pywrapfst) symbol table, e.g.
            `fst.input_symbols()`.
        Returns:
          A new SymbolTable with the same keys, symbols and name.
        Raises:
          ValueError: for a symbol the text format cannot hold, or a key
            above `2**31 - 1`.
        Examples:
          >>> import pynini
          >>> import semiring_jax as sj
          >>> theirs = pynini.SymbolTable(); _ = theirs.add_symbol("<eps>", 0)
          >>> _ = theirs.add_symbol("a", 4)
          >>> sj.SymbolTable.from_pynini(theirs).to_text()
          '<eps>\\t0\\na\\t4\\n'
        """
        ours = cls(name=str(table.name()))
        for key, symbol in table:
            ours._insert(symbol, key, "SymbolTable.from_pynini")
        return ours

    def to_pynini(self) -> Any:
        """The table as a `pynini.SymbolTable` (needs pynini installed).

        Returns:
          A new pynini.SymbolTable with the same keys, symbols and name.
        Raises:
          ImportError: if pynini is not installed.
        Examples:
          >>> import semiring_jax as sj
          >>> theirs = sj.SymbolTable(["<eps>", "a"]).to_pynini()
          >>> theirs.find("a")
          1
        """
        pynini = import_pynini("SymbolTable.to_pynini")
        theirs = pynini.SymbolTable(name=self.name or "<unspecified>")
        for key, symbol in self:
            theirs.add_symbol(symbol, key)
        return theirs

    # -- lookups and updates ---------------------------------------------------

    def find(self, item: str | int) -> int | str:
        """The key of a symbol (str), or the symbol of a key (int).

        Args:
          item: a symbol or a key (a Python or numpy integer).
        Returns:
          int for a symbol, str for a key.
        Raises:
          ValueError: if the table does not hold `item`; the message names it
            and the table.
        Examples:
          >>> import semiring_jax as sj
          >>> table = sj.SymbolTable(["<eps>", "a"])
          >>> table.find("a"), table.find(0)
          (1, '<eps>')
        """
        if isinstance(item, str):
            if item in self._key_of:
                return self._key_of[item]
            raise ValueError(f"SymbolTable.find: no symbol {quote(item)} in {self._label()}")
        key = _key(item, "SymbolTable.find")
        if key in self._symbol_of:
            return self._symbol_of[key]
        raise ValueError(f"SymbolTable.find: no key {item!r} in {self._label()}")

    def add_symbol(self, symbol: str, key: int | None = None) -> int:
        """Adds `symbol` (OpenFst semantics) and returns its key.

        A symbol already present keeps its key. A new symbol gets `key`, or by
        default one more than the largest key (0 for an empty table).

        Args:
          symbol: a non-empty str without spaces, tabs or newlines.
          key: a non-negative int, or None.
        Returns:
          The symbol's key.
        Raises:
          ValueError: if `key` belongs to another symbol, or the symbol is
            present with a different key.
        Examples:
          >>> import semiring_jax as sj
          >>> table = sj.SymbolTable(["<eps>"])
          >>> table.add_symbol("a"), table.add_symbol("b", 10), table.add_symbol("a")
          (1, 10, 1)
        """
        fn = "SymbolTable.add_symbol"
        _check_symbol(symbol, fn)
        if symbol in self._key_of:
            existing = self._key_of[symbol]
            if key is not None and _key(key, fn) != existing:
                raise ValueError(
                    f"{fn}: symbol {quote(symbol)} already has key {existing}, not {key}"
                )
            return existing
        if key is None:
            key = max(self._symbol_of, default=-1) + 1
        return self._insert(symbol, key, fn)

    def keys(self) -> list[int]:
        """The keys in increasing order."""
        return sorted(self._symbol_of)

    def symbols(self) -> list[str]:
        """The symbols in key order."""
        return [self._symbol_of[key] for key in self.keys()]

    def _label(self) -> str:
        return f"symbol table {quote(self.name, 200)}" if self.name else "the symbol table"

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self._key_of
        if isinstance(item, bool):
            return False
        try:
            return operator.index(item) in self._symbol_of  # type: ignore[arg-type]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """`(key, symbol)` pairs in key order, as pynini iterates."""
        return iter([(key, self._symbol_of[key]) for key in self.keys()])

    def __eq__(self, other: object) -> bool:
        """Same symbol-key pairs; the name is ignored."""
        if not isinstance(other, SymbolTable):
            return NotImplemented
        return self._key_of == other._key_of

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        pairs = list(self)
        shown = ", ".join(f"{symbol!r}: {key}" for key, symbol in pairs[:_REPR_SYMBOLS])
        more = f", ... ({len(pairs)} symbols)" if len(pairs) > _REPR_SYMBOLS else ""
        name = f", name={self.name!r}" if self.name else ""
        return f"SymbolTable({{{shown}{more}}}{name})"


def import_pynini(fn: str) -> Any:
    """The pynini module, or an ImportError that says how to install it."""
    try:
        import pynini
    except ImportError as err:
        raise ImportError(
            f"{fn} needs pynini; install it with: pip install 'semiring_jax[pynini]'"
        ) from err
    return pynini
