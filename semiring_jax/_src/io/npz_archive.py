"""Reading a `.npz` zip's members safely: names, `.npy` headers checked
against the zip directory before any data is read (`io/npz.py` describes
the checks)."""

from __future__ import annotations

import math
import os
import zipfile
from typing import NamedTuple

import numpy as np

from semiring_jax._src.core.host import messages
from semiring_jax._src.core.host.messages import quote
from semiring_jax._src.io.npz_layout import DEFLATE_RATIO, NAMES, File

__all__ = ["Declared", "declared", "file_name", "members", "read"]


class Declared(NamedTuple):
    """What a member's `.npy` header declares, before its data is read."""

    shape: tuple[int, ...]
    dtype: np.dtype


def members(archive: zipfile.ZipFile, where: str, size: int) -> dict[str, zipfile.ZipInfo]:
    """The zip members by array name, checked before anything is read."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name not in NAMES or not info.filename.endswith(".npy"):
            if "format.npy" not in archive.namelist():
                break  # reported below as no 'format'
            raise ValueError(f"load: {where}: array {quote(name)} is not part of the saved layout")
        if name in members:
            raise ValueError(f"load: {where}: array {name!r} appears twice in the file")
        if info.header_offset + info.compress_size > size:
            raise ValueError(
                f"load: {where}: array {name!r} claims {info.compress_size} compressed "
                f"bytes, more than the file holds ({size} bytes)"
            )
        members[name] = info
    if "format" not in members:
        raise ValueError(f"load: {where}: no array 'format'; not a file written by sj.save")
    return members


def declared(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, where: str) -> Declared:
    """A member's `.npy` header, checked against its zip directory entry."""
    fail = lambda problem: ValueError(f"load: {where}: array {name!r} {problem}")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise fail(
            f"is compressed with zip method {info.compress_type}; save writes stored or "
            f"deflated members only"
        )
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise fail(
            f"is stored uncompressed in {info.compress_size} bytes but claims {info.file_size}"
        )
    if info.file_size > DEFLATE_RATIO * info.compress_size + 64:
        raise fail(
            f"claims {info.file_size} bytes from {info.compress_size} compressed ones, more "
            f"than deflate can expand ({DEFLATE_RATIO}:1)"
        )
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise fail(f"is in .npy format version {version}, which load does not read")
            header_size = member.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        if str(err).startswith(f"load: {where}:"):
            raise
        raise fail(f"cannot be read: {messages.cut(str(err), 200)}") from None
    if dtype.hasobject:
        raise fail("cannot be read: it holds Python objects, which load does not unpickle")
    data_size = math.prod(shape) * dtype.itemsize  # exact: no int64 wrap-around
    if header_size + data_size != info.file_size:
        raise fail(
            f"declares shape {shape} of {dtype} ({data_size} bytes), but its zip member "
            f"holds {info.file_size - header_size} bytes of data"
        )
    return Declared(tuple(shape), dtype)


def file_name(file: File) -> str:
    if isinstance(file, (str, os.PathLike)):
        return repr(os.fspath(file))
    name = getattr(file, "name", None)
    return repr(name) if isinstance(name, str) else "<file object>"


def read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, where: str) -> np.ndarray:
    """One member's array (its header already checked by `declared`)."""
    try:
        with archive.open(info) as member:
            return np.asarray(np.lib.format.read_array(member, allow_pickle=False))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        # e.g. a damaged member (a bad CRC, or data cut short)
        raise ValueError(
            f"load: {where}: array {name!r} cannot be read: {messages.cut(str(err), 200)}"
        ) from None
