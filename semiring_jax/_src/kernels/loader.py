"""Compiled CPU kernels (XLA FFI), built on first use.

`scores.cc` runs the forward and backward recursions of acyclic Fsas in one
pass over the arcs (`tot_score`, `arc_posteriors`); `ctc.cc` runs the CTC
loss's forward-backward over each utterance's band (`ctc_loss`); `rnnt.cc`
the transducer grid's over a band (the RNN-T losses); `dense.cc` dense
intersection with a general graph (`dense_tot_score`, `viterbi_decode`,
`mmi_loss`); `beam_search.cc` (plain C, called through ctypes) the beam
search of `intersect_dense_pruned` and `pruned_lattice.cc` (plain C too) its
lattice;
`kshortest.cc` (plain C too) the search of `nbest`;
`common.h` holds their SIMD exp and log and their use of XLA's CPU threads,
`lanes.h` the searches' branch-free filters. They are
compiled once per machine, jaxlib version and source text with the C++
compiler (`$CXX`, else `c++`), for the building CPU (`-march=native`, and
without it if the compiler refuses), against the FFI headers that ship with
the installed jaxlib, so the handlers always match the runtime they are
loaded into. The file's key holds all of these, the CPU's flags, and the
compiler's version (its `--version` line) and the C library's: machines
that share a cache folder build and keep their own libraries. The library
is cached under `$SEMIRING_JAX_CACHE_DIR`, else
`$XDG_CACHE_HOME/semiring_jax` or `~/.cache/semiring_jax`, or where that
cannot be written, `semiring_jax-<uid>` in the temporary directory; a
compile takes about 30 s on 2 cores, and is given
`$SEMIRING_JAX_BUILD_TIMEOUT` seconds (90 by default) in all before the
compiler (run by `build.py`) is killed.

Loading a file runs its code, so a cache folder is used (read or built
into) only if it is ours and no one else can write it: then no one else can
plant or swap a file in it. Folders are made with mode 0700; one that fails
(another user's in the shared temporary directory, say, or one left
group-writable by a umask of 002) is skipped, never repaired (`chmod 700` it
to use it again). The file name holds the sha256 of the library's bytes
(`scores-<key>-<sha256>.so`, renamed into place whole), and a file is loaded
only if it is ours, writable by us alone, and matches it: a truncated copy
is rebuilt. A sound file that does not load is skipped, never deleted (in
a shared cache it is another machine's); one this process has just built
is removed unless the same bytes were there before it, and counts as a
failed build. A build writes `tmp-semiring_jax-*.so` beside the target; on a
timeout, KeyboardInterrupt or SIGTERM it kills the compiler and removes the
file, and the next build removes such files over an hour old (a SIGKILL's).

The first build logs one line (WARNING, logger `semiring_jax`) as it starts;
`logging.getLogger("semiring_jax").setLevel(logging.ERROR)` hides it. A
failed compile's full output goes to that logger at DEBUG level. A build
that fails or times out leaves `<key>.failed` (its reason) in the cache
folder, and for an hour no process builds that key again (each would pay
the same failure): they warn that the failure is remembered and use the
scan. `SEMIRING_JAX_BUILD_RETRY=1`, or deleting the marker, retries sooner.

The FFI kernels serve programs lowered for the CPU, the host functions
(the searches of `nbest` and `intersect_dense_pruned`) a process whose
default backend is the CPU: on a GPU or TPU host nothing is built. Each
op's route record (`core/route_table.py`) says where its kernel runs.
Where no compiler is found, or the build fails, `enabled()` is False (with
one `RuntimeWarning` saying why, naming the user's line that led to the
build) and the CPU runs each op's next route, with the same results. Set
`SEMIRING_JAX_CPU_KERNELS=0` to use the portable routes always (and silence
the warning).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import numpy.typing as npt

from semiring_jax._src.core import sharding
from semiring_jax._src.kernels import build

__all__ = ["HOST_FUNCTIONS", "TARGETS", "enabled", "ffi", "host_function", "target"]

_LOG = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_SOURCES = (
    _HERE / "scores.cc",
    _HERE / "ctc.cc",
    _HERE / "rnnt.cc",
    _HERE / "dense.cc",
    _HERE / "beam_search.cc",
    _HERE / "pruned_lattice.cc",
    _HERE / "kshortest.cc",
)
_HEADERS = (_HERE / "common.h", _HERE / "lanes.h")

# The dtypes the handlers take, by the suffix of their names.
_DTYPES = {"float32": "f32", "float64": "f64"}

# FFI target name -> exported handler symbol (scores.cc, ctc.cc, rnnt.cc).
TARGETS = {
    f"semiring_jax_{op}_{dtype}": f"Sj{symbol}{dtype.upper()}"
    for op, symbol in (
        ("log_total", "LogTotal"),
        ("log_grad", "LogGrad"),
        ("tropical_total", "TropicalTotal"),
        ("tropical_grad", "TropicalGrad"),
        ("kbest", "KBest"),
        ("entropy", "Entropy"),
        ("ctc_loss", "CtcLoss"),
        ("ctc_grad", "CtcGrad"),
        ("rnnt_loss", "RnntLoss"),
        ("rnnt_grad", "RnntGrad"),
        ("dense_log_total", "DenseLogTotal"),
        ("dense_log_grad", "DenseLogGrad"),
        ("dense_tropical_total", "DenseTropicalTotal"),
        ("dense_tropical_grad", "DenseTropicalGrad"),
    )
    for dtype in _DTYPES.values()
}

# Plain C functions for host code (through ctypes, not XLA).
HOST_FUNCTIONS = (
    "SjBeamSearch",
    "SjBeamSearchTake",
    "SjPrunedLattice",
    "SjPrunedLatticeTake",
    "SjKShortest",
)

# Warnings on: the sources compile cleanly with them (a test builds with
# -Werror); XLA's headers are a system include, whose warnings are theirs.
_FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-Wall",
    "-Wextra",
    # Vector types passed between inline functions of one library: the ABI
    # note that GCC gives for them (without -march=native) does not apply.
    "-Wno-psabi",
    "-fno-math-errno",
    "-fno-trapping-math",
)
# Tuned for the building machine's CPU (AVX2 etc.): the library is cached
# per machine (the CPU's flags are part of its name), and is built without
# it where the compiler refuses the flag.
_NATIVE = "-march=native"


_PARTIAL = "tmp-semiring_jax-"
# A partial file this old is no live build's (builds are killed at their
# timeout), so one left by a SIGKILLed process can go.
_STALE_S = 3600.0
_SILENCE = "Set SEMIRING_JAX_CPU_KERNELS=0 to silence this."
# A build that failed (timed out, or the compiler's error) is remembered
# this long per library key, so that each new process does not pay for the
# same failure again; SEMIRING_JAX_BUILD_RETRY=1 or deleting the marker
# retries at once.
_FAILED = ".failed"
_FAILED_TTL_S = 3600.0
_RETRY = "SEMIRING_JAX_BUILD_RETRY"


class _Unsafe(PermissionError):
    """A cache folder or file that someone else owns or could write."""


def _cache_dirs() -> list[Path]:
    """Where to keep the library: the user's cache, then a temporary folder
    (for a home that cannot be written, as in some CI containers)."""
    explicit = os.environ.get("SEMIRING_JAX_CACHE_DIR")
    if explicit:
        return [Path(explicit)]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    fallback = (
        Path(tempfile.gettempdir()) / f"semiring_jax-{os.getuid() if hasattr(os, 'getuid') else 0}"
    )
    return [Path(base) / "semiring_jax", fallback]


def _cpu_signature() -> bytes:
    """What the CPU supports, so that a cache shared between machines never
    hands a library built for one CPU to another."""
    try:
        with open("/proc/cpuinfo", "rb") as cpuinfo:
            for line in cpuinfo:
                if line.startswith((b"flags", b"Features")):
                    return line
    except OSError:
        pass
    return platform.processor().encode()


def _libc_version() -> str:
    """The C library's name and version ("glibc 2.36"): a library linked
    against a newer one does not load on an older system."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        version = os.confstr("CS_GNU_LIBC_VERSION")
        if version:
            return version
    return " ".join(platform.libc_ver())


def _library_key(compiler: str) -> str:
    """The file name's stem for the library built from this source, compiler
    (its path and version), C library, jaxlib and CPU (its digest follows:
    `<key>-<sha256>.so`)."""
    import jaxlib

    key = hashlib.sha256()
    for part in (
        *(path.read_bytes() for path in (*_SOURCES, *_HEADERS)),
        jaxlib.__version__.encode(),
        compiler.encode(),
        build.compiler_version(compiler).encode(),
        _libc_version().encode(),
        " ".join((*_FLAGS, _NATIVE)).encode(),
        platform.machine().encode(),
        _cpu_signature(),
    ):
        key.update(part)
        key.update(b"\0")
    return f"scores-{key.hexdigest()[:16]}"


def _check_private(path: Path, info: os.stat_result) -> None:
    """Raises _Unsafe unless `path` (as `info` describes it) is ours and
    no one else can write it."""
    if not hasattr(os, "getuid"):  # Windows: no owners or modes to check
        return
    if info.st_uid != os.getuid():
        raise _Unsafe(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        mode = stat.S_IMODE(info.st_mode)
        raise _Unsafe(f"{path} can be written by others (mode {mode:o}; chmod 700 it to use it)")


def _check_folder(folder: Path, create: bool = False) -> None:
    """Raises OSError saying why `folder` may not hold the library; with
    `create`, makes it (mode 0700) where missing."""
    if create:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # ours from before, or planted: checked next
            folder.mkdir(mode=0o700)
    info = folder.lstat()  # a symlink is refused, not followed
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{folder} is not a folder")
    _check_private(folder, info)
    _check_ancestors(folder)


def _check_ancestors(folder: Path) -> None:
    """Raises _Unsafe unless no one else could rename `folder` or a folder
    above it (and put one of theirs in its place between our check and the
    load): every ancestor belongs to us or root and is writable by no one
    else, or is sticky like /tmp (where only an entry's owner renames it)."""
    if not hasattr(os, "getuid"):
        return
    for ancestor in Path(os.path.realpath(folder)).parents:
        info = ancestor.stat()
        if info.st_uid not in (0, os.getuid()):
            raise _Unsafe(f"{ancestor}, above {folder}, belongs to another user")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            mode = stat.S_IMODE(info.st_mode)
            raise _Unsafe(f"{ancestor}, above {folder}, can be written by others (mode {mode:o})")


def _open_library(path: Path, digest: str) -> ctypes.CDLL | None:
    """The library at `path` if it is a file of ours that no one else can
    write and whose bytes have sha256 `digest`, else None.

    Loaded by its path once checked: in a folder that only we can write, no
    one else can swap the file meanwhile, and our concurrent builds only
    rename the same bytes over it (its name is their digest). A sound file
    that does not load here is left alone: in a cache shared between
    machines it may be another's, which loads there.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        try:
            _check_private(path, info)
        except _Unsafe as error:
            _LOG.debug("semiring_jax: not loading %s", error)
            return None
        with os.fdopen(fd, "rb", closefd=False) as file:
            if hashlib.sha256(file.read()).hexdigest() != digest:
                _LOG.debug("semiring_jax: %s does not match its digest", path)
                return None
        try:
            return ctypes.CDLL(str(path))
        except OSError as error:  # sound bytes that do not load here: build our own
            _LOG.debug("semiring_jax: %s does not load here (%s); skipping it", path, error)
            return None
    finally:
        os.close(fd)


def _cached(folder: Path, key: str) -> ctypes.CDLL | None:
    """A sound library for `key` in `folder`, if the folder is usable and has one."""
    try:
        _check_folder(folder)
    except OSError as error:
        _LOG.debug("semiring_jax: not reading %s: %s", folder, error)
        return None
    for path in sorted(folder.glob(f"{key}-*.so")):
        library = _open_library(path, path.name[len(key) + 1 : -len(".so")])
        if library is not None:
            return library
    return None


def _compile(compiler: str, output: str, budget: float) -> None:
    """Builds the library into `output` within `budget` seconds, or raises
    build.CompileError with the compiler's first error or its timeout."""
    deadline = time.monotonic() + budget
    command = [
        compiler,
        *_FLAGS,
        _NATIVE,
        "-isystem",
        jax.ffi.include_dir(),
        *(str(path) for path in _SOURCES),
        "-o",
        output,
    ]
    # Perhaps the compiler refuses -march=native: once more without.
    for attempt in (command, [part for part in command if part != _NATIVE]):
        try:
            code, messages = build.run(attempt, deadline - time.monotonic())
        except subprocess.TimeoutExpired:
            raise build.CompileError(f"the C++ compiler timed out after {budget:g} s") from None
        if code == 0:
            return
    _LOG.debug("semiring_jax: %s failed:\n%s", " ".join(attempt), messages)
    raise build.CompileError(f"the C++ compiler failed: {build.first_error(messages)}")


@functools.cache
def _announce() -> None:
    _LOG.warning(
        "semiring_jax: compiling the CPU kernels, once (about 30 s); "
        "SEMIRING_JAX_CPU_KERNELS=0 skips them"
    )


def _build(compiler: str, folder: Path, key: str, budget: float) -> ctypes.CDLL:
    _check_folder(folder, create=True)
    cutoff = time.time() - max(_STALE_S, 2 * budget)
    for stale in folder.glob(f"{_PARTIAL}*.so"):
        with contextlib.suppress(OSError):
            if stale.lstat().st_mtime < cutoff:
                stale.unlink()
    _announce()
    with build.sigterm_unwinds():
        # Built beside the target and renamed into place whole, under a
        # name that carries its digest: a reader sees the complete file or
        # none, and can check it.
        handle, partial = tempfile.mkstemp(prefix=_PARTIAL, suffix=".so", dir=folder)
        os.close(handle)
        try:
            _compile(compiler, partial, budget)
            os.chmod(partial, 0o700)  # the linker's mode follows the umask
            digest = hashlib.sha256(Path(partial).read_bytes()).hexdigest()
            target = folder / f"{key}-{digest}.so"
            existed = target.exists()  # the same bytes, perhaps another machine's
            os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
    library = _open_library(target, digest)
    if library is None:  # a failed build, remembered as one
        if not existed:  # ours alone: not another machine's to keep
            with contextlib.suppress(OSError):
                target.unlink()
        raise build.CompileError(f"the library just built does not load ({target.name})")
    return library


def _failure_marker(folder: Path, key: str) -> Path:
    return folder / f"{key}{_FAILED}"


def _check_failed(folder: Path, key: str) -> None:
    """Raises build.CompileError if a build of `key` into `folder` failed
    within the last hour (its marker says why), unless
    $SEMIRING_JAX_BUILD_RETRY=1."""
    if os.environ.get(_RETRY, "") == "1":
        return
    marker = _failure_marker(folder, key)
    try:
        _check_folder(folder)
        fd = os.open(marker, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as file:
        age = time.time() - os.fstat(file.fileno()).st_mtime
        reason = file.read(500).strip() or "no reason recorded"
    if not 0 <= age < _FAILED_TTL_S:
        return
    raise build.CompileError(
        f"{reason}; that failure, {age / 60:.0f} min ago, is remembered for "
        f"{_FAILED_TTL_S / 3600:g} h: set {_RETRY}=1 or delete {marker} to retry sooner"
    )


def _remember_failure(folder: Path, key: str, reason: str) -> bool:
    """Leaves the marker that `_check_failed` reads; whether it could."""
    try:
        _check_folder(folder)
        handle, partial = tempfile.mkstemp(prefix=_PARTIAL, suffix=_FAILED, dir=folder)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(reason + "\n")
        os.replace(partial, _failure_marker(folder, key))
    except OSError as error:
        _LOG.debug("semiring_jax: could not remember the failed build: %s", error)
        return False
    return True


def _find_or_build(compiler: str) -> ctypes.CDLL:
    """The library from the first cache folder holding a sound copy, else
    built into the first folder that can take it."""
    key = _library_key(compiler)
    folders = _cache_dirs()
    for folder in folders:
        library = _cached(folder, key)
        if library is not None:
            return library
    budget = build.build_timeout()
    for folder in folders:
        _check_failed(folder, key)
    for i, folder in enumerate(folders):
        try:
            library = _build(compiler, folder, key, budget)
        except build.CompileError as error:
            if not _remember_failure(folder, key, str(error)):
                raise
            raise build.CompileError(
                f"{error}; not retried for {_FAILED_TTL_S / 3600:g} h ({_RETRY}=1 retries)"
            ) from None
        except OSError as error:  # this folder cannot take it: try the next one
            if i == len(folders) - 1:
                raise
            if isinstance(error, _Unsafe):
                _LOG.warning("semiring_jax: skipped a kernel cache folder: %s", error)
            continue
        with contextlib.suppress(OSError):  # a retry that worked
            _failure_marker(folder, key).unlink()
        return library
    raise AssertionError("unreachable")


def _library_folders() -> tuple[str, ...]:
    """The folders of semiring_jax, jax and jaxlib: code that runs on the
    way from a user's call to the build, which a warning skips."""
    import jaxlib

    packages = (Path(__file__).parents[2], Path(jax.__file__).parent, Path(jaxlib.__file__).parent)
    return tuple(os.path.join(str(folder), "") for folder in packages)


def _caller_stacklevel() -> int:
    """The `stacklevel` that makes a warning issued by this function's
    caller name the first frame outside semiring_jax, jax and jaxlib: the
    user's line that led here (directly, or by tracing through jax.jit)."""
    skipped = _library_folders()
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The built library, its FFI targets registered; None when off or unbuilt."""
    if os.environ.get("SEMIRING_JAX_CPU_KERNELS", "1") == "0":
        return None
    try:
        library = _find_or_build(build.find_compiler())
        for name, symbol in TARGETS.items():
            capsule = jax.ffi.pycapsule(getattr(library, symbol))
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        for symbol in HOST_FUNCTIONS:
            getattr(library, symbol)
    except (OSError, subprocess.SubprocessError, AttributeError) as error:
        warnings.warn(
            f"semiring_jax: CPU kernels off ({error}); using the portable scan (same "
            f"results, slower). {_SILENCE}",
            RuntimeWarning,
            stacklevel=_caller_stacklevel(),
        )
        return None
    return library


def _load() -> bool:
    return _library() is not None


def host_function(symbol: str) -> Any:
    """The library's plain C function `symbol` (one of `HOST_FUNCTIONS`),
    called on numpy arrays outside any XLA program; None when the kernels
    are off or unbuilt, or when the default backend is not the CPU.

    Like the FFI kernels, they serve a CPU backend only (of any number of
    devices: they run outside XLA): on a GPU or TPU host the library is not
    built (a C++ build of up to a minute, or a warning about a missing
    compiler, is no part of what a JAX user there expects), and its callers
    run their portable routes (`nbest` its numpy search,
    `intersect_dense_pruned` the traced search and numpy's lattice).
    """
    if jax.default_backend() != "cpu":
        return None
    library = _library()
    return None if library is None else getattr(library, symbol)


def pointer(array: np.ndarray, ctype: type) -> ctypes._Pointer:
    """A C pointer of `ctype` to a contiguous numpy array's data, for a
    host function's argument (the caller keeps the array alive)."""
    return array.ctypes.data_as(ctypes.POINTER(ctype))


def ffi(op: str, dtype: npt.DTypeLike, results: Any, *, vmap_method: str) -> Any:
    """`jax.ffi.ffi_call` of kernel `op` for inputs of `dtype`, whose
    results are typed as varying over the manual mesh axes its operands
    vary over: inside `jax.shard_map` a foreign call's results carry no such
    type, and would not meet the scans' (a `lax.cond`, a scan's carry)."""
    call = jax.ffi.ffi_call(target(op, dtype), results, vmap_method=vmap_method)

    def run(*operands: Any, **attributes: Any) -> Any:
        return sharding.varying_like(call(*operands, **attributes), operands)

    return run


def target(op: str, dtype: npt.DTypeLike) -> str:
    """The FFI target of kernel `op` (e.g. "ctc_grad") for inputs of
    `dtype`, float32 or float64: a key of `TARGETS`."""
    return f"semiring_jax_{op}_{_DTYPES[np.dtype(dtype).name]}"


def enabled() -> bool:
    """Whether the compiled CPU library is built (building it on the first
    call): the kernel routes' condition (`core/routes.py`), which serve
    the programs lowered for the CPU.

    A process whose default backend is not the CPU does not build it (a
    C++ build of up to a minute, or a warning about a missing compiler, is
    no part of what a JAX user there expects).
    """
    return jax.default_backend() == "cpu" and _load()
