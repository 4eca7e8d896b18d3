"""Exit codes and input checks shared by every ``timeshare`` subcommand.

Exit codes (docs/guide.md lists them):

* :data:`EXIT_OK` (0): the command did what was asked and every invariant held;
* :data:`EXIT_FAILED` (1): it ran, but the answer is negative (``plan``: no candidate fits);
* :data:`EXIT_BAD_INPUT` (2): the input was wrong (a bad option value, an unreadable or
  invalid scenario, an output path that cannot be written); one line on stderr says which
  and what to do, and nothing was run;
* :data:`EXIT_INVARIANT` (3): a simulated run violated an invariant (deadlock, a
  collective mismatch, a tensor not bitwise equal, ranks disagreeing on a state).

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


def describe_os_error(exc: OSError, what: str) -> str:
    """One line for an OSError met while writing ``what`` (e.g. ENOSPC after the checks passed)."""
    if exc.errno == errno.ENOSPC:
        return f"{what}: no space left on the device"
    return f"{what}: {exc.strerror or exc}"


__all__ = ["CliInputError", "EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INVARIANT", "EXIT_OK", "MIN_FREE_BYTES",
           "check_number", "check_output_path", "describe_os_error", "one_line_errors"]
