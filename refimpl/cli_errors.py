"""Exit codes and input checks shared by every ``timeshare`` subcommand.

Exit codes (docs/guide.md lists them):

* :data:`EXIT_OK` (0): the command did what was asked and every invariant held;
* :data:`EXIT_FAILED` (1): it ran, but the answer is negative (``plan``: no candidate fits);
* :data:`EXIT_BAD_INPUT` (2): the input was wrong (a bad option value, an unreadable or
  invalid scenario, an output path that cannot be written); one line on stderr says which
  and what to do, and nothing was run;
* :data:`EXIT_INVARIANT` (3): a simulated run violated an invariant (deadlock, a
  collective mismatch, a tensor not bitwise equal, ranks disagreeing on a state);
* :data:`EXIT_BUG` (4): a bug in ``timeshare`` itself: one line on stderr names the
  error and the file the full report (traceback, command line, versions) went to
  (:func:`report_bug`); never a traceback on the terminal.

:func:`check_output_path` is run before any work so that a run is never lost to a path
that cannot be written.
"""
from __future__ import annotations

import errno
import functools
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INVARIANT = 3
EXIT_BUG = 4
#: where :func:`report_bug` writes (default: the system's temporary directory)
BUG_DIR_ENV = "TIMESHARE_BUG_DIR"

#: refuse to start writing when the target's file system has less free space than this
MIN_FREE_BYTES = 1 << 20


class CliInputError(ValueError):
    """Bad command-line input; the message is one line that names the option and says what to give."""


def check_output_path(path: str | os.PathLike, option: str, *, suffix: str | None = None, is_dir: bool = False) -> Path:
    """Check that ``path`` can be written before the run starts; raise :class:`CliInputError` if not.

    Checks, in order: ``suffix`` (e.g. ``.png`` for ``--png``), that the path is not an
    existing directory (a file is expected) or is one (``is_dir``), that the parent directory
    exists and is writable, and that its file system has at least :data:`MIN_FREE_BYTES` free.
    """
    p = Path(path)
    if suffix and p.suffix.lower() != suffix:
        raise CliInputError(f"{option} {p}: expected a {suffix} file name, got {p.suffix or 'no suffix'!r}")
    if is_dir:
        if p.exists() and not p.is_dir():
            raise CliInputError(f"{option} {p}: exists and is not a directory")
        parent = p if p.exists() else p.parent
        if not parent.exists():
            parent = next((q for q in p.parents if q.exists()), Path("."))
    else:
        if p.is_dir():
            raise CliInputError(f"{option} {p}: is a directory; give a file name inside it")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.exists():
            raise CliInputError(f"{option} {p}: directory {parent} does not exist; create it first")
        if not parent.is_dir():
            raise CliInputError(f"{option} {p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliInputError(f"{option} {p}: directory {parent} is not writable")
    try:
        free = shutil.disk_usage(parent).free
    except OSError as exc:
        raise CliInputError(f"{option} {p}: cannot check free space in {parent} ({exc.strerror or exc})") from None
    if free < MIN_FREE_BYTES:
        raise CliInputError(f"{option} {p}: the file system of {parent} is full ({free} bytes free)")
    return p


def check_number(option: str, value: float | int | None, *, lo: float, strict: bool = False,
                 integer: bool = False) -> None:
    """``value`` (when given) must be ``>= lo`` (``> lo`` if ``strict``); raise :class:`CliInputError` naming ``option``."""
    if value is None:
        return
    bad = value <= lo if strict else value < lo
    if bad or value != value:  # NaN too
        kind = "an integer" if integer else "a number"
        raise CliInputError(f"{option}: expected {kind} {'>' if strict else '>='} {lo:g}, got {value}")


def one_line_errors(fn: Callable[..., int]) -> Callable[..., int]:
    """Decorate a subcommand's ``run(args)``: a :class:`CliInputError` prints ``error: ...`` on stderr and returns 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            return fn(*args, **kwargs)
        except CliInputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT

    return wrapper


def report_bug(exc: BaseException, argv: list[str] | None) -> str:
    """Write the full report of an unexpected exception to a file; return the one line the CLI prints.

    The file (in ``$TIMESHARE_BUG_DIR`` or the temporary directory) holds the command line, the
    versions and the traceback; the line names the exception and that file, so a script sees exit
    :data:`EXIT_BUG` and a person sees where to look.
    """
    import tempfile
    import time
    import traceback

    from refimpl import __version__

    text = (f"timeshare {__version__}, python {sys.version.split()[0]}\n"
            f"command: timeshare {' '.join(sys.argv[1:] if argv is None else argv)}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    where = os.environ.get(BUG_DIR_ENV) or tempfile.gettempdir()
    first = (str(exc).splitlines() or [""])[0][:200]
    try:
        fd, path = tempfile.mkstemp(prefix=f"timeshare-bug-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt",
                                    dir=where)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        told = f"the full report is in {path}"
    except OSError as err:
        told = f"the full report could not be written to {where} ({err.strerror or err}); set TIMESHARE_BUG_DIR to a writable directory"
    return (f"internal error (a bug in timeshare, not in your input): {type(exc).__name__}: {first}; {told}; "
            "please report it with that file")


def describe_os_error(exc: OSError, what: str) -> str:
    """One line for an OSError met while writing ``what`` (e.g. ENOSPC after the checks passed)."""
    if exc.errno == errno.ENOSPC:
        return f"{what}: no space left on the device"
    return f"{what}: {exc.strerror or exc}"


__all__ = ["BUG_DIR_ENV", "CliInputError", "EXIT_BAD_INPUT", "EXIT_BUG", "EXIT_FAILED", "EXIT_INVARIANT", "EXIT_OK", "MIN_FREE_BYTES",
           "check_number", "check_output_path", "describe_os_error", "one_line_errors", "report_bug"]
