"""Running the C++ compiler for the kernels (`loader.py`): which one, its
version, the time a build may take, and a run of it that a timeout,
Ctrl-C or SIGTERM ends whole (the driver and everything it started), so
that no compiler is left writing on after the build has given up.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "CompileError",
    "Terminated",
    "build_timeout",
    "compiler_version",
    "find_compiler",
    "first_error",
    "run",
    "sigterm_unwinds",
]

# Well under a minute: a hung compiler (a stuck NFS mount, a licence
# server) should cost the first call a pause, not hang a job.
_TIMEOUT_S = 90.0
# Asking the compiler its version: a hung one should not hang the first call.
_VERSION_TIMEOUT_S = 10.0


class CompileError(OSError):
    """The compiler ran and failed (another cache folder would not help)."""


class Terminated(BaseException):
    """SIGTERM arrived during a build (raised so that its cleanup runs)."""


def find_compiler() -> str:
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        raise OSError(f"no C++ compiler found (tried {name!r}; set $CXX)")
    return path


def compiler_version(compiler: str) -> str:
    """The first line of `compiler --version` ("" where it says nothing or
    fails): a cache shared between machines with one path to different
    compilers keeps their libraries apart."""
    try:
        result = subprocess.run(
            [compiler, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_VERSION_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return next(iter(result.stdout.splitlines()), "").strip()


def build_timeout() -> float:
    """The seconds a build may take in all, from $SEMIRING_JAX_BUILD_TIMEOUT."""
    value = os.environ.get("SEMIRING_JAX_BUILD_TIMEOUT", "")
    if not value:
        return _TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise CompileError(f"SEMIRING_JAX_BUILD_TIMEOUT={value!r} is not a positive number")
    return seconds


def first_error(output: str) -> str:
    """The compiler's first error line, paths cut to their file names, and
    cut to 120 characters: enough to report, short enough for a warning."""
    lines = [line for line in output.splitlines() if line.strip()] or ["no output"]
    line = next((line for line in lines if "error" in line), lines[-1])
    line = re.sub(r"(?:[^\s:'\"]*/)+([^\s/:'\"]+)", r"\1", line.strip())
    return line if len(line) <= 120 else line[:117] + "..."


def run(command: list[str], timeout: float) -> tuple[int, str]:
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
    Popen, after the compiler has started but before `run` can kill it,
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


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
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
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
