"""Compiled CPU kernels (XLA FFI), built on first use.

`scores.cc` runs the forward and backward recursions of acyclic Fsas in one
pass over the arcs (`tot_score`, `arc_posteriors`); `ctc.cc` runs the CTC
loss's forward-backward over each utterance's band (`ctc_loss`); `common.h`
holds their SIMD exp and log and their use of XLA's CPU threads. They are
compiled once per machine, jaxlib version and source text with the C++
compiler (`$CXX`, else `c++`), for the building CPU (`-march=native`, and
without it if the compiler refuses), against the FFI headers that ship with
the installed jaxlib, so the handlers always match the runtime they are
loaded into. The library is cached under `$SEMIRING_JAX_CACHE_DIR`, else
`$XDG_CACHE_HOME/semiring_jax` or `~/.cache/semiring_jax`, or where that
cannot be written, `semiring_jax-<uid>` in the temporary directory; a
compile takes about 5 s.

They serve a single CPU device. Where no compiler is found, or the build
fails, `enabled()` is False (with one warning saying why) and every op uses
the portable `lax.scan` recursions, which give the same results; so do
other backends and runs with several devices. Set
`SEMIRING_JAX_CPU_KERNELS=0` to use the scan always.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax

__all__ = ["TARGETS", "enabled"]

_HERE = Path(__file__).parent
_SOURCES = (_HERE / "scores.cc", _HERE / "ctc.cc")
_HEADERS = (_HERE / "common.h",)

# FFI target name -> exported handler symbol (scores.cc, ctc.cc).
TARGETS = {
    "semiring_jax_log_forward": "SjLogForward",
    "semiring_jax_log_backward": "SjLogBackward",
    "semiring_jax_tropical_forward": "SjTropicalForward",
    "semiring_jax_tropical_backward": "SjTropicalBackward",
    "semiring_jax_ctc_forward": "SjCtcForward",
    "semiring_jax_ctc_backward": "SjCtcBackward",
}

_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-w", "-fno-math-errno", "-fno-trapping-math")
# Tuned for the building machine's CPU (AVX2 etc.): the library is cached
# per machine (the CPU's flags are part of its name), and is built without
# it where the compiler refuses the flag.
_NATIVE = "-march=native"


class _CompileError(OSError):
    """The compiler ran and failed (another cache folder would not help)."""


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


def _library_name(compiler: str) -> str:
    """The file name of the library built from this source, compiler and jaxlib."""
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
    return f"scores-{key.hexdigest()[:16]}.so"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes that start together
    # never load a half-written file.
    handle, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(handle)
    command = [
        compiler,
        *_FLAGS,
        _NATIVE,
        f"-I{jax.ffi.include_dir()}",
        *(str(path) for path in _SOURCES),
        "-o",
        partial,
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:  # perhaps -march=native: once more without
            command.remove(_NATIVE)
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise _CompileError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _find_or_build(compiler: str) -> Path:
    name = _library_name(compiler)
    folders = _cache_dirs()
    for folder in folders:
        if (folder / name).exists():
            return folder / name
    for i, folder in enumerate(folders):
        try:
            _build(compiler, folder / name)
            return folder / name
        except _CompileError:
            raise
        except OSError:  # the folder cannot be written: try the next one
            if i == len(folders) - 1:
                raise
    raise AssertionError("unreachable")


@functools.cache
def _load() -> bool:
    if os.environ.get("SEMIRING_JAX_CPU_KERNELS", "1") == "0":
        return False
    try:
        compiler = _compiler()
        library = ctypes.CDLL(str(_find_or_build(compiler)))
        for name, symbol in TARGETS.items():
            capsule = jax.ffi.pycapsule(getattr(library, symbol))
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    except (OSError, subprocess.SubprocessError, AttributeError) as error:
        warnings.warn(
            f"semiring_jax: the CPU score kernels are unavailable ({error}); using the "
            f"portable lax.scan recursions, which are slower on the CPU",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def enabled() -> bool:
    """Whether score ops traced now use the compiled CPU kernels.

    True when the default backend is a single CPU device and the kernels are
    built (building them on the first call). With several devices the
    portable scan serves instead: XLA cannot split an FFI call along a
    sharded batch axis and would gather the whole batch onto each device.
    Decided at trace time: a function already jitted keeps its choice.
    """
    return jax.default_backend() == "cpu" and jax.device_count() == 1 and _load()
