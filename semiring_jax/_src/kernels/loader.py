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
loaded into. The library is cached under `$SEMIRING_JAX_CACHE_DIR`, else
`$XDG_CACHE_HOME/semiring_jax` or `~/.cache/semiring_jax`, or where that
cannot be written, `semiring_jax-<uid>` in the temporary directory; a
compile takes about 30 s on 2 cores, and is given `$SEMIRING_JAX_BUILD_TIMEOUT` seconds
(90 by default) in all before the compiler is killed.

Loading a file runs its code, so a cache folder is used (read or built
into) only if it is ours and no one else can write it: then no one else can
plant or swap a file in it. Folders are made with mode 0700; one that fails
(another user's in the shared temporary directory, say, or one left
group-writable by a umask of 002) is skipped, never repaired (`chmod 700` it
to use it again). The file name holds the sha256 of the library's bytes
(`scores-<key>-<sha256>.so`, renamed into place whole), and a file is loaded
only if it is ours, writable by us alone, and matches it: a truncated copy
is rebuilt. A build writes `tmp-semiring_jax-*.so` beside the target; on a
timeout, KeyboardInterrupt or SIGTERM it kills the compiler and removes the
file, and the next build removes such files over an hour old (a SIGKILL's).

The first build logs one line (WARNING, logger `semiring_jax`) as it starts;
`logging.getLogger("semiring_jax").setLevel(logging.ERROR)` hides it. A
failed compile's full output goes to that logger at DEBUG level.

They serve a single CPU device. Where no compiler is found, or the build
fails, `enabled()` is False (with one `RuntimeWarning` saying why) and every
op uses the portable `lax.scan` recursions, which give the same results; so
do other backends and runs with several devices. Set
`SEMIRING_JAX_CPU_KERNELS=0` to use the scan always (and silence the
warning).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import numpy.typing as npt

__all__ = ["HOST_FUNCTIONS", "TARGETS", "enabled", "host_function", "serves", "target"]

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


# Well under a minute: a hung compiler (a stuck NFS mount, a licence
# server) should cost the first call a pause, not hang a job.
_TIMEOUT_S = 90.0
_PARTIAL = "tmp-semiring_jax-"
# A partial file this old is no live build's (builds are killed at their
# timeout), so one left by a SIGKILLed process can go.
_STALE_S = 3600.0
_SILENCE = "Set SEMIRING_JAX_CPU_KERNELS=0 to silence this."


class _CompileError(OSError):
    """The compiler ran and failed (another cache folder would not help)."""


class _Unsafe(PermissionError):
    """A cache folder or file that someone else owns or could write."""


class _Terminated(BaseException):
    """SIGTERM arrived during a build (raised so that its cleanup runs)."""


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


def _compiler() -> str:
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        raise OSError(f"no C++ compiler found (tried {name!r}; set $CXX)")
    return path


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


def _library_key(compiler: str) -> str:
    """The file name's stem for the library built from this source, compiler
    and jaxlib (its digest follows: `<key>-<sha256>.so`)."""
    import jaxlib

    key = hashlib.sha256()
    for part in (
        *(path.read_bytes() for path in (*_SOURCES, *_HEADERS)),
        jaxlib.__version__.encode(),
        compiler.encode(),
        " ".join((*_FLAGS, _NATIVE)).encode(),
        platform.machine().encode(),
        _cpu_signature(),
    ):
        key.update(part)
        key.update(b"\0")
    return f"scores-{key.hexdigest()[:16]}"


def _timeout() -> float:
    """The seconds a build may take in all, from $SEMIRING_JAX_BUILD_TIMEOUT."""
    value = os.environ.get("SEMIRING_JAX_BUILD_TIMEOUT", "")
    if not value:
        return _TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise _CompileError(f"SEMIRING_JAX_BUILD_TIMEOUT={value!r} is not a positive number")
    return seconds


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
    rename the same bytes over it (its name is their digest).
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
        except OSError as error:  # sound bytes that no longer load here: rebuild
            _LOG.debug("semiring_jax: %s does not load (%s); removing it", path, error)
            with contextlib.suppress(OSError):
                path.unlink()
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


def _first_error(output: str) -> str:
    """The compiler's first error line, paths cut to their file names, and
    cut to 120 characters: enough to report, short enough for a warning."""
    lines = [line for line in output.splitlines() if line.strip()] or ["no output"]
    line = next((line for line in lines if "error" in line), lines[-1])
    line = re.sub(r"(?:[^\s:'\"]*/)+([^\s/:'\"]+)", r"\1", line.strip())
    return line if len(line) <= 120 else line[:117] + "..."


def _run(command: list[str], timeout: float) -> tuple[int, str]:
    """Runs `command` in a process group of its own, which is killed whole
    (the driver, cc1plus, as, ld) if it times out or we are interrupted:
    killing the driver alone would leave the others writing on."""
    deadline = time.monotonic() + timeout
    with _signals_held() as held:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
    try:
        for signum in held:
            signal.raise_signal(signum)
        output = _output(process, deadline)
    except BaseException:
        if hasattr(os, "killpg"):
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        process.kill()
        process.communicate()  # reaps it; the pipes close once the group is gone
        raise
    return process.returncode, output


def _output(process: subprocess.Popen, deadline: float) -> str:
    """What `process` writes until it exits; subprocess.TimeoutExpired at
    `deadline`. Waits in short slices: a signal's Python handler runs in the
    main thread only, and where the system gave the signal to another
    thread a single long wait would not notice it until it ended."""
    while True:
        try:
            output, _ = process.communicate(
                timeout=max(min(deadline - time.monotonic(), 0.2), 0.01)
            )
            return output
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """Holds SIGINT and SIGTERM for the block and yields those that came,
    for the caller to raise again where it can clean up: one arriving inside
    Popen, after the compiler has started but before `_run` can kill it,
    would leave the compiler running. Only in the main thread (handlers are
    set there) and over handlers set from Python (others cannot be put back)."""
    held: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for wanted in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(wanted) is not None:
                previous[wanted] = signal.signal(wanted, lambda signum, frame: held.append(signum))
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _compile(compiler: str, output: str, budget: float) -> None:
    """Builds the library into `output` within `budget` seconds, or raises
    _CompileError with the compiler's first error or its timeout."""
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
            code, messages = _run(attempt, deadline - time.monotonic())
        except subprocess.TimeoutExpired:
            raise _CompileError(f"the C++ compiler timed out after {budget:g} s") from None
        if code == 0:
            return
    _LOG.debug("semiring_jax: %s failed:\n%s", " ".join(attempt), messages)
    raise _CompileError(f"the C++ compiler failed: {_first_error(messages)}")


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Makes a SIGTERM raise, so that the build's cleanup runs, and then
    ends the process by SIGTERM as it would have. Only in the main thread
    and over the default action: another handler is the application's."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise _Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
    with _sigterm_unwinds():
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
            os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
    library = _open_library(target, digest)
    if library is None:
        raise OSError(f"{target} changed as it was built")
    return library


def _find_or_build(compiler: str) -> ctypes.CDLL:
    """The library from the first cache folder holding a sound copy, else
    built into the first folder that can take it."""
    key = _library_key(compiler)
    folders = _cache_dirs()
    for folder in folders:
        library = _cached(folder, key)
        if library is not None:
            return library
    budget = _timeout()
    for i, folder in enumerate(folders):
        try:
            return _build(compiler, folder, key, budget)
        except _CompileError:
            raise
        except OSError as error:  # this folder cannot take it: try the next one
            if i == len(folders) - 1:
                raise
            if isinstance(error, _Unsafe):
                _LOG.warning("semiring_jax: skipped a kernel cache folder: %s", error)
    raise AssertionError("unreachable")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The built library, its FFI targets registered; None when off or unbuilt."""
    if os.environ.get("SEMIRING_JAX_CPU_KERNELS", "1") == "0":
        return None
    try:
        library = _find_or_build(_compiler())
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
            stacklevel=4,
        )
        return None
    return library


def _load() -> bool:
    return _library() is not None


def host_function(symbol: str) -> Any:
    """The library's plain C function `symbol` (one of `HOST_FUNCTIONS`),
    called on numpy arrays outside any XLA program (so on any backend);
    None when the kernels are off or unbuilt."""
    library = _library()
    return None if library is None else getattr(library, symbol)


def pointer(array: np.ndarray, ctype: type) -> ctypes._Pointer:
    """A C pointer of `ctype` to a contiguous numpy array's data, for a
    host function's argument (the caller keeps the array alive)."""
    return array.ctypes.data_as(ctypes.POINTER(ctype))


def target(op: str, dtype: npt.DTypeLike) -> str:
    """The FFI target of kernel `op` (e.g. "ctc_grad") for inputs of
    `dtype`, float32 or float64: a key of `TARGETS`."""
    return f"semiring_jax_{op}_{_DTYPES[np.dtype(dtype).name]}"


def serves(dtype: npt.DTypeLike) -> bool:
    """Whether the kernels serve inputs of `dtype` in what is traced now:
    float32 or float64, and `enabled()`."""
    return np.dtype(dtype).name in _DTYPES and enabled()


def enabled() -> bool:
    """Whether score ops traced now use the compiled CPU kernels.

    True when the default backend is a single CPU device and the kernels are
    built (building them on the first call). With several devices the
    portable scan serves instead: XLA cannot split an FFI call along a
    sharded batch axis and would gather the whole batch onto each device.
    Decided at trace time: a function already jitted keeps its choice.
    """
    return jax.default_backend() == "cpu" and jax.device_count() == 1 and _load()
